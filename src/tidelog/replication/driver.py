"""The partition driver: the Ready loop and the cleaner's pass over one replica, with no IO.

The asyncio node (node/partition.py) and the simulator (testing/sim/) both run this class;
each supplies the effects (`PartitionEffects`) -- files, sockets and threads in the node, a
model of them in the simulator. So the order that keeps acknowledged records safe is written
once:

    1. persist the quorum state (epoch, vote, directories)   BEFORE any message leaves
    2. send the messages
    3. start a group commit if the log has unflushed appends
    4. fail the acks a lost leadership or a truncation can no longer give
    5. apply newly committed records to the state machine (snapshotting when due)
    6. release the acks the HW now covers; answer the reads now confirmed (read_index.py);
       tell who listens; wake long-polls
    7. after a roll, ask for a cleaner pass; below a new log start, delete whole segments

and a cleaner pass on the leader: the low-water mark from facts (low_watermark.py), the
cursors past their caps invalidated, the log start moved up to the LWM (durably, before any
file goes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from tidelog.errors import NotLeader, TidelogError
from tidelog.replication.acks import OwedAcks
from tidelog.replication.log_interface import ReplicaLog
from tidelog.replication.low_watermark import LowWatermark, LowWatermarkFacts, decide_low_watermark
from tidelog.replication.messages import Message
from tidelog.replication.replica import QuorumState, Ready, Replica


class DriverLog(ReplicaLog, Protocol):
    @property
    def segment_count(self) -> int: ...

    def flush_due(self) -> bool: ...

    def delete_segments_below_log_start(self) -> list[int]: ...


class Applier(Protocol):
    """A state machine kept applied up to the HW (node/state_machine.py)."""

    def catch_up(self) -> None: ...


W = TypeVar("W")  # whatever stands for a producer waiting for its ack

# Told a read's index once the leadership is confirmed (answer from a state applied up to it),
# or None: the leadership ended first (the reader gets NotLeader).
ReadAnswer = Callable[[int | None], None]


class PartitionEffects(Protocol[W]):
    def persist(self, state: QuorumState) -> None:
        """Make the quorum state durable; returns only once it is."""
        ...

    def send(self, to: int, message: Message) -> None: ...

    def start_flush(self) -> None:
        """Start a group commit unless one is running; call PartitionDriver.flushed() after."""
        ...

    def acknowledge(self, acked: list[W], failed: list[W]) -> None:
        """Answer these producers: acknowledged, or failed (their leadership ended)."""
        ...

    def committed(self) -> None:
        """The HW moved or a snapshot was installed (the state machine has caught up)."""
        ...

    def wake(self) -> None:
        """The HW, the role or the log's contents changed: wake long-polling readers."""
        ...

    def rolled(self) -> None:
        """A new segment: retention gets a look now, not at the next interval."""
        ...

    def invalidate_cursor(self, name: str, reason: str) -> None:
        """Record, once, that a cursor no longer holds (through the metadata log)."""
        ...

    def handled(self, ready: Ready) -> None:
        """Called last, after every step above (the simulator checks its invariants here)."""
        ...


