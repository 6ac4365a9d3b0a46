"""Retention predicates over segments, and the low-water mark over holds."""

from __future__ import annotations

from dataclasses import dataclass

from tidelog.config import TopicConfig
from tidelog.replication.low_watermark import Hold, compute_low_watermark
from tidelog.storage.retention import retention_keep_from, retention_timestamp


@dataclass
class Seg:
    base_offset: int
    size_bytes: int
    max_timestamp: int
    last_append_ms: int


NOW = 10_000_000


def segs(*ages_ms: int, size: int = 100) -> list[Seg]:
    return [Seg(i * 10, size, NOW - age, NOW - age) for i, age in enumerate(ages_ms)]


def test_time_retention_deletes_old_closed_segments_only() -> None:
    config = TopicConfig(retention_ms=1000)
    verdict = retention_keep_from(segs(5000, 4000, 500, 5000), 0, config, NOW)
    assert verdict.keep_from == 20 and verdict.reason == "retention.ms"
    # the active (last) segment never goes, however old
    assert retention_keep_from(segs(5000), 0, config, NOW).keep_from == 0


def test_a_future_timestamp_cannot_pin_a_segment_forever() -> None:
    future = Seg(0, 100, NOW + 10**9, NOW - 5000)  # a record stamped far in the future
    assert retention_timestamp(future) == NOW - 5000
    verdict = retention_keep_from(
        [future, Seg(10, 100, NOW, NOW)], 0, TopicConfig(retention_ms=1000), NOW
    )
    assert verdict.keep_from == 10


def test_size_retention_keeps_the_partition_within_the_bound() -> None:
    config = TopicConfig(retention_bytes=250, retention_ms=-1)
    verdict = retention_keep_from(segs(1, 1, 1, 1, 1), 0, config, NOW)  # 500 bytes
    assert verdict.keep_from == 30 and verdict.reason == "retention.bytes"  # 200 bytes remain
    unlimited = retention_keep_from(segs(1, 1, 1), 0, TopicConfig(retention_ms=-1), NOW)
    assert unlimited.keep_from == 0 and unlimited.reason == "unlimited"


def test_the_low_watermark_is_the_minimum_over_live_holds() -> None:
    holds = [
        Hold("retention", "retention.ms", 500),
        Hold("cursor", "etl", 120, "idle 2 h"),
        Hold("cursor", "stale", 10, live=False, why_not="idle past cursor.max.idle.ms"),
        Hold("replica", "3", 300),
    ]
    lwm = compute_low_watermark(holds, log_start_offset=0, high_watermark=1000)
    assert lwm.offset == 120 and lwm.hold.name == "etl"
    assert "cursor etl at 120 (idle 2 h)" in lwm.to_dict()["set_by"]
    assert compute_low_watermark(holds, 0, 100).offset == 100, "never past the HW"
    assert compute_low_watermark([], 50, 1000).offset == 1000, "nothing holds: up to the HW"
    assert compute_low_watermark(holds, 200, 1000).offset == 200, "never below the log start"
