"""The simulated cluster: its nodes, each the production partition driver and `Replica` over a
`SimLog`, started, crashed, restarted and given a new disk; the network between them; the
clock (one tick is one millisecond); the driver's effects as the node carries them out (quorum
state, messages, flushes, acknowledgements, cursor invalidations); and the event log a seed's
trace prints. Every step of a node goes past the checkers.

A subclass adds what acts on the cluster: the nemesis and the workload (runner.py's
`Simulation`), or a script's commands (scenario.py's `Scenario`)."""

from __future__ import annotations

import functools
import hashlib
import random
from collections.abc import Callable
from typing import NoReturn

from tidelog.invariant import InvariantBroken
from tidelog.node.state_machine import StateMachineDriver, TableMachine
from tidelog.replication.driver import PartitionDriver
from tidelog.replication.liveness import Heartbeat, Liveness
from tidelog.replication.messages import Message
from tidelog.replication.replica import QuorumState, Ready, Replica, ReplicaConfig, Role
from tidelog.storage.memory_snapshot import MemorySnapshotStore
from tidelog.testing.sim.checkers import Checkers
from tidelog.testing.sim.cursors import SimCursor
from tidelog.testing.sim.network import InFlight, SimNetwork
from tidelog.testing.sim.nodes import ReplicaTicks, SimLog, SimNode, Waiter
from tidelog.testing.sim.params import (
    ELECTION_TIMEOUT_TICKS,
    LIVENESS_INTERVAL_TICKS,
    LIVENESS_TIMEOUT_TICKS,
    SimParams,
)
from tidelog.testing.sim.stats import Stats

# Sees every message as it is handed to a node, heartbeats too: (tick, src, dst, the sender's
# directory, message). It only watches (tests/test_sim_replay.py hashes what it sees).
DeliveryObserver = Callable[[int, int, int, str, Message | Heartbeat], None]


class SimEffects:
    """The partition driver's effects in the simulator: a model of the node's IO."""

    def __init__(self, cluster: Cluster, node: SimNode) -> None:
        self.cluster = cluster
        self.node = node

    def persist(self, state: QuorumState) -> None:
        self.node.state = state  # durable before any message leaves

    def send(self, to: int, message: Message) -> None:
        self.cluster.send(self.node.node_id, to, message, self.node.directory)

    def start_flush(self) -> None:
        node = self.node
        if node.flush is None:
            job = node.log.begin_flush()
            if job is not None:
                delay = self.cluster.rng.randint(0, self.cluster.params.flush_delay_max)
                node.flush = (job, self.cluster.now + delay)

    def acknowledge(self, acked: list[Waiter], failed: list[Waiter]) -> None:
        self.cluster.acknowledge(acked, failed)

    def committed(self) -> None:
        pass

    def wake(self) -> None:
        pass

    def rolled(self) -> None:
        self.cluster.stats.segments_rolled += 1

    def invalidate_cursor(self, name: str, reason: str) -> None:
        self.cluster.invalidate_cursor(self.node, name, reason)

    def handled(self, ready: Ready) -> None:
        self.cluster.after_ready(self.node, ready)


