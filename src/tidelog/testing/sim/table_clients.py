"""The table's clients, in state-machine seeds: a few clients write unique values to a few keys
(acks=all, on a node that believes it leads) and read keys through the partition driver's
linearizable read (read_index.py; some with the lease, some sent to any node to meet
NotLeader). Each operation is recorded as the client saw it, with its call and return ticks,
for the linearizability checker (checkers/linearizable_reads.py):

  - a write returns when it is acknowledged; one whose leadership ended after it was appended,
    or whose node crashed, has no return (its outcome is unknown), and its client goes on under
    a new id, as a Jepsen process does after an indeterminate operation;
  - a write refused at once (NotLeader) is not recorded;
  - a read returns when its node answers: with its table's value for the key, once the table
    has applied at least the read's index;
  - a read that fails (its leadership ended, NotLeader, its node crashed) is not recorded.

Each client has at most one operation outstanding. Their draws come from a random stream of
their own, so the cluster's stream is untouched: seeds without a table run as they always did.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from tidelog.errors import NotLeader
from tidelog.replication.driver import PartitionDriver
from tidelog.testing.linearizability import READ, WRITE, Operation
from tidelog.testing.sim.cluster import Cluster
from tidelog.testing.sim.nodes import SimNode, Waiter
from tidelog.testing.sim.params import ELECTION_TIMEOUT_TICKS, SimParams

# Keys of their own: the producers' records (keys k0..k6) are not in the history.
KEYS = (b"lin0", b"lin1", b"lin2")
# A lease shorter than the election timeout by a margin (read_index.py). The simulator's clocks
# run at one rate, and a paused node's clock runs on as a process's monotonic clock does (a
# leader paused past its lease resumes knowing it), so lease reads are held to linearizability
# like the others, under pauses too. (With SimParams.clock_stops_when_paused, seed 191 with
# forced pauses, partitions and lease reads reads a stale value: tests/test_replication.py.)
LEASE_TICKS = ELECTION_TIMEOUT_TICKS * 4 // 5
ANY_NODE_SHARE = 0.2  # reads sent to any live node, leader or not

# A producer's request to one node: (node, value, acks, key) -> the offset, or None if refused.
Propose = Callable[[int, bytes, str, bytes], "int | None"]


@dataclass
class _Call:
    """An operation called and not yet returned."""

    client: int
    key: bytes
    tick: int


@dataclass
class _Read(_Call):
    node: SimNode
    driver: PartitionDriver[Waiter]  # the node's driver when called: a crash ends the read
    epoch: int  # the leadership it was called in
    read_index: int = -1  # once confirmed: the index its node's table must have applied


class TableClients:
    def __init__(self, cluster: Cluster, params: SimParams, propose: Propose) -> None:
        self.cluster = cluster
        self.propose = propose
        self.rng = random.Random(params.seed ^ 0x7AB1E)
        self.rate = self.rng.uniform(0.02, 0.2)  # chance per tick that an idle client calls
        self.write_share = self.rng.uniform(0.2, 0.6)
        self.lease_share = self.rng.choice([0.0, 0.3, 0.7])
        if params.lease_share is not None:
            self.lease_share = params.lease_share
        self.idle = list(range(self.rng.choice([2, 3, 5])))
        self.next_client = len(self.idle)
        self.next_value = 0
        self.writes: dict[bytes, _Call] = {}  # value -> its write, until acknowledged or failed
        self.unconfirmed: dict[int, _Read] = {}  # reads called, not yet confirmed nor failed
        self.confirmed: list[_Read] = []  # reads waiting for their table to apply their index
        self.history: list[Operation] = []  # the operations returned, and writes of unknown fate
        self.reads_called = 0
        self.lease_reads = 0
        self.not_leader = 0
        self.longest_read = 0  # ticks from a read's call to its answer, at most

    # -- calls ----------------------------------------------------------------------------------

    def act(self) -> None:
        """This tick's calls: each idle client may call a write or a read."""
        for client in list(self.idle):
            if self.rng.random() < self.rate:
                key = self.rng.choice(KEYS)
                if self.rng.random() < self.write_share:
                    self._write(client, key)
                else:
                    self._read(client, key)

    def _serving(self) -> tuple[list[SimNode], list[SimNode]]:
        """The nodes a client can reach now (live, not paused), and those that believe they
        lead."""
        now = self.cluster.now
        live = [n for n in self.cluster.nodes.values() if n.alive and n.paused_until <= now]
        return live, [n for n in live if n.replica is not None and n.replica.is_leader]

    def _write(self, client: int, key: bytes) -> None:
        _, leaders = self._serving()
        if not leaders:
            return
        node = self.rng.choice(leaders)
        value = b"t%d" % self.next_value
        self.next_value += 1
        self.idle.remove(client)
        # Registered before the proposal: its acknowledgement may come at once.
        self.writes[value] = _Call(client, key, self.cluster.now)
        if self.propose(node.node_id, value, "all", key) is None:
            del self.writes[value]  # refused before anything was appended: not recorded
            self.idle.append(client)

    def _read(self, client: int, key: bytes) -> None:
        live, leaders = self._serving()
        pool = leaders if leaders and self.rng.random() >= ANY_NODE_SHARE else live
        if not pool:
            return
        node = self.rng.choice(pool)
        lease = LEASE_TICKS if self.rng.random() < self.lease_share else 0
        if node.driver is None or node.replica is None:
            return
        self.idle.remove(client)
        read = _Read(client, key, self.cluster.now, node, node.driver, node.replica.epoch)
        self.reads_called += 1
        serial = self.reads_called
        # Registered before the call: a lease (or a single voter) confirms it at once.
        self.unconfirmed[serial] = read
        try:
            node.driver.read(functools.partial(self._answered, serial), lease)
        except NotLeader:
            del self.unconfirmed[serial]
            self.not_leader += 1
            self.idle.append(client)
            return
        if lease:
            self.lease_reads += 1

    # -- returns --------------------------------------------------------------------------------

    def acknowledged(self, acked: list[Waiter], failed: list[Waiter]) -> None:
        """Producers answered (cluster.acknowledge): the table clients' writes among them."""
        for w in acked:
            call = self.writes.pop(w.value, None)
            if call is not None:
                self._returned(call, WRITE, w.value)
        for w in failed:
            call = self.writes.pop(w.value, None)
            if call is not None:
                self.history.append(
                    Operation(call.client, call.key, WRITE, w.value, call.tick, None)
                )
                self.idle.append(self.next_client)  # the client goes on under a new id
                self.next_client += 1

    def _answered(self, serial: int, read_index: int | None) -> None:
        read = self.unconfirmed.pop(serial)
        if read_index is None:  # the leadership ended first, or the node stopped
            self.idle.append(read.client)
            return
        read.read_index = read_index
        self.confirmed.append(read)
        self.settle()

    def settle(self) -> None:
        """Answer the confirmed reads whose table has applied their read index (every tick:
        a table that lags its read's index catches up later)."""
        waiting: list[_Read] = []
        for read in self.confirmed:
            node = read.node
            table = node.table
            if node.driver is not read.driver or table is None:
                self.idle.append(read.client)  # the node crashed before it answered
            elif table.applied_offset >= read.read_index:
                self.longest_read = max(self.longest_read, self.cluster.now - read.tick)
                self._returned(read, READ, table.get(read.key))
            else:
                waiting.append(read)
        self.confirmed = waiting

    def _returned(self, call: _Call, kind: Literal["read", "write"], value: bytes | None) -> None:
        self.history.append(
            Operation(call.client, call.key, kind, value, call.tick, self.cluster.now)
        )
        self.idle.append(call.client)

    def operations(self) -> list[Operation]:
        """The history at the end of the run: writes still unanswered have no return; reads
        still unanswered tell nothing and are left out."""
        unknown = [
            Operation(call.client, call.key, WRITE, value, call.tick, None)
            for value, call in self.writes.items()
        ]
        return self.history + unknown

    @property
    def waiting(self) -> bool:
        """Some read is neither answered nor failed yet."""
        return bool(self.unconfirmed or self.confirmed)

    def unanswered(self) -> list[str]:
        """The reads still waiting, each with what its leader knows of its rounds."""
        out: list[str] = []
        for read in [*self.unconfirmed.values(), *self.confirmed]:
            replica = read.driver.replica
            state = (
                f"confirmed at read index {read.read_index}, its table applied to "
                f"{read.node.table.applied_offset if read.node.table is not None else None}"
                if read.read_index >= 0
                else f"round {replica.reads.round}, confirmed round "
                f"{replica.reads.confirmed_round}, reads waiting for a round: "
                f"{replica.reads.needs_round}"
            )
            out.append(
                f"a read of {read.key!r} called at tick {read.tick} on node {read.node.node_id} "
                f"(leader in epoch {read.epoch}; now {replica.role.value} in epoch "
                f"{replica.epoch}, HW {replica.log.high_watermark}, epoch start "
                f"{replica.epoch_start_offset}, {state}) is unanswered"
            )
        return out
