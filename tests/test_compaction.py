"""Compaction keeps the latest record per key, drops expired tombstones, never changes an
offset, and survives a crash at any step; with transactions, it reads nothing at or above
min(HW, LSO), removes aborted transactions' records and keeps a marker while anything of its
transaction remains."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import values_in
from tidelog.config import TopicConfig
from tidelog.errors import DuplicateSequence, OutOfOrderSequence
from tidelog.record import ProducerRecord, build_batch, decode_records, iter_headers
from tidelog.record.markers import build_marker, is_marker
from tidelog.record.read_committed import committed_batches
from tidelog.replication.last_stable_offset import last_stable_offset
from tidelog.storage.compaction import compact, dirty_ratio
from tidelog.storage.log import SegmentedLog
from tidelog.storage.transactions import AbortedTransaction

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


# -- transactions: compaction's bound is min(HW, LSO), aborted records go, markers stay while
# anything of their transaction does (docs/design.md, "Transactions and the last stable offset")

TXN_CONFIG = TopicConfig(
    segment_bytes=400,
    cleanup_policy="compact",
    delete_retention_ms=1000,
    min_cleanable_dirty_ratio=0.0,
)
Entry = tuple[bytes | None, bytes | None]


class Writer:
    """Appends to a log as a leader, each producer's sequences in order."""

    def __init__(self, log: SegmentedLog, clock: Clock) -> None:
        self.log, self.clock = log, clock
        self.sequences: dict[int, int] = {}

    def plain(self, key: str, value: str | None) -> int:
        keyed(self.log, [(key, value)], ts=self.clock.now)
        return self.log.log_end_offset - 1

    def txn(self, pid: int, key: str, value: str) -> int:
        seq = self.sequences.get(pid, 0)
        self.sequences[pid] = seq + 1
        record = ProducerRecord(key.encode(), value.encode(), (), self.clock.now)
        batch = build_batch(
            [record], producer_id=pid, producer_epoch=0, base_sequence=seq, transactional=True
        )
        self.log.append_as_leader(batch, epoch=1)
        return self.log.log_end_offset - 1

    def end(self, pid: int, commit: bool) -> int:
        marker = build_marker(pid, 0, commit=commit, coordinator_epoch=1, now_ms=self.clock.now)
        self.log.append_as_leader(marker, epoch=1)
        return self.log.log_end_offset - 1

    def fill(self, n: int, prefix: str = "fill") -> None:
        """Records of keys of their own, so segments roll and close."""
        for i in range(n):
            self.plain(f"{prefix}{i}", "f" * 60)

    def commit(self) -> None:
        self.log.flush()
        self.log.set_high_watermark(self.log.log_end_offset)


def read_view(log: SegmentedLog, committed: bool) -> dict[int, Entry]:
    """offset -> (key, value) as a reader sees the log, fetch by fetch as the node answers
    (node/ops/data.py): read_uncommitted below the HW; read_committed below the LSO, without
    the batches of the aborted transactions each answer lists (record/read_committed.py)."""
    end = last_stable_offset(log) if committed else log.high_watermark
    offset, out = log.log_start_offset, {}
    while offset < end:
        found = log.read(offset, 1 << 20, end)
        if found is None:
            break
        data = found.read()
        batches = list(iter_headers(data))
        if committed:
            aborted = [
                (t.producer_id, t.first_offset) for t in log.aborted_transactions(offset, end)
            ]
            batches = list(committed_batches(data, batches, aborted))
        for pos, header in batches:
            if not header.is_control:
                out.update((r.offset, (r.key, r.value)) for r in decode_records(data, pos))
        offset = list(iter_headers(data))[-1][1].next_offset
    return out


def latest_per_key(view: dict[int, Entry]) -> dict[bytes | None, Entry]:
    return {key: (key, value) for _, (key, value) in sorted(view.items())}


def markers_in(log: SegmentedLog) -> list[int]:
    found = []
    for seg in log.segments:
        for _, header in seg.scan():
            if is_marker(header):
                found.append(header.base_offset)
    return found


def transaction_state(log: SegmentedLog) -> tuple[object, ...]:
    t = log.transactions
    return (
        {pid: o[:3] for pid, o in t.open.items()},
        [e[:5] for e in t.ended],
        list(t.aborted),
        last_stable_offset(log),
    )


