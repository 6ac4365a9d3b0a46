"""A seed's run with transactions spanning partitions (SimParams.transaction_partitions = N):
N partitions, each its own replica group on its own simulated nodes (a `Simulation`: the real
core under the seed's nemesis, with its plain producers, readers and cursors, and every
single-group checker), stepped in lockstep on one clock; beside them the transaction
coordinator (coordinator.py, which may fail over), the producers of transactions over two or
three partitions and the read_committed readers of every partition (spanning.py).

The safety phase runs them all with faults; the liveness phase heals every group, the
coordinator aborts what the producers left open, and the run waits until every group
converged and every decision is complete; then every reader reads every partition up to its
leader's LSO, and the checks run: each group's final checks, each partition's transaction
checker, and atomic visibility across partitions (checkers/atomicity.py).

Partition 0's group draws the seed's own random stream, the others their own; the
coordinator and the spanning clients draw a stream of their own too."""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Callable
from typing import NoReturn

from tidelog.testing.sim.checkers.atomicity import CrossPartitionAtomicity, PartitionView
from tidelog.testing.sim.checkers.derived_state import check_derived_transactions
from tidelog.testing.sim.cluster import DeliveryObserver
from tidelog.testing.sim.coordinator import Coordinator
from tidelog.testing.sim.nodes import Waiter
from tidelog.testing.sim.params import SimParams
from tidelog.testing.sim.runner import Simulation
from tidelog.testing.sim.spanning import SpanningProducers, SpanningReaders
from tidelog.testing.sim.stats import Stats


class PartitionGroup(Simulation):
    """One partition's replica group: a Simulation whose acknowledgements also reach the
    coordinator and the spanning producers."""

    def __init__(
        self,
        params: SimParams,
        run: PartitionedSimulation,
        trace: Callable[[str], None] | None = None,
        observe: DeliveryObserver | None = None,
    ) -> None:
        self.spanning = run  # set first: starting the nodes may acknowledge already
        super().__init__(params, trace, observe)

    def acknowledge(self, acked: list[Waiter], failed: list[Waiter]) -> None:
        super().acknowledge(acked, failed)
        self.spanning.acknowledged(acked, failed)


def _prefixed(trace: Callable[[str], None] | None, partition: int) -> Callable[[str], None] | None:
    if trace is None:
        return None
    return lambda line: trace(f"p{partition} {line}")


class PartitionedSimulation:
    def __init__(
        self,
        params: SimParams,
        trace: Callable[[str], None] | None = None,
        observe: DeliveryObserver | None = None,
    ) -> None:
        self.params = params
        self.trace = trace
        self.digest = hashlib.sha256()
        self.rng = random.Random(params.seed ^ 0x7A45)
        # Filled below: the coordinator and the producers see every group once it is started.
        self.groups: list[PartitionGroup] = []
        self.coordinator = Coordinator(self.groups, self.rng, params.faults, self.log_event)
        self.producers = SpanningProducers(self.groups, self.rng, self.coordinator)
        for k in range(params.transaction_partitions):
            self.groups.append(
                PartitionGroup(
                    dataclasses.replace(params, partition=k), self, _prefixed(trace, k), observe
                )
            )
        self.readers = SpanningReaders(self.groups, self.rng)
        self.atomicity = CrossPartitionAtomicity(self.groups[0].checkers.violations)

    @property
    def now(self) -> int:
        return self.groups[0].now

    def log_event(self, line: str) -> None:
        self.digest.update(line.encode())
        if self.trace is not None:
            self.trace(f"   {self.now:6d} {line}")

    def acknowledged(self, acked: list[Waiter], failed: list[Waiter]) -> None:
        self.producers.acknowledged(acked, failed)
        self.coordinator.acknowledged(acked, failed)

    def step(self, clients: bool = True) -> None:
        """One tick of every group, then the spanning clients and the coordinator."""
        for group in self.groups:
            group.step(clients)
        if clients:
            self.producers.act()
            self.readers.act()
        crash_rate = self.params.crash_rate  # the coordinator's node crashes as often as any
        if self.groups[0].faults_on and crash_rate and self.rng.random() < crash_rate:
            self.coordinator.fail_over()
        self.coordinator.act(self.now)
        for group in self.groups:
            group.raise_deferred()

    def converged(self) -> bool:
        return all(g.converged() for g in self.groups) and self.coordinator.idle

    def run(self) -> Stats:
        for _ in range(self.params.safety_ticks):
            self.step()
        for group in self.groups:
            group.checkers.check_log_matching()
            group.heal()
        self.producers.abort_open()
        budget = max(g.liveness_budget() for g in self.groups)
        for i in range(budget):
            self.step(clients=False)
            if self.converged():
                for group in self.groups:
                    group.stats.converged_after = i + 1
                break
        else:
            self._fail_liveness(budget)
        self.check_final()
        return self.stats()

    def _fail_liveness(self, budget: int) -> NoReturn:
        for group in self.groups:
            if not group.converged():
                states = {n: group.describe_node(n) for n in group.nodes}
                group.fail(
                    f"liveness: partition {group.params.partition}: no convergence within "
                    f"{budget} ticks after healing: {states}"
                )
        pending = sorted(p for p, d in self.coordinator.decisions.items() if not d.complete)
        self.groups[0].fail(
            f"liveness: transactions {pending} not complete within {budget} ticks after healing"
        )

    def check_final(self) -> None:
        for group in self.groups:
            group.check_final()
        lsos = self.readers.drain()
        for group in self.groups:
            group.checkers.transactions.check_final()
            if group.workload.transactions is None:  # (else its own check_final did)
                leader = group.leading()[0]
                check_derived_transactions(group.members(leader), group.checkers.violations)
        views = [
            PartitionView(g.checkers.history, g.checkers.transactions.sessions, lso)
            for g, lso in zip(self.groups, lsos, strict=True)
        ]
        decisions = {p: d.commit for p, d in self.coordinator.decisions.items()}
        self.atomicity.check_final(views, decisions, self.producers.acked)

    def stats(self) -> Stats:
        """The groups' stats, summed (converged_after: the run's)."""
        total = Stats()
        for group in self.groups:
            for f in dataclasses.fields(Stats):
                if f.name != "converged_after":
                    setattr(total, f.name, getattr(total, f.name) + getattr(group.stats, f.name))
        total.converged_after = self.groups[0].stats.converged_after
        return total
