"""The simulator's transactional workload (sim/transactions.py) and its checker
(sim/checkers/transactions.py): seeds pass with transactions committed, aborted and left open
under every fault, the LSO that ignores open transactions is caught, and each anomaly the
checker names is named when a history shows it. Likewise for transactions spanning partitions
(sim/partitions.py, sim/coordinator.py, sim/spanning.py, sim/checkers/atomicity.py): seeds pass
with the coordinator failing over, a coordinator that writes the first partition's marker only
is caught, and each cross-partition anomaly is named."""

from __future__ import annotations

import os

import pytest

from tidelog.record.batch import ProducerRecord, build_batch, read_header, stamp
from tidelog.record.markers import build_marker
from tidelog.replication.faults import (
    FAULT_LSO_IGNORES_OPEN_TRANSACTIONS,
    FAULT_MARKER_TO_FIRST_PARTITION_ONLY,
)
from tidelog.testing.__main__ import main
from tidelog.testing.sim import SimParams, Simulation, SimulationFailure
from tidelog.testing.sim.checkers.atomicity import (
    AckedRecord,
    CrossPartitionAtomicity,
    PartitionView,
)
from tidelog.testing.sim.checkers.commits import CommitHistory
from tidelog.testing.sim.checkers.transactions import TransactionAnomalies
from tidelog.testing.sim.failure import Violations
from tidelog.testing.sim.partitions import PartitionedSimulation

SEEDS = int(
    os.environ.get("TIDELOG_SIM_TXN_SEEDS", "6" if os.environ.get("TIDELOG_QUICK") else "30")
)


def run(seed: int, faults: frozenset[str] = frozenset()) -> Simulation:
    sim = Simulation(SimParams.from_seed(seed, faults, transactions=True))
    sim.run()
    return sim


def test_transactional_seeds_pass_and_do_what_they_are_for() -> None:
    committed = aborted = dropped = read = 0
    for seed in range(SEEDS):
        sim = run(seed)
        clients = sim.workload.transactions
        if clients is None:
            continue  # a table's seed: no transactions there
        committed += clients.counts.committed
        aborted += clients.counts.aborted
        dropped += clients.counts.dropped_batches
        read += clients.counts.records_read
    assert committed and aborted and dropped and read


def test_an_lso_that_ignores_open_transactions_is_caught() -> None:
    with pytest.raises(SimulationFailure) as failure:
        run(5, frozenset({FAULT_LSO_IGNORES_OPEN_TRANSACTIONS}))
    text = str(failure.value)
    assert "transactions: aborted read" in text
    assert "--fault lso-ignores-open-transactions --transactions" in text
    run(5)  # the same seed with the rule kept passes


def test_the_cli_runs_transactions_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--seed", "5", "--transactions"]) == 0
    assert (
        main(["--seed", "5", "--transactions", "--fault", FAULT_LSO_IGNORES_OPEN_TRANSACTIONS]) == 1
    )
    assert "aborted read" in capsys.readouterr().out


