"""A log kept in memory that behaves like a disk with a page cache: what was not flushed is lost
when the replica crashes. The simulator runs the replication core on it; it passes the same
conformance suite as SegmentedLog.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

from tidelog.config import TopicConfig
from tidelog.errors import InvalidRequest, OffsetOutOfRange
from tidelog.invariant import invariant
from tidelog.record.batch import BatchHeader, decode_records
from tidelog.record.markers import Marker, read_marker
from tidelog.record.slices import BytesSlice
from tidelog.record.validation import ValidatedBatches
from tidelog.storage.appending import check_follower_batches, stamp_as_leader
from tidelog.storage.epoch_history import EpochHistory
from tidelog.storage.log import AppendInfo
from tidelog.storage.producer_state import ProducerState
from tidelog.storage.segment import retention_timestamp
from tidelog.storage.transactions import AbortedTransaction, TransactionState


@dataclass(frozen=True)
class MemorySegment:
    """A segment's shape, as retention sees it (batches are cut into segments as a SegmentedLog
    cuts them, by segment.bytes)."""

    base_offset: int
    size_bytes: int
    max_timestamp: int
    last_append_ms: int

    @property
    def retention_timestamp(self) -> int:
        return retention_timestamp(self.max_timestamp, self.last_append_ms)


@dataclass(frozen=True)
class MemoryFlush:
    target: int
    generation: int


class MemoryLog:
    def __init__(
        self, config: TopicConfig | None = None, clock_ms: Callable[[], int] = lambda: 0
    ) -> None:
        self.config = config or TopicConfig()
        self._clock_ms = clock_ms
        self._bases: list[int] = []
        self._headers: list[BatchHeader] = []
        self._data: list[bytes] = []
        self._append_ms: list[int] = []  # when each batch was appended
        self._segment_bases = [0]  # the last one is the active segment's
        self._active_bytes = 0
        self.log_start_offset = 0
        self._end = 0  # log end when no batch is held (after truncate_fully_and_start_at)
        self.high_watermark = 0
        self.durable_end_offset = 0
        self._durable_hw = 0
        self.epochs = EpochHistory()
        self.producers = ProducerState()
        self.transactions = TransactionState()
        self._durable_epochs = list(self.epochs.entries)
        self.flush_count = 0
        self._generation = 0  # bumped by truncation: a flush begun before it proves nothing after

    # -- ReplicaLog -------------------------------------------------------------------------------

    @property
    def log_end_offset(self) -> int:
        return self._headers[-1].next_offset if self._headers else self._end

    @property
    def effective_durable_end(self) -> int:
        return self.durable_end_offset if self.config.fsync_before_ack else self.log_end_offset

    @property
    def needs_flush(self) -> bool:
        return self.durable_end_offset < self.log_end_offset

    @property
    def size_bytes(self) -> int:
        return sum(len(d) for d in self._data)

    @property
    def segment_count(self) -> int:
        return len(self._segment_bases)

    @property
    def segments(self) -> list[MemorySegment]:
        out = []
        bases = self._segment_bases
        for k, base in enumerate(bases):
            lo = bisect.bisect_left(self._bases, base)
            hi = bisect.bisect_left(self._bases, bases[k + 1]) if k + 1 < len(bases) else None
            headers = self._headers[lo:hi]
            size = sum(map(len, self._data[lo:hi]))
            newest = max((h.max_timestamp for h in headers), default=-1)
            appended = max(self._append_ms[lo:hi], default=-1)
            out.append(
                MemorySegment(base, size, newest, self._clock_ms() if appended < 0 else appended)
            )
        return out

    def set_high_watermark(self, hw: int) -> None:
        invariant(
            self.high_watermark <= hw and self.log_start_offset <= hw <= self.log_end_offset,
            "the HW moves forward, within the log",
        )
        self.high_watermark = hw
        self.transactions.settle(hw)

    def append_as_leader(
        self, data: bytes | bytearray | memoryview | ValidatedBatches, epoch: int
    ) -> AppendInfo:
        buf, stamped = stamp_as_leader(self, data, epoch)
        self.epochs.assign(epoch, self.log_end_offset)
        return self._append(buf, stamped)

    def append_as_follower(self, data: bytes | bytearray | memoryview) -> AppendInfo:
        headers = check_follower_batches(data, self.log_end_offset)
        for _, header in headers:
            self.epochs.assign(header.partition_leader_epoch, header.base_offset)
        return self._append(bytes(data), headers)

    def _append(self, buf: bytes | bytearray, headers: list[tuple[int, BatchHeader]]) -> AppendInfo:
        now = self._clock_ms()
        for pos, header in headers:
            size = header.size_bytes
            if self._active_bytes and self._active_bytes + size > self.config.segment_bytes:
                self._segment_bases.append(header.base_offset)  # roll, as SegmentedLog does
                self._active_bytes = 0
            self._active_bytes += size
            self._append_ms.append(now)
            self.producers.record(header)
            batch = bytes(buf[pos : pos + header.size_bytes])
            if header.is_transactional:
                self.transactions.observe(header, read_marker(batch, header), now)
            self._bases.append(header.base_offset)
            self._headers.append(header)
            self._data.append(batch)
        first, last = headers[0][1], headers[-1][1]
        return AppendInfo(
            first.base_offset,
            last.last_offset,
            last.next_offset,
            max(h.max_timestamp for _, h in headers),
            len(headers),
            sum(h.last_offset_delta + 1 for _, h in headers),
            len(buf),
        )

    def truncate_to(self, offset: int) -> None:
        if offset >= self.log_end_offset:
            return
        if offset < self.log_start_offset:
            raise InvalidRequest(f"cannot truncate to {offset}, below the log start")
        self._generation += 1
        while self._headers and self._headers[-1].last_offset >= offset:
            self._bases.pop()
            self._headers.pop()
            self._data.pop()
            self._append_ms.pop()
        self._end = self._headers[-1].next_offset if self._headers else self.log_start_offset
        while len(self._segment_bases) > 1 and self._segment_bases[-1] >= offset:
            self._segment_bases.pop()
        self._active_bytes = sum(
            len(d)
            for b, d in zip(self._bases, self._data, strict=True)
            if b >= self._segment_bases[-1]
        )
        self.producers.rebuild(self._headers)
        self.epochs.truncate_from_end(self.log_end_offset)
        self.durable_end_offset = min(self.durable_end_offset, self.log_end_offset)
        self.high_watermark = min(self.high_watermark, self.log_end_offset)
        self.rebuild_transactions()

    def rebuild_transactions(self) -> None:
        """From every batch held (a real log's recovery scan: only markers are decoded)."""
        batches: list[tuple[BatchHeader, Marker | None]] = [
            (h, read_marker(d, h) if h.is_transactional else None)
            for h, d in zip(self._headers, self._data, strict=True)
        ]
        self.transactions.rebuild(batches, self.high_watermark, self._clock_ms())

    def aborted_transactions(self, start: int, end: int) -> list[AbortedTransaction]:
        return self.transactions.aborted_transactions(start, end)

    def truncate_fully_and_start_at(self, offset: int, prefix_epoch: int = -1) -> None:
        self._generation += 1
        self._bases, self._headers, self._data, self._append_ms = [], [], [], []
        self._segment_bases, self._active_bytes = [offset], 0
        self.producers.rebuild([])
        self.transactions.clear()
        self.log_start_offset = offset
        self._end = offset
        self.high_watermark = offset
        self.durable_end_offset = offset
        self.epochs.start_at(offset, prefix_epoch)
        self.write_state_checkpoint()

    def read(self, start_offset: int, max_bytes: int, max_offset: int) -> BytesSlice | None:
        self.check_range(start_offset)
        if start_offset >= max_offset:
            return None
        i = bisect.bisect_right(self._bases, start_offset) - 1
        if i < 0 or self._headers[i].last_offset < start_offset:
            i += 1
        chunks: list[bytes] = []
        size = 0
        first = -1
        while i < len(self._headers) and self._headers[i].base_offset < max_offset:
            if chunks and size + len(self._data[i]) > max_bytes:
                break
            if first < 0:
                first = self._headers[i].base_offset
            chunks.append(self._data[i])
            size += len(self._data[i])
            i += 1
        if not chunks:
            return None
        return BytesSlice(b"".join(chunks), max(first, self.log_start_offset))

    def check_range(self, offset: int) -> None:
        if offset < self.log_start_offset or offset > self.log_end_offset:
            raise OffsetOutOfRange(
                f"offset {offset} is outside [{self.log_start_offset}, {self.log_end_offset}]",
                log_start=self.log_start_offset,
                high_watermark=self.high_watermark,
                log_end=self.log_end_offset,
            )

    def bytes_from(self, offset: int) -> int:
        return sum(
            len(d)
            for h, d in zip(self._headers, self._data, strict=True)
            if h.last_offset >= offset
        )

    def offset_for_timestamp(self, timestamp: int) -> int | None:
        for header, data in zip(self._headers, self._data, strict=True):
            if header.max_timestamp >= timestamp:
                for rec in decode_records(data):
                    if rec.timestamp >= timestamp and rec.offset >= self.log_start_offset:
                        return rec.offset
        return None

    # -- durability -----------------------------------------------------------------------------

    def flush(self) -> int:
        job = self.begin_flush()
        if job is not None:
            self.complete_flush(job)
        return self.durable_end_offset

    def begin_flush(self) -> MemoryFlush | None:
        """Capture what an fsync started now would cover; complete_flush() makes it durable."""
        if not self.needs_flush:
            return None
        return MemoryFlush(self.log_end_offset, self._generation)

    def complete_flush(self, job: MemoryFlush) -> int:
        self.flush_count += 1
        if job.generation == self._generation:
            self.durable_end_offset = max(
                self.durable_end_offset, min(job.target, self.log_end_offset)
            )
        return self.durable_end_offset

    def flush_due(self) -> bool:
        return self.needs_flush

    def write_state_checkpoint(self) -> None:
        self._durable_hw = self.high_watermark

    def crash(self) -> None:
        """Lose everything that was not flushed, as a power cut would."""
        self.truncate_to(max(self.durable_end_offset, self.log_start_offset))
        self.high_watermark = min(self._durable_hw, self.log_end_offset)
        self.high_watermark = max(self.high_watermark, self.log_start_offset)
        self.rebuild_transactions()  # as a restart's recovery does, with the HW it read back

    # -- log start ------------------------------------------------------------------------------

    def advance_log_start(self, offset: int) -> bool:
        offset = min(offset, self.high_watermark)
        if offset <= self.log_start_offset:
            return False
        self.log_start_offset = offset
        self.epochs.truncate_from_start(offset)
        self.write_state_checkpoint()
        return True

    def delete_segments_below_log_start(self) -> list[int]:
        """Whole segments that lie entirely below the log start; never the active one."""
        deleted: list[int] = []
        bases = self._segment_bases
        while len(bases) > 1 and bases[1] <= self.log_start_offset:
            deleted.append(bases.pop(0))
            n = bisect.bisect_left(self._bases, bases[0])
            del self._bases[:n], self._headers[:n], self._data[:n], self._append_ms[:n]
        if deleted:
            self.transactions.drop_below(bases[0])
        return deleted

    def batches(self) -> list[tuple[BatchHeader, bytes]]:
        return list(zip(self._headers, self._data, strict=True))

    def batches_between(self, start: int, end: int) -> list[tuple[BatchHeader, bytes]]:
        """Batches holding any offset in [start, end)."""
        i = max(0, bisect.bisect_right(self._bases, start) - 1)
        out = []
        while i < len(self._headers) and self._headers[i].base_offset < end:
            if self._headers[i].last_offset >= start:
                out.append((self._headers[i], self._data[i]))
            i += 1
        return out
