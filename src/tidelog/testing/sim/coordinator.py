"""The simulated transaction coordinator of transactions that span partitions
(SimParams.transaction_partitions), in the real coordinator's order
(node/transaction_coordinator.py, replication/metadata_transactions.py): its decision first,
a durable record (the metadata log's PrepareCommit / PrepareAbort), then the marker asked of
the leader of each of the transaction's partitions, each ask re-sent until that partition's
marker is committed there (acks=all); once every partition has it, the decision is complete
(TxnComplete). A marker is asked again after every fault that loses its ask: a partition
leader's change or crash (which fails the ask's wait), or the coordinator's own fail-over (a
new coordinator keeps the durable decisions, forgets every answer in flight, and asks every
partition of each incomplete decision again; a partition that already has the marker appends
it once more, which ends an empty transaction). A re-send while the leader's append is in
flight is answered by that append on a node (no second one), so here the ask simply stays in
flight until answered.

With FAULT_MARKER_TO_FIRST_PARTITION_ONLY the coordinator asks only the transaction's first
partition and completes the decision once that one has its marker."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tidelog.record.markers import build_marker
from tidelog.replication.faults import FAULT_MARKER_TO_FIRST_PARTITION_ONLY
from tidelog.testing.sim.cluster import Cluster
from tidelog.testing.sim.nodes import Waiter
from tidelog.testing.sim.transactions import owe, propose_transactional


@dataclass
class Decision:
    """A transaction's outcome as the coordinator recorded it (durable: kept through its
    fail-overs), and what the current coordinator heard of its markers (lost with it)."""

    producer_id: int
    commit: bool
    partitions: tuple[int, ...]
    complete: bool = False
    confirmed: set[int] = field(default_factory=set)  # partitions whose marker is committed
    asked: set[int] = field(default_factory=set)  # partitions whose ask is in flight


@dataclass
class MarkerCounts:
    decided_commit: int = 0
    decided_abort: int = 0
    completed: int = 0
    asks: int = 0
    fail_overs: int = 0


class Coordinator:
    def __init__(
        self,
        partitions: Sequence[Cluster],
        rng: random.Random,
        faults: frozenset[str],
        log_event: Callable[[str], None],
    ) -> None:
        self.partitions = partitions
        self.rng = rng
        self.first_only = FAULT_MARKER_TO_FIRST_PARTITION_ONLY in faults
        self.log_event = log_event
        self.decisions: dict[int, Decision] = {}  # producer id -> its decision (durable)
        # id(waiter) -> (the decision, the partition, the waiter: kept, so the id stays its own)
        self.in_flight: dict[int, tuple[Decision, int, Waiter]] = {}
        self.counts = MarkerCounts()

    @property
    def idle(self) -> bool:
        """Every decision complete."""
        return all(d.complete for d in self.decisions.values())

    def decide(self, producer_id: int, commit: bool, partitions: tuple[int, ...]) -> None:
        """The transaction's end, recorded before any marker is asked."""
        if producer_id in self.decisions:
            return  # decided once
        self.decisions[producer_id] = Decision(producer_id, commit, partitions)
        if commit:
            self.counts.decided_commit += 1
        else:
            self.counts.decided_abort += 1
        what = "commit" if commit else "abort"
        self.log_event(f"txn {producer_id} decided {what} over partitions {list(partitions)}")

    def fail_over(self) -> None:
        """The coordinator's process dies and another takes over from the durable decisions:
        answers in flight are lost, and every partition is asked again."""
        self.in_flight.clear()
        for decision in self.decisions.values():
            decision.confirmed.clear()
            decision.asked.clear()
        self.counts.fail_overs += 1
        self.log_event("txn coordinator fails over")

    def act(self, now: int) -> None:
        """Ask the markers not yet committed and not in flight."""
        for decision in self.decisions.values():
            if decision.complete:
                continue
            targets = decision.partitions[:1] if self.first_only else decision.partitions
            for partition in targets:
                if partition not in decision.confirmed and partition not in decision.asked:
                    self._ask(decision, partition, now)

    def _ask(self, decision: Decision, partition: int, now: int) -> None:
        cluster = self.partitions[partition]
        batch = build_marker(
            decision.producer_id, 0, commit=decision.commit, coordinator_epoch=0, now_ms=now
        )
        waiter = propose_transactional(
            cluster, self.rng, batch, b"marker-%d.p%d" % (decision.producer_id, partition)
        )
        if waiter is None:
            return  # nobody leads there now: asked again next tick
        decision.asked.add(partition)
        self.counts.asks += 1
        self.in_flight[id(waiter)] = (decision, partition, waiter)
        owe(cluster, waiter)

    def acknowledged(self, acked: list[Waiter], failed: list[Waiter]) -> None:
        for waiters, ok in ((acked, True), (failed, False)):
            for waiter in waiters:
                found = self.in_flight.pop(id(waiter), None)
                if found is None:
                    continue
                decision, partition, _ = found
                decision.asked.discard(partition)
                if not ok:
                    continue  # asked again next tick
                decision.confirmed.add(partition)
                targets = decision.partitions[:1] if self.first_only else decision.partitions
                if not decision.complete and all(p in decision.confirmed for p in targets):
                    decision.complete = True
                    self.counts.completed += 1
                    self.log_event(f"txn {decision.producer_id} complete")
