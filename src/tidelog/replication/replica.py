"""One replica of one partition as a pure state machine: pull-based Raft (KRaft-style).

Driver API (etcd-raft's shape):

    replica.tick()                    one unit of time passed
    replica.step(sender, message)     a message arrived
    replica.propose(batches)          leader only: append producer batches, returns offsets
    replica.read(context)             leader only: a linearizable read; ready.reads hands it
                                      back with its read index once confirmed (read_index.py)
    replica.on_flushed()              the log's durable end moved (group commit finished)
    replica.hand_over()               its node is stopping: hand the leadership to an in-sync
                                      voter first; replica.handing_over while under way
    ready = replica.ready()           what to do now, in this order:
        1. persist ready.state (epoch, vote) durably      -- BEFORE any message is sent
        2. send ready.messages
        3. if ready.flush: start a group commit (call on_flushed() when it is done)
    replica.advance()                 the driver did all of the above

No IO, no clock, no global randomness: the log is reached through a small interface, time is
ticks, randomness comes from the injected random.Random. The simulator runs this exact class.

This module is the driver's API. The replica's parts are layers below it: its fields
(replica_state.py, which lists them all), the follower's side (following.py), the leader's
(leading.py) and elections (elections.py).

Watermarks (checked where they change, by invariants -O cannot strip: tidelog/invariant.py):
    log_start_offset <= high_watermark <= log_end_offset
    high_watermark never decreases while this replica leads an epoch
    a leader counts a replica toward the HW only for what that replica has made durable, and
    only once an offset of its own epoch is on a quorum (Raft Fig. 8, KRaft's epochStartOffset)
"""

from __future__ import annotations

from collections.abc import Mapping

from tidelog.errors import NotEnoughReplicas, NotLeader
from tidelog.invariant import InvariantBroken
from tidelog.record.validation import ValidatedBatches
from tidelog.replication.clock import TickSource
from tidelog.replication.directories import NO_DIRECTORY
from tidelog.replication.elections import Elections
from tidelog.replication.faults import FAULT_IGNORE_DIRECTORIES, FAULT_READ_WITHOUT_INDEX
from tidelog.replication.following import CommittedPrefixBroken
from tidelog.replication.last_stable_offset import last_stable_offset
from tidelog.replication.leading import LEADER_CHANGE_CONTROL_KEY
from tidelog.replication.liveness import LivenessView
from tidelog.replication.log_interface import AppendResult, ReplicaLog, SnapshotAccess
from tidelog.replication.low_watermark import KIND_REPLICA, Hold
from tidelog.replication.messages import (
    BeginEpoch,
    EpochNotice,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    Message,
    Resign,
    TransferLeadership,
    VoteRequest,
    VoteResponse,
    claimed_sender,
)
from tidelog.replication.quiescence import alive
from tidelog.replication.read_index import ConfirmedRead
from tidelog.replication.ready import NO_VOTE, QuorumState, Ready
from tidelog.replication.replica_config import ReplicaConfig
from tidelog.replication.replica_state import NO_LEADER, RandomSource, Role
from tidelog.replication.status import ReplicaStatus, ReplicaView

# The replica's interface. Its outputs, settings and vocabulary have modules of their own
# (ready.py, replica_config.py, replica_state.py) and are exported from here too.
__all__ = [
    "LEADER_CHANGE_CONTROL_KEY",
    "NO_LEADER",
    "NO_VOTE",
    "CommittedPrefixBroken",
    "QuorumState",
    "RandomSource",
    "Ready",
    "Replica",
    "ReplicaConfig",
    "Role",
]


