"""The holds a node knows of for one partition, beside the replicas (which the core tracks):
retention, cursors (with their caps) and, for state-machine logs, the newest snapshot."""

from __future__ import annotations

from dataclasses import dataclass, field

from tidelog.config import TopicConfig
from tidelog.replication.low_watermark import (
    KIND_BACKUP,
    KIND_CURSOR,
    KIND_RETENTION,
    KIND_SNAPSHOT,
    Hold,
)
from tidelog.replication.metadata import MetadataState
from tidelog.storage.log import SegmentedLog
from tidelog.storage.retention import RetentionVerdict, retention_keep_from


@dataclass
class PartitionHolds:
    holds: list[Hold] = field(default_factory=list)
    to_invalidate: list[tuple[str, str]] = field(default_factory=list)  # (cursor, reason)
    cursor_stats: dict[str, dict[str, int]] = field(default_factory=dict)


def human_ms(ms: int) -> str:
    s = ms / 1000
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    if s < 172800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{n} B"


def partition_holds(
    topic: str,
    partition: int,
    log: SegmentedLog,
    config: TopicConfig,
    metadata: MetadataState,
    now_ms: int,
    snapshot_offset: int | None = None,
    state_machine: bool = False,
) -> PartitionHolds:
    out = PartitionHolds()
    if state_machine:
        # A state-machine log is kept by its snapshots, not by age or size.
        keep = log.log_start_offset
        if snapshot_offset is not None:
            keep = max(keep, snapshot_offset - config.snapshot_catchup_entries)
        out.holds.append(
            Hold(
                KIND_SNAPSHOT,
                "latest",
                keep,
                f"snapshot at {snapshot_offset}, keeping {config.snapshot_catchup_entries} entries behind it"
                if snapshot_offset is not None
                else "no snapshot yet: everything is kept",
            )
        )
        verdict = None
    elif "delete" in config.cleanup_policy:
        verdict = retention_keep_from(log.segments, log.log_start_offset, config, now_ms)  # type: ignore[arg-type]
    else:  # compact only: retention never deletes, compaction keeps the latest per key
        verdict = RetentionVerdict(log.log_start_offset, "unlimited")
    if verdict is not None:
        detail = {
            "retention.ms": f"segments older than {human_ms(config.retention_ms)} may go",
            "retention.bytes": f"over {human_bytes(config.retention_bytes)} may go",
            "within-limits": "nothing is past retention.ms or retention.bytes",
            "unlimited": "nothing is deleted by age or size",
        }[verdict.reason]
        out.holds.append(Hold(KIND_RETENTION, verdict.reason, verdict.keep_from, detail))
    for cursor in sorted(metadata.cursors.values(), key=lambda c: c.name):
        if cursor.topic != topic or partition not in cursor.positions:
            continue
        position = cursor.positions[partition]
        kind = KIND_BACKUP if cursor.backup else KIND_CURSOR
        idle_ms = max(0, now_ms - cursor.committed_ms)
        lag_bytes = log.bytes_from(position)
        out.cursor_stats[cursor.name] = {
            "position": position,
            "lag": max(0, log.high_watermark - position),
            "lead": position - log.log_start_offset,
            "lag_bytes": lag_bytes,
            "idle_ms": idle_ms,
        }
        detail = f"idle {human_ms(idle_ms)}, {human_bytes(lag_bytes)} behind"
        if not config.cursors_hold:
            out.holds.append(
                Hold(kind, cursor.name, position, detail, live=False, why_not="cursors.hold=false")
            )
            continue
        if not cursor.live:
            out.holds.append(
                Hold(kind, cursor.name, position, detail, live=False, why_not=cursor.invalidated)
            )
            continue
        reason = ""
        if position < log.log_start_offset:
            reason = f"position {position} is below the log start {log.log_start_offset}"
        elif config.cursor_max_lag_bytes >= 0 and lag_bytes > config.cursor_max_lag_bytes:
            reason = f"{human_bytes(lag_bytes)} behind > cursor.max.lag.bytes {human_bytes(config.cursor_max_lag_bytes)}"
        elif config.cursor_max_idle_ms >= 0 and idle_ms > config.cursor_max_idle_ms:
            reason = f"idle {human_ms(idle_ms)} > cursor.max.idle.ms {human_ms(config.cursor_max_idle_ms)}"
        elif config.cursor_max_idle_ms >= 0:
            detail += f", invalidated in {human_ms(config.cursor_max_idle_ms - idle_ms)} if idle"
        out.holds.append(Hold(kind, cursor.name, position, detail, live=not reason, why_not=reason))
        if reason:
            out.to_invalidate.append((cursor.name, reason))
    return out
