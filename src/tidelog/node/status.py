"""A partition replica's status on this node, typed: the replica's own (replication/status.py),
its storage, its flushes and the low-water mark with every hold. `tidelog status`, `/metrics`
and the console read these; `to_wire()` is what travels (`tidelog status --json`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tidelog.replication.low_watermark import LowWatermark
from tidelog.replication.status import ReplicaStatus


@dataclass(frozen=True)
class FlushFigures:
    compactions: int
    flush_count: int
    flush_seconds_total: float
    flush_seconds_max: float
    flushed_records: int

    def to_wire(self) -> dict[str, object]:
        return {
            "compactions": self.compactions,
            "flush_count": self.flush_count,
            "flush_seconds_total": round(self.flush_seconds_total, 6),
            "flush_seconds_max": round(self.flush_seconds_max, 6),
            "flushed_records": self.flushed_records,
        }


@dataclass(frozen=True)
class PartitionStatus:
    topic: str
    partition: int
    replica: ReplicaStatus
    size_bytes: int
    segment_count: int
    durable_end_offset: int
    flushes: FlushFigures
    invalid_batches: Sequence[Mapping[str, object]] = ()
    low_watermark: LowWatermark | None = None  # as the cleaner last decided it (cached)
    # The whole log's first offset, the archive included (-1: the local log start, no archive)
    log_start_offset: int = -1
    archive: Mapping[str, object] | None = None  # node/archiver.py's status of its archive

    def to_wire(self) -> dict[str, object]:
        out = self.replica.to_wire()
        local = out["log_start_offset"]
        out.update(
            local_log_start_offset=local,
            log_start_offset=local if self.log_start_offset < 0 else self.log_start_offset,
        )
        if self.archive is not None:
            out["archive"] = dict(self.archive)
        out.update(
            topic=self.topic,
            partition=self.partition,
            size_bytes=self.size_bytes,
            segment_count=self.segment_count,
            durable_end_offset=self.durable_end_offset,
            invalid_batches=[dict(b) for b in self.invalid_batches],
            metrics=self.flushes.to_wire(),
        )
        if self.low_watermark is not None:
            out["low_watermark"] = self.low_watermark.to_dict()
            out["cursors"] = {k: dict(v) for k, v in self.low_watermark.cursor_stats.items()}
        return out


@dataclass(frozen=True)
class CachedLowWatermark:
    """An LWM and what it was decided from: reused while none of it has changed and it is
    younger than its max age (holds that move with time alone: idle cursors, retention.ms)."""

    key: tuple[int, ...]
    decided_at: float
    value: LowWatermark
