"""One seed's run as `python -m tidelog.testing` runs it: one replica group (runner.py's
`Simulation`), or with transactions over several partitions, a group per partition
(partitions.py); an assertion inside the run is named by the property a checker saw broken
first, with the command that replays the seed."""

from __future__ import annotations

from collections.abc import Callable

from tidelog.testing.sim.checkers import Checkers
from tidelog.testing.sim.failure import SimulationFailure
from tidelog.testing.sim.params import SimParams
from tidelog.testing.sim.partitions import PartitionedSimulation
from tidelog.testing.sim.runner import Simulation
from tidelog.testing.sim.stats import Stats


def run_seed(
    seed: int,
    faults: frozenset[str] = frozenset(),
    trace: Callable[[str], None] | None = None,
    transactions: bool = False,
    transaction_partitions: int = 1,
    delete_records: bool = False,
) -> Stats:
    params = SimParams.from_seed(seed, faults, transactions, transaction_partitions, delete_records)
    if transaction_partitions > 1:
        spanning = PartitionedSimulation(params, trace)
        return _named_failure(params, spanning.run, [g.checkers for g in spanning.groups])
    sim = Simulation(params, trace)
    return _named_failure(params, sim.run, [sim.checkers])


def _named_failure(params: SimParams, run: Callable[[], Stats], checkers: list[Checkers]) -> Stats:
    """run(), an assertion inside it named by the property a checker saw broken first."""
    seed = params.seed
    try:
        return run()
    except SimulationFailure:
        raise
    except AssertionError as exc:
        deferred = [why for c in checkers for why in c.violations.deferred]
        if deferred:  # a checker saw it first: name the property, not the assertion
            raise SimulationFailure(
                f"seed {seed} tick {checkers[0].violations.clock()}: {deferred[0]}\n"
                f"replay: {params.replay_command()}"
            ) from exc
        # An assertion inside the real core (an invariant on its own state) tripped.
        raise SimulationFailure(
            f"seed {seed} tick {checkers[0].violations.clock()}: assertion in the replication "
            f"core: {exc!r}\nreplay: {params.replay_command()}"
        ) from exc