class PartitionDriver(Generic[W]):
    def __init__(
        self,
        replica: Replica,
        log: DriverLog,
        effects: PartitionEffects[W],
        machine: Applier | None = None,
    ) -> None:
        self.replica = replica
        self.log = log
        self.effects = effects
        self.machine = machine
        self.owed: OwedAcks[W] = OwedAcks()
        self._reads: dict[int, ReadAnswer] = {}  # context -> who waits for the read
        self._last_read = 0
        self.stopped = False
        self._segments_seen = log.segment_count
        # Something happened since the last act() (a message, a write, a flush): the node acts
        # on it at its next tick, whatever next_deadline() says. on_dirty tells it so.
        self.dirty = True
        self.on_dirty: Callable[[], None] | None = None

    # -- acknowledgements (replication/acks.py) -------------------------------------------------

    def owe(self, last_offset: int, durable_only: bool, waiter: W) -> bool:
        """Right after this leader appended a batch ending at last_offset: owe its producer an
        ack, from this leadership. True when it is due already (nothing is registered)."""
        replica = self.replica
        if not replica.is_leader:
            leader = replica.leader_id
            raise NotLeader("not the leader", leader_hint=leader if leader >= 0 else None)
        mark = self.log.effective_durable_end if durable_only else self.log.high_watermark
        if mark > last_offset:
            return True
        self.owed.register(last_offset, durable_only, replica.epoch, waiter)
        return False

    def _release(self) -> None:
        if not len(self.owed):
            return
        leading = self.replica.epoch if self.replica.is_leader else None
        acked, failed = self.owed.due(
            self.log.high_watermark, self.log.effective_durable_end, leading
        )
        if acked or failed:
            self.effects.acknowledge(acked, failed)

    def fail_owed(self) -> None:
        failed = self.owed.fail_all()
        if failed:
            self.effects.acknowledge([], failed)

    # -- linearizable reads (read_index.py) -----------------------------------------------------

    def read(self, answer: ReadAnswer, lease_ticks: int = 0) -> None:
        """A linearizable read (Replica.read): answer is called with the read index once this
        leadership is confirmed, or with None if it ends first. NotLeader at once when this
        replica does not lead."""
        self._last_read += 1
        context = self._last_read
        self.replica.read(context, lease_ticks)
        self._reads[context] = answer
        self.process_ready()

    def _answer_reads(self, ready: Ready) -> None:
        for read in ready.reads:
            answer = self._reads.pop(read.context, None)
            if answer is not None:
                answer(read.read_index)
        for context in ready.failed_reads:
            answer = self._reads.pop(context, None)
            if answer is not None:
                answer(None)

    def fail_reads(self) -> None:
        """The replica stops (its node closes or crashes): nobody will confirm these."""
        reads, self._reads = self._reads, {}
        for answer in reads.values():
            answer(None)

    # -- inputs ---------------------------------------------------------------------------------

    def tick(self) -> None:
        """One tick of the replica's own clock (the simulator's dense ticking)."""
        if self.stopped:
            return
        self.replica.tick()
        self._acted()

    def act(self) -> None:
        """The shared clock moved (a node's loop): do what is due (Replica.act)."""
        if self.stopped:
            return
        self.replica.act()
        self._acted()

    def _acted(self) -> None:
        self.process_ready()
        if self.log.flush_due():
            self.effects.start_flush()  # flush.ms, for logs that do not fsync before acking
        self.dirty = False

    def next_deadline(self) -> int | None:
        """When act() is next due without an event (Replica.next_deadline); a log holding
        unflushed data is looked at every tick (flush.ms may make it due) until it is flushed."""
        if self.stopped:
            return None
        due = self.replica.next_deadline()
        if self.log.needs_flush:
            soon = self.replica.now + 1
            due = soon if due is None else min(due, soon)
        return due

    def step(self, sender: int, message: Message, directory: str = "") -> TidelogError | None:
        """A message arrived. A follower that cannot append it (its disk is full, say) drops
        it and fetches again on a later tick; the error is returned for the caller to report."""
        error = None
        try:
            self.replica.step(sender, message, directory)
        except TidelogError as exc:
            error = exc
        self.process_ready()
        return error

    def flushed(self) -> None:
        """A group commit finished (the log's durable end already moved)."""
        self.replica.on_flushed()
        self._release()
        self.process_ready()

    # -- the Ready loop -------------------------------------------------------------------------

    def set_target(self, voters: tuple[int, ...] | None, learner_bytes_per_tick: int = 0) -> None:
        """The group's target voters (Replica.set_target); a new one is acted on at the next
        tick. (The simulator set it on the replica alone: an idle single-voter leader, with no
        deadline, never began to walk to it: fresh seed 898038552.)"""
        if self.replica.set_target(voters, learner_bytes_per_tick):
            self.nudge()

    def hand_over(self) -> bool:
        """Its node is stopping (Replica.hand_over): hand the leadership over, and say whether
        that is under way (the node waits while it is)."""
        if self.stopped:
            return False
        self.replica.hand_over()
        self.process_ready()
        return self.replica.handing_over

    def nudge(self) -> None:
        """Something outside the replica changed (a peer's liveness): act at the next tick."""
        if not self.dirty and not self.stopped:
            self.dirty = True
            if self.on_dirty is not None:
                self.on_dirty()

    def process_ready(self) -> None:
        if self.stopped:
            return
        self.nudge()
        ready = self.replica.ready()
        fx = self.effects
        if ready.state is not None:
            fx.persist(ready.state)
        for out in ready.messages:
            fx.send(out.to, out.message)
        if ready.flush:
            fx.start_flush()
        if ready.lost_leadership or ready.truncated:
            self.fail_owed()
        committed = ready.high_watermark_changed or ready.snapshot_installed >= 0
        if self.machine is not None and committed:
            self.machine.catch_up()
        if ready.high_watermark_changed:
            self._release()
        if ready.reads or ready.failed_reads:
            self._answer_reads(ready)  # after the state machine caught up with the HW
        if committed:
            fx.committed()
        if ready.high_watermark_changed or ready.role_changed or ready.truncated:
            fx.wake()
        if self.log.segment_count > self._segments_seen:
            fx.rolled()
        self._segments_seen = self.log.segment_count
        if ready.log_start_changed:
            # The new log start is durable (checkpointed) before any file goes.
            self.log.delete_segments_below_log_start()
        self.replica.advance()
        fx.handled(ready)

    # -- the cleaner's pass ---------------------------------------------------------------------

    def low_watermark(self, facts: LowWatermarkFacts) -> LowWatermark:
        """The LWM with this replica's view of the replicas added to the facts."""
        return decide_low_watermark(
            dataclasses.replace(facts, replicas=tuple(self.replica.replica_holds()))
        )

    def clean(self, facts: Callable[[], LowWatermarkFacts]) -> LowWatermark | None:
        """On the leader: decide the LWM from the facts (gathered only here, where they are
        used), invalidate the cursors past their caps, move the log start up to the LWM.
        Followers follow the leader's log start; they return None."""
        if self.stopped or not self.replica.is_leader:
            return None
        lwm = self.low_watermark(facts())
        for name, reason in lwm.to_invalidate:
            self.effects.invalidate_cursor(name, reason)
        if lwm.offset > self.log.log_start_offset:
            self.replica.advance_log_start(lwm.offset)
            self.process_ready()
        return lwm
