"""Log compaction (cleanup.policy=compact): keep the latest record per key in closed,
committed segments; drop tombstones (null values) once delete.retention.ms has passed.
Offsets never change: a compacted batch keeps its records' offsets and its last offset, so gaps
appear, and a gap is not data loss.

Transactions (docs/design.md, "Transactions and the last stable offset"), as Kafka's cleaner:
- Compaction's bound is min(HW, LSO) (`SegmentedLog.compaction_bound`): a segment takes part
  only if it ends at or below it, and only records below it count as a key's latest. Nothing of
  an undecided transaction (which may still abort) ever supersedes a committed record.
- An aborted transaction's records (a producer's transactional batches from the transaction's
  first offset up to its ABORT marker, as a read_committed reader drops them) never count as a
  key's latest. They are removed, whole batches by their header, in the pass whose segments
  hold the ABORT marker (so every batch of the transaction goes at once), and the transaction
  leaves the log's aborted list then (`TransactionState.forget_aborted`): a scan of the
  compacted log, as an unclean open does, finds exactly what remains.
- A marker stays while any batch of its transaction does (without it, those batches would join
  the producer's next transaction on a scan); once none does and its segment is older than
  delete.retention.ms (as for tombstones) it is removed. A marker that ends nothing changes no
  scan, so the transactions derived from the log stay the same.
Committed transactional records are compacted like any others.

A producer's newest batch is never removed, as Kafka's cleaner keeps it: the producer state an
unclean open rebuilds from batch headers (storage/producer_state.py) would otherwise hold an
older sequence, or none, and refuse the producer's next write as out of order or miss a retried
duplicate. When compaction would remove all of its records (superseded by key, or of an aborted
transaction) it stays as an empty batch (`record.batch.empty_batch`: the header, no record); a
batch that keeps some records keeps its base offset too. "Newest" is the producer state when
the inputs are frozen (`CompactionInputs.producer_last`); a producer that has written since has
a newer batch, above this one, so keeping this one a pass too long costs only its header. A
kept empty batch of an aborted transaction keeps the transaction and its marker in the log, the
transaction now starting at that batch (`TransactionState.narrow_aborted`); so does a marker
that is its producer's newest batch (its epoch is the producer's).

This is the one place that decodes every record of old segments, as compaction needs. The
rewritten segment goes through `.cleaned` -> `.swap` -> `.log`; a crash at any step leaves
either the old segment or the new one, never half of each.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from tidelog.errors import CorruptRecord
from tidelog.record.batch import (
    BatchHeader,
    Record,
    decode_records,
    empty_batch,
    rebuild_batch,
)
from tidelog.record.markers import read_marker
from tidelog.storage import faults
from tidelog.storage.durable import write_file
from tidelog.storage.log import SegmentedLog
from tidelog.storage.scrub import InvalidBatch
from tidelog.storage.segment import LogSegment
from tidelog.storage.transactions import AbortedTransaction

CrashPoint = Callable[[str], None]


@dataclass
class CompactionReport:
    """What a pass did. records_removed counts every data record removed; tombstones_removed
    and aborted_records_removed are the parts of it that were expired tombstones and records of
    aborted transactions (told apart because an aborted record goes whatever its key's latest
    is: it was never committed). markers_removed counts transaction markers (control records,
    not in records_removed) removed once nothing of their transaction remained."""

    segments_rewritten: int = 0
    records_removed: int = 0
    tombstones_removed: int = 0
    aborted_records_removed: int = 0
    markers_removed: int = 0
    empty_batches_kept: int = 0  # producers' newest batches, emptied of records but kept
    bytes_before: int = 0  # of the segments compaction read
    bytes_after: int = 0  # of the same segments once the rewritten ones are swapped in
    skipped: str = ""
    invalid_batches: list[InvalidBatch] = field(default_factory=list)  # kept as they are


def dirty_ratio(log: SegmentedLog) -> float:
    """Share of compactable bytes not yet compacted (Kafka's min.cleanable.dirty.ratio)."""
    segments = log.compactable_segments()
    total = sum(s.size_bytes for s in segments)
    if total == 0:
        return 0.0
    dirty = sum(s.size_bytes for s in segments if s.next_offset > log.cleaner_point)
    return dirty / total


@dataclass
class CompactionPlan:
    """What a compaction pass will swap in; built from immutable closed segments, so it can be
    prepared on a worker thread while the log keeps taking appends."""

    cleaned: list[tuple[LogSegment, Path, int]] = field(default_factory=list)  # old, new file, size
    cleaner_point: int = 0
    report: CompactionReport = field(default_factory=CompactionReport)
    # Aborted transactions whose every batch the plan removes (their marker is below
    # cleaner_point): forgotten by the log's transactions once their segments are swapped in.
    aborted_removed: list[AbortedTransaction] = field(default_factory=list)
    # Aborted transactions of which only their producer's newest batch (emptied) is left:
    # each with the offset it starts at from now on.
    aborted_narrowed: list[tuple[AbortedTransaction, int]] = field(default_factory=list)


class CompactionInputs(NamedTuple):
    """Frozen on the log's own thread for a plan made on a worker thread."""

    segments: list[LogSegment]  # the compactable ones: closed, ending at or below the bound
    everything: list[LogSegment]
    bound: int  # min(HW, LSO): no record at or above it takes part
    aborted: list[AbortedTransaction]  # the aborted transactions with a batch below the bound
    # producer id -> the last offset of its newest batch (the producer state): never removed.
    producer_last: dict[int, int] = {}


class AbortedBatches:
    """Which batches aborted transactions wrote, decided as a read_committed reader decides
    (record/read_committed.py): a producer's transactional data batches from the transaction's
    first offset up to its ABORT marker."""

    def __init__(self, aborted: Iterable[AbortedTransaction]) -> None:
        self._firsts: dict[int, list[int]] = {}
        self._transactions: dict[int, list[AbortedTransaction]] = {}
        for t in sorted(aborted, key=lambda t: t.first_offset):
            self._firsts.setdefault(t.producer_id, []).append(t.first_offset)
            self._transactions.setdefault(t.producer_id, []).append(t)

    def transaction_of(self, header: BatchHeader) -> AbortedTransaction | None:
        """The aborted transaction that wrote this batch, or None."""
        if header.is_control or not header.is_transactional:
            return None
        firsts = self._firsts.get(header.producer_id)
        if not firsts:
            return None
        i = bisect.bisect_right(firsts, header.base_offset) - 1
        if i < 0:
            return None
        found = self._transactions[header.producer_id][i]
        return found if header.base_offset < found.marker_offset else None


def latest_offsets(
    segments: list[LogSegment], bound: int, aborted: AbortedBatches | None = None
) -> dict[bytes, int]:
    """key -> the offset of its newest committed record below bound (a batch that cannot be
    read counts for no key: what it holds is unknown, so it supersedes nothing; nor does a
    batch of an aborted transaction, which was never committed)."""
    latest: dict[bytes, int] = {}
    for seg in segments:
        for pos, header in seg.scan():
            if header.is_control or header.base_offset >= bound:
                continue
            if aborted is not None and aborted.transaction_of(header) is not None:
                continue
            records = _records(os.pread(seg.fd, header.size_bytes, pos), header, None)
            for rec in records or ():
                if rec.key is not None and rec.offset < bound:
                    latest[rec.key] = rec.offset
    return latest


def _records(
    raw: bytes, header: BatchHeader, report: CompactionReport | None
) -> list[Record] | None:
    """The batch's records, or None for a batch that cannot be read (written before batches
    were validated): compaction keeps such a batch as it is and reports it."""
    try:
        return decode_records(raw)
    except CorruptRecord as exc:
        if report is not None:
            report.invalid_batches.append(
                InvalidBatch(header.base_offset, header.last_offset, exc.name, exc.message)
            )
        return None


def snapshot_inputs(log: SegmentedLog) -> CompactionInputs:
    """On the log's own thread: what a plan reads, frozen."""
    bound = log.compaction_bound()
    everything = list(log.segments)
    compactable = [s for s in everything[:-1] if s.next_offset <= bound]
    aborted = log.transactions.aborted_transactions(everything[0].base_offset, bound)
    producer_last = {pid: e.last_offset for pid, e in log.producers.producers.items()}
    return CompactionInputs(compactable, everything, bound, aborted, producer_last)


def plan_compaction(
    log: SegmentedLog,
    inputs: CompactionInputs,
    now_ms: int,
    *,
    force: bool = False,
    crash_point: CrashPoint | None = faults.crash_point,
) -> CompactionPlan:
    """Read and rewrite (into .cleaned files) without touching the log's state."""
    plan = CompactionPlan()
    segments = inputs.segments
    if not segments:
        plan.report.skipped = "no closed segment below the HW and the LSO"
        return plan
    total = sum(s.size_bytes for s in segments)
    dirty = sum(s.size_bytes for s in segments if s.next_offset > log.cleaner_point)
    ratio = dirty / total if total else 0.0
    if not force and ratio < log.config.min_cleanable_dirty_ratio:
        plan.report.skipped = f"dirty ratio {ratio:.2f} < min.cleanable.dirty.ratio"
        return plan
    aborted = AbortedBatches(inputs.aborted)
    end = segments[-1].next_offset
    cleaner = _SegmentCleaner(
        latest_offsets(inputs.everything, inputs.bound, aborted),
        aborted,
        end,
        now_ms,
        log.config.delete_retention_ms,
        plan.report,
        inputs.producer_last,
    )
    for seg in segments:
        rewritten = cleaner.rewrite(seg)
        if rewritten is None:
            continue
        cleaned = seg.log_path.with_name(seg.log_path.name + ".cleaned")
        write_file(cleaned, rewritten, sync_dir=False)  # the swap fsyncs the directory
        if crash_point is not None:
            crash_point("cleaned-written")
        plan.cleaned.append((seg, cleaned, len(rewritten)))
    plan.cleaner_point = end
    passed = [t for t in inputs.aborted if t.marker_offset < end]
    kept = cleaner.aborted_kept
    plan.aborted_removed = [t for t in passed if (t.producer_id, t.marker_offset) not in kept]
    plan.aborted_narrowed = [
        (t, kept[t.producer_id, t.marker_offset])
        for t in passed
        if (t.producer_id, t.marker_offset) in kept
    ]
    return plan


def apply_compaction(
    log: SegmentedLog, plan: CompactionPlan, crash_point: CrashPoint | None = faults.crash_point
) -> CompactionReport:
    """On the log's own thread: swap the rewritten segments in, one by one, crash-safely."""
    report = plan.report
    report.bytes_after = report.bytes_before  # the segments scanned, as they are once swapped
    swapped_below = plan.cleaner_point
    try:
        for seg, cleaned, size in plan.cleaned:
            swapped_below = seg.base_offset
            before = seg.size_bytes
            if log.swap_in_cleaned(seg, cleaned, crash_point):
                report.segments_rewritten += 1
                report.bytes_after += size - before
        swapped_below = plan.cleaner_point
    finally:
        # A transaction is gone once every segment below its marker is swapped in (or deleted).
        log.transactions.forget_aborted(
            t for t in plan.aborted_removed if t.marker_offset < swapped_below
        )
        log.transactions.narrow_aborted(
            (t, first) for t, first in plan.aborted_narrowed if t.marker_offset < swapped_below
        )
    if plan.cleaner_point > log.cleaner_point:
        log.cleaner_point = plan.cleaner_point
        log.write_state_checkpoint()
    return report


def compact(
    log: SegmentedLog,
    now_ms: int,
    *,
    force: bool = False,
    crash_point: CrashPoint | None = faults.crash_point,
) -> CompactionReport:
    """Plan and apply in one go (tests, tools); the node plans on a worker thread."""
    plan = plan_compaction(log, snapshot_inputs(log), now_ms, force=force, crash_point=crash_point)
    return apply_compaction(log, plan, crash_point)


class _SegmentCleaner:
    """One pass's rules, applied to the compactable segments in offset order (the markers'
    rule needs every batch of a transaction seen before its marker)."""

    def __init__(
        self,
        latest: dict[bytes, int],
        aborted: AbortedBatches,
        end: int,
        now_ms: int,
        delete_retention_ms: int,
        report: CompactionReport,
        producer_last: dict[int, int] | None = None,
    ) -> None:
        self.latest = latest
        self.aborted = aborted
        self.end = end  # where the compactable segments end
        self.now_ms = now_ms
        self.delete_retention_ms = delete_retention_ms
        self.report = report
        # Producers with a batch of their current transaction (since their last marker) kept.
        self.transaction_kept: set[int] = set()
        self.producer_last = producer_last or {}
        # (producer id, marker offset) of aborted transactions whose removal left their
        # producer's newest batch, emptied -> that batch's base offset.
        self.aborted_kept: dict[tuple[int, int], int] = {}

    def rewrite(self, seg: LogSegment) -> bytes | None:
        """The segment's new bytes, or None when nothing in it changes."""
        expired = self.now_ms - seg.retention_timestamp > self.delete_retention_ms
        out = bytearray()
        changed = False
        for pos, header in seg.scan():
            raw = os.pread(seg.fd, header.size_bytes, pos)
            if header.is_control:
                kept = self._marker(raw, header, expired)
            else:
                kept = self._data(raw, header, expired)
            if kept is None:
                out += raw
            else:
                changed = True
                out += kept
        self.report.bytes_before += seg.size_bytes
        return bytes(out) if changed else None

    def _data(self, raw: bytes, header: BatchHeader, expired: bool) -> bytes | None:
        """A data batch's new bytes (empty: removed), or None to keep it as it is."""
        aborted = self.aborted.transaction_of(header)
        if aborted is not None and aborted.marker_offset < self.end:
            self.report.records_removed += header.records_count
            self.report.aborted_records_removed += header.records_count
            if not self._is_producer_last(header):
                return b""
            self.aborted_kept[aborted.producer_id, aborted.marker_offset] = header.base_offset
            kept: bytes | None = self._emptied(header)
        else:
            # An aborted batch whose marker is not in this pass goes later, with the rest of
            # its transaction; until then it is kept as it is.
            kept = None if aborted is not None else self._compacted(raw, header, expired)
        if kept != b"" and header.is_transactional and header.producer_id >= 0:
            self.transaction_kept.add(header.producer_id)  # (a scan sees the batch: it stays)
        return kept

    def _compacted(self, raw: bytes, header: BatchHeader, expired: bool) -> bytes | None:
        records = _records(raw, header, self.report)
        if records is None:
            return None
        keep = [r for r in records if self._keeps(r, expired)]
        last = self._is_producer_last(header)
        if not records and not last:
            return b""  # an empty batch kept for its producer, which has written since
        if len(keep) == len(records):
            return None
        if keep:
            return rebuild_batch(header, keep, keep_base_offset=last)
        return self._emptied(header) if last else b""

    def _is_producer_last(self, header: BatchHeader) -> bool:
        """Whether the batch is its producer's newest (producer state is derived from it)."""
        return (
            header.producer_id >= 0
            and self.producer_last.get(header.producer_id) == header.last_offset
        )

    def _emptied(self, header: BatchHeader) -> bytes | None:
        """A producer's newest batch with no record left: its header alone (None when it is
        that already, so an unchanged segment is not rewritten)."""
        if header.records_count == 0:
            return None
        self.report.empty_batches_kept += 1
        return empty_batch(header)

    def _keeps(self, rec: Record, expired: bool) -> bool:
        if rec.key is not None and self.latest.get(rec.key, rec.offset) != rec.offset:
            self.report.records_removed += 1
            return False
        if rec.key is not None and rec.value is None and expired:
            self.report.records_removed += 1
            self.report.tombstones_removed += 1
            return False
        return True

    def _marker(self, raw: bytes, header: BatchHeader, expired: bool) -> bytes | None:
        """A control batch: b"" to remove a marker whose transaction has nothing left and whose
        segment is past delete.retention.ms, else None (kept)."""
        try:
            marker = read_marker(raw, header)
        except CorruptRecord:
            return None  # (the log refuses such a batch; kept as it is if one is there)
        if marker is None:
            return None
        if marker.producer_id in self.transaction_kept:
            self.transaction_kept.discard(marker.producer_id)
            return None
        if not expired or self._is_producer_last(header):
            # (a producer's newest batch keeps its epoch through an unclean open, as above)
            return None
        self.report.markers_removed += 1
        return b""
