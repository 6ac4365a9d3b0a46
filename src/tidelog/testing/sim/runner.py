"""A seed's run: the safety phase (the nemesis and the clients act on the cluster every tick,
with the checkers watching), then the liveness phase (every fault healed, no clients) in which
a leader must emerge, finish any membership change, and every member must converge to the same
committed log; then the final checks. (seeds.py's `run_seed` is what `python -m tidelog.testing`
runs.)"""

from __future__ import annotations

from collections.abc import Callable

from tidelog.invariant import InvariantBroken
from tidelog.replication.faults import FAULT_ACKS_REGISTERED_LATE
from tidelog.testing.sim.checkers.convergence import check_converged
from tidelog.testing.sim.checkers.derived_state import check_derived_transactions
from tidelog.testing.sim.checkers.linearizable_reads import (
    READ_DRAIN_TICKS,
    check_linearizable_reads,
)
from tidelog.testing.sim.checkers.tables import check_tables
from tidelog.testing.sim.cluster import Cluster, DeliveryObserver
from tidelog.testing.sim.low_watermark import clean
from tidelog.testing.sim.nemesis import Nemesis
from tidelog.testing.sim.nodes import Waiter
from tidelog.testing.sim.params import SimParams
from tidelog.testing.sim.stats import Stats
from tidelog.testing.sim.workload import Workload


class Simulation(Cluster):
    def __init__(
        self,
        params: SimParams,
        trace: Callable[[str], None] | None = None,
        observe: DeliveryObserver | None = None,
    ) -> None:
        self.nemesis = Nemesis(self)
        self.workload = Workload(self, params)
        super().__init__(params, trace, observe)

    def propose(self, node_id: int, value: bytes, acks: str) -> int | None:
        """A producer's request to one node: the offset it got, or None if refused."""
        return self.workload.propose(node_id, value, acks)

    def acknowledge(self, acked: list[Waiter], failed: list[Waiter]) -> None:
        super().acknowledge(acked, failed)
        self.workload.acknowledged(acked, failed)

    def step(self, clients: bool = True) -> None:
        """One tick: faults, the nodes' turns, deliveries, flushes, clients, a cleaner pass."""
        self.now += 1
        if self.faults_on:
            self.nemesis.act()
        self.tick_nodes()
        self.deliver_due()
        self.complete_flushes()
        if self.replaced:
            self._readmitted()
        self.workload.settle()
        if clients:
            self.workload.act()
        if self.params.clean_every and self.now % self.params.clean_every == 0:
            clean(self)
        self.raise_deferred()

    def heal(self) -> None:
        """The liveness phase begins: no more faults, every node up and reachable."""
        self.faults_on = False
        self.blocked.clear()
        for node in self.nodes.values():
            node.paused_until = 0
            if not node.alive:
                self._start(node.node_id)

    def converged(self) -> bool:
        leaders = self.leading()
        if len(leaders) != 1:
            return False
        leader = leaders[0]
        owed = leader.driver.owed.awaiting_commit if leader.driver is not None else 0
        if owed and FAULT_ACKS_REGISTERED_LATE not in self.params.faults:
            return False
        replica = leader.replica
        if replica is None:
            raise InvariantBroken("replica is not None")
        if replica.committed_membership != replica.history.current:
            return False  # a membership change still under way
        if self.target is not None and (
            replica.learners or tuple(sorted(replica.voters)) != self.target
        ):
            return False
        leo = leader.log.log_end_offset
        # Log starts may differ: a follower that had to start over may have discarded more.
        return all(
            n.log.log_end_offset == leo and n.log.high_watermark == leo and n.alive
            for n in self.members(leader)
        )

    def check_final(self) -> None:
        self.stats.snapshots_taken += sum(
            n.machine.snapshots_taken for n in self.nodes.values() if n.machine is not None
        )
        leaders = self.leading()
        if len(leaders) != 1:
            self.fail(f"liveness: {len(leaders)} leaders after healing")
        members = self.members(leaders[0])
        self.stats.membership_changes = max(
            len(n.replica.history.entries) for n in members if n.replica is not None
        )
        check_converged(leaders[0], members, self.acked, self.checkers.violations)
        self.checkers.check_log_matching()
        if self.params.state_machine:
            check_tables(
                leaders[0].log.high_watermark,
                self.members_now(),
                self.checkers.history,
                self.checkers.violations,
            )
        if self.workload.transactions is not None:
            self.checkers.transactions.check_final()
            check_derived_transactions(members, self.checkers.violations)
        if self.workload.tables is not None:
            check_linearizable_reads(
                self.workload.tables.operations(),
                self.workload.tables.unanswered(),
                self.checkers.violations,
            )

    def liveness_budget(self) -> int:
        """Ticks the liveness phase may take to converge."""
        budget = self.params.liveness_ticks
        if self.params.fetch_max_bytes < 1000:
            # One batch per round trip: catching up takes time proportional to the lag.
            longest = max(n.log.log_end_offset for n in self.nodes.values())
            budget += 2 * (self.params.delay_max + 2) * longest
            # And a snapshot comes fetch_max_bytes at a time (one byte, in some seeds), each
            # lost chunk asked again after a retry.
            snapshot = max((n.snapshots.largest for n in self.nodes.values()), default=0)
            budget += (
                (2 * (self.params.delay_max + 2) + 15) * snapshot // self.params.fetch_max_bytes
            )
        return budget

    def run(self) -> Stats:
        for _ in range(self.params.safety_ticks):
            self.step()
        self.checkers.check_log_matching()
        self.heal()
        budget = self.liveness_budget()
        for i in range(budget):
            self.step(clients=False)
            if self.converged():
                self.stats.converged_after = i + 1
                break
        else:
            states = {n: self.describe_node(n) for n in self.nodes}
            self.fail(f"liveness: no convergence within {budget} ticks after healing: {states}")
        tables = self.workload.tables
        if tables is not None:
            for _ in range(READ_DRAIN_TICKS):
                if not tables.waiting:
                    break
                self.step(clients=False)  # the reads still waiting are answered or fail
        self.check_final()
        return self.stats