class Replica(Elections):
    """One replica of one partition: the driver's API over the layers below."""

    def __init__(
        self,
        config: ReplicaConfig,
        log: ReplicaLog,
        state: QuorumState,
        rng: RandomSource,
        snapshots: SnapshotAccess | None = None,
        known_directories: Mapping[int, str] | None = None,
        clock: TickSource | None = None,
        liveness: LivenessView | None = None,
    ) -> None:
        super().__init__(config, log, state, rng, snapshots, known_directories, clock, liveness)
        if self._single_voter:
            self._start_prevote()

    # -- the driver's API -----------------------------------------------------------------------

    @property
    def high_watermark(self) -> int:
        return self.log.high_watermark

    @property
    def is_leader(self) -> bool:
        return self.role is Role.LEADER

    def elapse(self, ticks: int = 1) -> None:
        """Time passes on the replica's own clock, and nothing is done (act() does it)."""
        if self._own_clock is None:
            raise InvariantBroken("a shared clock is advanced by its owner")
        self._own_clock.ticks += ticks

    def tick(self) -> None:
        """One tick passes (a replica with its own clock) and what is due is done."""
        if self._own_clock is not None:
            self._own_clock.ticks += 1
        self.act()

    def act(self) -> None:
        """Do what the time makes due: elections, fetch retries, parked fetches' answers,
        check-quorum. A node calls it only when next_deadline() has come or after an event; a
        replica that has nothing due costs nothing in between."""
        elapsed = self.now - self._acted_at
        self._acted_at = self.now
        if self.role is Role.LEADER:
            self._leader_tick(max(1, elapsed))
        elif self.role is Role.FOLLOWER:
            if self.quiesced:
                if self._quiesced_leader_alive():
                    return  # nothing to do until the leader wakes us, or its node dies
                self._unquiesce_follower(leader_dead=not alive(self.liveness, self.leader_id))
            if self.now >= self.election_deadline and not self._may_stand:
                # A replaced disk or a learner catches up, a leaving replica waits for its node
                # to stop; neither campaigns.
                self._reset_election_timer()
            elif self.now >= self.election_deadline:
                self._start_prevote()
            elif (
                self.fetch_in_flight
                and self.now - self.fetch_sent_tick >= self.config.fetch_retry_ticks
            ):
                self.fetch_in_flight = False
                self._maybe_send_fetch()
            elif not self.fetch_in_flight:
                self._maybe_send_fetch()
        elif self.now >= self.election_deadline and self._may_stand:
            self._start_prevote()
        else:
            self._ask_voters_come_alive()

    def next_deadline(self) -> int | None:
        """The tick at which act() next has something to do if nothing happens meanwhile (no
        message, no write), or None: then only an event gives it work. A leader of one replica
        with nothing in flight, and a follower whose leader is parked on its fetch, cost nothing
        until then."""
        now, config = self.now, self.config
        if self.role is Role.LEADER:
            return self._leader_deadline()
        if self.role is Role.FOLLOWER:
            if self.quiesced:
                return None  # the leader wakes us, or the liveness does (the node dirties us)
            due = self.election_deadline  # (one that may not stand only re-arms its timer)
            if self.leader_id != NO_LEADER:
                if not self.fetch_in_flight:
                    return now + 1
                due = min(due, self.fetch_sent_tick + config.fetch_retry_ticks)
            return due
        if not self._may_stand:
            return None
        return self.election_deadline

    def step(self, sender: int, message: Message, directory: str = NO_DIRECTORY) -> None:
        """A message from sender: the node id (and data directory) its transport vouches for.
        A message that claims to come from another node (its replica, candidate, voter or
        leader field) is dropped: nobody may speak for a voter but that voter. A voter whose
        directory is not the admitted one (a replaced disk) is an observer (admission.py)."""
        if sender == self.node_id:
            return
        if isinstance(message, FetchRequest | FetchSnapshotRequest) and not (
            sender in self.voters or (sender in self.learners and self._learner_may(message))
        ):
            return  # only members fetch. Anything else is heard from anyone (Raft's 4.1): a
            # replica whose membership is behind must follow a leader it does not know yet.
        claimed = claimed_sender(message)
        if claimed is not None and claimed != sender:
            self.forged_messages += 1
            return
        admitted = FAULT_IGNORE_DIRECTORIES in self.config.faults or self.admission.admitted(
            sender, directory
        )
        if not admitted and not self.admission.observer_may(sender, message, self._leading()):
            if isinstance(message, VoteRequest):
                self._send(
                    sender,
                    VoteResponse(
                        self.epoch,
                        self.node_id,
                        False,
                        message.pre_vote,
                        self.leader_id,
                        self.is_admitted,
                    ),
                )
            return
        if not admitted and isinstance(message, FetchRequest):
            self.admission.track(sender, directory, self.log.log_end_offset, self.progress[sender])
        # A pre-vote never moves an epoch, except a refusal, which carries the voter's own.
        pre_vote = isinstance(message, VoteRequest) and message.pre_vote
        pre_vote |= isinstance(message, VoteResponse) and message.pre_vote and message.granted
        if message.epoch > self.epoch and not pre_vote:
            # A leader is learned only from the leader itself; a hint about a third node
            # (in an error answer or a notice) moves the epoch, not whom we follow.
            leader = NO_LEADER
            if (
                isinstance(
                    message, BeginEpoch | EpochNotice | FetchResponse | FetchSnapshotResponse
                )
                and message.leader == sender
            ):
                leader = message.leader
            self._become_follower(message.epoch, leader)
        if message.epoch < self.epoch and isinstance(
            message, BeginEpoch | FetchResponse | FetchSnapshotResponse
        ):
            # A leader of an older epoch: tell it the epoch has moved on, or a node whose own
            # candidacy raised its epoch would wait forever for a leader that cannot reach it.
            self._send(sender, EpochNotice(self.epoch, self.node_id, self.leader_id))
            return
        if isinstance(message, EpochNotice):
            self._on_epoch_notice(sender, message)
        elif isinstance(message, Resign):
            self._on_resign(sender, message)
        elif isinstance(message, TransferLeadership):
            self._on_transfer_leadership(sender, message)
        elif isinstance(message, VoteRequest):
            self._on_vote_request(sender, message)
        elif isinstance(message, VoteResponse):
            self._on_vote_response(sender, message)
        elif isinstance(message, BeginEpoch):
            self._on_begin_epoch(sender, message)
        elif isinstance(message, FetchRequest):
            self._on_fetch_request(sender, message)
        elif isinstance(message, FetchResponse):
            self._on_fetch_response(sender, message)
        elif isinstance(message, FetchSnapshotRequest):
            self._on_fetch_snapshot_request(sender, message)
        elif isinstance(message, FetchSnapshotResponse):
            self._on_fetch_snapshot_response(sender, message)

    def _learner_may(self, message: Message) -> bool:
        """All a learner may say: fetch from the leader, in the leader's own epoch."""
        return (
            isinstance(message, FetchRequest | FetchSnapshotRequest)
            and message.epoch == self._leading()
        )

    def _leading(self) -> int | None:
        """The epoch this replica leads, if it leads."""
        return self.epoch if self.role is Role.LEADER else None

    def propose(self, batches: bytes | bytearray | memoryview | ValidatedBatches) -> AppendResult:
        """Append producer batches as leader (a producer's payload after validate_produced).
        NotLeader when this replica does not lead."""
        if self.role is not Role.LEADER:
            raise NotLeader(
                f"replica {self.node_id} is not the leader", leader_hint=self._leader_hint()
            )
        if self.leaving:
            # No hint: the successor is not the leader until it has won its election.
            raise NotLeader(
                f"replica {self.node_id} is handing its leadership over (its node is stopping)"
            )
        info = self.log.append_as_leader(batches, self.epoch)
        self._after_leader_append()
        return info

    def read(self, context: int, lease_ticks: int = 0) -> None:
        """A linearizable read (read_index.py), named by the driver's context. Once a majority
        confirmed this leadership after the call, ready().reads hands back (context, read
        index): answer from a state applied up to that index. If the leadership ends first,
        ready().failed_reads names it. lease_ticks > 0 allows the lease: while the last
        confirmed round started less than lease_ticks ago, the read is confirmed at once at
        the HW. NotLeader when this replica does not lead."""
        if self.role is not Role.LEADER:
            raise NotLeader(
                f"replica {self.node_id} is not the leader", leader_hint=self._leader_hint()
            )
        if FAULT_READ_WITHOUT_INDEX in self.config.faults or (
            lease_ticks > 0
            and self._may_serve_reads()
            and self.reads.lease_valid(self.now, lease_ticks)
        ):
            self._ready.reads.append(ConfirmedRead(context, self.log.high_watermark))
            return
        self.reads.request(context)
        if self._may_serve_reads():
            self._start_read_round()

    def campaign(self, pre_vote: bool = True) -> None:
        """Stand for election now instead of after a timeout (a new group's preferred leader,
        or a scripted scenario). pre_vote=False skips straight to a real election. A replica
        that is no voter, or whose node is stopping, does not stand."""
        if self.role is Role.LEADER or self.is_learner or self.leaving:
            return
        if pre_vote:
            self._start_prevote()
        else:
            self._start_election()

    def stand(self) -> None:
        """Lead now, as an operator or a preferred leader asks: a live leader is asked to hand
        over (it does once we hold all it holds; a pre-vote would be refused while it lives),
        otherwise we campaign."""
        if self.role is Role.LEADER or self.is_learner or self.leaving:
            return
        if self._hears_leader:
            self._send(self.leader_id, TransferLeadership(self.epoch, self.node_id))
        else:
            self.campaign()

    def hand_over(self) -> None:
        """Its node is stopping (a controlled shutdown, as Kafka's controlled.shutdown.enable):
        from now on this replica takes no write and never stands for election (a campaign
        under way ends; it still votes). As leader it resigns in favour of the in-sync voter
        that holds everything it holds, once every write it took is committed and durable
        (Raft's leadership transfer; Resign is its TimeoutNow), and that voter stands at once.
        `handing_over` says while that is under way; none is when the group has no other voter,
        or none in sync. Called again, it only looks again whether the successor is ready."""
        self.leaving = True
        if self.role in (Role.PROSPECTIVE, Role.CANDIDATE):
            self._become_follower(self.epoch, NO_LEADER)
        self._maybe_hand_over()

    def check_min_insync(self, min_insync: int) -> None:
        """acks=all fails fast when fewer replicas than min.insync.replicas are in sync."""
        in_sync = self.in_sync_replicas()
        if len(in_sync) < min_insync:
            raise NotEnoughReplicas(
                f"{len(in_sync)} replicas in sync, min.insync.replicas is {min_insync}",
                in_sync=sorted(in_sync),
            )

    def on_flushed(self) -> None:
        if self.role is Role.LEADER:
            self._maybe_advance_high_watermark()
        elif self.role is Role.FOLLOWER and self.log.effective_durable_end > self.reported_durable:
            # Tell the leader at once: its HW may be waiting for exactly this fsync.
            self._maybe_send_fetch(report_durability=True)

    def ready(self) -> Ready:
        ready = self._ready
        if self.log.needs_flush:
            ready.flush = True
        if ready.empty:
            return ready  # the usual answer: nothing to do, and nothing new to allocate
        self._ready = Ready()
        return ready

    def advance(self) -> None:
        """Nothing to release today: outputs are handed over whole by ready()."""

    # -- membership and replaced disks ----------------------------------------------------------

    def set_target(self, voters: tuple[int, ...] | None, learner_bytes_per_tick: int = 0) -> bool:
        """The voters this group should have (the cluster's metadata says so): its leader walks
        the group there one change at a time. None: no change wanted. True if it changed: the
        driver must then act (PartitionDriver.set_target), or an idle leader with no deadline
        never starts the walk."""
        if not (voters is None or voters):
            raise InvariantBroken("a group needs a voter")
        target = tuple(sorted(voters)) if voters is not None else None
        changed = (target, learner_bytes_per_tick) != (self.target, self.learner_bytes_per_tick)
        self.target = target
        self.learner_bytes_per_tick = learner_bytes_per_tick
        return changed

    @property
    def directories(self) -> dict[int, str]:
        """The voters' admitted data directories, as this replica knows them."""
        return self.admission.directories

    @property
    def known_directories(self) -> Mapping[int, str]:
        return self.admission.known

    @property
    def replaced(self) -> dict[int, str]:
        """Voters seen with a directory not admitted here."""
        return self.admission.replaced

    def admit_unclean(self, presented: Mapping[int, str]) -> list[int]:
        """An operator accepted loss (an unclean election): the directories voters present now
        and this replica's own are admitted without catching up. Returns the voters whose
        admitted directory changed."""
        return self.admission.admit_unclean(presented, self.voters)

    # -- the low-water mark ---------------------------------------------------------------------

    def replica_holds(self) -> list[Hold]:
        """The replicas' part of the low-water mark (low_watermark.py decides the rest). On the
        leader: what each follower still needs, until it has been out of touch too long. On a
        follower: the leader's log start, reported (followers follow it, they do not decide)."""
        if self.role is not Role.LEADER:
            return [
                Hold(
                    KIND_REPLICA,
                    "leader",
                    self.leader_log_start,
                    "the leader's log start",
                    live=False,
                    why_not="followers follow the leader's log start",
                )
            ]
        cap = self.config.replica_max_lag_ticks
        holds = []
        for r, p in sorted(self.progress.items()):
            idle = 0 if p.quiesced else self.now - p.last_fetch_tick
            holds.append(
                Hold(
                    KIND_REPLICA,
                    str(r),
                    p.fetch_offset,
                    f"last fetch {idle} ticks ago",
                    live=idle <= cap,
                    why_not="" if idle <= cap else f"out of touch for {idle} ticks > {cap}",
                )
            )
        return holds

    def advance_log_start(self, offset: int) -> bool:
        """Leader only: discard the log below offset (never past the HW). Followers learn the
        new log start in fetch answers and discard the same prefix."""
        if self.role is not Role.LEADER:
            raise NotLeader("only the leader moves the log start", leader_hint=self._leader_hint())
        moved = self.log.advance_log_start(min(offset, self.log.high_watermark))
        if moved:
            self._log_start_moved()
            self._wake_quiesced()  # followers discard the same prefix once they hear of it
        return moved

    # -- views ----------------------------------------------------------------------------------

    def status(self) -> ReplicaStatus:
        replicas: dict[int, ReplicaView] = {}
        if self.role is Role.LEADER:
            in_sync = self.in_sync_replicas()
            leo = self.log.log_end_offset
            replicas[self.node_id] = ReplicaView(
                leo, True, 0, durable_end_offset=self.log.effective_durable_end
            )
            for r, p in sorted(self.progress.items()):
                observing = self.observers.get(r)
                replicas[r] = ReplicaView(
                    p.fetch_offset if observing is not None else p.match_offset,
                    r in in_sync,
                    max(0, leo - p.match_offset),
                    high_watermark=p.known_hw,
                    last_fetch_ticks_ago=self.now - p.last_fetch_tick,
                    observer_until=observing[1] if observing is not None else None,
                    learner=r in self.learners,
                    quiesced=p.quiesced,
                )
        return ReplicaStatus(
            role=self.role.value,
            epoch=self.epoch,
            leader=self.leader_id,
            voted_for=self.voted_for,
            high_watermark=self.log.high_watermark,
            log_end_offset=self.log.log_end_offset,
            log_start_offset=self.log.log_start_offset,
            directory_id=self.config.directory_id,
            voters=tuple(self.voters),
            learners=tuple(self.learners),
            committed_voters=tuple(self.history.at(self.log.high_watermark).voters),
            observer=self.is_observer,
            replicas=replicas,
            replaced=dict(self.replaced),
            quiesced=self.quiescent,
            last_stable_offset=self.last_stable_offset(),
        )

    def last_stable_offset(self) -> int:
        """read_committed readers read below it (replication/last_stable_offset.py)."""
        return last_stable_offset(self.log, self.config.faults)

    @property
    def quiescent(self) -> bool:
        """A follower told to wait, or a leader whose followers all were."""
        if self.role is Role.LEADER:
            return bool(self.progress) and all(p.quiesced for p in self.progress.values())
        return self.quiesced
