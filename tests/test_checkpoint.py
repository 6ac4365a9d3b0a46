from __future__ import annotations

from pathlib import Path

import pytest

from tidelog.errors import CorruptRecord
from tidelog.storage.checkpoint import read_checkpoint, write_checkpoint


def test_round_trip_and_replace(tmp_path: Path) -> None:
    path = tmp_path / "state"
    assert read_checkpoint(path) is None
    write_checkpoint(path, {"high_watermark": 10, "epochs": [[1, 0]]})
    assert read_checkpoint(path) == {"high_watermark": 10, "epochs": [[1, 0]]}
    write_checkpoint(path, {"high_watermark": 11})
    assert read_checkpoint(path) == {"high_watermark": 11}
    assert not list(tmp_path.glob("*.tmp"))


def test_corruption_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "state"
    write_checkpoint(path, {"high_watermark": 10})
    text = path.read_text().replace("10", "99")
    path.write_text(text)
    with pytest.raises(CorruptRecord):
        read_checkpoint(path)
    path.write_bytes(b"\x00garbage")
    with pytest.raises(CorruptRecord):
        read_checkpoint(path)


def test_a_leftover_temp_file_does_not_matter(tmp_path: Path) -> None:
    path = tmp_path / "state"
    write_checkpoint(path, {"a": 1})
    (tmp_path / "state.tmp").write_bytes(b"half written")
    assert read_checkpoint(path) == {"a": 1}
    write_checkpoint(path, {"a": 2})
    assert read_checkpoint(path) == {"a": 2}


@pytest.mark.process
def test_a_short_write_never_swaps_in_a_torn_file(tmp_path: Path) -> None:
    """A file size limit makes the kernel write part of a buffer and report the short count
    (as a nearly full disk does): write_file, snapshots and compaction's cleaned segments must
    fail with a named error and leave what was there before."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        f"""
        import resource, signal
        from pathlib import Path
        from tidelog.errors import StorageError, StorageFull
        from tidelog.storage.durable import write_file
        from tidelog.storage.snapshot import SnapshotStore
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        target = Path({str(tmp_path)!r}) / "state"
        write_file(target, b"old")
        store = SnapshotStore(Path({str(tmp_path)!r}), 2)
        store.write(5, b"small")
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
        for attempt in (lambda: write_file(target, b"x" * 300_000),
                        lambda: store.write(9, b"y" * 300_000)):
            try:
                attempt()
            except (StorageError, StorageFull) as exc:
                print("refused:", exc.name)
            else:
                print("written")
        print(target.read_bytes() == b"old", [m.offset for m in store.all()])
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    ).stdout.splitlines()
    assert out == ["refused: StorageError", "refused: StorageError", "True [5]"], out


def test_a_snapshot_keeps_the_epoch_of_its_last_record_and_old_ones_still_read(
    tmp_path: Path,
) -> None:
    """Version 2 records the epoch (a replica restarting with its snapshot ahead of its log
    starts over there with it: fresh seed 898038519); version 1 files read as epoch -1."""
    import struct

    import crc32c

    from tidelog.storage.snapshot import SnapshotStore

    store = SnapshotStore(tmp_path, 3)
    meta = store.write(40, b"state", epoch=7)
    assert meta.epoch == 7
    latest = store.latest()
    assert latest is not None and (latest.offset, latest.epoch) == (40, 7)
    assert store.load(latest) == b"state"
    old = struct.pack(">8sqIq", b"TLSNAP1\n", 90, crc32c.crc32c(b"older"), 5) + b"older"
    (tmp_path / "snapshots" / f"{90:020d}.snapshot").write_bytes(old)
    latest = store.latest()
    assert latest is not None and (latest.offset, latest.epoch) == (90, -1)
    assert store.load(latest) == b"older"
