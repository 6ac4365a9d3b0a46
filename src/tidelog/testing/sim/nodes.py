"""A simulated node: its disk (a MemoryLog that shows the checkers what each truncation
removes), its snapshots, its durable quorum state and the production partition driver over it,
and what its driver owes producers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tidelog.config import TopicConfig
from tidelog.node.state_machine import StateMachineDriver, TableMachine
from tidelog.record.batch import BatchHeader
from tidelog.replication.driver import PartitionDriver
from tidelog.replication.liveness import Liveness
from tidelog.replication.replica import QuorumState, Replica
from tidelog.replication.table import TableState
from tidelog.storage.memory_log import MemoryFlush, MemoryLog
from tidelog.storage.memory_snapshot import MemorySnapshotStore


class SimLog(MemoryLog):
    """A node's disk: a MemoryLog that shows the checkers what each truncation removes (a
    crash, which loses only what was never flushed, is not one)."""

    def __init__(
        self,
        config: TopicConfig,
        clock_ms: Callable[[], int],
        on_truncate: Callable[[int, list[tuple[BatchHeader, bytes]]], None],
    ) -> None:
        super().__init__(config, clock_ms=clock_ms)
        self._on_truncate = on_truncate
        self._crashing = False

    def truncate_to(self, offset: int) -> None:
        if not self._crashing and offset < self.log_end_offset:
            self._on_truncate(offset, self.batches_between(offset, self.log_end_offset))
        super().truncate_to(offset)

    def crash(self) -> None:
        self._crashing = True
        try:
            super().crash()
        finally:
            self._crashing = False


@dataclass
class Waiter:
    """A producer waiting for its acknowledgement: what a node's driver owes it."""

    node: int
    epoch: int
    last_offset: int
    value: bytes
    acks: str
    # A transaction's batch or marker: the transaction checker judges what became of it
    # (checkers/transactions.py), not the acks=all check.
    transactional: bool = False


@dataclass
class SimNode:
    node_id: int
    log: SimLog
    snapshots: MemorySnapshotStore
    state: QuorumState = field(default_factory=QuorumState)
    driver: PartitionDriver[Waiter] | None = None
    machine: StateMachineDriver | None = None
    flush: tuple[MemoryFlush, int] | None = None
    paused_until: int = 0
    checked_upto: int = 0
    led_epoch: int = -1  # the epoch this node last led
    directory: str = ""  # its data directory's id: a new one after its disk is replaced
    # Every voter's directory as formatted with the cluster (KIP-853's initial voters); a
    # replaced disk knows none.
    known_directories: dict[int, str] = field(default_factory=dict)
    liveness: Liveness | None = None  # a new one at every start: it knows no peer at first
    deadline: int | None = None  # sparse ticks: when its replica is next due (after each act)
    incarnation: int = 0

    @property
    def replica(self) -> Replica | None:
        return self.driver.replica if self.driver is not None else None

    @property
    def alive(self) -> bool:
        return self.driver is not None

    @property
    def table(self) -> TableState | None:
        machine = self.machine.machine if self.machine is not None else None
        return machine.state if isinstance(machine, TableMachine) else None


class ReplicaTicks:
    """A node's liveness keeps its replica's time (which stands still while it is paused)."""

    def __init__(self, node: SimNode) -> None:
        self.node = node

    @property
    def ticks(self) -> int:
        replica = self.node.replica
        return replica.now if replica is not None else 0
