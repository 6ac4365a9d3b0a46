"""Retention predicates over segments, and the low-water mark over holds."""

from __future__ import annotations

import dataclasses
from typing import Any

from tidelog.config import TopicConfig
from tidelog.replication.low_watermark import (
    CursorFact,
    Hold,
    LowWatermarkFacts,
    compute_low_watermark,
    decide_low_watermark,
    retention_keep_from,
)
from tidelog.storage.memory_log import MemorySegment

Seg = MemorySegment  # a segment's shape, as retention sees it


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
    assert future.retention_timestamp == NOW - 5000
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


def facts(config: TopicConfig, *cursors: CursorFact, **kw: Any) -> LowWatermarkFacts:
    """A partition of five 100-byte segments, the oldest two past retention.ms."""
    return LowWatermarkFacts(
        log_start_offset=kw.pop("log_start_offset", 0),
        high_watermark=kw.pop("high_watermark", 45),
        segments=segs(9000, 8000, 10, 5, 1),
        config=config,
        now_ms=NOW,
        cursors=cursors,
        **kw,
    )


def test_one_function_decides_from_facts_which_hold_sets_the_low_watermark() -> None:
    config = TopicConfig(retention_ms=1000, cursor_max_idle_ms=60_000)
    alone = decide_low_watermark(facts(config))
    assert (alone.offset, alone.hold.kind, alone.hold.name) == (20, "retention", "retention.ms")
    etl = CursorFact("etl", 12, committed_ms=NOW - 1000, lag_bytes=350)
    lwm = decide_low_watermark(facts(config, etl))
    assert (lwm.offset, lwm.hold.name) == (12, "etl") and lwm.to_invalidate == ()
    assert lwm.cursor_stats["etl"] == {
        "position": 12,
        "lag": 33,
        "lead": 12,
        "lag_bytes": 350,
        "idle_ms": 1000,
    }
    replica = Hold("replica", "3", 5, "last fetch 2 ticks ago")
    slow = decide_low_watermark(dataclasses.replace(facts(config, etl), replicas=(replica,)))
    assert (slow.offset, slow.hold.kind) == (5, "replica")


def test_cursors_past_their_caps_stop_holding_and_are_named_for_invalidation() -> None:
    config = TopicConfig(retention_ms=1000, cursor_max_idle_ms=60_000, cursor_max_lag_bytes=300)
    idle = CursorFact("idle", 3, committed_ms=NOW - 61_000, lag_bytes=10)
    behind = CursorFact("behind", 4, committed_ms=NOW, lag_bytes=301)
    gone = CursorFact("gone", 2, committed_ms=NOW, lag_bytes=10, invalidated="idle 2 d")
    backup = CursorFact("nightly", 15, committed_ms=NOW, lag_bytes=10, backup=True)
    lwm = decide_low_watermark(facts(config, idle, behind, gone, backup))
    assert (lwm.offset, lwm.hold.kind, lwm.hold.name) == (15, "backup", "nightly")
    reasons = dict(lwm.to_invalidate)
    assert set(reasons) == {"idle", "behind"}, "an invalidated cursor is not invalidated again"
    assert "cursor.max.idle.ms" in reasons["idle"]
    assert "cursor.max.lag.bytes" in reasons["behind"]
    advisory = decide_low_watermark(
        facts(dataclasses.replace(config, cursors_hold=False), backup, idle)
    )
    assert advisory.offset == 20 and advisory.to_invalidate == ()
    below = CursorFact("late", 3, committed_ms=NOW, lag_bytes=10)
    assert decide_low_watermark(facts(config, below, log_start_offset=5)).to_invalidate == (
        ("late", "position 3 is below the log start 5"),
    )


def test_a_state_machine_log_is_kept_by_its_snapshot_not_by_retention() -> None:
    config = TopicConfig(retention_ms=1000, snapshot_catchup_entries=10)
    none_yet = decide_low_watermark(facts(config, state_machine=True))
    assert none_yet.offset == 0 and "no snapshot yet" in none_yet.hold.detail
    lwm = decide_low_watermark(facts(config, state_machine=True, snapshot_offset=40))
    assert (lwm.offset, lwm.hold.kind) == (30, "snapshot")
    capped = decide_low_watermark(facts(config, state_machine=True, snapshot_offset=90))
    assert capped.offset == 45, "never past the HW"