class Cluster:
    def __init__(
        self,
        params: SimParams,
        trace: Callable[[str], None] | None = None,
        observe: DeliveryObserver | None = None,
    ) -> None:
        self.params = params
        # Each partition's group its own stream (partition 0's is the seed's, as it always was).
        self.rng = random.Random((params.seed ^ 0x5EED) + (params.partition << 48))
        self.now = 0
        self.voter_ids = list(range(1, params.nodes + 1))
        self.learner_ids = list(range(params.nodes + 1, params.nodes + 1 + params.learners))
        first_spare = params.nodes + params.learners + 1
        self.spare_ids = list(range(first_spare, first_spare + params.spares))
        self.node_ids = self.voter_ids + self.learner_ids + self.spare_ids
        self.target: tuple[int, ...] | None = None  # the voters the metadata wants (reassigned)
        self.config = params.topic_config()
        self.nodes: dict[int, SimNode] = {}
        self.checkers = Checkers(params, self.config, lambda: self.now, self.nodes)
        initial = {n: f"d{n}.0" for n in self.node_ids}
        for n in self.node_ids:
            self.nodes[n] = SimNode(
                n,
                self._new_log(n),
                MemorySnapshotStore(self.config.snapshot_retain),
                directory=initial[n],
                known_directories=dict(initial),
            )
        self.replaced: set[int] = set()  # wiped, and not yet admitted again by a leader
        self.network = SimNetwork(params, self.rng)
        self.faults_on = True
        self.stats = Stats()
        self.trace = trace
        self.observe = observe
        self.digest = hashlib.sha256()
        self.acked: dict[bytes, int] = {}
        self.acked_one: dict[bytes, int] = {}
        # Durable cursors (as the metadata log holds them) that the cleaner must respect.
        self.cursors = [SimCursor(f"c{i}", backup=i == 2) for i in range(params.cursors)]
        for n in self.node_ids:
            self._start(n)

    @property
    def blocked(self) -> set[tuple[int, int]]:
        """The links a partition cut, as (src, dst)."""
        return self.network.blocked

    # -- the nodes ------------------------------------------------------------------------------

    def replica_config(self, node_id: int) -> ReplicaConfig:
        return ReplicaConfig(
            node_id=node_id,
            voters=tuple(self.voter_ids),
            learners=tuple(self.learner_ids),
            election_timeout_ticks=ELECTION_TIMEOUT_TICKS,
            election_jitter_ticks=20,
            fetch_max_wait_ticks=5,
            fetch_retry_ticks=15,
            check_quorum_ticks=40,
            replica_lag_ticks=40,
            fetch_max_bytes=self.params.fetch_max_bytes,
            hw_policy=self.params.hw_policy,
            replica_max_lag_ticks=self.params.replica_max_lag_ticks,
            directory_id=self.nodes[node_id].directory,
            faults=self.params.faults,
            state_machine=self.params.state_machine,
        )

    def _new_log(self, node_id: int) -> SimLog:
        return SimLog(
            self.config,
            clock_ms=lambda: self.now,
            on_truncate=functools.partial(self.checkers.truncations.truncated, node_id),
        )

    def _start(self, node_id: int) -> None:
        node = self.nodes[node_id]
        seed = self.rng.getrandbits(32)
        node.machine = None
        if self.params.state_machine:
            node.machine = StateMachineDriver(
                f"sim/{node_id}",
                node.log,
                node.snapshots,
                TableMachine(),
                self.config.snapshot_entries,
                seed,
            )
        node.liveness = None
        if self.params.quiesce:
            node.incarnation += 1
            node.liveness = Liveness(
                node_id,
                node.incarnation,
                ReplicaTicks(node),
                LIVENESS_INTERVAL_TICKS,
                LIVENESS_TIMEOUT_TICKS,
            )
        replica = Replica(
            self.replica_config(node_id),
            node.log,
            node.state,
            random.Random(seed),
            node.machine,
            known_directories=node.known_directories,
            liveness=node.liveness,
        )
        node.driver = PartitionDriver(replica, node.log, SimEffects(self, node), node.machine)
        node.driver.set_target(self.target)
        if node.machine is not None:
            node.machine.catch_up()
        node.checked_upto = min(node.checked_upto, node.log.high_watermark)
        self.log_event(f"start {node_id} epoch={node.state.epoch} leo={node.log.log_end_offset}")
        self.process_ready(node)

    def crash(self, node_id: int) -> None:
        node = self.nodes[node_id]
        if not node.alive:
            return
        if node.driver is None:
            raise InvariantBroken("node.driver is not None")
        node.driver.stopped = True
        self.acknowledge([], node.driver.owed.fail_all())
        node.driver.fail_reads()
        node.driver = None
        if node.machine is not None:
            self.stats.snapshots_taken += node.machine.snapshots_taken
        node.flush = None
        node.paused_until = 0
        node.log.crash()
        node.snapshots.crash()
        node.checked_upto = min(node.checked_upto, node.log.high_watermark)
        self.stats.crashes += 1
        self.log_event(
            f"crash {node_id} leo={node.log.log_end_offset} hw={node.log.high_watermark}"
        )

    def wipe(self, node_id: int) -> None:
        """The node's disk is replaced: it comes back empty, under its old id, with a new
        directory id. At most one replaced disk at a time is not yet admitted again (any
        minority may lose its disks; a majority losing them loses data by definition)."""
        node = self.nodes[node_id]
        self.crash(node_id)
        node.log = self._new_log(node_id)
        node.snapshots = MemorySnapshotStore(self.config.snapshot_retain)
        node.state = QuorumState()
        node.known_directories = {}
        incarnation = int(node.directory.rpartition(".")[2]) + 1
        node.directory = f"d{node_id}.{incarnation}"
        node.checked_upto = 0
        self.replaced.add(node_id)
        self.stats.wipes += 1
        self.log_event(f"wipe {node_id} directory={node.directory}")

    def _readmitted(self) -> None:
        for n in sorted(self.replaced):
            directory = self.nodes[n].directory
            for other in self.nodes.values():
                r = other.replica
                if r is not None and r.is_leader and r.directories.get(n) == directory:
                    self.replaced.discard(n)
                    self.stats.readmitted += 1
                    self.log_event(f"readmitted {n}")
                    break

    def restart(self, node_id: int) -> None:
        if not self.nodes[node_id].alive:
            self._start(node_id)

    def set_target(self, target: tuple[int, ...]) -> None:
        """The metadata gives the group new target voters. Every replica hears of it at once,
        as every node applies the metadata log (when does not matter for safety: the walk
        does)."""
        self.target = target
        for node in self.nodes.values():
            if node.driver is not None:
                node.driver.set_target(self.target)

    def process_ready(self, node: SimNode) -> None:
        if node.driver is None:
            raise InvariantBroken("node.driver is not None")
        node.driver.process_ready()

    def after_ready(self, node: SimNode, ready: Ready) -> None:
        """The driver handled a Ready: count, and check the invariants."""
        replica = node.replica
        if replica is None:
            raise InvariantBroken("replica is not None")
        if ready.role_changed and replica.role is Role.LEADER:
            self.stats.elections += 1
            self.log_event(f"leader {node.node_id} epoch={replica.epoch} voters={replica.voters}")
            self.checkers.new_leader(node)
        if ready.snapshot_installed >= 0:
            self.stats.snapshots_installed += 1
            self.log_event(f"snapshot {ready.snapshot_installed} installed on {node.node_id}")
        # A leader may advance its HW and step down in one step (a tick that also fails its
        # check-quorum): that HW was still declared by a leader.
        self.checkers.check_node(node, led=ready.lost_leadership)

    def tick_nodes(self) -> None:
        """Every live node that is not paused takes its turn of this tick."""
        for n in self.node_ids:
            node = self.nodes[n]
            if node.driver is not None and node.paused_until > self.now:
                # A paused process's monotonic clock runs on (replication/clock.py): it
                # resumes knowing how long it slept, as a node stopped by SIGSTOP or a GC does.
                if not self.params.clock_stops_when_paused:
                    node.driver.replica.elapse()
            elif node.driver is not None:
                if node.liveness is not None:
                    self._liveness(node)
                if self.params.sparse_ticks:
                    # As the node's loop does: the deadline computed after the last act (a
                    # replica's next_deadline() is always in its future when asked).
                    replica = node.driver.replica
                    replica.elapse()
                    due = node.deadline
                    if node.driver.dirty or (due is not None and due <= replica.now):
                        node.driver.act()
                        node.deadline = node.driver.next_deadline()
                else:
                    node.driver.tick()
                if self.now % 25 == 0:
                    node.log.write_state_checkpoint()

    def _liveness(self, node: SimNode) -> None:
        """The node's heartbeats to every other node, and its replica woken when a peer came
        alive, died or restarted (a node wakes the replicas it shares with that peer)."""
        liveness = node.liveness
        if not (liveness is not None and node.driver is not None):
            raise InvariantBroken("liveness is not None and node.driver is not None")
        if liveness.heartbeat_due():
            heartbeat = liveness.heartbeat()
            for other in self.node_ids:
                if other != node.node_id:
                    self.send(node.node_id, other, heartbeat)
        if liveness.changed():
            node.driver.nudge()

    def complete_flushes(self) -> None:
        for node in self.nodes.values():
            if node.flush is None or not node.alive or node.paused_until > self.now:
                continue
            job, due = node.flush
            if due > self.now:
                continue
            node.flush = None
            node.log.complete_flush(job)
            if node.driver is None:
                raise InvariantBroken("node.driver is not None")
            node.driver.flushed()

    # -- messages -------------------------------------------------------------------------------

    def send(self, src: int, dst: int, message: Message | Heartbeat, directory: str = "") -> None:
        if isinstance(message, Heartbeat):
            self.stats.heartbeats += 1
        else:
            self.stats.messages += 1
            self.checkers.votes.sent(src, dst, message, self.nodes[src].log)
        if not self.network.send(self.now, src, dst, directory, message, self.faults_on):
            self.stats.dropped += 1

    def deliver_due(self) -> None:
        held: list[InFlight] = []
        for item in self.network.due(self.now):
            _, _, src, dst, directory, message = item
            node = self.nodes[dst]
            if (src, dst) in self.network.blocked or not node.alive:
                self.stats.dropped += 1
                continue
            if node.paused_until > self.now:
                held.append(item._replace(due=node.paused_until))
                continue
            if node.driver is None:
                raise InvariantBroken("node.driver is not None")
            if self.observe is not None:
                self.observe(self.now, src, dst, directory, message)
            if isinstance(message, Heartbeat):
                if node.liveness is None:
                    raise InvariantBroken("node.liveness is not None")
                node.liveness.on_heartbeat(src, message)
                continue
            self.digest.update(
                f"{self.now}:{src}>{dst}:{type(message).__name__}:{message.epoch}".encode()
            )
            self.deliver_message(src, node, message, directory)
        self.network.hold(held)

    def deliver_message(self, src: int, node: SimNode, message: Message, directory: str) -> None:
        """Hand a message to a node's replica (what it asks of a voter is noted, so the vote
        checker can tell what each grant answered)."""
        if node.driver is None:
            raise InvariantBroken("node.driver is not None")
        self.checkers.votes.delivered(node.node_id, src, message)
        node.driver.step(src, message, directory)

    # -- what the cluster tells its clients -----------------------------------------------------

    def acknowledge(self, acked: list[Waiter], failed: list[Waiter]) -> None:
        self.stats.failed += len(failed)
        for w in acked:
            if w.transactional:
                self.log_event(f"ack {w.value.decode()}@{w.last_offset} via {w.node}")
            elif w.acks == "all":
                self._acknowledge(self.acked, w)
                self.stats.acked_all += 1
            else:
                self._acknowledge(self.acked_one, w)
                self.stats.acked_one += 1

    def _acknowledge(self, into: dict[bytes, int], w: Waiter) -> None:
        into[w.value] = w.last_offset
        self.log_event(f"ack{w.acks} {w.value.decode()}@{w.last_offset} via {w.node}")

    def invalidate_cursor(self, node: SimNode, name: str, reason: str) -> None:
        """The metadata log records the invalidation (at once, here)."""
        cursor = next(c for c in self.cursors if c.name == name)
        if cursor.invalidated:
            return
        self.checkers.cursors.check_invalidation(cursor, node, reason)
        cursor.invalidated = reason
        self.stats.invalidations += 1
        self.log_event(f"cursor {name} invalidated at {cursor.position}: {reason}")

    # -- what the cluster looks like ------------------------------------------------------------

    def members(self, leader: SimNode) -> list[SimNode]:
        """The group as its leader has it (nodes moved off it hold whatever they held)."""
        replica = leader.replica
        if replica is None:
            raise InvariantBroken("replica is not None")
        return [self.nodes[n] for n in sorted(replica.history.current.members)]

    def leading(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.replica is not None and n.replica.is_leader]

    def members_now(self) -> list[SimNode]:
        leaders = self.leading()
        return self.members(leaders[0]) if len(leaders) == 1 else list(self.nodes.values())

    def describe_node(self, node_id: int) -> str:
        node = self.nodes[node_id]
        r = node.replica
        if r is None:
            return f"down leo={node.log.log_end_offset}"
        return (
            f"{r.role.value} epoch={r.epoch} leader={r.leader_id} leo={node.log.log_end_offset} "
            f"hw={node.log.high_watermark} durable={node.log.durable_end_offset} "
            f"in_flight={r.fetch_in_flight} reported_durable={r.reported_durable} flush={node.flush}"
        )

    # -- the run's record -----------------------------------------------------------------------

    def fail(self, why: str) -> NoReturn:
        self.checkers.fail(why)

    def raise_deferred(self) -> None:
        self.checkers.violations.raise_deferred()

    def log_event(self, line: str) -> None:
        self.digest.update(line.encode())
        if self.trace is not None:
            self.trace(f"{self.now:6d} {line}")