def assert_state_is_what_a_scan_derives(log: SegmentedLog) -> tuple[object, ...]:
    """The log's transactions are those a scan of it derives now (as an unclean open does)."""
    state = transaction_state(log)
    log.rebuild_producers()
    assert transaction_state(log) == state
    return state


def test_an_open_transaction_never_supersedes_and_once_aborted_it_is_removed(
    tmp_path: Path,
) -> None:
    clock = Clock()
    log = SegmentedLog(tmp_path, TXN_CONFIG, clock_ms=clock)
    w = Writer(log, clock)
    committed_k = w.plain("k", "committed")
    w.fill(8)
    opened = w.txn(7, "k", "undecided")  # a transaction opens: it may still abort
    w.fill(12, "more")
    w.commit()
    assert last_stable_offset(log) == log.compaction_bound() == opened < log.high_watermark
    assert log.compactable_segments() and all(
        s.next_offset <= opened for s in log.compactable_segments()
    )
    report = compact(log, clock.now, force=True)
    assert not report.aborted_records_removed
    after = contents(log)
    assert after[committed_k] == (b"k", b"committed"), "an open transaction supersedes nothing"
    assert after[opened] == (b"k", b"undecided")
    committed_view = read_view(log, committed=True)
    assert latest_per_key(committed_view)[b"k"] == (b"k", b"committed")

    marker = w.end(7, commit=False)
    w.fill(12, "tail")
    w.commit()
    assert log.transactions.aborted == [AbortedTransaction(7, opened, marker)]
    assert read_view(log, committed=False)[opened] == (b"k", b"undecided")
    report = compact(log, clock.now, force=True)
    assert report.aborted_records_removed == 1 and report.records_removed >= 1
    after = contents(log)
    assert after[committed_k] == (b"k", b"committed"), "an aborted record supersedes nothing"
    assert opened not in after
    # What Kafka's readers see once its cleaner ran: the aborted record is gone for both.
    for committed in (True, False):
        assert latest_per_key(read_view(log, committed))[b"k"] == (b"k", b"committed")
        assert opened not in read_view(log, committed)
    # Producer 7 is still active and the aborted batch was its newest: the batch stays,
    # emptied, so its transaction (and the marker ending it) stays too, as Kafka's cleaner does.
    assert report.empty_batches_kept == 1
    assert log.transactions.aborted == [AbortedTransaction(7, opened, marker)]
    assert markers_in(log) == [marker], "the marker stays while a batch of its transaction does"
    assert_state_is_what_a_scan_derives(log)

    clock.now += 5_000
    report = compact(log, clock.now, force=True)
    assert report.markers_removed == 0 and markers_in(log) == [marker]
    assert log.producers.producers[7].last_offset == opened

    # Once producer 7 has expired, its batch goes, and with it the transaction and the marker.
    clock.now += TXN_CONFIG.producer_id_expiration_ms + 1
    assert log.expire_producers() >= 1
    report = compact(log, clock.now, force=True)
    assert report.markers_removed == 1 and markers_in(log) == []
    assert log.transactions.aborted == [], "nothing of it is left to drop"
    assert contents(log)[committed_k] == (b"k", b"committed")
    assert_state_is_what_a_scan_derives(log)


def test_a_committed_transaction_supersedes_and_its_marker_stays_while_it_does(
    tmp_path: Path,
) -> None:
    clock = Clock()
    log = SegmentedLog(tmp_path, TXN_CONFIG, clock_ms=clock)
    w = Writer(log, clock)
    old_k = w.plain("k", "old")
    old_j = w.txn(8, "j", "old")  # producer 8's first transaction: committed, then superseded
    first_marker = w.end(8, commit=True)
    new_k = w.txn(8, "k", "new")
    second_marker = w.end(8, commit=True)
    w.plain("j", "newer")
    w.fill(14)
    w.commit()
    clock.now += 5_000  # every marker is past delete.retention.ms
    report = compact(log, clock.now, force=True)
    after = contents(log)
    assert old_k not in after and after[new_k] == (b"k", b"new"), "a committed record supersedes"
    assert old_j not in after and report.aborted_records_removed == 0
    # The first transaction left nothing, so its marker goes; the second's record stays, and so
    # does its marker: without it, a scan would take that record for an open transaction.
    assert report.markers_removed == 1
    assert first_marker not in markers_in(log) and second_marker in markers_in(log)
    assert log.transactions.open == {} and last_stable_offset(log) == log.high_watermark
    assert_state_is_what_a_scan_derives(log)
    for committed in (True, False):
        assert latest_per_key(read_view(log, committed))[b"k"] == (b"k", b"new")


