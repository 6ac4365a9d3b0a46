from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.errors import CorruptRecord
from tidelog.storage.offset_index import OffsetIndex, TimeIndex


def test_offset_index_floor_truncate_and_reload(tmp_path: Path) -> None:
    idx = OffsetIndex(tmp_path / "0.index", 100)
    for i in range(1, 6):
        idx.append(100 + i * 10, i * 1000)
    assert idx.floor(99) == (100, 0)
    assert idx.floor(100) == (100, 0)
    assert idx.floor(125) == (120, 2000)
    assert idx.floor(10**9) == (150, 5000)
    assert idx.floor_position(2500) == (120, 2000)
    idx.write()
    again = OffsetIndex(tmp_path / "0.index", 100)
    again.load(log_size_bytes=6000)
    assert again.offsets == idx.offsets and again.positions == idx.positions
    idx.truncate_to(130)
    assert idx.offsets == [110, 120]
    idx.write()
    again.load(log_size_bytes=6000)
    assert again.offsets == [110, 120]
    idx.append(125, 2500)
    idx.write()
    again.load(log_size_bytes=6000)
    assert again.offsets == [110, 120, 125]


def test_damaged_index_is_refused(tmp_path: Path) -> None:
    idx = OffsetIndex(tmp_path / "0.index", 0)
    idx.append(5, 100)
    idx.append(9, 200)
    idx.write()
    with pytest.raises(CorruptRecord):
        OffsetIndex(tmp_path / "0.index", 0).load(log_size_bytes=150)  # position past the log
    (tmp_path / "0.index").write_bytes(b"\x00" * 7)
    with pytest.raises(CorruptRecord):
        OffsetIndex(tmp_path / "0.index", 0).load(log_size_bytes=1000)
    (tmp_path / "0.index").write_bytes(bytes.fromhex("00000009000000c80000000500000064"))
    with pytest.raises(CorruptRecord):
        OffsetIndex(tmp_path / "0.index", 0).load(log_size_bytes=1000)


def test_time_index(tmp_path: Path) -> None:
    idx = TimeIndex(tmp_path / "0.timeindex", 0)
    idx.maybe_append(1000, 10)
    idx.maybe_append(900, 20)  # not a new maximum: ignored
    idx.maybe_append(2000, 30)
    assert idx.timestamps == [1000, 2000]
    assert idx.floor(500) == 0
    assert idx.floor(1500) == 10
    assert idx.floor(2000) == 10
    assert idx.floor(2001) == 30
    idx.write()
    again = TimeIndex(tmp_path / "0.timeindex", 0)
    again.load(next_offset=31)
    assert again.timestamps == [1000, 2000]
    with pytest.raises(CorruptRecord):
        TimeIndex(tmp_path / "0.timeindex", 0).load(next_offset=25)


@given(st.lists(st.integers(1, 50), min_size=1, max_size=50), st.integers(0, 3000))
def test_floor_matches_a_linear_scan(gaps: list[int], target: int) -> None:
    idx = OffsetIndex(Path("/nonexistent"), 0)
    offset = 0
    entries = []
    for i, gap in enumerate(gaps):
        offset += gap
        idx.append(offset, (i + 1) * 10)
        entries.append((offset, (i + 1) * 10))
    below = [e for e in entries if e[0] <= target]
    assert idx.floor(target) == (below[-1] if below else (0, 0))
