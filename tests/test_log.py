"""The log: one conformance suite for the segmented log and the in-memory log, plus what only
the segmented log does (segments, indexes, recovery)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import batch_of, values_in
from tidelog.config import TopicConfig
from tidelog.errors import (
    CorruptRecord,
    DuplicateSequence,
    InvalidRecord,
    InvalidRequest,
    OffsetOutOfRange,
    RecordTooLarge,
)
from tidelog.record import ProducerRecord, build_batch, iter_headers
from tidelog.storage.log import SegmentedLog
from tidelog.storage.memory_log import MemoryLog

SMALL = TopicConfig(segment_bytes=2048, index_interval_bytes=256)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


LogFactory = Callable[[], Any]


@pytest.fixture(params=["segmented", "memory"])
def make_log(request: pytest.FixtureRequest, tmp_path: Path) -> LogFactory:
    def factory() -> Any:
        if request.param == "segmented":
            return SegmentedLog(tmp_path / "p-0", SMALL)
        return MemoryLog(SMALL)

    return factory


def read_all(log: Any, upper: int | None = None) -> list[tuple[int, bytes | None]]:
    out: list[tuple[int, bytes | None]] = []
    offset = log.log_start_offset
    upper = log.log_end_offset if upper is None else upper
    while offset < upper:
        chunk = log.read(offset, 700, upper)
        if chunk is None:
            break
        data = chunk.read()
        out.extend(v for v in values_in(data) if v[0] >= offset)
        last = None
        for _, header in iter_headers(data):
            last = header
        assert last is not None
        offset = last.next_offset
    return out


# -- conformance: both logs ---------------------------------------------------------------------


def test_leader_appends_get_consecutive_offsets(make_log: LogFactory) -> None:
    log = make_log()
    a = log.append_as_leader(batch_of(b"a", b"b", b"c"), epoch=3)
    b = log.append_as_leader(batch_of(b"d") + batch_of(b"e", b"f"), epoch=3)
    assert (a.first_offset, a.last_offset, a.next_offset) == (0, 2, 3)
    assert (b.first_offset, b.last_offset, b.record_count, b.batch_count) == (3, 5, 3, 2)
    assert log.log_end_offset == 6
    assert read_all(log) == [(i, v) for i, v in enumerate([b"a", b"b", b"c", b"d", b"e", b"f"])]
    assert log.epochs.latest_epoch == 3


def test_reads_stop_below_the_upper_bound_and_respect_the_budget(make_log: LogFactory) -> None:
    log = make_log()
    for i in range(20):
        log.append_as_leader(batch_of(bytes([65 + i]) * 100), epoch=1)
    assert [o for o, _ in read_all(log, upper=7)] == list(range(7))
    chunk = log.read(3, 1, 20)  # a budget smaller than a batch still returns one batch
    assert [o for o, _ in values_in(chunk.read())] == [3]
    assert log.read(7, 1000, 7) is None
    assert log.read(20, 1000, 20) is None
    with pytest.raises(OffsetOutOfRange):
        log.read(21, 1000, 21)


def test_follower_appends_keep_leader_offsets_and_epochs(make_log: LogFactory) -> None:
    leader = make_log()
    leader.append_as_leader(batch_of(b"a", b"b"), epoch=1)
    leader.append_as_leader(batch_of(b"c"), epoch=2)
    follower = MemoryLog(SMALL)
    data = leader.read(0, 1 << 20, leader.log_end_offset).read()
    follower.append_as_follower(data)
    assert follower.log_end_offset == 3
    assert follower.epochs.entries == leader.epochs.entries
    with pytest.raises(CorruptRecord):
        follower.append_as_follower(data)  # offsets below the log end


def test_truncate_and_epochs(make_log: LogFactory) -> None:
    log = make_log()
    log.append_as_leader(batch_of(b"a", b"b"), epoch=1)
    log.append_as_leader(batch_of(b"c"), epoch=2)
    log.append_as_leader(batch_of(b"d"), epoch=3)
    assert log.epochs.end_offset_for(1, log.log_end_offset) == (1, 2)
    assert log.epochs.end_offset_for(2, log.log_end_offset) == (2, 3)
    log.truncate_to(3)
    assert log.log_end_offset == 3
    assert log.epochs.latest_epoch == 2
    log.truncate_to(1)  # inside the first batch: the whole batch goes, as in Kafka
    assert log.log_end_offset == 0
    assert log.epochs.entries == []
    log.append_as_leader(batch_of(b"x"), epoch=4)
    assert read_all(log) == [(0, b"x")]


def test_a_log_whose_entries_are_all_gone_keeps_the_epoch_of_its_last_one(
    make_log: LogFactory,
) -> None:
    """Simulator seed 402349: a follower's log start had moved to its HW (29), it was told to
    truncate its uncommitted tail to 29, and the epoch history lost its only entry: the log
    claimed epoch -1 and voted for a candidate missing two committed records. The epoch of the
    entry below the log start (the prefix epoch) outlives every entry, as a snapshot's term."""
    log = make_log()
    log.append_as_leader(batch_of(b"a", b"b"), epoch=1)
    log.append_as_leader(batch_of(b"c"), epoch=2)
    log.append_as_leader(batch_of(b"d"), epoch=2)
    log.set_high_watermark(3)
    assert log.advance_log_start(3)
    assert log.epochs.entries == [(2, 2)]  # the entry below the start, moved up to it
    log.truncate_to(3)
    assert (log.log_start_offset, log.log_end_offset) == (3, 3)
    assert log.epochs.latest_epoch == 2
    assert log.epochs.end_offset_for(2, 3) == (2, 3)
    assert log.epochs.end_offset_for(1, 3) == (-1, 2)  # older: cannot be checked here
    log.append_as_leader(batch_of(b"e"), epoch=4)
    assert log.epochs.entries == [(2, 2), (4, 3)]
    assert log.epochs.epoch_at(2) == 2 and log.epochs.epoch_at(3) == 4


