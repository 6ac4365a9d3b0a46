"""A partition's transactions as its log derives them (storage/transactions.py) on both log
kinds, and the last stable offset's rule (replication/last_stable_offset.py)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from tidelog.config import TopicConfig
from tidelog.record.batch import BatchHeader, ProducerRecord, build_batch, iter_headers
from tidelog.record.markers import Marker, build_marker, read_marker
from tidelog.record.read_committed import committed_batches
from tidelog.replication.faults import FAULT_LSO_IGNORES_OPEN_TRANSACTIONS
from tidelog.replication.last_stable_offset import last_stable_offset
from tidelog.replication.low_watermark import (
    KIND_TRANSACTION,
    LowWatermarkFacts,
    decide_low_watermark,
    transaction_facts,
)
from tidelog.storage.checkpoint import read_checkpoint, write_checkpoint
from tidelog.storage.log import TRANSACTION_CHECKPOINT, SegmentedLog
from tidelog.storage.memory_log import MemoryLog
from tidelog.storage.transactions import AbortedTransaction, TransactionState
from tidelog.testing.sim.checkers.derived_state import check_derived_transactions
from tidelog.testing.sim.failure import SimulationFailure, Violations
from tidelog.testing.sim.params import SimParams

SMALL = TopicConfig(segment_bytes=400, index_interval_bytes=128)
AnyLog = SegmentedLog | MemoryLog


def txn_batch(pid: int, seq: int, *values: bytes, epoch: int = 0) -> bytes:
    return build_batch(
        [ProducerRecord(None, v) for v in values],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        transactional=True,
    )


def plain(*values: bytes) -> bytes:
    return build_batch([ProducerRecord(None, v) for v in values])


def marker(pid: int, commit: bool, epoch: int = 0) -> bytes:
    return build_marker(pid, epoch, commit=commit, coordinator_epoch=3)


@pytest.fixture(params=["segmented", "memory"])
def make_log(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], AnyLog]:
    def make() -> AnyLog:
        if request.param == "segmented":
            return SegmentedLog(tmp_path / "p-0", SMALL)
        return MemoryLog(SMALL)

    return make


def commit_all(log: AnyLog) -> None:
    log.flush()
    log.set_high_watermark(log.log_end_offset)


def test_an_open_transaction_holds_the_lso_until_its_marker_is_committed(
    make_log: Callable[[], AnyLog],
) -> None:
    log = make_log()
    log.append_as_leader(plain(b"a"), 1)  # 0
    log.append_as_leader(txn_batch(7, 0, b"t1", b"t2"), 1)  # 1, 2
    log.append_as_leader(plain(b"b"), 1)  # 3
    commit_all(log)
    assert log.high_watermark == 4
    assert last_stable_offset(log) == 1
    assert last_stable_offset(log, frozenset({FAULT_LSO_IGNORES_OPEN_TRANSACTIONS})) == 4
    log.append_as_leader(marker(7, commit=True), 1)  # 4
    # The marker is above the HW: commit or abort is not decided yet.
    assert last_stable_offset(log) == 1
    commit_all(log)
    assert last_stable_offset(log) == log.high_watermark == 5
    assert log.aborted_transactions(0, 5) == []


def test_aborted_transactions_are_listed_for_the_range_read(
    make_log: Callable[[], AnyLog],
) -> None:
    log = make_log()
    log.append_as_leader(txn_batch(7, 0, b"x"), 1)  # 0
    log.append_as_leader(txn_batch(8, 0, b"y"), 1)  # 1
    log.append_as_leader(txn_batch(7, 1, b"x2"), 1)  # 2
    log.append_as_leader(marker(7, commit=False), 1)  # 3
    log.append_as_leader(marker(8, commit=True), 1)  # 4
    log.append_as_leader(plain(b"z"), 1)  # 5
    commit_all(log)
    assert last_stable_offset(log) == 6
    assert log.aborted_transactions(0, 6) == [AbortedTransaction(7, 0, 3)]
    assert log.aborted_transactions(2, 3) == [AbortedTransaction(7, 0, 3)]
    assert log.aborted_transactions(4, 6) == []  # its marker is below the read
    assert log.aborted_transactions(0, 0) == []


def test_truncation_rebuilds_transactions(make_log: Callable[[], AnyLog]) -> None:
    log = make_log()
    log.append_as_leader(txn_batch(7, 0, b"x"), 1)  # 0
    commit_all(log)
    log.append_as_leader(marker(7, commit=False), 1)  # 1, not committed
    assert log.aborted_transactions(0, 2) == [AbortedTransaction(7, 0, 1)]
    log.truncate_to(1)  # the marker is gone: the transaction is open again
    assert log.aborted_transactions(0, 2) == []
    assert log.transactions.holding_from(log.high_watermark, 0) == [(7, 0)]
    assert last_stable_offset(log) == 0


def test_a_follower_derives_what_the_leader_did(make_log: Callable[[], AnyLog]) -> None:
    leader, follower = MemoryLog(SMALL), make_log()
    leader.append_as_leader(txn_batch(7, 0, b"x"), 2)
    leader.append_as_leader(marker(7, commit=False), 2)
    leader.append_as_leader(txn_batch(9, 0, b"w"), 2)
    for _, batch in leader.batches():
        follower.append_as_follower(batch)
    commit_all(follower)
    assert follower.aborted_transactions(0, 3) == [AbortedTransaction(7, 0, 1)]
    assert last_stable_offset(follower) == 2
    assert list(follower.transactions.open) == [9]


def test_deleting_segments_drops_what_they_ended(tmp_path: Path) -> None:
    log = SegmentedLog(tmp_path / "p-0", SMALL)
    for pid in range(20):
        log.append_as_leader(txn_batch(pid, 0, b"x" * 40), 1)
        log.append_as_leader(marker(pid, commit=False), 1)
    commit_all(log)
    assert len(log.aborted_transactions(0, log.log_end_offset)) == 20
    log.advance_log_start(20)
    log.delete_segments_below_log_start()
    first = log.segments[0].base_offset
    kept = log.transactions.aborted
    assert kept and all(t.marker_offset >= first for t in kept)
    assert len(kept) < 20


@pytest.mark.parametrize("clean", [True, False])
def test_a_reopened_log_has_the_same_transactions(tmp_path: Path, clean: bool) -> None:
    log = SegmentedLog(tmp_path / "p-0", SMALL)
    log.append_as_leader(txn_batch(7, 0, b"x"), 1)
    log.append_as_leader(marker(7, commit=False), 1)
    log.append_as_leader(txn_batch(8, 0, b"y"), 1)
    log.append_as_leader(txn_batch(9, 0, b"z"), 1)
    log.append_as_leader(marker(9, commit=True), 1)
    commit_all(log)
    log.append_as_leader(marker(8, commit=True), 1)  # above the HW
    before = (log.transactions.open, log.transactions.ended, log.transactions.aborted)
    if clean:
        log.close()
    else:
        log.flush()
        log.write_state_checkpoint()
        log.abandon()
    again = SegmentedLog(tmp_path / "p-0", SMALL)
    assert again.transactions.aborted == before[2]
    assert [t[:4] for t in again.transactions.ended] == [t[:4] for t in before[1]]
    assert again.transactions.open == before[0] == {}
    assert last_stable_offset(again) == 2  # producer 8's transaction, decided above the HW
    again.close()


def test_the_lwm_is_held_by_an_unstable_transaction() -> None:
    log = MemoryLog(TopicConfig(segment_bytes=1))  # a segment per batch: each may go by age
    log.append_as_leader(plain(b"a"), 1)
    log.append_as_leader(txn_batch(7, 0, b"t", epoch=4), 1)
    log.append_as_leader(plain(b"b"), 1)
    commit_all(log)
    facts = LowWatermarkFacts(
        log.log_start_offset,
        log.high_watermark,
        log.segments,
        TopicConfig(retention_ms=0, segment_bytes=1),
        now_ms=5_000,
        transactions=transaction_facts(log.transactions, log.high_watermark, 5_000),
    )
    lwm = decide_low_watermark(facts)
    assert lwm.offset == 1 == last_stable_offset(log)
    assert lwm.hold.kind == KIND_TRANSACTION
    assert lwm.hold.name == "producer 7"
    assert "epoch 4" in lwm.hold.detail and "open" in lwm.hold.detail


def test_opening_a_log_of_many_markers_is_cheap(tmp_path: Path) -> None:
    """Measured: an unclean open decodes only the markers; a clean one reads the checkpoint."""
    log = SegmentedLog(tmp_path / "p-0", TopicConfig(segment_bytes=1 << 20))
    batches = b"".join(
        txn_batch(pid, 0, b"v") + marker(pid, commit=pid % 2 == 0) for pid in range(2000)
    )
    log.append_as_leader(batches, 1)
    commit_all(log)
    log.close()
    started = time.perf_counter()
    clean = SegmentedLog(tmp_path / "p-0", TopicConfig(segment_bytes=1 << 20))
    clean_s = time.perf_counter() - started
    assert len(clean.transactions.aborted) == 1000
    clean.flush()
    clean.abandon()  # no clean-shutdown mark: the next open scans
    started = time.perf_counter()
    unclean = SegmentedLog(tmp_path / "p-0", TopicConfig(segment_bytes=1 << 20))
    unclean_s = time.perf_counter() - started
    assert len(unclean.transactions.aborted) == 1000
    unclean.close()
    assert clean_s < 2.0 and unclean_s < 5.0, (clean_s, unclean_s)


def test_a_reader_drops_an_aborted_transaction_and_keeps_the_producers_next() -> None:
    """Kafka's consumer rule (record/read_committed.py): an aborted transaction is taken in
    when the batches reach its first offset (markers included), and its ABORT marker ends it."""
    log = MemoryLog(SMALL)
    log.append_as_leader(txn_batch(7, 0, b"dropped"), 1)  # 0
    log.append_as_leader(marker(7, commit=False), 1)  # 1
    log.append_as_leader(txn_batch(7, 1, b"kept"), 1)  # 2: the producer's next transaction
    log.append_as_leader(marker(7, commit=True), 1)  # 3
    commit_all(log)
    for start in (0, 1):
        chunk = log.read(start, 1 << 20, log.high_watermark)
        assert chunk is not None
        data = chunk.read()
        batches = list(iter_headers(data))
        aborted = [(t.producer_id, t.first_offset) for t in log.aborted_transactions(start, 4)]
        assert aborted == [(7, 0)]
        kept = committed_batches(data, batches, aborted)
        assert [h.base_offset for _, h in kept] == [2]


def test_a_clean_restart_of_a_log_without_transactions_scans_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = SegmentedLog(tmp_path / "p-0", SMALL)
    log.append_as_leader(plain(b"a"), 1)
    commit_all(log)
    log.close()
    assert not (tmp_path / "p-0" / "transaction-state").exists()
    scans: list[str] = []
    real = SegmentedLog._scan_markers

    def counted(self: SegmentedLog) -> list[tuple[BatchHeader, Marker | None]]:
        scans.append(self.directory.name)
        return real(self)

    monkeypatch.setattr(SegmentedLog, "_scan_markers", counted)
    reopened = SegmentedLog(tmp_path / "p-0", SMALL)
    assert reopened.transactions.open == {} and scans == []
    reopened.flush()
    reopened.abandon()  # an unclean stop: the next open scans
    SegmentedLog(tmp_path / "p-0", SMALL).close()
    assert scans == ["p-0"]


def test_forgetting_aborted_transactions_keeps_the_rest_listed_by_range(tmp_path: Path) -> None:
    """Compaction forgets the aborted transactions it removed (storage/compaction.py); the
    others stay listed for the ranges they overlap, and reopening gives the same list."""
    log = SegmentedLog(tmp_path / "p-0", SMALL)
    for pid in range(4):
        log.append_as_leader(txn_batch(pid, 0, b"x"), 1)  # 3 * pid
        log.append_as_leader(plain(b"between"), 1)
        log.append_as_leader(marker(pid, commit=False), 1)  # 3 * pid + 2
    commit_all(log)
    every = log.aborted_transactions(0, log.log_end_offset)
    assert [t.marker_offset for t in every] == [2, 5, 8, 11]
    log.transactions.forget_aborted([every[1], every[2]])
    assert log.aborted_transactions(0, 12) == [every[0], every[3]]
    assert log.aborted_transactions(3, 9) == []  # (the bisection still finds its start)
    assert log.aborted_transactions(6, 12) == [every[3]]
    log.close()
    again = SegmentedLog(tmp_path / "p-0", SMALL)
    assert again.aborted_transactions(0, 12) == [every[0], every[3]]
    again.close()


def test_a_producer_with_an_open_transaction_outlives_its_expiry(tmp_path: Path) -> None:
    """Its marker is still to come: forgetting it made the coordinator's abort skip this
    partition and hold the LSO for good. A producer with nothing open expires as before."""
    now = [1_000]
    config = TopicConfig(segment_bytes=1 << 20, producer_id_expiration_ms=100)
    log = SegmentedLog(tmp_path / "p-0", config, clock_ms=lambda: now[0])
    log.append_as_leader(txn_batch(7, 0, b"open"), 1)
    log.append_as_leader(
        build_batch([ProducerRecord(None, b"idem")], producer_id=8, producer_epoch=0), 1
    )
    now[0] += 1_000
    assert log.expire_producers() == 1
    assert set(log.producers.producers) == {7}
    log.append_as_leader(marker(7, commit=False), 1)
    now[0] += 1_000
    assert log.expire_producers() == 1 and log.producers.producers == {}


def scanned(log: AnyLog, minimal: bool = False) -> TransactionState:
    """The transactions a scan of the log as it is now derives (an unclean restart's, or a
    follower's that copied only what is left); minimal: of only the batches reaching past the
    log start, as a replica whose segments were cut there holds them."""
    state = TransactionState()
    if isinstance(log, SegmentedLog):
        batches = log._scan_markers()
    else:
        batches = [(h, read_marker(d, h) if h.is_transactional else None) for h, d in log.batches()]
    if minimal:
        batches = [(h, m) for h, m in batches if h.next_offset > log.log_start_offset]
    state.rebuild(batches, log.high_watermark, 0)
    return state


@pytest.mark.parametrize("seed", range(40))
def test_deleting_segments_under_undecided_transactions_agrees_with_a_scan(
    seed: int, tmp_path: Path
) -> None:
    """delete-records and retention may take an undecided transaction's first batches. A
    replica that appended them, one that scans what is left, and one whose segments begin
    exactly at the batch holding the log start must agree on the LSO and on where each
    undecided transaction holds it from (or that it holds nothing)."""
    rng = random.Random(seed)
    log: AnyLog
    for log in (SegmentedLog(tmp_path / f"p-{seed}", SMALL), MemoryLog(SMALL)):
        sequences: dict[int, int] = {}
        open_pids: set[int] = set()
        for _ in range(120):
            pid = rng.randrange(4)
            roll = rng.random()
            if roll < 0.45:
                seq = sequences.get(pid, 0)
                log.append_as_leader(txn_batch(pid, seq, b"t" * rng.randrange(1, 60)), 1)
                sequences[pid] = seq + 1
                open_pids.add(pid)
            elif roll < 0.6 and pid in open_pids:
                log.append_as_leader(marker(pid, commit=rng.random() < 0.5), 1)
                open_pids.discard(pid)
            elif roll < 0.8:
                log.append_as_leader(plain(b"p" * rng.randrange(1, 60)), 1)
            elif roll < 0.87:
                log.flush()
                log.set_high_watermark(rng.randint(log.high_watermark, log.log_end_offset))
            elif roll < 0.9 and isinstance(log, SegmentedLog):
                log.close()  # a clean restart: the checkpoint, not a scan, gives them back
                log = SegmentedLog(tmp_path / f"p-{seed}", SMALL)
            else:
                start = rng.randint(log.log_start_offset, log.high_watermark)
                log.advance_log_start(start)
                log.delete_segments_below_log_start()
                hw, start = log.high_watermark, log.log_start_offset
                kept = log.transactions
                for scan in (scanned(log), scanned(log, minimal=True)):
                    assert kept.holding_from(hw, start) == scan.holding_from(hw, start), seed
                    assert kept.stable_offset(hw, start) == scan.stable_offset(hw, start)
        if isinstance(log, SegmentedLog):
            log.close()


def test_the_simulators_derived_state_check_catches_a_log_that_forgot_a_transaction() -> None:
    """checkers/derived_state.py, on a real MemoryLog: what its state drops must be what a scan
    drops. A difference that drops nothing (an aborted transaction whose batches are all gone)
    passes; a state that lost an open transaction, or an aborted one with batches, fails."""
    log = MemoryLog(TopicConfig(segment_bytes=1))  # a segment per batch
    log.append_as_leader(txn_batch(7, 0, b"gone"), 1)  # 0
    log.append_as_leader(plain(b"p"), 1)  # 1
    log.append_as_leader(marker(7, commit=False), 1)  # 2
    log.append_as_leader(txn_batch(8, 0, b"kept"), 1)  # 3
    log.append_as_leader(marker(8, commit=False), 1)  # 4
    log.append_as_leader(txn_batch(9, 0, b"open"), 1)  # 5
    commit_all(log)
    log.advance_log_start(1)
    log.delete_segments_below_log_start()  # 7's only batch: its entry now drops nothing
    node = SimpleNamespace(node_id=1, log=log)
    violations = Violations(SimParams(seed=1), lambda: 0)
    check_derived_transactions([node], violations)  # type: ignore[list-item]
    assert [t.producer_id for t in log.transactions.aborted] == [7, 8]  # (7's kept, harmlessly)
    log.transactions.aborted.pop()  # 8's batch at 3 would be read as committed
    with pytest.raises(
        SimulationFailure, match=r"drops the batches at \[\], a scan of its log's at \[3\]"
    ):
        check_derived_transactions([node], violations)  # type: ignore[list-item]
    log.rebuild_transactions()
    del log.transactions.open[9]  # the LSO would pass 9's undecided batch
    with pytest.raises(SimulationFailure, match=r"hold the LSO from \[\], a scan"):
        check_derived_transactions([node], violations)  # type: ignore[list-item]


def test_a_checkpoint_without_the_batches_of_an_open_transaction_is_scanned_instead(
    tmp_path: Path,
) -> None:
    """An older version's clean-close checkpoint has no batches for its undecided
    transactions; trusted, the transaction would start at its first batch alone, and the next
    deletion of that batch would drop it while its later batches stay (an abort would then
    end nothing, and read_committed would show aborted records). The log is scanned instead."""
    log = SegmentedLog(tmp_path / "p-0", SMALL)
    log.append_as_leader(txn_batch(7, 0, b"a" * 300), 1)  # 0
    log.append_as_leader(txn_batch(7, 1, b"b" * 300), 1)  # 1, in the next segment
    commit_all(log)
    log.close()
    path = tmp_path / "p-0" / TRANSACTION_CHECKPOINT
    data = read_checkpoint(path)
    assert data is not None and data["open_batch_spans"] == {"7": [[0, 1], [1, 2]]}
    del data["open_batch_spans"]
    write_checkpoint(path, data)
    again = SegmentedLog(tmp_path / "p-0", SMALL)
    try:
        again.advance_log_start(1)
        again.delete_segments_below_log_start()
        assert again.transactions.holding_from(again.high_watermark, 1) == [(7, 1)]
        assert last_stable_offset(again) == 1
    finally:
        again.close()
