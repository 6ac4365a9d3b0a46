"""The simulator's transactional workload (sim/transactions.py) and its checker
(sim/checkers/transactions.py): seeds pass with transactions committed, aborted and left open
under every fault, the LSO that ignores open transactions is caught, and each anomaly the
checker names is named when a history shows it."""

from __future__ import annotations

import os

import pytest

from tidelog.record.batch import ProducerRecord, build_batch, read_header, stamp
from tidelog.record.markers import build_marker
from tidelog.replication.faults import FAULT_LSO_IGNORES_OPEN_TRANSACTIONS
from tidelog.testing.__main__ import main
from tidelog.testing.sim import SimParams, Simulation, SimulationFailure
from tidelog.testing.sim.checkers.commits import CommitHistory
from tidelog.testing.sim.checkers.transactions import TransactionAnomalies
from tidelog.testing.sim.failure import Violations

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