def test_a_log_that_starts_over_keeps_the_epoch_it_is_given(make_log: LogFactory) -> None:
    """Simulator seed 300028: a follower that started over at its leader's log start held no
    entry and claimed epoch -1; the leader now sends the epoch of its entry below the start."""
    log = make_log()
    log.append_as_leader(batch_of(b"a"), epoch=1)
    log.truncate_fully_and_start_at(234, prefix_epoch=6)
    assert (log.log_start_offset, log.log_end_offset) == (234, 234)
    assert log.epochs.latest_epoch == 6
    log.truncate_fully_and_start_at(300)  # a leader that does not know it (older data)
    assert log.epochs.latest_epoch == -1


def test_the_prefix_epoch_survives_a_restart(tmp_path: Path) -> None:
    log = SegmentedLog(tmp_path / "p-0", SMALL)
    log.append_as_leader(batch_of(b"a"), epoch=3)
    log.append_as_leader(batch_of(b"b"), epoch=5)
    log.set_high_watermark(2)
    log.advance_log_start(2)
    log.flush()
    log.close()
    again = SegmentedLog(tmp_path / "p-0", SMALL)
    assert (again.log_start_offset, again.log_end_offset) == (2, 2)
    assert again.epochs.latest_epoch == 5 and again.epochs.entries == [(5, 1)]
    again.truncate_fully_and_start_at(10, prefix_epoch=7)
    again.close()
    third = SegmentedLog(tmp_path / "p-0", SMALL)
    assert third.epochs.latest_epoch == 7 and third.log_end_offset == 10
    third.close()


