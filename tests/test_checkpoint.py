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