def test_an_aborted_transaction_whose_marker_is_past_the_pass_is_kept_but_supersedes_nothing(
    tmp_path: Path,
) -> None:
    clock = Clock()
    log = SegmentedLog(tmp_path, TXN_CONFIG, clock_ms=clock)
    w = Writer(log, clock)
    committed_k = w.plain("k", "committed")
    aborted_k = w.txn(9, "k", "aborted")
    w.fill(14)
    marker = w.end(9, commit=False)  # in the active segment: not compactable yet
    w.commit()
    assert all(s.next_offset <= marker for s in log.compactable_segments())
    report = compact(log, clock.now, force=True)
    after = contents(log)
    assert after[committed_k] == (b"k", b"committed") and after[aborted_k] == (b"k", b"aborted")
    assert report.aborted_records_removed == 0
    assert log.transactions.aborted == [AbortedTransaction(9, aborted_k, marker)]
    assert latest_per_key(read_view(log, committed=True))[b"k"] == (b"k", b"committed")
    assert_state_is_what_a_scan_derives(log)


def mixed_transactions(tmp_path: Path, clock: Clock) -> SegmentedLog:
    """Committed, aborted, open and decided-above-the-HW transactions among plain records."""
    log = SegmentedLog(tmp_path, TXN_CONFIG, clock_ms=clock)
    w = Writer(log, clock)
    for round_ in range(3):
        w.plain("k", f"plain{round_}")
        w.txn(1, "k", f"committed{round_}")
        w.txn(2, "k", f"aborted{round_}")
        w.txn(1, "j", f"committed{round_}")
        w.end(2, commit=False)
        w.end(1, commit=True)
        w.fill(6, f"r{round_}-")
    w.txn(3, "k", "aborted-late")
    w.fill(4, "late")
    w.end(3, commit=False)
    w.txn(4, "k", "decided-above-hw")
    w.fill(6, "x")
    w.commit()
    w.end(4, commit=True)  # above the HW: undecided yet
    w.txn(5, "k", "open")
    return log


@pytest.mark.parametrize("clean", [True, False])
def test_reopening_a_compacted_log_gives_the_same_transactions(tmp_path: Path, clean: bool) -> None:
    clock = Clock()
    log = mixed_transactions(tmp_path, clock)
    before = {c: read_view(log, c) for c in (True, False)}
    clock.now += 5_000
    report = compact(log, clock.now, force=True)
    assert report.aborted_records_removed >= 3 and report.markers_removed >= 1
    state = assert_state_is_what_a_scan_derives(log)
    views = {c: read_view(log, c) for c in (True, False)}
    # A read_committed reader sees the same latest value of every key; both readers see only
    # records that were there, at their offsets.
    assert latest_per_key(views[True]) == latest_per_key(before[True])
    assert latest_per_key(views[True])[b"k"] == (b"k", b"committed2")
    for committed in (True, False):
        assert all(before[committed][o] == kv for o, kv in views[committed].items())
    assert not any(v is not None and v.startswith(b"aborted") for _, v in views[False].values())
    assert (b"k", b"aborted-late") in before[False].values(), "(it was there to remove)"
    if clean:
        log.close()
    else:
        log.flush()
        log.write_state_checkpoint()
        log.abandon()
    again = SegmentedLog(tmp_path, TXN_CONFIG, clock_ms=clock)
    assert transaction_state(again) == state
    assert {c: read_view(again, c) for c in (True, False)} == views
    again.close()


@pytest.mark.parametrize("step", ["cleaned-written", "swap-renamed", "swapped"])
def test_a_crash_while_compacting_transactions_leaves_old_or_new(tmp_path: Path, step: str) -> None:
    clock = Clock()
    log = mixed_transactions(tmp_path, clock)
    log.flush()
    log.write_state_checkpoint()  # (the HW as the node's checkpoint loop keeps it)
    before = contents(log)
    committed_before = latest_per_key(read_view(log, committed=True))
    clock.now += 5_000

    def crash(at: str) -> None:
        if at == step:
            raise Crash(at)

    with pytest.raises(Crash):
        compact(log, clock.now, force=True, crash_point=crash)
    log.abandon()
    again = SegmentedLog(tmp_path, TXN_CONFIG, clock_ms=clock)
    assert all(before[offset] == kv for offset, kv in contents(again).items())
    assert latest_per_key(read_view(again, committed=True)) == committed_before
    assert_state_is_what_a_scan_derives(again)
    compact(again, clock.now, force=True)  # and it can finish the job
    assert latest_per_key(read_view(again, committed=True)) == committed_before
    assert_state_is_what_a_scan_derives(again)
    again.close()