def test_log_start_and_deleting_whole_segments(make_log: LogFactory) -> None:
    log = make_log()
    for i in range(40):
        log.append_as_leader(batch_of(bytes([i]) * 200), epoch=1)
    log.set_high_watermark(30)
    assert log.advance_log_start(25)
    assert not log.advance_log_start(10)  # never backwards
    log.advance_log_start(35)
    assert log.log_start_offset == 30  # never past the HW
    log.delete_segments_below_log_start()
    with pytest.raises(OffsetOutOfRange) as info:
        log.read(29, 100, 40)
    assert info.value.log_start == 30
    assert read_all(log)[0][0] == 30
    assert log.log_end_offset == 40


def test_truncate_fully_and_start_at(make_log: LogFactory) -> None:
    log = make_log()
    log.append_as_leader(batch_of(b"a"), epoch=1)
    log.truncate_fully_and_start_at(100)
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (100, 100, 100)
    log.append_as_follower(
        build_batch([ProducerRecord(None, b"z")], base_offset=100, partition_leader_epoch=5)
    )
    assert read_all(log) == [(100, b"z")]


def test_offset_for_timestamp(make_log: LogFactory) -> None:
    log = make_log()
    for i in range(10):
        log.append_as_leader(batch_of(b"v", b"w", ts=1000 * i), epoch=1)
    assert log.offset_for_timestamp(0) == 0
    assert log.offset_for_timestamp(4500) == 10
    assert log.offset_for_timestamp(5000) == 10
    assert log.offset_for_timestamp(10**12) is None


def test_bad_input_is_refused_without_damage(make_log: LogFactory) -> None:
    log = make_log()
    log.append_as_leader(batch_of(b"ok"), epoch=1)
    good = batch_of(b"x")
    bad = bytearray(good)
    bad[-1] ^= 1
    with pytest.raises(CorruptRecord):
        log.append_as_leader(bytes(bad), epoch=1)
    with pytest.raises(CorruptRecord):
        log.append_as_leader(good + b"\x00\x01", epoch=1)
    with pytest.raises(RecordTooLarge):
        log.append_as_leader(batch_of(b"y" * (SMALL.max_message_bytes + 1)), epoch=1)
    with pytest.raises(InvalidRequest):
        log.append_as_leader(b"", epoch=1)
    assert read_all(log) == [(0, b"ok")]


@settings(max_examples=60)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("append"), st.integers(1, 5), st.integers(1, 400), st.integers(1, 4)),
            st.tuples(st.just("truncate"), st.integers(0, 100)),
            st.tuples(st.just("start"), st.integers(0, 100)),
            st.tuples(st.just("flush")),
            st.tuples(st.just("reopen")),
        ),
        max_size=40,
    )
)
def test_segmented_log_behaves_like_the_memory_log(
    tmp_path_factory: pytest.TempPathFactory, ops: list[Any]
) -> None:
    directory = tmp_path_factory.mktemp("model")
    real = SegmentedLog(directory, SMALL)
    model = MemoryLog(SMALL)
    epoch = 1
    for op in ops:
        if op[0] == "append":
            _, count, size, epoch_step = op
            epoch = max(epoch, epoch_step, model.epochs.latest_epoch)
            data = build_batch([ProducerRecord(None, os.urandom(size))] * count, now_ms=5)
            real.append_as_leader(data, epoch)
            model.append_as_leader(data, epoch)
        elif op[0] == "truncate":
            target = max(op[1], model.high_watermark, model.log_start_offset)
            real.truncate_to(target)
            model.truncate_to(target)
        elif op[0] == "start":
            model.set_high_watermark(model.log_end_offset)
            real.set_high_watermark(real.log_end_offset)
            real.advance_log_start(op[1])
            model.advance_log_start(op[1])
            assert real.delete_segments_below_log_start() == model.delete_segments_below_log_start()
        elif op[0] == "flush":
            real.flush()
        else:
            real.close()
            real = SegmentedLog(directory, SMALL)
            model.delete_segments_below_log_start()  # opening a log deletes them too
        assert real.log_end_offset == model.log_end_offset
        assert real.log_start_offset == model.log_start_offset
        assert real.epochs.entries == model.epochs.entries
        assert read_all(real) == read_all(model)
        # The simulator's retention sees the segments the node's would.
        shape = [(s.base_offset, s.size_bytes, s.max_timestamp) for s in real.segments]
        assert shape == [(s.base_offset, s.size_bytes, s.max_timestamp) for s in model.segments]
    real.close()


