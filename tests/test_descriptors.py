"""The bounded cache of open segment files (storage/descriptors.py, issue 18): logs far beyond
the cache's size still read and write correctly, a slice outlives its segment's descriptor, and
a pinned segment's file stays open."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidelog.config import TopicConfig
from tidelog.errors import StorageError
from tidelog.record.batch import ProducerRecord, build_batch, decode_records, iter_headers
from tidelog.storage.descriptors import CAPACITY_MIN, SEGMENT_FILES
from tidelog.storage.log import SegmentedLog


@pytest.fixture
def small_cache() -> Iterator[None]:
    before = SEGMENT_FILES.capacity
    SEGMENT_FILES.resize(CAPACITY_MIN)
    try:
        yield
    finally:
        SEGMENT_FILES.resize(before)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def batch(value: bytes) -> bytes:
    return build_batch([ProducerRecord(None, value)], now_ms=0)


def values(log: SegmentedLog) -> list[bytes]:
    piece = log.read(log.log_start_offset, 1 << 20, log.log_end_offset)
    data = piece.read() if piece is not None else b""
    return [
        r.value or b""
        for pos, header in iter_headers(data)
        for r in decode_records(data[pos : pos + header.size_bytes])
    ]


def test_many_logs_share_a_bounded_number_of_descriptors(tmp_path: Path, small_cache: None) -> None:
    before = open_fds()
    logs = [SegmentedLog(tmp_path / f"p{i}", TopicConfig()) for i in range(100)]
    for i, log in enumerate(logs):
        log.append_as_leader(batch(b"first-%d" % i), epoch=1)
    assert len(SEGMENT_FILES) <= CAPACITY_MIN + 1
    assert open_fds() - before <= CAPACITY_MIN + 8, "a descriptor per log stayed open"
    for i, log in enumerate(logs):  # every one opened again on demand, appends and reads
        log.append_as_leader(batch(b"second-%d" % i), epoch=1)
        log.flush()
    for i, log in enumerate(logs):
        assert values(log) == [b"first-%d" % i, b"second-%d" % i]
    for log in logs:
        log.close()
    assert open_fds() <= before + 1


def test_a_slice_reads_its_own_file_after_the_segment_was_closed(
    tmp_path: Path, small_cache: None
) -> None:
    log = SegmentedLog(tmp_path / "a", TopicConfig())
    log.append_as_leader(batch(b"mine"), epoch=1)
    piece = log.read(0, 1 << 20, log.log_end_offset)
    assert piece is not None
    others = [SegmentedLog(tmp_path / f"o{i}", TopicConfig()) for i in range(3 * CAPACITY_MIN)]
    for other in others:  # the cache closes log's file and hands its number out again
        other.append_as_leader(batch(b"other"), epoch=1)
    assert [r.value for r in decode_records(piece.read())] == [b"mine"]  # one batch
    for other in [log, *others]:
        other.close()


def test_a_pinned_segment_stays_open_and_a_closed_one_is_refused(
    tmp_path: Path, small_cache: None
) -> None:
    log = SegmentedLog(tmp_path / "a", TopicConfig())
    log.append_as_leader(batch(b"x"), epoch=1)
    seg = log.active
    seg.pin()
    fd = seg.fd
    others = [SegmentedLog(tmp_path / f"o{i}", TopicConfig()) for i in range(3 * CAPACITY_MIN)]
    assert seg.descriptor == fd, "a pinned segment's file was closed"
    seg.close()  # while pinned: closed for everyone else, still readable by the pinning thread
    assert os.pread(seg.fd, 10, 0)
    seg.unpin()
    assert seg.descriptor == -1
    with pytest.raises(StorageError, match="closed"):
        _ = seg.fd
    for other in others:
        other.close()


def test_a_segment_file_that_vanished_is_an_error_not_an_empty_file(
    tmp_path: Path, small_cache: None
) -> None:
    log = SegmentedLog(tmp_path / "a", TopicConfig())
    log.append_as_leader(batch(b"x"), epoch=1)
    path = log.active.log_path
    others = [SegmentedLog(tmp_path / f"o{i}", TopicConfig()) for i in range(3 * CAPACITY_MIN)]
    assert log.active.descriptor == -1  # closed by the cache
    path.unlink()
    with pytest.raises(StorageError):
        log.append_as_leader(batch(b"y"), epoch=1)
    assert not path.exists()
    for other in others:
        other.close()
