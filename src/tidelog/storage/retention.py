"""Retention as predicates over whole segments (Kafka's retention.ms and retention.bytes).

The answer is an offset, the first one retention wants to keep; it is one hold among others
(the replication core takes the minimum over all holds), so retention alone never deletes what
a live cursor or replica still needs. Only closed segments are ever candidates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from tidelog.config import TopicConfig


class SegmentView(Protocol):
    @property
    def base_offset(self) -> int: ...

    @property
    def size_bytes(self) -> int: ...

    @property
    def max_timestamp(self) -> int: ...

    @property
    def last_append_ms(self) -> int: ...


@dataclass(frozen=True)
class RetentionVerdict:
    keep_from: int  # retention wants every offset >= keep_from kept
    reason: (
        str  # "retention.ms" or "retention.bytes" (that rule set it), "within-limits", "unlimited"
    )


def retention_timestamp(segment: SegmentView) -> int:
    """A segment's age for retention.ms: its newest record timestamp, but never later than when
    it was last written, so a record stamped in the future cannot pin it forever."""
    newest = segment.max_timestamp if segment.max_timestamp >= 0 else segment.last_append_ms
    return min(newest, segment.last_append_ms)


def retention_keep_from(
    segments: list[SegmentView], log_start_offset: int, config: TopicConfig, now_ms: int
) -> RetentionVerdict:
    """The first offset retention keeps: everything below is eligible for deletion."""
    closed = segments[:-1]  # never the active segment
    keep = log_start_offset
    limited = config.retention_ms >= 0 or config.retention_bytes >= 0
    reason = "within-limits" if limited else "unlimited"
    if config.retention_ms >= 0:
        for i, seg in enumerate(closed):
            if now_ms - retention_timestamp(seg) > config.retention_ms:
                nxt = segments[i + 1].base_offset
                if nxt > keep:
                    keep, reason = nxt, "retention.ms"
            else:
                break
    if config.retention_bytes >= 0:
        # Oldest closed segments go while the partition is over retention.bytes; with a pass at
        # every roll, the partition stays within retention.bytes plus the active segment.
        total = sum(s.size_bytes for s in segments)
        for i, seg in enumerate(closed):
            if total <= config.retention_bytes:
                break
            total -= seg.size_bytes
            nxt = segments[i + 1].base_offset
            if nxt > keep:
                keep, reason = nxt, "retention.bytes"
    return RetentionVerdict(keep, reason)
