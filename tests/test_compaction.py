"""Compaction keeps the latest record per key, drops expired tombstones, never changes an
offset, and survives a crash at any step."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import values_in
from tidelog.config import TopicConfig
from tidelog.record import ProducerRecord, build_batch, decode_records, iter_headers
from tidelog.storage.compaction import compact, dirty_ratio
from tidelog.storage.log import SegmentedLog

CONFIG = TopicConfig(
    segment_bytes=1024,
    cleanup_policy="compact",
    delete_retention_ms=1000,
    min_cleanable_dirty_ratio=0.0,
)


class Clock:
    now = 1_000_000

    def __call__(self) -> int:
        return self.now


def keyed(log: SegmentedLog, items: list[tuple[str, str | None]], ts: int) -> None:
    for key, value in items:
        log.append_as_leader(
            build_batch(
                [ProducerRecord(key.encode(), None if value is None else value.encode(), (), ts)]
            ),
            epoch=1,
        )


def contents(log: SegmentedLog) -> dict[int, tuple[bytes | None, bytes | None]]:
    out = {}
    for seg in log.segments:
        data = seg.slice(0, seg.size_bytes, seg.base_offset).read() if seg.size_bytes else b""
        for pos, _ in iter_headers(data):
            for rec in decode_records(data, pos):
                out[rec.offset] = (rec.key, rec.value)
    return out


def filled(tmp_path: Path, clock: Clock) -> SegmentedLog:
    log = SegmentedLog(tmp_path, CONFIG, clock_ms=clock)
    for round_ in range(6):
        keyed(log, [(f"k{i}", f"v{round_}-{i}" + "x" * 40) for i in range(5)], ts=clock.now)
    keyed(log, [("k1", None), ("k2", None)], ts=clock.now)  # tombstones
    keyed(log, [(f"tail{i}", "t" * 60) for i in range(20)], ts=clock.now)
    log.set_high_watermark(log.log_end_offset)
    return log


def test_keeps_latest_per_key_and_never_moves_an_offset(tmp_path: Path) -> None:
    clock = Clock()
    log = filled(tmp_path, clock)
    before = contents(log)
    assert dirty_ratio(log) == 1.0
    report = compact(log, clock.now)
    after = contents(log)
    assert report.segments_rewritten > 0 and report.records_removed >= 25
    for offset, kv in after.items():
        assert before[offset] == kv, "an offset kept its record"
    keys = {}
    for offset, (key, value) in sorted(before.items()):
        keys[key] = (offset, value)
    for key, (offset, value) in keys.items():
        if offset < log.compactable_segments()[-1].next_offset:
            assert after[offset] == (key, value), f"the latest {key!r} survives"
    assert (b"k1", None) in after.values(), "a fresh tombstone stays for delete.retention.ms"
    assert all(len([k for k, _ in after.values() if k == f"k{i}".encode()]) == 1 for i in range(5))
    # Reads still work across the gaps, and the log reopens the same.
    offsets = [o for o, _ in values_in(log.read(0, 1 << 20, log.high_watermark).read())]
    assert offsets == sorted(offsets)
    log.close()
    again = SegmentedLog(tmp_path, CONFIG, clock_ms=clock)
    assert contents(again) == after
    assert again.cleaner_point > 0 and dirty_ratio(again) == 0.0


def test_tombstones_go_after_delete_retention_ms(tmp_path: Path) -> None:
    clock = Clock()
    log = filled(tmp_path, clock)
    compact(log, clock.now)
    clock.now += 5_000
    compact(log, clock.now, force=True)
    values = contents(log).values()
    assert (b"k1", None) not in values and (b"k2", None) not in values
    assert not any(k in (b"k1", b"k2") for k, _ in values), "deleted keys are gone entirely"


def test_only_committed_closed_segments_are_touched(tmp_path: Path) -> None:
    clock = Clock()
    log = filled(tmp_path, clock)
    log.high_watermark = 3  # pretend almost nothing is committed
    report = compact(log, clock.now)
    assert report.skipped


class Crash(Exception):
    pass


@pytest.mark.parametrize("step", ["cleaned-written", "swap-renamed", "swapped"])
def test_a_crash_at_any_step_recovers_to_a_consistent_log(tmp_path: Path, step: str) -> None:
    clock = Clock()
    log = filled(tmp_path, clock)
    log.flush()
    before = contents(log)

    def crash(at: str) -> None:
        if at == step:
            raise Crash(at)

    with pytest.raises(Crash):
        compact(log, clock.now, crash_point=crash)
    for seg in log.segments:
        seg.close()
    again = SegmentedLog(tmp_path, CONFIG, clock_ms=clock)
    after = contents(again)
    assert not list(tmp_path.glob("*.cleaned")) and not list(tmp_path.glob("*.swap"))
    for offset, kv in after.items():
        assert before[offset] == kv
    latest = {}
    for offset, (key, _value) in sorted(before.items()):
        latest[key] = offset
    assert all(offset in after for offset in latest.values()), "no latest value lost"
    assert again.log_end_offset == log.log_end_offset
    compact(again, clock.now, force=True)  # and it can finish the job
    assert all(offset in contents(again) for offset in latest.values())