# -- the segmented log only ----------------------------------------------------------------------


def test_rolls_on_segment_bytes_and_segment_ms(tmp_path: Path) -> None:
    clock = Clock()
    log = SegmentedLog(tmp_path, TopicConfig(segment_bytes=4096, segment_ms=60_000), clock_ms=clock)
    for _ in range(10):
        log.append_as_leader(batch_of(b"x" * 1000), epoch=1)
    assert log.segment_count >= 3
    assert all(s.size_bytes <= 4096 for s in log.segments)
    names = sorted(p.name for p in tmp_path.glob("*.log"))
    assert names[0] == "00000000000000000000.log"
    assert all(len(n) == len("00000000000000000000.log") for n in names)
    count = log.segment_count
    clock.now += 61_000
    log.append_as_leader(batch_of(b"late"), epoch=1)
    assert log.segment_count == count + 1
    clock.now += 61_000
    assert log.maybe_roll_by_time()
    assert log.active.size_bytes == 0


def test_a_follower_append_larger_than_a_segment_splits_at_batch_boundaries(tmp_path: Path) -> None:
    leader = MemoryLog(SMALL)
    for i in range(30):
        leader.append_as_leader(batch_of(bytes([i]) * 300), epoch=1)
    data = leader.read(0, 1 << 20, leader.log_end_offset).read()
    log = SegmentedLog(tmp_path, SMALL)
    log.append_as_follower(data)
    assert log.segment_count > 3
    assert read_all(log) == read_all(leader)


def test_never_deletes_the_active_segment(tmp_path: Path) -> None:
    log = SegmentedLog(tmp_path, SMALL)
    log.append_as_leader(batch_of(b"only"), epoch=1)
    log.set_high_watermark(1)
    log.advance_log_start(1)
    assert log.delete_segments_below_log_start() == []
    assert log.segment_count == 1


def test_deleted_segments_go_through_dot_deleted(tmp_path: Path) -> None:
    clock = Clock()
    log = SegmentedLog(
        tmp_path, TopicConfig(segment_bytes=2048, file_delete_delay_ms=1000), clock_ms=clock
    )
    for i in range(20):
        log.append_as_leader(batch_of(bytes([i]) * 500), epoch=1)
    log.set_high_watermark(20)
    log.advance_log_start(10)
    deleted = log.delete_segments_below_log_start()
    assert deleted
    assert list(tmp_path.glob("*.log.deleted"))
    clock.now += 1001
    log.purge_retired()
    assert not list(tmp_path.glob("*.deleted"))


def test_reopen_after_clean_close(tmp_path: Path) -> None:
    log = SegmentedLog(tmp_path, SMALL)
    for i in range(50):
        log.append_as_leader(batch_of(bytes([i]) * 100), epoch=2)
    log.set_high_watermark(40)
    before = read_all(log)
    log.close()
    again = SegmentedLog(tmp_path, SMALL)
    assert again.recovery.clean_shutdown
    assert again.recovery.truncated_bytes == 0
    assert again.high_watermark == 40
    assert read_all(again) == before
    assert again.epochs.entries == log.epochs.entries


def _fill(tmp_path: Path, n: int = 50) -> tuple[SegmentedLog, list[tuple[int, bytes | None]]]:
    log = SegmentedLog(tmp_path, SMALL)
    for i in range(n):
        log.append_as_leader(batch_of(bytes([i]) * 100), epoch=1)
    log.flush()
    return log, read_all(log)


def _crash(log: SegmentedLog) -> None:
    """Drop the object without closing it, as a SIGKILL would (the page cache keeps writes)."""
    for seg in log.segments:
        seg.close()  # (only its descriptor: a segment writes nothing when it closes)


