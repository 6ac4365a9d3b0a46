"""Sparse indexes of a segment, Kafka's `.index` and `.timeindex` layouts.

`.index`:     4-byte offset relative to the segment base, 4-byte file position.
`.timeindex`: 8-byte timestamp, 4-byte relative offset.

They are hints, not truth: entries live in memory and reach the file when the segment rolls or
the log closes; after a crash the tail segment's indexes are rebuilt from its batches, and an
index that fails its sanity check is rebuilt rather than trusted (Kafka does the same).
"""

from __future__ import annotations

import bisect
import os
import struct
from pathlib import Path

from tidelog.errors import CorruptRecord
from tidelog.invariant import invariant
from tidelog.storage.durable import write_all, write_file

_OFFSET_ENTRY = struct.Struct(">II")
_TIME_ENTRY = struct.Struct(">qI")


class OffsetIndex:
    """Relative offset -> file position, one entry per ~index.interval.bytes of log."""

    ENTRY = _OFFSET_ENTRY

    def __init__(self, path: Path, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.offsets: list[int] = []  # absolute offsets, increasing
        self.positions: list[int] = []  # increasing
        self._written = 0  # entries already in the file

    def __len__(self) -> int:
        return len(self.offsets)

    def append(self, offset: int, position: int) -> None:
        if self.offsets:
            invariant(
                offset > self.offsets[-1] and position > self.positions[-1],
                "offset > self.offsets[-1] and position > self.positions[-1]",
            )
        self.offsets.append(offset)
        self.positions.append(position)

    def floor(self, offset: int) -> tuple[int, int]:
        """(offset, position) of the last entry at or below offset, or (base, 0)."""
        i = bisect.bisect_right(self.offsets, offset) - 1
        if i < 0:
            return self.base_offset, 0
        return self.offsets[i], self.positions[i]

    def floor_position(self, position: int) -> tuple[int, int]:
        """(offset, position) of the last entry at or before a file position."""
        i = bisect.bisect_right(self.positions, position) - 1
        if i < 0:
            return self.base_offset, 0
        return self.offsets[i], self.positions[i]

    def truncate_to(self, offset: int) -> None:
        """Drop entries at or above offset."""
        i = bisect.bisect_left(self.offsets, offset)
        self._drop_from(i)

    def truncate_to_position(self, position: int) -> None:
        i = bisect.bisect_left(self.positions, position)
        self._drop_from(i)

    def _drop_from(self, i: int) -> None:
        del self.offsets[i:]
        del self.positions[i:]
        if self._written > i:
            self._written = 0  # rewrite the file whole on the next write

    def clear(self) -> None:
        self._drop_from(0)

    def write(self) -> None:
        """Bring the file up to date with memory (append, or rewrite after a truncation)."""
        self._written = _sync_file(
            self.path,
            self._written,
            [self.ENTRY.pack(o - self.base_offset, p) for o, p in self._unwritten()],
        )

    def _unwritten(self) -> zip[tuple[int, int]]:
        start = self._written
        return zip(self.offsets[start:], self.positions[start:], strict=True)

    def fsync(self) -> None:
        _fsync_path(self.path)

    def load(self, log_size_bytes: int) -> None:
        """Read the file; CorruptRecord if it is not a plausible index of this segment."""
        raw = self.path.read_bytes()
        if len(raw) % self.ENTRY.size:
            raise CorruptRecord(f"{self.path.name}: size {len(raw)} is not a multiple of 8")
        offsets: list[int] = []
        positions: list[int] = []
        for rel, pos in self.ENTRY.iter_unpack(raw):
            if offsets and (self.base_offset + rel <= offsets[-1] or pos <= positions[-1]):
                raise CorruptRecord(f"{self.path.name}: entries out of order")
            if pos >= log_size_bytes:
                raise CorruptRecord(f"{self.path.name}: position {pos} beyond the log")
            offsets.append(self.base_offset + rel)
            positions.append(pos)
        self.offsets, self.positions = offsets, positions
        self._written = len(offsets)


class TimeIndex:
    """Max timestamp so far -> relative offset, appended when the max timestamp grows."""

    ENTRY = _TIME_ENTRY

    def __init__(self, path: Path, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.timestamps: list[int] = []
        self.offsets: list[int] = []
        self._written = 0

    def __len__(self) -> int:
        return len(self.timestamps)

    @property
    def last_timestamp(self) -> int:
        return self.timestamps[-1] if self.timestamps else -1

    def maybe_append(self, timestamp: int, offset: int) -> None:
        if timestamp > self.last_timestamp and (not self.offsets or offset > self.offsets[-1]):
            self.timestamps.append(timestamp)
            self.offsets.append(offset)

    def floor(self, timestamp: int) -> int:
        """Offset to start scanning from for the first record with a timestamp >= timestamp."""
        i = bisect.bisect_left(self.timestamps, timestamp) - 1
        if i < 0:
            return self.base_offset
        return self.offsets[i]

    def truncate_to(self, offset: int) -> None:
        i = bisect.bisect_left(self.offsets, offset)
        del self.timestamps[i:]
        del self.offsets[i:]
        if self._written > i:
            self._written = 0

    def clear(self) -> None:
        self.truncate_to(-1)

    def write(self) -> None:
        start = self._written
        self._written = _sync_file(
            self.path,
            start,
            [
                self.ENTRY.pack(t, o - self.base_offset)
                for t, o in zip(self.timestamps[start:], self.offsets[start:], strict=True)
            ],
        )

    def fsync(self) -> None:
        _fsync_path(self.path)

    def load(self, next_offset: int) -> None:
        raw = self.path.read_bytes()
        if len(raw) % self.ENTRY.size:
            raise CorruptRecord(f"{self.path.name}: size {len(raw)} is not a multiple of 12")
        timestamps: list[int] = []
        offsets: list[int] = []
        for ts, rel in self.ENTRY.iter_unpack(raw):
            off = self.base_offset + rel
            if timestamps and (ts <= timestamps[-1] or off <= offsets[-1]):
                raise CorruptRecord(f"{self.path.name}: entries out of order")
            if off >= next_offset:
                raise CorruptRecord(f"{self.path.name}: offset {off} beyond the segment")
            timestamps.append(ts)
            offsets.append(off)
        self.timestamps, self.offsets = timestamps, offsets
        self._written = len(offsets)


def _sync_file(path: Path, written: int, entries: list[bytes]) -> int:
    """Append the unwritten entries (or rewrite the file when written == 0); new written count."""
    if not entries and path.exists():
        return written
    data = b"".join(entries)
    if written == 0:
        # Its owner fsyncs the index next (fsync()); the directory is fsynced on roll.
        write_file(path, data, sync=False, sync_dir=False)
    else:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            write_all(fd, data)
        finally:
            os.close(fd)
    return written + len(entries)


def _fsync_path(path: Path) -> None:
    if not path.exists():
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
