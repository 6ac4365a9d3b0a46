"""Log compaction (cleanup.policy=compact): keep the latest record per key in closed,
committed segments; drop tombstones (null values) once delete.retention.ms has passed.
Offsets never change: a compacted batch keeps its records' offsets and its last offset, so gaps
appear, and a gap is not data loss.

This is the one place that decodes every record of old segments, as compaction needs. The
rewritten segment goes through `.cleaned` -> `.swap` -> `.log`; a crash at any step leaves
either the old segment or the new one, never half of each.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tidelog.errors import CorruptRecord
from tidelog.record.batch import BatchHeader, Record, decode_records, rebuild_batch
from tidelog.storage import faults
from tidelog.storage.durable import write_file
from tidelog.storage.log import SegmentedLog
from tidelog.storage.scrub import InvalidBatch
from tidelog.storage.segment import LogSegment

CrashPoint = Callable[[str], None]


@dataclass
class CompactionReport:
    segments_rewritten: int = 0
    records_removed: int = 0
    tombstones_removed: int = 0
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


def latest_offsets(segments: list[LogSegment], hw: int) -> dict[bytes, int]:
    """key -> the offset of its newest committed record (a batch that cannot be read counts
    for no key: what it holds is unknown, so it supersedes nothing)."""
    latest: dict[bytes, int] = {}
    for seg in segments:
        for pos, header in seg.scan():
            if header.is_control or header.base_offset >= hw:
                continue
            records = _records(os.pread(seg.fd, header.size_bytes, pos), header, None)
            for rec in records or ():
                if rec.key is not None and rec.offset < hw:
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


def snapshot_inputs(log: SegmentedLog) -> tuple[list[LogSegment], list[LogSegment], int]:
    """On the log's own thread: (compactable segments, every segment, HW), frozen for a plan."""
    return log.compactable_segments(), list(log.segments), log.high_watermark


def plan_compaction(
    log: SegmentedLog,
    inputs: tuple[list[LogSegment], list[LogSegment], int],
    now_ms: int,
    *,
    force: bool = False,
    crash_point: CrashPoint | None = faults.crash_point,
) -> CompactionPlan:
    """Read and rewrite (into .cleaned files) without touching the log's state."""
    plan = CompactionPlan()
    segments, everything, hw = inputs
    if not segments:
        plan.report.skipped = "no closed segment below the HW"
        return plan
    total = sum(s.size_bytes for s in segments)
    dirty = sum(s.size_bytes for s in segments if s.next_offset > log.cleaner_point)
    ratio = dirty / total if total else 0.0
    if not force and ratio < log.config.min_cleanable_dirty_ratio:
        plan.report.skipped = f"dirty ratio {ratio:.2f} < min.cleanable.dirty.ratio"
        return plan
    latest = latest_offsets(everything, hw)
    for seg in segments:
        rewritten = _rewrite(seg, latest, now_ms, log, plan.report)
        if rewritten is None:
            continue
        cleaned = seg.log_path.with_name(seg.log_path.name + ".cleaned")
        write_file(cleaned, rewritten, sync_dir=False)  # the swap fsyncs the directory
        if crash_point is not None:
            crash_point("cleaned-written")
        plan.cleaned.append((seg, cleaned, len(rewritten)))
    plan.cleaner_point = segments[-1].next_offset
    return plan


def apply_compaction(
    log: SegmentedLog, plan: CompactionPlan, crash_point: CrashPoint | None = faults.crash_point
) -> CompactionReport:
    """On the log's own thread: swap the rewritten segments in, one by one, crash-safely."""
    report = plan.report
    report.bytes_after = report.bytes_before  # the segments scanned, as they are once swapped
    for seg, cleaned, size in plan.cleaned:
        before = seg.size_bytes
        if log.swap_in_cleaned(seg, cleaned, crash_point):
            report.segments_rewritten += 1
            report.bytes_after += size - before
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


def _rewrite(
    seg: LogSegment,
    latest: dict[bytes, int],
    now_ms: int,
    log: SegmentedLog,
    report: CompactionReport,
) -> bytes | None:
    """The segment's new bytes, or None when nothing in it changes."""
    tombstones_expire = now_ms - seg.retention_timestamp > log.config.delete_retention_ms
    out = bytearray()
    changed = False
    for pos, header in seg.scan():
        raw = os.pread(seg.fd, header.size_bytes, pos)
        if header.is_control:
            out += raw
            continue
        records = _records(raw, header, report)
        if records is None:
            out += raw
            continue
        keep = []
        for rec in records:
            if rec.key is not None and latest.get(rec.key, rec.offset) != rec.offset:
                report.records_removed += 1
            elif rec.key is not None and rec.value is None and tombstones_expire:
                report.records_removed += 1
                report.tombstones_removed += 1
            else:
                keep.append(rec)
        if len(keep) == len(records):
            out += raw
        else:
            changed = True
            if keep:
                out += rebuild_batch(header, keep)
    report.bytes_before += seg.size_bytes
    return bytes(out) if changed else None
