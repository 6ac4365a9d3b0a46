"""One replica's durable log of one partition: segments, roll, read, truncate, recovery, flush.

Offsets on this object (DESIGN.md): log_start_offset <= durable_end_offset <= log_end_offset.
The high-water mark is decided by replication and only stored here (checkpointed) so a restarted
replica can serve what it knew to be committed.

Durability is group commit: begin_flush() captures everything appended so far and returns a
job whose run() (one fdatasync per touched segment, safe to run in a worker thread) is followed
by complete_flush(), which moves durable_end_offset. Appends may continue while a job runs.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from tidelog.config import TopicConfig
from tidelog.errors import (
    CorruptRecord,
    InvalidRequest,
    OffsetOutOfRange,
    StorageError,
    StorageFull,
)
from tidelog.formats import write_version
from tidelog.invariant import InvariantBroken, invariant
from tidelog.record.batch import BatchHeader, decode_records
from tidelog.record.markers import Marker, is_marker, read_marker
from tidelog.record.validation import ValidatedBatches
from tidelog.storage import versioned_text
from tidelog.storage.appending import check_follower_batches, stamp_as_leader
from tidelog.storage.checkpoint import read_checkpoint, write_checkpoint
from tidelog.storage.durable import fsync_dir, translate_os_error
from tidelog.storage.epoch_history import EpochEntry, EpochHistory
from tidelog.storage.faults import crash_point
from tidelog.storage.producer_state import ProducerEntry, ProducerState
from tidelog.storage.segment import FileSlice, LogSegment
from tidelog.storage.transactions import AbortedTransaction, TransactionState

log = logging.getLogger(__name__)

PARTITION_CHECKPOINT = "partition.checkpoint"
EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
PRODUCER_CHECKPOINT = "producer-state"
TRANSACTION_CHECKPOINT = "transaction-state"
# Past this many entries (transactions, and undecided transactions' batches) the clean-close
# checkpoint says only "scan" (it must stay under checkpoint.py's 1 MiB limit, at some 65 bytes
# an entry with 64-bit producer ids): the next open scans the log for them instead.
TRANSACTION_CHECKPOINT_ENTRIES_MAX = 8_192
CLEAN_SHUTDOWN = ".clean-shutdown"
DELETED_SUFFIX = ".deleted"


class AppendInfo(NamedTuple):
    first_offset: int
    last_offset: int
    next_offset: int
    max_timestamp: int
    batch_count: int
    record_count: int
    size_bytes: int


@dataclass
class RecoveryReport:
    truncated_bytes: int = 0
    removed_segments: list[str] = field(default_factory=list)
    rebuilt_indexes: int = 0
    clean_shutdown: bool = True

    def __str__(self) -> str:
        return (
            f"clean_shutdown={self.clean_shutdown} truncated_bytes={self.truncated_bytes} "
            f"removed_segments={self.removed_segments}"
        )


@dataclass
class FlushJob:
    target: int
    fds: list[int]
    recovery_point: int
    generation: int
    seconds: float = 0.0  # how long the fsyncs took (measured in run)

    def run(self) -> None:
        started = time.perf_counter()
        try:
            for fd in self.fds:
                os.fdatasync(fd)
        except OSError as exc:
            raise translate_os_error(exc, "fsyncing the log") from exc
        finally:
            self.seconds = time.perf_counter() - started
            for fd in self.fds:
                os.close(fd)


def now_wall_ms() -> int:
    return int(time.time() * 1000)


class SegmentedLog:
    def __init__(
        self,
        directory: Path,
        config: TopicConfig,
        *,
        clock_ms: Callable[[], int] = now_wall_ms,
    ) -> None:
        self.directory = directory
        self.config = config
        self._clock_ms = clock_ms
        self.segments: list[LogSegment] = []
        self._bases: list[int] = []
        self.log_start_offset = 0
        self.high_watermark = 0
        self.recovery_point = 0
        self.cleaner_point = 0  # compaction has run over everything below this
        self.durable_end_offset = 0
        self._truncation_generation = 0
        self._unflushed_messages = 0
        self._last_flush_ms = clock_ms()
        self._retired: list[tuple[int, LogSegment]] = []
        # Told of every retirement below the log start (base offsets, bytes), whoever asked.
        self.on_retired: Callable[[list[int], int], None] | None = None
        self.epochs = EpochHistory()
        self.producers = ProducerState()
        self.transactions = TransactionState()
        self.recovery = RecoveryReport()
        self._open()

    # -- properties -----------------------------------------------------------------------------

    @property
    def active(self) -> LogSegment:
        return self.segments[-1]

    @property
    def log_end_offset(self) -> int:
        return self.active.next_offset

    @property
    def size_bytes(self) -> int:
        return sum(s.size_bytes for s in self.segments)

    @property
    def segment_count(self) -> int:
        return len(self.segments)

    @property
    def last_epoch(self) -> int:
        return self.epochs.latest_epoch

    # -- opening and recovery -----------------------------------------------------------------

    def _open(self) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._open_files()
        except OSError as exc:
            raise translate_os_error(exc, f"opening log {self.directory}") from exc

    def _open_files(self) -> None:
        """Recovery, in this order: finish or drop work a stop interrupted, read the partition
        checkpoint, load the segments (checking those not known durable), then bring the log
        start, epochs and high watermark into the recovered log, and the producers last."""
        d = self.directory
        clean_marker = d / CLEAN_SHUTDOWN
        clean = self._closed_cleanly(clean_marker)
        report = RecoveryReport(clean_shutdown=clean)
        self._finish_interrupted_work()
        state = self._read_state_checkpoint()
        self.log_start_offset = int(state.get("log_start_offset", 0))
        self.high_watermark = int(state.get("high_watermark", 0))
        self.recovery_point = int(state.get("recovery_point", 0))
        self.cleaner_point = int(state.get("cleaner_point", 0))
        self._load_segments(clean, report)
        self._recover_epochs()
        self._recover_high_watermark()
        self.durable_end_offset = self.log_end_offset
        self.recovery_point = self.log_end_offset
        self._load_producers(clean)
        clean_marker.unlink(missing_ok=True)
        self.recovery = report
        if report.truncated_bytes or report.removed_segments:
            log.warning(
                "%s: recovery truncated %d bytes, removed segments %s; log now [%d, %d)",
                d.name,
                report.truncated_bytes,
                report.removed_segments,
                self.log_start_offset,
                self.log_end_offset,
            )
        self.write_state_checkpoint()

    def _finish_interrupted_work(self) -> None:
        d = self.directory
        for leftover in (
            list(d.glob("*.tmp")) + list(d.glob(f"*{DELETED_SUFFIX}")) + list(d.glob("*.cleaned"))
        ):
            leftover.unlink(missing_ok=True)  # unfinished work that never took effect
        for swap in d.glob("*.log.swap"):
            # A compacted segment was complete and durable: finish putting it in place.
            target = swap.with_name(swap.name[: -len(".swap")])
            os.replace(swap, target)
            for suffix in (".index", ".timeindex"):
                target.with_suffix(suffix).unlink(missing_ok=True)
            log.warning("%s: finished swapping in compacted segment %s", d.name, target.name)

    def _load_segments(self, clean: bool, report: RecoveryReport) -> None:
        """The segments, from the one that holds the log start to the first corrupt batch. The
        tail is verified batch by batch, and after an unclean stop so is every segment that
        reaches past the recovery point; the log start is then brought within them."""
        d = self.directory
        bases = sorted(int(p.stem) for p in d.glob("*.log") if p.stem.isdigit())
        # Whole segments below the durable log start were being cleaned when we stopped.
        while len(bases) > 1 and bases[1] <= self.log_start_offset:
            removed = bases.pop(0)
            self._remove_files(removed)
            report.removed_segments.append(f"{removed:020d} (below log start)")
        now = self._clock_ms()
        for i, base in enumerate(bases):
            seg = LogSegment(
                d, base, index_interval_bytes=self.config.index_interval_bytes, now_ms=now
            )
            is_tail = i == len(bases) - 1
            next_base = bases[i + 1] if not is_tail else None
            verify = is_tail or (
                not clean and (next_base is None or next_base > self.recovery_point)
            )
            truncated = seg.load(verify=verify)
            report.truncated_bytes += truncated
            self.segments.append(seg)
            if truncated and not is_tail:
                # Everything after a corrupt batch is unreachable: a log has no holes.
                for later in bases[i + 1 :]:
                    self._remove_files(later)
                    report.removed_segments.append(f"{later:020d} (after a corrupt batch)")
                break
        if not self.segments:
            base = self.log_start_offset
            self.segments.append(
                LogSegment(
                    d, base, index_interval_bytes=self.config.index_interval_bytes, now_ms=now
                )
            )
        self._bases = [s.base_offset for s in self.segments]
        self.log_start_offset = max(self.log_start_offset, self.segments[0].base_offset)
        self.log_start_offset = min(self.log_start_offset, self.log_end_offset)

    def _recover_epochs(self) -> None:
        """The epoch history, cut to the recovered log."""
        epochs = self._read_epoch_checkpoint()
        self.epochs = EpochHistory(epochs, on_change=self._write_epoch_checkpoint)
        self.epochs.truncate_from_start(self.log_start_offset)
        # Epochs that start past the recovered end lost their data. The prefix epoch (the one
        # below the log start) stays. A checkpoint from before prefix epochs has none: there an
        # empty log keeps the epoch that covered its deleted prefix, moved up to the log start.
        entries = self.epochs.entries
        legacy = 0 < self.log_start_offset == self.log_end_offset and not (
            entries and entries[0].start_offset < self.log_start_offset
        )
        self.epochs.truncate_from_end(self.log_end_offset + (1 if legacy else 0))

    def _recover_high_watermark(self) -> None:
        """The checkpointed high watermark, within the recovered log."""
        if self.high_watermark > self.log_end_offset:
            log.warning(
                "%s: checkpointed high watermark %d is past the recovered log end %d; clamping",
                self.directory.name,
                self.high_watermark,
                self.log_end_offset,
            )
            self.high_watermark = self.log_end_offset
        self.high_watermark = max(self.high_watermark, self.log_start_offset)
        # The order set_high_watermark and advance_log_start keep, checked again as read back.
        if not self.log_start_offset <= self.high_watermark <= self.log_end_offset:
            raise InvariantBroken(
                f"{self.directory.name}: recovered log start {self.log_start_offset}, HW "
                f"{self.high_watermark}, end {self.log_end_offset} are out of order"
            )

    def _load_producers(self, clean: bool) -> None:
        """Producers and transactions: from the checkpoint written at a clean close, else from
        every batch header (and the one record of every marker)."""
        path = self.directory / PRODUCER_CHECKPOINT
        try:
            data = read_checkpoint(path) if clean else None
        except CorruptRecord:
            data = None
        path.unlink(missing_ok=True)  # only valid for the log exactly as it was closed
        if data is not None and int(data.get("log_end_offset", -1)) == self.log_end_offset:
            now = self._clock_ms()
            self.producers.producers = {
                int(pid): ProducerEntry(*(int(v) for v in list(entry)[:4]))._replace(
                    last_write_ms=now
                )
                for pid, entry in dict(data.get("producers", {})).items()
            }
            if not self._load_transactions():
                self.transactions.rebuild(self._scan_markers(), self.high_watermark, now)
            return
        (self.directory / TRANSACTION_CHECKPOINT).unlink(missing_ok=True)  # (as the above)
        self.rebuild_producers()

    def _load_transactions(self) -> bool:
        """The transactions as the clean close (which wrote the producers' checkpoint) left
        them: its checkpoint, or none when it wrote none (the log had no transaction; a log
        of transactions is never closed by a build without this file, as transactions need
        a feature level such a build refuses). False: scan the log."""
        path = self.directory / TRANSACTION_CHECKPOINT
        try:
            data = read_checkpoint(path)
        except CorruptRecord:
            data = {}
        path.unlink(missing_ok=True)
        if data is None:
            self.transactions.clear()
            return True
        try:
            if data.get("scan") or int(data.get("log_end_offset", -1)) != self.log_end_offset:
                return False
            self.transactions.load_checkpoint(data, self._clock_ms())
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            # An older version's file (no batches of its undecided transactions), or one that
            # does not hold together: the scan derives what it would have said.
            log.info("%s: transaction checkpoint not used (%s): scanning the log", self, exc)
            return False
        self.transactions.settle(self.high_watermark)
        return True

    def _scan_markers(self) -> list[tuple[BatchHeader, Marker | None]]:
        return [
            (header, self._marker_at(seg, pos, header))
            for seg in self.segments
            for pos, header in seg.scan()
        ]

    def rebuild_producers(self) -> None:
        """Producer and transaction state from every batch in the log (one scan for both; only
        marker batches are read beyond their header)."""
        now = self._clock_ms()
        batches = self._scan_markers()
        self.producers.rebuild((header for header, _ in batches), now)
        self.transactions.rebuild(batches, self.high_watermark, now)

    @staticmethod
    def _marker_at(seg: LogSegment, pos: int, header: BatchHeader) -> Marker | None:
        if not is_marker(header):
            return None
        return read_marker(os.pread(seg.fd, header.size_bytes, pos), header)

    def aborted_transactions(self, start: int, end: int) -> list[AbortedTransaction]:
        """The aborted transactions with a batch in [start, end) (a read_committed answer's)."""
        return self.transactions.aborted_transactions(start, end)

    def expire_producers(self) -> int:
        return self.producers.expire(
            self._clock_ms(), self.config.producer_id_expiration_ms, self.transactions.open
        )

    def _read_state_checkpoint(self) -> dict[str, int]:
        try:
            return read_checkpoint(self.directory / PARTITION_CHECKPOINT) or {}
        except CorruptRecord as exc:
            log.warning("%s: %s; starting from the segments alone", self.directory.name, exc)
            return {}

    def _read_epoch_checkpoint(self) -> list[EpochEntry]:
        try:
            data = read_checkpoint(self.directory / EPOCH_CHECKPOINT)
        except CorruptRecord as exc:
            log.warning("%s: %s; rebuilding epochs from batch headers", self.directory.name, exc)
            data = None
        if data is not None:
            return [EpochEntry(int(e), int(o)) for e, o in data.get("epochs", [])]
        return self._epochs_from_headers()

    def _epochs_from_headers(self) -> list[EpochEntry]:
        history = EpochHistory()
        for seg in self.segments:
            for _, header in seg.scan():
                history.assign(header.partition_leader_epoch, header.base_offset)
        return history.entries

    def _write_epoch_checkpoint(self, entries: list[EpochEntry]) -> None:
        write_checkpoint(
            self.directory / EPOCH_CHECKPOINT,
            {"epochs": [[e.epoch, e.start_offset] for e in entries]},
        )

    def write_state_checkpoint(self) -> None:
        write_checkpoint(
            self.directory / PARTITION_CHECKPOINT,
            {
                "log_start_offset": self.log_start_offset,
                "high_watermark": self.high_watermark,
                "recovery_point": self.recovery_point,
                "cleaner_point": self.cleaner_point,
            },
        )

    # -- appending ----------------------------------------------------------------------------

    def append_as_leader(
        self, data: bytes | bytearray | memoryview | ValidatedBatches, epoch: int
    ) -> AppendInfo:
        """Validate producer batches, stamp offsets from the log end and the leader epoch."""
        buf, stamped = stamp_as_leader(self, data, epoch)
        self.epochs.assign(epoch, self.log_end_offset)
        return self._append(buf, stamped)

    def append_as_follower(self, data: bytes | bytearray | memoryview) -> AppendInfo:
        """Append batches exactly as the leader wrote them (offsets and epochs included)."""
        headers = check_follower_batches(data, self.log_end_offset)
        for _, header in headers:
            self.epochs.assign(header.partition_leader_epoch, header.base_offset)
        return self._append(data, headers)

    def _append(
        self, data: bytes | bytearray | memoryview, headers: list[tuple[int, BatchHeader]]
    ) -> AppendInfo:
        now = self._clock_ms()
        view = memoryview(data)
        chunk_start = 0
        chunk: list[tuple[int, BatchHeader]] = []
        for pos, header in headers:
            if self._should_roll(pos - chunk_start, header.size_bytes, now):
                if chunk:
                    self._write_chunk(view, chunk_start, pos, chunk, now)
                chunk, chunk_start = [], pos
                self.roll(header.base_offset)
            chunk.append((pos - chunk_start, header))
        end = len(view)
        self._write_chunk(view, chunk_start, end, chunk, now)
        transactions = self.transactions
        for pos, header in headers:
            self.producers.record(header, now)
            if header.is_transactional:  # (only markers are read further than the header)
                transactions.observe(header, read_marker(view, header, pos), now)
        first = headers[0][1]
        last = headers[-1][1]
        records = sum(h.last_offset_delta + 1 for _, h in headers)
        self._unflushed_messages += records
        return AppendInfo(
            first.base_offset,
            last.last_offset,
            last.next_offset,
            max(h.max_timestamp for _, h in headers),
            len(headers),
            records,
            end,
        )

    def _write_chunk(
        self, view: memoryview, start: int, end: int, chunk: list[tuple[int, BatchHeader]], now: int
    ) -> None:
        self.active.append(view[start:end], chunk, now)

    def _should_roll(self, pending_bytes: int, incoming_bytes: int, now: int) -> bool:
        """Roll before a batch that would overflow segment.bytes (a lone oversized batch still
        gets a segment of its own) or once the active segment is older than segment.ms."""
        used = self.active.size_bytes + pending_bytes
        if used == 0:
            return False
        return (
            used + incoming_bytes > self.config.segment_bytes
            or now - self.active.created_ms >= self.config.segment_ms
        )

    def maybe_roll_by_time(self) -> bool:
        """segment.ms applies even when nothing is appended (so retention can reach old data)."""
        now = self._clock_ms()
        seg = self.active
        if seg.size_bytes and now - seg.created_ms >= self.config.segment_ms:
            self.roll(seg.next_offset)
            return True
        return False

    def roll(self, base_offset: int | None = None) -> LogSegment:
        old = self.active
        base = old.next_offset if base_offset is None else base_offset
        invariant(base >= old.next_offset, "base >= old.next_offset")
        if old.size_bytes == 0:
            return old
        try:
            old.index.write()
            old.time_index.write()
        except OSError as exc:
            raise translate_os_error(exc, "writing segment indexes") from exc
        seg = LogSegment(
            self.directory,
            base,
            index_interval_bytes=self.config.index_interval_bytes,
            now_ms=self._clock_ms(),
        )
        self.segments.append(seg)
        self._bases.append(base)
        return seg

    # -- durability -----------------------------------------------------------------------------

    @property
    def needs_flush(self) -> bool:
        return self.durable_end_offset < self.log_end_offset

    def flush_due(self) -> bool:
        """Kafka's flush.messages / flush.ms: when the log wants an fsync by itself."""
        if not self.needs_flush:
            return False
        if self.config.fsync_before_ack:
            return True
        if self._unflushed_messages >= self.config.flush_messages:
            return True
        return (
            self.config.flush_ms >= 0
            and self._clock_ms() - self._last_flush_ms >= self.config.flush_ms
        )

    def begin_flush(self) -> FlushJob | None:
        if not self.needs_flush:
            return None
        target = self.log_end_offset
        fds = [
            os.dup(s.fd)
            for s in self.segments
            if s.next_offset > self.durable_end_offset and s.size_bytes > 0
        ]
        self._unflushed_messages = 0
        return FlushJob(target, fds, self.active.base_offset, self._truncation_generation)

    def complete_flush(self, job: FlushJob) -> int:
        self._last_flush_ms = self._clock_ms()
        if job.generation != self._truncation_generation:
            return self.durable_end_offset
        self.durable_end_offset = max(self.durable_end_offset, min(job.target, self.log_end_offset))
        if self.recovery_point < job.recovery_point <= self.durable_end_offset:
            # Every segment before the then-active one is on disk: recovery may skip them.
            self.recovery_point = job.recovery_point
            self.write_state_checkpoint()
        return self.durable_end_offset

    def flush(self) -> int:
        job = self.begin_flush()
        if job is not None:
            job.run()
            self.complete_flush(job)
        return self.durable_end_offset

    @property
    def effective_durable_end(self) -> int:
        """What counts toward the HW: fsynced data, or everything when flush.messages > 1."""
        return self.durable_end_offset if self.config.fsync_before_ack else self.log_end_offset

    # -- reading --------------------------------------------------------------------------------

    def _segment_index(self, offset: int) -> int:
        return max(0, bisect.bisect_right(self._bases, offset) - 1)

    def check_range(self, offset: int) -> None:
        if offset < self.log_start_offset or offset > self.log_end_offset:
            raise OffsetOutOfRange(
                f"offset {offset} is outside [{self.log_start_offset}, {self.log_end_offset}]",
                log_start=self.log_start_offset,
                high_watermark=self.high_watermark,
                log_end=self.log_end_offset,
            )

    def read(self, start_offset: int, max_bytes: int, max_offset: int) -> FileSlice | None:
        """Whole batches from the one holding start_offset, below max_offset (exclusive), within
        max_bytes (but at least one batch). None when nothing is there yet."""
        self.check_range(start_offset)
        if start_offset >= max_offset:
            return None
        for seg in self.segments[self._segment_index(start_offset) :]:
            found = seg.find(start_offset)
            if found is None:
                continue
            pos, header = found
            if header.base_offset >= max_offset:
                return None
            limit = (
                seg.size_bytes
                if seg.next_offset <= max_offset
                else seg.position_of(max_offset, pos)
            )
            end = limit
            if pos + max_bytes < limit:
                end = max(
                    seg.batch_boundary_at_or_before(pos + max_bytes, pos), pos + header.size_bytes
                )
            return seg.slice(pos, end, max(header.base_offset, self.log_start_offset))
        return None

    def bytes_from(self, offset: int) -> int:
        """Bytes stored from the batch holding offset to the log end (a cursor's lag in bytes)."""
        if offset >= self.log_end_offset:
            return 0
        offset = max(offset, self.log_start_offset)
        i = self._segment_index(offset)
        seg = self.segments[i]
        found = seg.find(offset)
        head = seg.size_bytes - found[0] if found is not None else 0
        return head + sum(s.size_bytes for s in self.segments[i + 1 :])

    def offset_for_timestamp(self, timestamp: int) -> int | None:
        """First offset whose record timestamp is >= timestamp (Kafka's ListOffsets by time)."""
        for seg in self.segments:
            if seg.max_timestamp < timestamp:
                continue
            found = seg.offset_for_timestamp(timestamp)
            if found is None:
                continue
            pos, header = found
            batch = os.pread(seg.fd, header.size_bytes, pos)
            for rec in decode_records(batch):
                if rec.timestamp >= timestamp and rec.offset >= self.log_start_offset:
                    return rec.offset
        return None

    # -- truncation and deletion ----------------------------------------------------------------

    def truncate_to(self, offset: int) -> None:
        """Remove everything at or above offset (a follower's divergence truncation)."""
        if offset >= self.log_end_offset:
            return
        if offset < self.log_start_offset:
            raise InvalidRequest(
                f"cannot truncate to {offset}, below the log start {self.log_start_offset}"
            )
        self._truncation_generation += 1
        while len(self.segments) > 1 and self.active.base_offset >= offset:
            self._retire(self.segments.pop(), 0)
            self._bases.pop()
        self.active.truncate_to(offset)
        self.epochs.truncate_from_end(self.log_end_offset)
        self.rebuild_producers()
        self.durable_end_offset = min(self.durable_end_offset, self.log_end_offset)
        self.high_watermark = min(self.high_watermark, self.log_end_offset)
        self.recovery_point = min(self.recovery_point, self.log_end_offset)

    def truncate_fully_and_start_at(self, offset: int, prefix_epoch: int = -1) -> None:
        """Drop the whole log and begin empty at offset (a follower behind the leader's start),
        the leader's entry below offset being of prefix_epoch."""
        self._truncation_generation += 1
        for seg in self.segments:
            self._retire(seg, 0)
        seg = LogSegment(
            self.directory,
            offset,
            index_interval_bytes=self.config.index_interval_bytes,
            now_ms=self._clock_ms(),
        )
        self.segments = [seg]
        self._bases = [offset]
        self.log_start_offset = offset
        self.high_watermark = offset
        self.durable_end_offset = offset
        self.recovery_point = offset
        self.epochs.start_at(offset, prefix_epoch)
        self.producers.rebuild([])
        self.transactions.clear()
        self.write_state_checkpoint()

    def advance_log_start(self, offset: int) -> bool:
        """Move the log start forward (durably) without touching files; the cleaner deletes."""
        offset = min(offset, self.high_watermark)
        if offset <= self.log_start_offset:
            return False
        self.log_start_offset = offset
        invariant(
            self.log_start_offset <= self.high_watermark <= self.log_end_offset,
            "self.log_start_offset <= self.high_watermark <= self.log_end_offset",
        )
        self.epochs.truncate_from_start(offset)
        self.write_state_checkpoint()
        crash_point("log-start-durable")
        return True

    def delete_segments_below_log_start(self) -> list[int]:
        """Retire whole segments that lie entirely below the log start; never the active one."""
        retired: list[LogSegment] = []
        while len(self.segments) > 1 and self.segments[1].base_offset <= self.log_start_offset:
            seg = self.segments.pop(0)
            self._bases.pop(0)
            self._rename_deleted(seg)
            retired.append(seg)
            crash_point("segment-renamed")
        if retired:
            self._sync_directory()  # one directory fsync for the whole batch
            due = self._clock_ms() + self.config.file_delete_delay_ms
            self._retired.extend((due, seg) for seg in retired)
            freed = sum(seg.size_bytes for seg in retired)
            if self.config.file_delete_delay_ms == 0:
                self.purge_retired()
            if self.on_retired is not None:
                self.on_retired([seg.base_offset for seg in retired], freed)
            self.transactions.drop_below(self.segments[0].base_offset)
        return [seg.base_offset for seg in retired]

    def _retire(self, seg: LogSegment, delay_ms: int) -> None:
        """Rename to .deleted now (so a restart ignores it); close and unlink after a delay so
        in-flight reads on its descriptor finish."""
        self._rename_deleted(seg)
        self._sync_directory()
        self._retired.append((self._clock_ms() + delay_ms, seg))
        if delay_ms == 0:
            self.purge_retired()

    def _rename_deleted(self, seg: LogSegment) -> None:
        for path in (seg.log_path, seg.index.path, seg.time_index.path):
            with contextlib.suppress(FileNotFoundError):
                os.replace(path, path.with_name(path.name + DELETED_SUFFIX))

    def _sync_directory(self) -> None:
        try:
            fsync_dir(self.directory)
        except OSError as exc:
            raise translate_os_error(exc, "syncing the log directory") from exc

    def compaction_bound(self) -> int:
        """min(HW, LSO): compaction reads and rewrites nothing at or above it, so only
        committed data of decided transactions takes part (the LSO's rule, as
        replication/last_stable_offset.py states it, from this log's own transactions)."""
        return self.transactions.stable_offset(self.high_watermark, self.log_start_offset)

    def compactable_segments(self) -> list[LogSegment]:
        """Closed segments ending at or below min(HW, LSO): only committed data, and only
        transactions already decided, is ever rewritten."""
        bound = self.compaction_bound()
        return [s for s in self.segments[:-1] if s.next_offset <= bound]

    def swap_in_cleaned(
        self, old: LogSegment, cleaned: Path, crash_point: Callable[[str], None] | None = None
    ) -> bool:
        """Replace a closed segment by its compacted copy (same base offset), crash-safely:
        .cleaned (complete, fsynced) -> .swap (durable intent) -> .log. False if the segment
        went away meanwhile (the copy is dropped)."""
        if old not in self.segments or old is self.active:
            cleaned.unlink(missing_ok=True)
            return False
        swap = old.log_path.with_name(old.log_path.name + ".swap")
        try:
            os.replace(cleaned, swap)
            fsync_dir(self.directory)
            if crash_point is not None:
                crash_point("swap-renamed")
            os.replace(swap, old.log_path)
            fsync_dir(self.directory)
            if crash_point is not None:
                crash_point("swapped")
            seg = LogSegment(
                self.directory,
                old.base_offset,
                index_interval_bytes=self.config.index_interval_bytes,
                now_ms=self._clock_ms(),
            )
            seg.load(verify=True)
            seg.last_append_ms = old.last_append_ms
        except OSError as exc:
            raise translate_os_error(exc, f"swapping in compacted {old.log_path.name}") from exc
        i = self.segments.index(old)
        self.segments[i] = seg
        # In-flight reads hold the old descriptor; its inode lives until we close it.
        self._retired.append((self._clock_ms() + self.config.file_delete_delay_ms, old))
        return True

    def purge_retired(self, force: bool = False) -> int:
        now = self._clock_ms()
        keep: list[tuple[int, LogSegment]] = []
        purged = 0
        for due, seg in self._retired:
            if force or due <= now:
                seg.close()
                for path in (seg.log_path, seg.index.path, seg.time_index.path):
                    path.with_name(path.name + DELETED_SUFFIX).unlink(missing_ok=True)
                purged += 1
            else:
                keep.append((due, seg))
        self._retired = keep
        return purged

    def _remove_files(self, base: int) -> None:
        seg_stem = self.directory / f"{base:020d}"
        for suffix in (".log", ".index", ".timeindex"):
            seg_stem.with_suffix(suffix).unlink(missing_ok=True)

    # -- lifecycle ------------------------------------------------------------------------------

    def set_high_watermark(self, hw: int) -> None:
        """Moves the HW forward: committed never becomes uncommitted (paired with the order
        check after the checkpoint is read, in _open_files)."""
        if not (self.high_watermark <= hw and self.log_start_offset <= hw <= self.log_end_offset):
            raise InvariantBroken(
                f"{self.directory.name}: HW {self.high_watermark} -> {hw} with the log at "
                f"[{self.log_start_offset}, {self.log_end_offset})"
            )
        self.high_watermark = hw
        self.transactions.settle(hw)

    def _closed_cleanly(self, marker: Path) -> bool:
        """Whether the last close marked the shutdown clean. A marker of a newer version than
        this build reads is refused (UnsupportedFormatVersion); a damaged one counts as no
        marker: every segment past the recovery point is checked again."""
        try:
            return versioned_text.read(versioned_text.CLEAN_SHUTDOWN, marker) is not None
        except StorageError as exc:
            log.warning("%s: %s; recovering as after a crash", self.directory.name, exc.message)
            return False

    def close(self) -> None:
        """Flush everything, write indexes and checkpoints, and mark the shutdown clean."""
        try:
            self.flush()
            for seg in self.segments:
                seg.flush_indexes()
            self.recovery_point = self.log_end_offset
            self.write_state_checkpoint()
            write_checkpoint(
                self.directory / PRODUCER_CHECKPOINT,
                {
                    "log_end_offset": self.log_end_offset,
                    "producers": {str(p): list(e) for p, e in self.producers.producers.items()},
                },
            )
            self._write_transaction_checkpoint()
            # Not synced itself: what it vouches for already is, and one that a crash left empty
            # reads as version 1, which still says the close got this far.
            marker = versioned_text.encode(
                versioned_text.CLEAN_SHUTDOWN, b"", write_version(CLEAN_SHUTDOWN)
            )
            (self.directory / CLEAN_SHUTDOWN).write_bytes(marker)
            fsync_dir(self.directory)
        except OSError as exc:
            raise translate_os_error(exc, "closing the log") from exc
        finally:
            self.purge_retired(force=True)
            for seg in self.segments:
                seg.close()

    def _write_transaction_checkpoint(self) -> None:
        state = self.transactions
        if not (state.open or state.ended or state.aborted):
            return  # (no file: the next open knows there is no transaction, without a scan)
        data: dict[str, object] = {"log_end_offset": self.log_end_offset}
        if state.checkpoint_entries() > TRANSACTION_CHECKPOINT_ENTRIES_MAX:
            data["scan"] = 1
        else:
            data.update(state.to_checkpoint())
        write_checkpoint(self.directory / TRANSACTION_CHECKPOINT, data)

    def abandon(self) -> None:
        """Close every descriptor and write nothing: the log is being deleted (its directory
        may already be renamed away)."""
        for _, seg in self._retired:
            seg.close()
        self._retired = []
        for seg in self.segments:
            seg.close()


__all__ = [
    "AppendInfo",
    "FileSlice",
    "FlushJob",
    "RecoveryReport",
    "SegmentedLog",
    "StorageError",
    "StorageFull",
]