def test_delete_records_seeds_pass_and_move_the_log_start_past_open_transactions(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--delete-records: an operator deletes records mid-run (sim/transactions.py), and each
    replica's transaction state is held to a scan of its log after its segments go."""
    deletes = 0
    for seed in range(SEEDS):
        sim = Simulation(SimParams.from_seed(seed, delete_records=True))
        sim.run()
        clients = sim.workload.transactions
        deletes += clients.counts.deletes if clients is not None else 0
    assert deletes
    assert main(["--seed", "39", "--delete-records"]) == 0
    assert (
        "--transactions --delete-records"
        in SimParams.from_seed(23, delete_records=True).replay_command()
    )
    with pytest.raises(SystemExit):
        main(["--seed", "1", "--delete-records", "--transaction-partitions", "3"])
    assert "one partition" in capsys.readouterr().err


# -- the checker on histories made by hand ------------------------------------------------------


def checker() -> TransactionAnomalies:
    violations = Violations(SimParams(seed=0), lambda: 0)
    history = CommitHistory(violations)
    offset = 0
    for batch in (
        build_batch([ProducerRecord(None, b"p0")]),  # 0 plain
        build_batch(
            [ProducerRecord(None, b"a0"), ProducerRecord(None, b"a1")],
            producer_id=7,
            producer_epoch=0,
            base_sequence=0,
            transactional=True,
        ),  # 1, 2
        build_batch(
            [ProducerRecord(None, b"c0")],
            producer_id=8,
            producer_epoch=0,
            base_sequence=0,
            transactional=True,
        ),  # 3
        build_marker(7, 0, commit=False, coordinator_epoch=0),  # 4
        build_batch(
            [ProducerRecord(None, b"c1")],
            producer_id=8,
            producer_epoch=0,
            base_sequence=1,
            transactional=True,
        ),  # 5
        build_marker(8, 0, commit=True, coordinator_epoch=0),  # 6
        build_batch(
            [ProducerRecord(None, b"u0")],
            producer_id=9,
            producer_epoch=0,
            base_sequence=0,
            transactional=True,
        ),  # 7: never decided
    ):
        stamped = bytearray(batch)
        stamp(stamped, 0, offset, 1)
        history.saw(offset, bytes(stamped), "test", 1)
        offset = read_header(bytes(stamped)).next_offset
    return TransactionAnomalies(history, violations)


def test_a_correct_read_passes_the_checker() -> None:
    c = checker()
    c.read(c.new_session(0), 0, 7, [(0, b"p0"), (3, b"c0"), (5, b"c1")], "test")
    c.check_final()


@pytest.mark.parametrize(
    ("records", "named"),
    [
        ([(0, b"p0"), (1, b"a0"), (3, b"c0"), (5, b"c1")], "aborted read"),
        ([(0, b"p0"), (3, b"c0")], "seen partly"),
        ([(3, b"c0"), (5, b"c1")], "committed record lost"),
    ],
)
def test_each_anomaly_is_named(records: list[tuple[int, bytes]], named: str) -> None:
    c = checker()
    c.read(c.new_session(0), 0, 7, list(records), "test")
    with pytest.raises(SimulationFailure, match=named):
        c.check_final()


def test_an_undecided_record_read_is_an_aborted_read() -> None:
    c = checker()
    c.read(c.new_session(0), 7, 8, [(7, b"u0")], "test")
    with pytest.raises(SimulationFailure, match=r"aborted read.*undecided"):
        c.check_final()


def test_a_record_seen_twice_is_named_at_once() -> None:
    c = checker()
    c.read(c.new_session(0), 0, 1, [(0, b"p0")], "test")
    with pytest.raises(SimulationFailure, match="seen twice"):
        c.read(c.new_session(1), 3, 4, [(3, b"p0")], "test")


# -- transactions spanning partitions (--transaction-partitions) --------------------------------

SPANNING_SEEDS = int(
    os.environ.get("TIDELOG_SIM_SPANNING_SEEDS", "2" if os.environ.get("TIDELOG_QUICK") else "8")
)


def run_spanning(seed: int, faults: frozenset[str] = frozenset()) -> PartitionedSimulation:
    sim = PartitionedSimulation(SimParams.from_seed(seed, faults, transaction_partitions=3))
    sim.run()
    return sim


def test_spanning_seeds_pass_and_do_what_they_are_for() -> None:
    commits = aborts = fail_overs = read = 0
    for seed in range(SPANNING_SEEDS):
        sim = run_spanning(seed)
        counts = sim.coordinator.counts
        assert counts.completed == counts.decided_commit + counts.decided_abort
        assert len(sim.groups) == 3
        commits += counts.decided_commit
        aborts += counts.decided_abort
        fail_overs += counts.fail_overs
        read += sim.readers.counts.records_read
        # every transaction wrote to two or three partitions, and each of them holds a marker
        spans = {
            p for group in sim.groups for p in PartitionView(group.checkers.history, [], 0).records
        }
        assert spans and spans <= set(sim.coordinator.decisions)
    assert commits and aborts and fail_overs and read


def test_a_marker_to_the_first_partition_only_is_caught() -> None:
    with pytest.raises(SimulationFailure) as failure:
        run_spanning(3, frozenset({FAULT_MARKER_TO_FIRST_PARTITION_ONLY}))
    text = str(failure.value)
    assert "transactions across partitions: committed transaction" in text
    assert "never become visible" in text
    assert (
        "--fault marker-to-first-partition-only --transactions --transaction-partitions 3" in text
    )
    run_spanning(3)  # the same seed with every marker written passes


def test_the_cli_runs_transactions_over_partitions(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--seed", "3", "--transaction-partitions", "3"]) == 0
    fault = FAULT_MARKER_TO_FIRST_PARTITION_ONLY
    assert main(["--seed", "3", "--transaction-partitions", "3", "--fault", fault]) == 1
    assert "seen partly" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--seed", "3", "--transaction-partitions", "0"])


# -- the cross-partition checker on histories made by hand --------------------------------------


def _history(violations: Violations, batches: list[bytes]) -> CommitHistory:
    history = CommitHistory(violations)
    offset = 0
    for batch in batches:
        stamped = bytearray(batch)
        stamp(stamped, 0, offset, 1)
        history.saw(offset, bytes(stamped), "test", 1)
        offset = read_header(bytes(stamped)).next_offset
    return history


def _txn_batch(producer_id: int, value: bytes) -> bytes:
    return build_batch(
        [ProducerRecord(None, value)],
        producer_id=producer_id,
        producer_epoch=0,
        base_sequence=0,
        transactional=True,
    )


def spanning_checker(
    second_marker_commits: bool | None,
) -> tuple[CrossPartitionAtomicity, list[PartitionView], list[TransactionAnomalies]]:
    """Producer 7 wrote offset 0 of partitions 0 and 1 and committed; partition 0 has its
    COMMIT marker at 1, partition 1 the marker given (None: none, the transaction open)."""
    violations = Violations(SimParams(seed=0), lambda: 0)
    first = _history(
        violations, [_txn_batch(7, b"a"), build_marker(7, 0, commit=True, coordinator_epoch=0)]
    )
    second_batches = [_txn_batch(7, b"b")]
    if second_marker_commits is not None:
        second_batches.append(build_marker(7, 0, commit=second_marker_commits, coordinator_epoch=0))
    second = _history(violations, second_batches)
    anomalies = [TransactionAnomalies(h, violations) for h in (first, second)]
    lso = 0 if second_marker_commits is None else 2
    views = [
        PartitionView(first, anomalies[0].sessions, 2),
        PartitionView(second, anomalies[1].sessions, lso),
    ]
    return CrossPartitionAtomicity(violations), views, anomalies


def test_a_transaction_seen_in_every_partition_passes() -> None:
    atomicity, views, anomalies = spanning_checker(True)
    anomalies[0].read(anomalies[0].new_session(0), 0, 2, [(0, b"a")], "test")
    anomalies[1].read(anomalies[1].new_session(0), 0, 2, [(0, b"b")], "test")
    atomicity.check_final(views, {7: True}, [AckedRecord(1, 7, b"b", 0)])


def test_commit_in_one_partition_abort_in_another_is_seen_partly() -> None:
    atomicity, views, anomalies = spanning_checker(False)
    anomalies[0].read(anomalies[0].new_session(0), 0, 2, [(0, b"a")], "test")
    anomalies[1].read(anomalies[1].new_session(0), 0, 2, [], "test")  # dropped: aborted there
    with pytest.raises(SimulationFailure, match=r"seen partly.*offsets \[0\] of partition 1"):
        atomicity.check_final(views, {7: True}, [])


def test_a_partition_never_given_its_marker_is_seen_partly() -> None:
    atomicity, views, anomalies = spanning_checker(None)
    anomalies[0].read(anomalies[0].new_session(0), 0, 2, [(0, b"a")], "test")
    with pytest.raises(SimulationFailure, match=r"LSO stays at 0.*never become visible"):
        atomicity.check_final(views, {7: True}, [])


def test_a_transaction_the_coordinator_aborted_is_an_aborted_read() -> None:
    atomicity, views, anomalies = spanning_checker(True)
    anomalies[0].read(anomalies[0].new_session(0), 0, 2, [(0, b"a")], "test")
    with pytest.raises(SimulationFailure, match=r"aborted read.*decided abort"):
        atomicity.check_final(views, {7: False}, [])


def test_an_acked_batch_missing_from_its_partition_is_lost() -> None:
    atomicity, views, _ = spanning_checker(True)
    with pytest.raises(SimulationFailure, match=r"committed record lost.*offset 5 of partition 1"):
        atomicity.check_final(views, {7: True}, [AckedRecord(1, 7, b"b", 5)])