# -- a producer's newest batch -----------------------------------------------------------------


def idempotent(
    clock: Clock, pid: int, sequence: int, items: list[tuple[str, str]], transactional: bool = False
) -> bytes:
    records = [ProducerRecord(k.encode(), v.encode(), (), clock.now) for k, v in items]
    return build_batch(
        records,
        producer_id=pid,
        producer_epoch=0,
        base_sequence=sequence,
        transactional=transactional,
    )


def batches_of(log: SegmentedLog, pid: int) -> list[tuple[int, int, int, int]]:
    """(base offset, last offset, base sequence, records) of the producer's batches."""
    return [
        (h.base_offset, h.last_offset, h.base_sequence, h.records_count)
        for seg in log.segments
        for _, h in seg.scan()
        if h.producer_id == pid and not h.is_control
    ]


def reopened_uncleanly(log: SegmentedLog, tmp_path: Path, clock: Clock) -> SegmentedLog:
    """The log as an unclean restart finds it: no clean-shutdown checkpoint of producers."""
    log.flush()
    log.write_state_checkpoint()
    log.abandon()
    return SegmentedLog(tmp_path, TXN_CONFIG, clock_ms=clock)


def copied_by_a_follower(log: SegmentedLog, directory: Path, clock: Clock) -> SegmentedLog:
    """A new replica that fetched the whole (compacted) log, batch bytes as they are."""
    follower = SegmentedLog(directory, TXN_CONFIG, clock_ms=clock)
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        found = log.read(offset, 1 << 20, log.log_end_offset)
        assert found is not None
        data = found.read()
        follower.append_as_follower(data)
        offset = list(iter_headers(data))[-1][1].next_offset
    return follower


def assert_views_lost_only(
    log: SegmentedLog, before: dict[bool, dict[int, Entry]], gone: set[int]
) -> None:
    for committed in (True, False):
        expected = {o: kv for o, kv in before[committed].items() if o not in gone}
        assert read_view(log, committed) == expected


def test_a_producers_newest_batch_superseded_by_key_keeps_its_sequence(tmp_path: Path) -> None:
    clock = Clock()
    log = SegmentedLog(tmp_path / "leader", TXN_CONFIG, clock_ms=clock)
    w = Writer(log, clock)
    log.append_as_leader(idempotent(clock, 9, 0, [("a", "a0"), ("b", "b0")]), epoch=1)
    newest = idempotent(clock, 9, 2, [("a", "a1"), ("b", "b1")])
    log.append_as_leader(newest, epoch=1)
    at = log.log_end_offset - 2
    w.plain("a", "a2")
    w.plain("b", "b2")  # every record of producer 9 is superseded
    w.fill(12)
    w.commit()
    before = {c: read_view(log, c) for c in (True, False)}
    report = compact(log, clock.now, force=True)
    assert report.empty_batches_kept == 1
    # Its older batch goes; the newest stays as its header alone, at its offsets.
    assert batches_of(log, 9) == [(at, at + 1, 2, 0)]
    assert_views_lost_only(log, before, {0, 1, at, at + 1})
    # A lookup by time passes over the empty batch (it keeps its timestamps) to the next record.
    assert log.offset_for_timestamp(clock.now) == at + 2
    follower = copied_by_a_follower(log, tmp_path / "follower", clock)
    assert follower.producers.producers[9][:4] == log.producers.producers[9][:4]
    follower.close()

    again = reopened_uncleanly(log, tmp_path / "leader", clock)
    assert again.producers.producers[9].last_sequence == 3
    assert_views_lost_only(again, before, {0, 1, at, at + 1})
    with pytest.raises(DuplicateSequence):
        again.append_as_leader(newest, epoch=1)  # a retry of the newest batch
    with pytest.raises(OutOfOrderSequence):
        again.append_as_leader(idempotent(clock, 9, 5, [("c", "c0")]), epoch=1)
    info = again.append_as_leader(idempotent(clock, 9, 4, [("c", "c0")]), epoch=1)
    assert info.last_offset == again.log_end_offset - 1
    again.close()


