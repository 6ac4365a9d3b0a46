"""One segment: `<20-digit base offset>.log` plus its sparse `.index` and `.timeindex`.

The segment knows file positions and batch headers; it never decodes a record. Writes go
through one O_APPEND descriptor, reads through pread/sendfile on the same descriptor, so the
page cache serves both. The descriptor lives in a process-wide cache of open files
(storage/descriptors.py): an idle segment's file is closed when too many are open, and opened
again when next used.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tidelog.errors import CorruptRecord, StorageError
from tidelog.invariant import invariant
from tidelog.record.batch import HEADER_SIZE, BatchHeader, read_header, validate
from tidelog.storage.descriptors import SEGMENT_FILES, OwnedDescriptor
from tidelog.storage.durable import translate_os_error, write_all
from tidelog.storage.offset_index import OffsetIndex, TimeIndex

log = logging.getLogger(__name__)

SCAN_CHUNK_BYTES = 64 * 1024


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


@dataclass(frozen=True)
class FileSlice:
    """A byte range of a segment file: what a fetch sends, never re-encoded. It owns a
    duplicate of the segment's descriptor (closed when the slice goes), so the segment's own may
    be closed meanwhile (descriptors.py) without the slice reading another file."""

    owner: OwnedDescriptor
    position: int
    size: int
    first_offset: int

    @property
    def fd(self) -> int:
        return self.owner.fd

    def read(self) -> bytes:
        data = os.pread(self.fd, self.size, self.position)
        if len(data) != self.size:
            raise StorageError(f"short read: {len(data)} of {self.size} bytes")
        return data


def retention_timestamp(max_timestamp: int, last_append_ms: int) -> int:
    """A segment's age for retention.ms and delete.retention.ms: its newest record timestamp,
    but never later than when it was last written, so a record stamped in the future cannot
    pin it forever."""
    newest = max_timestamp if max_timestamp >= 0 else last_append_ms
    return min(newest, last_append_ms)


class LogSegment:
    def __init__(
        self,
        directory: Path,
        base_offset: int,
        *,
        index_interval_bytes: int,
        now_ms: int,
    ) -> None:
        self.base_offset = base_offset
        stem = directory / segment_name(base_offset)
        self.log_path = stem.with_suffix(".log")
        self.index = OffsetIndex(stem.with_suffix(".index"), base_offset)
        self.time_index = TimeIndex(stem.with_suffix(".timeindex"), base_offset)
        self.index_interval_bytes = index_interval_bytes
        self.pins = 0  # threads reading this segment (compaction, scrub): never closed then
        self.closed = False
        try:
            self.descriptor = os.open(self.log_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
            self.size_bytes = os.fstat(self.descriptor).st_size
        except OSError as exc:
            raise translate_os_error(exc, f"opening {self.log_path}") from exc
        SEGMENT_FILES.adopt(self)
        self.next_offset = base_offset
        self.max_timestamp = -1
        self.created_ms = now_ms
        self.last_append_ms = now_ms
        self._bytes_since_index_entry = 0

    @property
    def fd(self) -> int:
        """The file's descriptor, for one system call: do not keep it (descriptors.py)."""
        if self.closed and self.pins == 0:
            raise StorageError(f"segment {self.log_path.name} is closed")
        return SEGMENT_FILES.fd(self)

    def reopen(self) -> int:
        """Open the file again after the cache closed it (never creating it)."""
        try:
            return os.open(self.log_path, os.O_RDWR | os.O_APPEND)
        except OSError as exc:
            raise translate_os_error(exc, f"opening {self.log_path}") from exc

    def pin(self) -> None:
        """A thread is about to read this segment: keep its file open (event loop only)."""
        self.pins += 1

    def unpin(self) -> None:
        self.pins -= 1
        if self.pins == 0 and self.closed:
            SEGMENT_FILES.release(self)

    @property
    def retention_timestamp(self) -> int:
        return retention_timestamp(self.max_timestamp, self.last_append_ms)

    # -- writing ------------------------------------------------------------------------------

    def append(
        self,
        data: bytes | bytearray | memoryview,
        headers: list[tuple[int, BatchHeader]],
        now_ms: int,
    ) -> None:
        """Append whole, already validated batches; headers carry positions relative to data."""
        invariant(
            headers and headers[0][1].base_offset >= self.next_offset,
            "headers and headers[0][1].base_offset >= self.next_offset",
        )
        start = self.size_bytes
        self._write_all(data, start)
        for rel, header in headers:
            self._index_batch(start + rel, header)
        self.size_bytes = start + len(data)
        self.next_offset = headers[-1][1].next_offset
        if self.size_bytes == len(data):
            self.created_ms = now_ms
        self.last_append_ms = now_ms

    def _write_all(self, data: bytes | bytearray | memoryview, start: int) -> None:
        try:
            write_all(self.fd, data)
        except OSError as exc:
            # Leave no torn batch behind: the log must end on a batch boundary.
            try:
                os.ftruncate(self.fd, start)
            except OSError:
                log.exception("could not undo a partial write in %s", self.log_path)
            raise translate_os_error(exc, f"appending to {self.log_path.name}") from exc

    def _index_batch(self, position: int, header: BatchHeader) -> None:
        if (
            self._bytes_since_index_entry >= self.index_interval_bytes
            or not self.index_interval_bytes
        ):
            if position > 0:
                self.index.append(header.base_offset, position)
                self.time_index.maybe_append(
                    max(self.max_timestamp, header.max_timestamp), header.base_offset
                )
            self._bytes_since_index_entry = 0
        self._bytes_since_index_entry += header.size_bytes
        if header.max_timestamp > self.max_timestamp:
            self.max_timestamp = header.max_timestamp

    def truncate_to(self, offset: int) -> int:
        """Drop every batch that holds an offset >= offset (as Kafka does, a batch straddling
        offset goes whole); returns the bytes removed."""
        if offset >= self.next_offset:
            return 0
        position = self.size_bytes
        for pos, header in self.scan(self._scan_start(offset)):
            if header.last_offset >= offset:
                position = pos
                break
        removed = self.size_bytes - position
        try:
            os.ftruncate(self.fd, position)
        except OSError as exc:
            raise translate_os_error(exc, f"truncating {self.log_path.name}") from exc
        self.index.truncate_to_position(position)
        self.time_index.truncate_to(offset)
        self.size_bytes = position
        self._rebuild_tail_state()
        return removed

    def fdatasync(self) -> None:
        os.fdatasync(self.fd)

    def flush_indexes(self) -> None:
        self.index.write()
        self.time_index.write()
        self.index.fsync()
        self.time_index.fsync()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.pins == 0:
                SEGMENT_FILES.release(self)

    # -- reading ------------------------------------------------------------------------------

    def scan(
        self, start: int = 0, end: int | None = None, *, verify: bool = False
    ) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) for each batch in [start, end); verify=True checks CRCs."""
        end = self.size_bytes if end is None else end
        pos = start
        while pos < end:
            want = min(end - pos, SCAN_CHUNK_BYTES)
            chunk = os.pread(self.fd, want, pos)
            offset_in_chunk = 0
            if not chunk:
                raise CorruptRecord(f"short read at position {pos} of {self.log_path.name}")
            while offset_in_chunk < len(chunk):
                remaining = len(chunk) - offset_in_chunk
                if remaining < HEADER_SIZE:
                    if pos + offset_in_chunk + remaining >= end:
                        raise CorruptRecord(f"{remaining} trailing bytes at the end of the segment")
                    break
                header = read_header(chunk, offset_in_chunk)
                size = header.size_bytes
                if size < HEADER_SIZE:
                    raise CorruptRecord(f"batch_length {header.batch_length} too small")
                batch_pos = pos + offset_in_chunk
                if batch_pos + size > end:
                    raise CorruptRecord(f"batch at {batch_pos} runs past the end of the segment")
                if verify:
                    if remaining >= size:
                        validate(chunk, offset_in_chunk)
                    else:
                        validate(os.pread(self.fd, size, batch_pos))
                yield batch_pos, header
                offset_in_chunk += size
            if offset_in_chunk == 0:
                raise CorruptRecord(f"short read at position {pos} of {self.log_path.name}")
            pos += offset_in_chunk

    def _scan_start(self, offset: int) -> int:
        return self.index.floor(offset)[1]

    def find(self, offset: int) -> tuple[int, BatchHeader] | None:
        """The batch holding offset (or the first one after it, in a gap); None past the end."""
        for pos, header in self.scan(self._scan_start(offset)):
            if header.last_offset >= offset:
                return pos, header
        return None

    def position_of(self, offset: int, start: int = 0) -> int:
        """Position of the first batch with base offset >= offset (size if none)."""
        if offset >= self.next_offset:
            return self.size_bytes
        _, indexed = self.index.floor(offset)
        for pos, header in self.scan(max(start, indexed)):
            if header.base_offset >= offset:
                return pos
        return self.size_bytes

    def batch_boundary_at_or_before(self, position: int, start: int) -> int:
        """The last batch boundary <= position (and > start unless none fits)."""
        if position >= self.size_bytes:
            return self.size_bytes
        _, indexed = self.index.floor_position(position)
        boundary = max(start, indexed)
        for pos, header in self.scan(boundary):
            end = pos + header.size_bytes
            if end > position:
                break
            boundary = end
        return boundary

    def slice(self, start: int, end: int, first_offset: int) -> FileSlice:
        return FileSlice(OwnedDescriptor(os.dup(self.fd)), start, end - start, first_offset)

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, BatchHeader] | None:
        """First batch holding a record whose max timestamp >= timestamp (a batch compaction
        emptied keeps its timestamps but holds no record to answer with)."""
        start_offset = self.time_index.floor(timestamp)
        _, position = self.index.floor(start_offset)
        for pos, header in self.scan(position):
            if header.max_timestamp >= timestamp and header.records_count > 0:
                return pos, header
        return None

    # -- recovery -----------------------------------------------------------------------------

    def load(self, *, verify: bool) -> int:
        """Bring in-memory state up from the files; verify=True validates every batch's CRC
        and truncates at the first bad one. Returns the bytes truncated."""
        if verify:
            return self._recover()
        try:
            self.index.load(self.size_bytes)
            last_pos = self.index.positions[-1] if self.index.positions else 0
            self._rebuild_tail_state(last_pos)
            self.time_index.load(self.next_offset)
        except (CorruptRecord, OSError) as exc:
            log.warning(
                "%s: index unusable (%s); rebuilding it from the log", self.log_path.name, exc
            )
            return self._recover()
        return 0

    def _recover(self) -> int:
        self.index.clear()
        self.time_index.clear()
        self._bytes_since_index_entry = 0
        self.max_timestamp = -1
        self.next_offset = self.base_offset
        valid_end = 0
        try:
            for pos, header in self.scan(verify=True):
                if header.base_offset < self.next_offset:
                    raise CorruptRecord(
                        f"batch at {pos} has base offset {header.base_offset}, expected >= {self.next_offset}"
                    )
                self._index_batch(pos, header)
                self.next_offset = header.next_offset
                valid_end = pos + header.size_bytes
        except CorruptRecord as exc:
            log.warning(
                "%s: invalid batch at position %d (%s); truncating %d bytes",
                self.log_path.name,
                valid_end,
                exc.message,
                self.size_bytes - valid_end,
            )
        truncated = self.size_bytes - valid_end
        if truncated:
            os.ftruncate(self.fd, valid_end)
            self.size_bytes = valid_end
        self.index.write()
        self.time_index.write()
        return truncated

    def _rebuild_tail_state(self, from_position: int | None = None) -> None:
        """Recompute next offset and max timestamp from the last indexed batch onward."""
        position = self.index.positions[-1] if from_position is None and self.index.positions else 0
        if from_position is not None:
            position = from_position
        self.next_offset = self.base_offset if position == 0 else self.index.offsets[-1]
        self.max_timestamp = self.time_index.last_timestamp
        self._bytes_since_index_entry = 0
        for _, header in self.scan(position):
            self.next_offset = header.next_offset
            self.max_timestamp = max(self.max_timestamp, header.max_timestamp)
            self._bytes_since_index_entry += header.size_bytes
        try:
            mtime_ms = int(os.fstat(self.fd).st_mtime * 1000)
        except OSError:
            mtime_ms = int(time.time() * 1000)
        self.last_append_ms = mtime_ms