def test_torn_tail_is_truncated_after_a_crash(tmp_path: Path) -> None:
    log, before = _fill(tmp_path)
    tail = log.active.log_path
    _crash(log)
    with open(tail, "ab") as f:
        f.write(batch_of(b"torn")[:-7])
    again = SegmentedLog(tmp_path, SMALL)
    assert not again.recovery.clean_shutdown
    assert again.recovery.truncated_bytes > 0
    assert read_all(again) == before
    again.append_as_leader(batch_of(b"after"), epoch=2)
    assert read_all(again)[-1] == (50, b"after")


def test_flipped_byte_in_the_tail_truncates_to_the_last_valid_batch(tmp_path: Path) -> None:
    log, before = _fill(tmp_path)
    log.close()
    tail = sorted(tmp_path.glob("*.log"))[-1]
    data = bytearray(tail.read_bytes())
    positions = [pos for pos, _ in iter_headers(bytes(data))]
    data[positions[-2] + 70] ^= 0xFF  # damage the second-to-last batch of the tail segment
    tail.write_bytes(bytes(data))
    again = SegmentedLog(tmp_path, SMALL)
    kept = read_all(again)
    assert kept == before[: len(kept)]
    assert len(before) - len(kept) == 2


def test_missing_or_damaged_indexes_are_rebuilt(tmp_path: Path) -> None:
    log, before = _fill(tmp_path, 200)
    log.close()
    indexes = sorted(tmp_path.glob("*.index"))
    indexes[0].unlink()
    indexes[1].write_bytes(b"\xff" * 13)
    sorted(tmp_path.glob("*.timeindex"))[2].write_bytes(b"\x01" * 24)
    again = SegmentedLog(tmp_path, SMALL)
    assert read_all(again) == before
    assert all(len(s.index) > 0 for s in again.segments[:-1])
    assert again.offset_for_timestamp(1000) == 0


def test_checkpointed_hw_beyond_the_recovered_end_is_clamped(tmp_path: Path) -> None:
    log, _ = _fill(tmp_path, 10)
    log.set_high_watermark(10)
    log.write_state_checkpoint()
    tail = log.active.log_path
    _crash(log)
    with open(tail, "r+b") as f:
        f.truncate(os.path.getsize(tail) - 50)
    again = SegmentedLog(tmp_path, SMALL)
    assert again.log_end_offset == 9
    assert again.high_watermark == 9


def test_group_commit_tracks_the_durable_end(tmp_path: Path) -> None:
    log = SegmentedLog(tmp_path, SMALL)
    log.append_as_leader(batch_of(b"a"), epoch=1)
    job = log.begin_flush()
    assert job is not None
    log.append_as_leader(batch_of(b"b"), epoch=1)  # arrives while the fsync runs
    job.run()
    assert log.complete_flush(job) == 1
    assert log.needs_flush
    assert log.flush() == 2
    assert log.begin_flush() is None


def test_a_flush_that_races_a_truncation_does_not_overstate_durability(tmp_path: Path) -> None:
    log = SegmentedLog(tmp_path, SMALL)
    log.append_as_leader(batch_of(b"a", b"b"), epoch=1)
    job = log.begin_flush()
    assert job is not None
    log.truncate_to(0)
    log.append_as_leader(batch_of(b"c", b"d", b"e"), epoch=2)
    job.run()
    assert log.complete_flush(job) == 0