def test_a_producers_newest_batch_in_an_aborted_transaction_keeps_its_sequence(
    tmp_path: Path,
) -> None:
    clock = Clock()
    log = SegmentedLog(tmp_path, TXN_CONFIG, clock_ms=clock)
    w = Writer(log, clock)
    log.append_as_leader(idempotent(clock, 9, 0, [("a", "a0")], transactional=True), epoch=1)
    w.end(9, commit=True)
    newest = idempotent(clock, 9, 1, [("b", "b0"), ("c", "c0")], transactional=True)
    log.append_as_leader(newest, epoch=1)
    at = log.log_end_offset - 2
    marker = w.end(9, commit=False)
    w.fill(12)
    w.commit()
    before = {c: read_view(log, c) for c in (True, False)}
    report = compact(log, clock.now, force=True)
    assert report.aborted_records_removed == 2 and report.empty_batches_kept == 1
    assert batches_of(log, 9) == [(0, 0, 0, 1), (at, at + 1, 1, 0)]
    assert log.transactions.aborted == [AbortedTransaction(9, at, marker)]
    assert marker in markers_in(log), "a batch of its transaction is left"
    state = assert_state_is_what_a_scan_derives(log)
    assert_views_lost_only(log, before, {at, at + 1})

    again = reopened_uncleanly(log, tmp_path, clock)
    assert transaction_state(again) == state
    assert_views_lost_only(again, before, {at, at + 1})
    with pytest.raises(DuplicateSequence):
        again.append_as_leader(newest, epoch=1)
    again.append_as_leader(idempotent(clock, 9, 3, [("d", "d0")], transactional=True), epoch=1)
    assert again.transactions.open[9].first_offset == again.log_end_offset - 1
    again.close()


def test_a_producers_newest_batch_partly_superseded_keeps_its_base_offset(tmp_path: Path) -> None:
    clock = Clock()
    log = SegmentedLog(tmp_path, TXN_CONFIG, clock_ms=clock)
    w = Writer(log, clock)
    newest = idempotent(clock, 9, 0, [("a", "a0"), ("b", "b0")])
    log.append_as_leader(newest, epoch=1)
    w.plain("a", "a1")  # supersedes the batch's first record only
    w.fill(12)
    w.commit()
    compact(log, clock.now, force=True)
    # Its base sequence belongs to its base offset: moving the one without the other would
    # make the rebuilt state's last sequence 0 instead of 1.
    assert batches_of(log, 9) == [(0, 1, 0, 1)]
    again = reopened_uncleanly(log, tmp_path, clock)
    assert again.producers.producers[9].last_sequence == 1
    with pytest.raises(DuplicateSequence):
        again.append_as_leader(newest, epoch=1)
    again.append_as_leader(idempotent(clock, 9, 2, [("c", "c0")]), epoch=1)
    again.close()


def test_a_marker_that_is_its_producers_newest_batch_stays(tmp_path: Path) -> None:
    clock = Clock()
    log = SegmentedLog(tmp_path, TXN_CONFIG, clock_ms=clock)
    w = Writer(log, clock)
    log.append_as_leader(idempotent(clock, 9, 0, [("a", "a0")], transactional=True), epoch=1)
    # Aborted with a bumped epoch (the producer was fenced): the marker holds the newest epoch.
    fenced = build_marker(9, 1, commit=False, coordinator_epoch=1, now_ms=clock.now)
    log.append_as_leader(fenced, epoch=1)
    marker = log.log_end_offset - 1
    w.fill(12)
    w.commit()
    assert log.producers.producers[9].epoch == 1
    clock.now += 5_000  # past delete.retention.ms: an ordinary marker would go
    report = compact(log, clock.now, force=True)
    assert report.aborted_records_removed == 1 and batches_of(log, 9) == []
    assert markers_in(log) == [marker] and report.markers_removed == 0
    assert_state_is_what_a_scan_derives(log)
    again = reopened_uncleanly(log, tmp_path, clock)
    assert again.producers.producers[9].epoch == 1
    again.close()