def test_enospc_on_append_is_storage_full_and_leaves_no_torn_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from tidelog.errors import StorageFull
    from tidelog.storage import segment as segment_module

    log = SegmentedLog(tmp_path, SMALL)
    log.append_as_leader(batch_of(b"before"), epoch=1)
    real_write = os.write

    def full_disk(fd: int, data: Any) -> int:
        real_write(fd, bytes(data)[:7])  # a partial write, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(segment_module.os, "write", full_disk)
    with pytest.raises(StorageFull):
        log.append_as_leader(batch_of(b"lost"), epoch=1)
    monkeypatch.setattr(segment_module.os, "write", real_write)
    assert log.active.size_bytes == os.path.getsize(log.active.log_path)
    log.append_as_leader(batch_of(b"after"), epoch=1)  # space is back: writes resume
    assert read_all(log) == [(0, b"before"), (1, b"after")]
    log.close()
    assert read_all(SegmentedLog(tmp_path, SMALL)) == [(0, b"before"), (1, b"after")]


def test_a_replay_with_other_records_is_refused_not_acknowledged(make_log: LogFactory) -> None:
    """A retry of an idempotent batch (the same bytes), or a replay that encoded the same
    records again (a retried Spark task: other timestamps, another CRC), is dropped and
    answered as a duplicate. A batch that reuses the sequences of another with other records
    was answered the same way, and its records were lost though acknowledged (a real client
    did so): it is refused with InvalidRecord rule sequence_reuse. Kafka compares sequences
    only."""
    log = make_log()

    def batch(value: bytes, sequence: int = 0, timestamp: int = 1000) -> bytes:
        record = ProducerRecord(None, value, timestamp=timestamp)
        return build_batch([record], producer_id=7, producer_epoch=0, base_sequence=sequence)

    log.append_as_leader(batch(b"a"), epoch=1)
    with pytest.raises(DuplicateSequence):
        log.append_as_leader(batch(b"a"), epoch=1)  # a retry: the same bytes
    with pytest.raises(DuplicateSequence):
        log.append_as_leader(batch(b"a", timestamp=2000), epoch=1)  # encoded again
    with pytest.raises(InvalidRecord) as info:
        log.append_as_leader(batch(b"not a"), epoch=1)
    assert info.value.details["rule"] == "sequence_reuse" and info.value.details["base_offset"] == 0
    assert read_all(log) == [(0, b"a")]
    log.append_as_leader(batch(b"b", sequence=1), epoch=1)
    assert read_all(log) == [(0, b"a"), (1, b"b")]


@pytest.mark.process
def test_the_hw_never_moves_back_even_under_python_O(tmp_path: Path) -> None:
    """Issue 33: invariants were bare asserts, which `python -O` strips. A HW moved back is
    refused under -O too, with the InvariantBroken the node's fail-stop path stops on."""
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from tidelog.config import TopicConfig\n"
        "from tidelog.invariant import InvariantBroken\n"
        "from tidelog.record.batch import ProducerRecord, build_batch\n"
        "from tidelog.storage.log import SegmentedLog\n"
        "log = SegmentedLog(Path(sys.argv[1]), TopicConfig())\n"
        "log.append_as_leader(build_batch([ProducerRecord(None, b'x')] * 3), 1)\n"
        "log.set_high_watermark(3)\n"
        "try:\n"
        "    log.set_high_watermark(2)\n"
        "except InvariantBroken as exc:\n"
        "    print('refused:', exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-O", "-c", script, str(tmp_path / "t-0")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.startswith("refused: t-0: HW 3 -> 2"), out.stdout + out.stderr


def test_recovery_names_the_segments_it_removed_below_the_log_start(tmp_path: Path) -> None:
    """Stopped between moving the log start (durable) and deleting the segments below it: the
    reopened log removes them and its report names the ones removed, not the one kept."""
    log, _ = _fill(tmp_path)
    bases = [seg.base_offset for seg in log.segments]
    assert len(bases) >= 3
    log.set_high_watermark(50)
    log.advance_log_start(bases[2])
    log.flush()
    _crash(log)
    again = SegmentedLog(tmp_path, SMALL)
    assert again.recovery.removed_segments == [
        f"{bases[0]:020d} (below log start)",
        f"{bases[1]:020d} (below log start)",
    ]
    assert again.segments[0].base_offset == bases[2]
