"""One replica of one partition as a pure state machine: pull-based Raft (KRaft-style).

Driver API (etcd-raft's shape):

    replica.tick()                    one unit of time passed
    replica.step(sender, message)     a message arrived
    replica.propose(batches)          leader only: append producer batches, returns offsets
    replica.on_flushed()              the log's durable end moved (group commit finished)
    ready = replica.ready()           what to do now, in this order:
        1. persist ready.state (epoch, vote) durably      -- BEFORE any message is sent
        2. send ready.messages
        3. if ready.flush: start a group commit (call on_flushed() when it is done)
    replica.advance()                 the driver did all of the above

No IO, no clock, no global randomness: the log is reached through a small interface, time is
ticks, randomness comes from the injected random.Random. The simulator runs this exact class.

Watermarks (checked where they change, by invariants -O cannot strip: tidelog/invariant.py):
    log_start_offset <= high_watermark <= log_end_offset
    high_watermark never decreases while this replica leads an epoch
    a leader counts a replica toward the HW only for what that replica has made durable, and
    only once an offset of its own epoch is on a quorum (Raft Fig. 8, KRaft's epochStartOffset)
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from typing import Protocol

from tidelog.errors import NotEnoughReplicas, NotLeader
from tidelog.invariant import InvariantBroken, invariant
from tidelog.record.batch import ProducerRecord, build_batch
from tidelog.record.validation import ValidatedBatches
from tidelog.replication.admission import Admission
from tidelog.replication.clock import Clock, TickSource
from tidelog.replication.directories import NO_DIRECTORY
from tidelog.replication.faults import (
    FAULT_COMMIT_OLD_EPOCH,
    FAULT_DISCARD_PAST_SNAPSHOT,
    FAULT_EMPTY_LOG_FORGETS_EPOCH,
    FAULT_IGNORE_DIRECTORIES,
    FAULT_TRUNCATE_TO_HW,
    FAULT_UNCOMMITTED_CHANGES,
)
from tidelog.replication.fetch_serving import (
    answer_now,
    divergence,
    must_start_over,
    refusal,
    start_over_point,
)
from tidelog.replication.liveness import LivenessView
from tidelog.replication.log_interface import AppendResult, ReplicaLog, SnapshotAccess
from tidelog.replication.low_watermark import KIND_REPLICA, Hold
from tidelog.replication.membership import (
    INITIAL,
    Membership,
    MembershipHistory,
    decode_memberships,
    next_membership,
)
from tidelog.replication.messages import (
    FETCH_FENCED,
    FETCH_NOT_LEADER,
    BeginEpoch,
    EpochNotice,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    Message,
    Outgoing,
    Resign,
    TransferLeadership,
    VoteRequest,
    VoteResponse,
    claimed_sender,
)
from tidelog.replication.progress import (
    Progress,
    heard_from,
    in_sync,
    next_due,
    reported_durable,
)
from tidelog.replication.quiescence import (
    alive,
    alive_as_quiesced,
    first_to_stand,
    follower_may_quiesce,
    leader_may_quiesce,
)
from tidelog.replication.quorum import isr_offset, majority, quorum_offset
from tidelog.replication.ready import NO_VOTE, QuorumState, Ready
from tidelog.replication.replica_config import ReplicaConfig
from tidelog.replication.snapshot_transfer import SnapshotFetch, snapshot_answer, snapshot_refusal
from tidelog.replication.status import ReplicaStatus, ReplicaView

# The replica's interface. Its outputs and settings have modules of their own (ready.py,
# replica_config.py) and are exported from here too.
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

NO_LEADER = -1
LEADER_CHANGE_CONTROL_KEY = b"\x00\x00\x00\x02"  # Kafka's control record key: version 0, type 2


class CommittedPrefixBroken(AssertionError):
    """An invariant failed: a rule the design depends on is broken (the node fails stop)."""


class RandomSource(Protocol):
    """The only randomness the core uses: injected (a seeded random.Random in practice)."""

    def randint(self, a: int, b: int) -> int: ...


class Role(enum.Enum):
    FOLLOWER = "follower"
    PROSPECTIVE = "prospective"  # running a pre-vote
    CANDIDATE = "candidate"
    LEADER = "leader"


class Replica:
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
        self.config = config
        # The node's liveness (one heartbeat per pair of nodes, liveness.py): with it, an idle
        # group quiesces -- its followers stop fetching and its leader stops expecting them,
        # and a dead leader or follower is learnt from the liveness instead. None: never.
        self.liveness = liveness
        self.quiesced = False  # a follower told by its leader to wait for news
        self.quiesced_incarnation = -1  # the leader's incarnation when it said so
        self._own_clock = Clock() if clock is None else None
        self.clock: TickSource = clock if clock is not None else Clock()
        if self._own_clock is not None:
            self.clock = self._own_clock
        self._acted_at = self.clock.ticks
        self.log = log
        self.snapshots = snapshots
        self.installing: SnapshotFetch | None = None  # a snapshot being fetched from the leader
        self.rng = rng
        self.node_id = config.node_id
        self.epoch = state.epoch
        self.voted_for = state.voted_for
        self.role = Role.FOLLOWER
        self.leader_id = NO_LEADER
        self.progress: dict[int, Progress] = {}
        self.epoch_start_offset = 0
        self.leader_since_tick = 0
        self.votes: set[int] = set()
        # The vote request of our current campaign, and the voters it reached as far as the
        # node's liveness knew: one that comes alive later (a new cluster's nodes starting one
        # after another) is asked again at once rather than after an election timeout.
        self._vote_request: VoteRequest | None = None
        self._asked: set[int] = set()
        self.last_leader_contact = 0
        self.election_deadline = 0
        self.fetch_in_flight = False
        self.fetch_sent_tick = 0
        self.reported_durable = -1  # the durable offset our last fetch told the leader
        self.forged_messages = 0  # dropped: they claimed to come from a node other than theirs
        self.leader_high_watermark = log.high_watermark  # as last heard from the leader
        self.leader_log_start = log.log_start_offset
        # Admitted directories (durable, in the quorum state) and the leader's observers.
        self.admission = Admission(
            config.node_id,
            config.directory_id,
            state.directories,
            known_directories or {},
            self._persist_state,
        )
        self.history = MembershipHistory(
            decode_memberships(state.memberships)
            or [Membership(INITIAL, config.voters, config.learners)]
        )
        self.history.truncate(log.log_end_offset)  # changes in a tail the log lost in a crash
        self.target: tuple[int, ...] | None = None  # voters the leader walks the group towards
        self.learner_bytes_per_tick = 0  # catch-up throttle for learners (0: none)
        self._learner_budget = 0
        self._ready = Ready()
        self._reset_election_timer()
        if FAULT_TRUNCATE_TO_HW in config.faults:
            log.truncate_to(log.high_watermark)  # the pre-KIP-101 restart
            self.history.truncate(log.log_end_offset)
        if self._single_voter:
            self._start_prevote()

    # -- public driver API ----------------------------------------------------------------------

    @property
    def high_watermark(self) -> int:
        return self.log.high_watermark

    @property
    def is_leader(self) -> bool:
        return self.role is Role.LEADER

    @property
    def now(self) -> int:
        return self.clock.ticks

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
            if self.now >= self.election_deadline and (self.is_observer or self.is_learner):
                # A replaced disk or a learner catches up; it does not campaign.
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
        elif self.now >= self.election_deadline and not (self.is_observer or self.is_learner):
            self._start_prevote()
        else:
            self._ask_voters_come_alive()

    def step(self, sender: int, message: Message, directory: str = NO_DIRECTORY) -> None:
        """A message from sender: the node id (and data directory) its transport vouches for.
        A message that claims to come from another node (its replica, candidate, voter or
        leader field) is dropped: nobody may speak for a voter but that voter. A voter whose
        directory is not the admitted one (a replaced disk) is an observer: see below."""
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

    # -- replaced disks: observers --------------------------------------------------------------

    @property
    def voters(self) -> tuple[int, ...]:
        """The newest membership in this replica's log decides, committed or not."""
        return self.history.current.voters

    @property
    def learners(self) -> tuple[int, ...]:
        return self.history.current.learners

    @property
    def is_learner(self) -> bool:
        """Does not campaign: not a voter of this group (yet, or any more). Except a voter whose
        own removal is not committed yet (a leader that removed itself, then lost leadership or
        crashed): the remaining voters may lack that change, and need the one replica that has
        it to lead long enough to commit it. That is safe: a candidate wins by a majority of its
        newest membership's voters, not counting itself when it is not one (Raft's rule)."""
        if self.node_id in self.voters:
            return False
        uncommitted = self.history.current.offset >= self.log.high_watermark
        return not (uncommitted and self.node_id in self.committed_membership.voters)

    def _counts(self, replica: int) -> bool:
        """A follower whose liveness counts toward the ISR and check-quorum: a voter whose
        directory is admitted (not an observer)."""
        return replica not in self.observers and replica in self.voters

    def _learner_may(self, message: Message) -> bool:
        """All a learner may say: fetch from the leader, in the leader's own epoch."""
        return (
            isinstance(message, FetchRequest | FetchSnapshotRequest)
            and message.epoch == self._leading()
        )

    def _leading(self) -> int | None:
        """The epoch this replica leads, if it leads."""
        return self.epoch if self.role is Role.LEADER else None

    @property
    def is_observer(self) -> bool:
        """This replica lost its disk: it catches up without voting (admission.py)."""
        return self.admission.is_observer

    @property
    def is_admitted(self) -> bool:
        return self.admission.is_admitted

    @property
    def directories(self) -> dict[int, str]:
        """The voters' admitted data directories, as this replica knows them."""
        return self.admission.directories

    @property
    def known_directories(self) -> Mapping[int, str]:
        return self.admission.known

    @property
    def observers(self) -> dict[int, tuple[str, int]]:
        """Leader: voters catching up under a directory not admitted yet -> (directory, the
        offset they must hold durably to be admitted)."""
        return self.admission.observers

    @property
    def replaced(self) -> dict[int, str]:
        """Voters seen with a directory not admitted here."""
        return self.admission.replaced

    def admit_unclean(self, presented: Mapping[int, str]) -> list[int]:
        """An operator accepted loss (an unclean election): the directories voters present now
        and this replica's own are admitted without catching up. Returns the voters whose
        admitted directory changed."""
        return self.admission.admit_unclean(presented, self.voters)

    def _persist_state(self) -> None:
        """Every change of epoch, vote or admitted directories comes here: it is made durable
        before any message leaves."""
        self._ready.state = QuorumState(
            self.epoch, self.voted_for, self.admission.encode(), self.history.encode()
        )

    def propose(self, batches: bytes | bytearray | memoryview | ValidatedBatches) -> AppendResult:
        """Append producer batches as leader (a producer's payload after validate_produced).
        NotLeader when this replica does not lead."""
        if self.role is not Role.LEADER:
            raise NotLeader(
                f"replica {self.node_id} is not the leader", leader_hint=self._leader_hint()
            )
        info = self.log.append_as_leader(batches, self.epoch)
        self._after_leader_append()
        return info

    def campaign(self, pre_vote: bool = True) -> None:
        """Stand for election now instead of after a timeout (a new group's preferred leader,
        or a scripted scenario). pre_vote=False skips straight to a real election. A replica
        that is no voter does not stand."""
        if self.role is Role.LEADER or self.is_learner:
            return
        if pre_vote:
            self._start_prevote()
        else:
            self._start_election()

    @property
    def _hears_leader(self) -> bool:
        """A follower that heard from its leader within an election timeout."""
        if self.role is not Role.FOLLOWER or self.leader_id == NO_LEADER:
            return False
        if self.quiesced:
            return self._quiesced_leader_alive()
        return self.now - self.last_leader_contact < self.config.election_timeout_ticks

    def stand(self) -> None:
        """Lead now, as an operator or a preferred leader asks: a live leader is asked to hand
        over (it does once we hold all it holds; a pre-vote would be refused while it lives),
        otherwise we campaign."""
        if self.role is Role.LEADER or self.is_learner:
            return
        if self._hears_leader:
            self._send(self.leader_id, TransferLeadership(self.epoch, self.node_id))
        else:
            self.campaign()

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

    def in_sync_replicas(self) -> set[int]:
        if self.role is not Role.LEADER:
            return set()
        lag = self.config.replica_lag_ticks
        return {self.node_id} | in_sync(self.progress, self.now, lag, self._counts)

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
        )

    # -- elections ------------------------------------------------------------------------------

    @property
    def _single_voter(self) -> bool:
        """The only voter of its membership: it leads without asking anyone. Never a replaced
        disk (an observer): catching up, its log may end in a membership of it alone that the
        group left long ago, and it elected itself on a restart, without 300 committed
        records (fresh seed 368196973)."""
        return self.voters == (self.node_id,) and not self.is_learner and not self.is_observer

    def _others(self) -> list[int]:
        return [v for v in self.voters if v != self.node_id]

    def _reset_election_timer(self) -> None:
        jitter = self.rng.randint(0, self.config.election_jitter_ticks)
        self.election_deadline = self.now + self.config.election_timeout_ticks + jitter

    def _leader_hint(self) -> int | None:
        return self.leader_id if self.leader_id != NO_LEADER else None

    def _set_state(self, epoch: int, voted_for: int) -> None:
        invariant(epoch >= self.epoch, "epoch >= self.epoch")
        if (epoch, voted_for) != (self.epoch, self.voted_for):
            self.epoch = epoch
            self.voted_for = voted_for
            self._persist_state()

    def _set_role(self, role: Role) -> None:
        if role is not self.role:
            if self.role is Role.LEADER:
                self._ready.lost_leadership = True
                self._fail_pending_fetches()
            self.quiesced = False
            self.role = role
            self._ready.role_changed = True

    @property
    def _last_epoch(self) -> int:
        """The epoch of the log's last entry; for a log that holds none, of the last entry below
        its log start (its prefix epoch: a Raft snapshot's last term)."""
        if (
            FAULT_EMPTY_LOG_FORGETS_EPOCH in self.config.faults
            and self.log.log_start_offset == self.log.log_end_offset
        ):
            return -1
        return self.log.epochs.latest_epoch

    def _log_is_up_to_date(self, last_epoch: int, log_end_offset: int) -> bool:
        """Raft's election restriction: a vote only for a candidate whose log ends in a later
        epoch than ours, or in the same one no shorter. Nothing else stops a candidate that
        lacks committed entries: votes are granted without consulting memberships (Raft thesis
        4.1, KRaft's handleVoteRequest), so a voter of a membership the group left long ago
        still counts for a stale candidate that has nothing later (seed 300028)."""
        mine = (self._last_epoch, self.log.log_end_offset)
        return (last_epoch, log_end_offset) >= mine

    def _start_prevote(self) -> None:
        self._set_role(Role.PROSPECTIVE)
        self.leader_id = NO_LEADER
        self.votes = {self.node_id}
        self._reset_election_timer()
        if self._single_voter:
            self._start_election()
            return
        request = VoteRequest(
            self.epoch + 1,
            self.node_id,
            self._last_epoch,
            self.log.log_end_offset,
            pre_vote=True,
            admitted=self.is_admitted,
        )
        self._ask_voters(request)

    def _ask_voters(self, request: VoteRequest) -> None:
        self._vote_request = request
        self._asked = set()
        for v in self._others():
            self._send(v, request)
            if self.liveness is None or self.liveness.is_alive(v):
                self._asked.add(v)

    def _ask_voters_come_alive(self) -> None:
        """A campaign's request to a voter whose node was not alive went nowhere (no link yet):
        now that it is, ask again (a duplicate request gets the same answer). Called only while
        we campaign, so the request is this campaign's: each one stores its own."""
        request = self._vote_request
        if request is None or self.liveness is None:
            return
        for v in self._others():
            if v not in self._asked and v not in self.votes and self.liveness.is_alive(v):
                self._asked.add(v)
                self._send(v, request)

    def _start_election(self) -> None:
        self._set_role(Role.CANDIDATE)
        self._set_state(self.epoch + 1, self.node_id)
        self.leader_id = NO_LEADER
        self.votes = {self.node_id}
        self._reset_election_timer()
        if self._single_voter:
            self._become_leader()
            return
        request = VoteRequest(
            self.epoch,
            self.node_id,
            self._last_epoch,
            self.log.log_end_offset,
            pre_vote=False,
            admitted=self.is_admitted,
        )
        self._ask_voters(request)

    def _on_vote_request(self, sender: int, req: VoteRequest) -> None:
        up_to_date = self._log_is_up_to_date(req.last_epoch, req.log_end_offset)
        if self.role is Role.LEADER and sender in self.progress and self.progress[sender].quiesced:
            # A quiesced follower that stands for election restarted (or lost its leader's
            # word): tell it who leads.
            self._wake_progress(sender, self.progress[sender])
        if self.quiesced and req.candidate == self.leader_id:
            # Our leader campaigns: it no longer leads (it stepped down, or restarted and
            # forgot); trusting its liveness, we would refuse it for good.
            self.quiesced = False
            self.leader_id = NO_LEADER
            self.last_leader_contact = -(10**12)
        if req.pre_vote:
            leader_alive = self.role is Role.LEADER or self._hears_leader
            granted = req.epoch > self.epoch and up_to_date and not leader_alive
            # A refusal carries our own epoch (etcd's rule): a prospective candidate behind it
            # moves up, or two nodes each refusing the other's pre-vote could wait forever.
            epoch = req.epoch if granted else self.epoch
            self._send(
                sender,
                VoteResponse(epoch, self.node_id, granted, True, self.leader_id, self.is_admitted),
            )
            return
        granted = (
            req.epoch == self.epoch
            and self.voted_for in (NO_VOTE, req.candidate)
            and self.role is not Role.LEADER
            and up_to_date
        )
        if granted:
            self._set_state(self.epoch, req.candidate)
            self._reset_election_timer()
        self._send(
            sender,
            VoteResponse(
                self.epoch, self.node_id, granted, False, self.leader_id, self.is_admitted
            ),
        )

    def _on_vote_response(self, sender: int, resp: VoteResponse) -> None:
        if resp.pre_vote:
            if self.role is not Role.PROSPECTIVE or resp.epoch != self.epoch + 1:
                return
            if not resp.granted or sender not in self.voters:
                return
            self.votes.add(sender)
            if self._won():
                self._start_election()
            return
        if self.role is not Role.CANDIDATE or resp.epoch != self.epoch or not resp.granted:
            return
        if sender in self.voters:  # a vote counts only from a voter of our own membership
            self.votes.add(sender)
        if self._won():
            self._become_leader()

    def _won(self) -> bool:
        """A majority of our newest membership's voters (ourselves only if we are one)."""
        return len(self.votes & set(self.voters)) >= majority(len(self.voters))

    def _resign(self, successor: int | None = None) -> None:
        """Hand over (our own removal is committed, or a voter asked): to successor, or to the
        most caught-up remaining voter."""
        voters = [v for v in self.voters if v != self.node_id]
        if successor is None:
            successor = max(voters, key=lambda v: (self.progress[v].match_offset, -v))
        self._become_follower(self.epoch, NO_LEADER)
        for v in voters:
            self._send(v, Resign(self.epoch, self.node_id, successor))

    def _on_transfer_leadership(self, sender: int, msg: TransferLeadership) -> None:
        """A voter that holds everything we hold may take over; one that does not yet asks
        again (the operator's command waits and retries)."""
        if (
            self.role is not Role.LEADER
            or msg.epoch != self.epoch
            or sender not in self.voters
            or self.progress[sender].match_offset < self.log.log_end_offset
        ):
            return
        self._resign(successor=sender)

    def _on_resign(self, sender: int, msg: Resign) -> None:
        if msg.epoch != self.epoch or self.leader_id != sender or self.role is not Role.FOLLOWER:
            return
        self.leader_id = NO_LEADER  # no longer alive, as far as pre-votes are concerned
        self.quiesced = False
        self.last_leader_contact = -(10**12)
        if msg.successor == self.node_id and not self.is_learner:
            self._start_election()

    def _on_epoch_notice(self, sender: int, msg: EpochNotice) -> None:
        """(A later epoch was handled above, as for any message.) In our own epoch, a notice
        from the epoch's leader itself tells us whom to follow."""
        if (
            msg.epoch == self.epoch
            and self.role is not Role.LEADER
            and msg.leader == sender
            and (self.role is not Role.FOLLOWER or self.leader_id != msg.leader)
        ):
            self._become_follower(msg.epoch, msg.leader)

    def _on_begin_epoch(self, sender: int, msg: BeginEpoch) -> None:
        if msg.epoch < self.epoch:
            return
        if self.role is not Role.FOLLOWER or self.leader_id != msg.leader:
            self._become_follower(msg.epoch, msg.leader)
        elif self.quiesced:
            self._unquiesce_follower(leader_dead=False)  # the leader has news: fetch it

    def _become_follower(self, epoch: int, leader: int) -> None:
        voted = self.voted_for if epoch == self.epoch else NO_VOTE
        self._set_state(epoch, voted)
        self._set_role(Role.FOLLOWER)
        self.leader_id = leader
        self.quiesced = False
        self.fetch_in_flight = False
        self.reported_durable = -1
        self.installing = None
        self.last_leader_contact = self.now
        self._reset_election_timer()
        if FAULT_TRUNCATE_TO_HW in self.config.faults and leader != NO_LEADER:
            # The pre-KIP-101 bug: trusting the local HW as the end of the committed log.
            self.log.truncate_to(self.log.high_watermark)
            self._truncated()
        self._maybe_send_fetch()

    def _become_leader(self) -> None:
        self._set_role(Role.LEADER)
        self.leader_id = self.node_id
        self.leader_since_tick = self.now
        self.epoch_start_offset = self.log.log_end_offset
        self.progress = {
            r: Progress(last_fetch_tick=self.now, begin_sent_tick=self.now)
            for r in self._others() + list(self.learners)
        }
        self.admission.lead()
        if self.log.log_end_offset > self.log.high_watermark:
            # Entries of earlier epochs may be uncommitted; only an entry of our own epoch on a
            # quorum commits them (Raft section 5.4.2), so write one now rather than waiting
            # for a producer.
            self.log.append_as_leader(self._leader_change_marker(), self.epoch)
        for v in self.progress:
            self._send(v, BeginEpoch(self.epoch, self.node_id))
        self._after_leader_append()

    def _leader_change_marker(self) -> bytes:
        value = {"leader": self.node_id, "epoch": self.epoch, "voters": list(self.voters)}
        record = ProducerRecord(LEADER_CHANGE_CONTROL_KEY, json.dumps(value).encode())
        return build_batch([record], control=True, now_ms=0)

    # -- membership (membership.py) --------------------------------------------------------------

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
    def committed_membership(self) -> Membership:
        return self.history.at(self.log.high_watermark)

    def _may_change_membership(self) -> bool:
        if FAULT_UNCOMMITTED_CHANGES in self.config.faults:
            return True
        hw = self.log.high_watermark
        return self.history.current.offset < hw and self.epoch_start_offset < hw

    def _changing_membership(self) -> bool:
        """A target the group is not at yet (the leader walks it there)."""
        if self.target is None:
            return False
        current = self.history.current
        return not (self.target == tuple(sorted(current.voters)) and not current.learners)

    def _maybe_change_membership(self) -> None:
        if self.role is not Role.LEADER or not self._changing_membership():
            return  # no target, or there already
        current = self.history.current
        if self.target is None:
            raise InvariantBroken("self.target is not None")
        lag = self.config.replica_lag_ticks

        def caught_up(n: int) -> bool:
            """In sync, and heard from just now (a long poll's age at most): a replica that
            crashed, or lost its disk, a moment ago must not count."""
            if n == self.node_id:
                return True
            p = self.progress.get(n)
            return (
                p is not None
                and self.now - p.last_caught_up_tick <= lag
                and self.now - p.last_fetch_tick <= self.config.fetch_retry_ticks
                and n not in self.observers
            )

        step = next_membership(
            current,
            self.target,
            caught_up,
            self.node_id,
            at_once=FAULT_UNCOMMITTED_CHANGES in self.config.faults,
        )
        if step is None:
            return
        if not self._may_change_membership():
            if self.log.log_end_offset == self.epoch_start_offset:
                # Elected with nothing uncommitted, so no entry of our epoch was written; a
                # change may follow only one that commits (as KRaft writes one every election).
                self.log.append_as_leader(self._leader_change_marker(), self.epoch)
                self._after_leader_append()
            return
        voters, learners = step
        if sum(1 for v in voters if caught_up(v)) < majority(len(voters)):
            # etcd's strict reconfiguration check: never leave a membership whose majority is
            # not caught up now (a voter down, or a replaced disk not yet admitted), or the
            # group may be unable to elect anyone until that voter is back.
            return
        proposal = Membership(self.log.log_end_offset, voters, learners)
        info = self.log.append_as_leader(proposal.control_batch(), self.epoch)
        invariant(info.first_offset == proposal.offset, "info.first_offset == proposal.offset")
        self.history.append(proposal)
        self._persist_state()
        self._on_membership_changed()
        self._after_leader_append()

    def _on_membership_changed(self) -> None:
        """Leader: follow the members it now has (new ones hear of its epoch at once)."""
        if self.role is not Role.LEADER:
            return
        members = set(self.history.current.members)
        for gone in [r for r in self.progress if r not in members]:
            del self.progress[gone]
            self.observers.pop(gone, None)
        for new in sorted(members - set(self.progress) - {self.node_id}):
            # Caught up only once it has fetched what we hold now (not by its first fetch).
            self.progress[new] = Progress(
                last_fetch_tick=self.now,
                begin_sent_tick=self.now,
                leo_at_last_fetch=self.log.log_end_offset,
            )
            self._send(new, BeginEpoch(self.epoch, self.node_id))

    def _truncated(self) -> None:
        """The log lost its tail: so did the membership changes in it."""
        self._ready.truncated = True
        if self.history.truncate(self.log.log_end_offset):
            self._persist_state()

    def _start_over(self, offset: int, encoded: str, prefix_epoch: int) -> None:
        """The log starts over at offset (a leader's log start or snapshot), with the membership
        the leader had there, and the epoch of the leader's entry below it as its last epoch
        (an empty log that claimed epoch -1 granted its vote to candidates missing what it had
        committed: simulator seed 300028)."""
        self.log.truncate_fully_and_start_at(offset, prefix_epoch)
        self._ready.truncated = True
        self.history.start_over_at(offset, encoded)
        self._persist_state()

    def _log_start_moved(self) -> None:
        self._ready.log_start_changed = True
        if self.history.forget_below(self.log.log_start_offset):
            self._persist_state()

    # -- leader side of replication -------------------------------------------------------------

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
            due = self.election_deadline  # (an observer or learner only re-arms its timer)
            if self.leader_id != NO_LEADER:
                if not self.fetch_in_flight:
                    return now + 1
                due = min(due, self.fetch_sent_tick + config.fetch_retry_ticks)
            return due
        if self.is_observer or self.is_learner:
            return None
        return self.election_deadline

    def _leader_deadline(self) -> int | None:
        if self._changing_membership():
            return (
                self.now + 1
            )  # a membership change (and its throttled catch-up) walks tick by tick
        return next_due(
            self.progress,
            self.now,
            self.log.high_watermark,
            self.leader_since_tick,
            self.config,
            self._counts,
        )

    def _leader_tick(self, elapsed: int = 1) -> None:
        retry = self.config.fetch_retry_ticks
        if self.learner_bytes_per_tick > 0:
            self._learner_budget = min(
                self._learner_budget + self.learner_bytes_per_tick * elapsed,
                10 * self.learner_bytes_per_tick,
            )
        if self._changing_membership():
            self._wake_quiesced()  # the walk needs its followers fetching (caught up, alive)
        self._maybe_change_membership()
        if self.role is not Role.LEADER:
            return
        hw = self.log.high_watermark
        for r, p in self.progress.items():
            if p.quiesced:
                if not alive_as_quiesced(self.liveness, r, p.incarnation, self.config.faults):
                    # Its node died (check-quorum counts it by its fetches again) or restarted
                    # (it forgot whom it follows: tell it).
                    p.quiesced = False
                    if alive(self.liveness, r):
                        self._wake_progress(r, p)
                continue
            if p.pending is not None and (
                self.now >= p.pending_deadline or p.pending.high_watermark < hw
            ):
                # A parked fetch learns of a new HW here, at most a tick late, unless records
                # carried it sooner: one answer per tick instead of one per commit. One that
                # waited its whole time for nothing may quiesce its follower.
                quiesce = self.now >= p.pending_deadline and leader_may_quiesce(
                    self.liveness,
                    r,
                    p.pending,
                    self.log,
                    r in self.observers,
                    self._changing_membership(),
                )
                self._answer_fetch(r, p.pending, quiesce=quiesce)
            elif self.now - p.last_fetch_tick >= retry and self.now - p.begin_sent_tick >= retry:
                # A voter that is not fetching may have missed our election (or be running a
                # pre-vote nobody grants): tell it again, as KRaft resends BeginQuorumEpoch.
                p.begin_sent_tick = self.now
                self._send(r, BeginEpoch(self.epoch, self.node_id))
        if self.config.hw_policy == "isr":
            self._maybe_advance_high_watermark()
        if self.now - self.leader_since_tick >= self.config.check_quorum_ticks:
            recent = heard_from(
                self.progress, self.now, self.config.check_quorum_ticks, self._counts
            )
            if recent + (self.node_id in self.voters) < majority(len(self.voters)):
                # Cut off from a quorum: stop taking writes that can never commit here.
                self._become_follower(self.epoch, NO_LEADER)

    def _after_leader_append(self) -> None:
        self._wake_quiesced()
        self._maybe_advance_high_watermark()
        self._complete_pending_fetches()

    # -- quiescence (quiescence.py) --------------------------------------------------------------

    def _quiesced_leader_alive(self) -> bool:
        return alive_as_quiesced(
            self.liveness, self.leader_id, self.quiesced_incarnation, self.config.faults
        )

    def _wake_progress(self, r: int, p: Progress) -> None:
        p.quiesced = False
        # It was alive (the liveness said so) and caught up until now.
        p.last_fetch_tick = p.begin_sent_tick = self.now
        p.last_caught_up_tick = self.now
        self._send(r, BeginEpoch(self.epoch, self.node_id))

    def _wake_quiesced(self) -> None:
        for r, p in self.progress.items():
            if p.quiesced:
                self._wake_progress(r, p)

    def _unquiesce_follower(self, leader_dead: bool) -> None:
        self.quiesced = False
        self.fetch_in_flight = False
        if leader_dead:
            # One voter stands at once, the others after a jitter (their votes would split).
            self.last_leader_contact = -(10**12)
            first = first_to_stand(self.voters, self.leader_id, self.epoch, self.liveness)
            jitter = self.config.election_jitter_ticks
            wait = 0 if first in (None, self.node_id) else jitter // 2 + self.rng.randint(0, jitter)
            self.election_deadline = self.now + wait
        else:
            self.last_leader_contact = self.now
            self._reset_election_timer()
        self._maybe_send_fetch()

    @property
    def quiescent(self) -> bool:
        """A follower told to wait, or a leader whose followers all were."""
        if self.role is Role.LEADER:
            return bool(self.progress) and all(p.quiesced for p in self.progress.values())
        return self.quiesced

    def _on_fetch_request(self, sender: int, req: FetchRequest) -> None:
        if self.role is not Role.LEADER or req.epoch != self.epoch:
            error = FETCH_FENCED if req.epoch < self.epoch else FETCH_NOT_LEADER
            self._send(sender, refusal(self.epoch, self.leader_id, req, self.log, error))
            return
        progress = self.progress[sender]
        progress.pending = None
        progress.quiesced = False  # it fetches: it is counted by its fetches again
        if must_start_over(req, self.log):
            memberships, prefix_epoch = start_over_point(self.log, self.history)
            self._send(
                sender,
                self._empty_response(
                    req,
                    snapshot_required=True,
                    memberships=memberships,
                    log_start_epoch=prefix_epoch,
                ),
            )
            return
        diverging = divergence(req, self.log)
        if diverging is not None:
            epoch, end = diverging
            self._send(
                sender,
                self._empty_response(
                    req, diverging=True, diverging_epoch=epoch, diverging_end_offset=end
                ),
            )
            return
        self._record_fetch(sender, progress, req)
        self._maybe_advance_high_watermark()
        if answer_now(req, self.log, self.config.state_machine):
            self._answer_fetch(sender, req)
        else:
            progress.pending = req
            progress.pending_deadline = self.now + self.config.fetch_max_wait_ticks

    def _record_fetch(self, sender: int, p: Progress, req: FetchRequest) -> None:
        leo = self.log.log_end_offset
        invariant(req.fetch_offset <= leo, "req.fetch_offset <= leo")
        durable = reported_durable(req)
        if sender in self.observers and self.admission.maybe_admit(sender, durable):
            self._wake_quiesced()  # the admitted map reaches followers in fetch answers
        if sender in self.observers:
            p.observe_fetch(req, self.now)
        else:
            p.record_fetch(req, durable, leo, self.now)

    def _empty_response(self, req: FetchRequest, **fields: object) -> FetchResponse:
        return FetchResponse(
            self.epoch,
            self.node_id,
            req.fetch_offset,
            self.log.high_watermark,
            self.log.log_start_offset,
            last_fetched_epoch=req.last_fetched_epoch,
            directories=self.admission.for_follower(req.directories_crc),
            **fields,  # type: ignore[arg-type]
        )

    def _answer_fetch(self, follower: int, req: FetchRequest, quiesce: bool = False) -> None:
        progress = self.progress[follower]
        has_data = req.fetch_offset < self.log.log_end_offset
        throttled = self.learner_bytes_per_tick > 0 and follower in self.learners
        if throttled and has_data and self._learner_budget <= 0:
            progress.pending = req  # answered once the catch-up budget allows
            progress.pending_deadline = self.now + 1
            return
        progress.pending = None
        records = None
        if has_data:
            max_bytes = (
                min(req.max_bytes, max(1, self._learner_budget)) if throttled else req.max_bytes
            )
            records = self.log.read(req.fetch_offset, max_bytes, self.log.log_end_offset)
            if records is not None and throttled:
                self._learner_budget -= records.size
        progress.known_hw = self.log.high_watermark
        if quiesce:
            if self.liveness is None:
                raise InvariantBroken("self.liveness is not None")
            progress.quiesced = True
            progress.incarnation = self.liveness.incarnation(follower)
        self._send(
            follower,
            FetchResponse(
                self.epoch,
                self.node_id,
                req.fetch_offset,
                self.log.high_watermark,
                self.log.log_start_offset,
                records=records,
                last_fetched_epoch=req.last_fetched_epoch,
                directories=self.admission.for_follower(req.directories_crc),
                memberships=self.history.for_follower(req.fetch_offset, req.membership_digest),
                quiesce=quiesce,
            ),
        )

    def _complete_pending_fetches(self) -> None:
        """Parked fetches that new records answer (a new HW alone waits for the tick, but in
        a state machine's log, whose followers apply what commits)."""
        leo = self.log.log_end_offset
        hw = self.log.high_watermark if self.config.state_machine else -1
        for r, p in self.progress.items():
            if p.pending is not None and (
                p.pending.fetch_offset < leo or p.pending.high_watermark < hw
            ):
                self._answer_fetch(r, p.pending)

    def _fail_pending_fetches(self) -> None:
        for p in self.progress.values():
            p.pending = None

    def _maybe_advance_high_watermark(self) -> None:
        if self.role is not Role.LEADER:
            return
        voters = self.voters
        match = {r: p.match_offset for r, p in self.progress.items() if r in voters}
        if self.node_id in voters:
            match[self.node_id] = self.log.effective_durable_end
        if self.config.hw_policy == "isr" and self.node_id in voters:
            candidate, _ = isr_offset(match, self.in_sync_replicas(), self.node_id)
        else:
            candidate = quorum_offset(list(match.values()))
        if (
            candidate <= self.epoch_start_offset
            and FAULT_COMMIT_OLD_EPOCH not in self.config.faults
        ):
            return  # Raft's rule: nothing commits by counting until our own epoch's entry does
        candidate = min(candidate, self.log.log_end_offset)
        if candidate > self.log.high_watermark:
            self.log.set_high_watermark(candidate)
            self._ready.high_watermark_changed = True
            self._complete_pending_fetches()
            if self.node_id not in self.voters and self.history.current.offset < candidate:
                self._resign()

    # -- follower side of replication -----------------------------------------------------------

    def _maybe_send_fetch(self, report_durability: bool = False) -> None:
        if self.role is not Role.FOLLOWER or self.leader_id == NO_LEADER or self.quiesced:
            return
        if self.fetch_in_flight and not report_durability:
            return
        if self.installing is not None:
            if not self.fetch_in_flight:
                self._request_snapshot_chunk()
            return
        # Fetch ahead of our own fsync (the answer's records overlap it); the leader counts
        # only durable_offset toward the HW, and a later request reports the fsync.
        durable = self.log.effective_durable_end
        self.fetch_in_flight = True
        self.fetch_sent_tick = self.now
        self.reported_durable = durable
        self._send(
            self.leader_id,
            FetchRequest(
                self.epoch,
                self.node_id,
                self.log.log_end_offset,
                self.log.epochs.latest_epoch,
                self.log.high_watermark,
                self.config.fetch_max_bytes,
                durable,
                self.admission.crc,
                self.history.current.digest,
            ),
        )

    def _on_fetch_response(self, sender: int, resp: FetchResponse) -> None:
        if resp.epoch < self.epoch:
            return
        if resp.error:
            if resp.leader == sender and resp.leader != self.leader_id and resp.epoch == self.epoch:
                self._become_follower(self.epoch, resp.leader)
            elif sender == self.leader_id:
                self.fetch_in_flight = False
            return
        if self.role is not Role.FOLLOWER or self.leader_id != sender:
            self._become_follower(resp.epoch, sender)
            return
        if (
            resp.fetch_offset != self.log.log_end_offset
            or resp.last_fetched_epoch != self.log.epochs.latest_epoch
            or not self.fetch_in_flight
        ):
            return  # a late or duplicated answer, computed for a log we no longer have
        self.fetch_in_flight = False
        self.last_leader_contact = self.now
        self._reset_election_timer()
        if resp.directories:
            self.admission.adopt(resp.directories)
        self.leader_high_watermark = resp.high_watermark
        self.leader_log_start = resp.log_start_offset
        if resp.snapshot_required and self.config.state_machine and self.snapshots is not None:
            # A state-machine log cannot skip what the leader discarded: take its snapshot.
            self.installing = SnapshotFetch(self.snapshots)
        elif resp.snapshot_required:
            # A stream has no state to rebuild: start over at the leader's log start.
            self._start_over(resp.log_start_offset, resp.memberships, resp.log_start_epoch)
        elif resp.diverging:
            self._truncate_diverging(resp.diverging_epoch, resp.diverging_end_offset)
        else:
            # Only an answer without divergence proves our log matches the leader's up to the
            # fetch offset, so only then may the leader's HW become ours (up to our log end).
            records = resp.records if resp.records is not None and resp.records.size > 0 else None
            if records is not None:
                self.log.append_as_follower(records.read())
            if resp.memberships and self.history.adopt(
                resp.memberships, resp.fetch_offset, self.log.log_end_offset
            ):
                self._persist_state()
            self._follow_high_watermark(resp.high_watermark)
            self._follow_log_start(resp.log_start_offset)
            if resp.quiesce and follower_may_quiesce(
                self.liveness, sender, records is not None, self.log, self.installing is not None
            ):
                self.quiesced = True
                if self.liveness is None:
                    raise InvariantBroken("self.liveness is not None")
                self.quiesced_incarnation = self.liveness.incarnation(sender)
                return  # no next fetch: the leader wakes us with news
            if (
                records is not None
                and records.size < self.config.fetch_max_bytes // 2
                and self.log.effective_durable_end < self.log.log_end_offset
            ):
                # The leader had no more than this: the next fetch goes when the fsync is done
                # (on_flushed), carrying the durability report the HW waits for, instead of one
                # fetch now and a report after. A full answer means more is waiting: fetch
                # ahead, overlapping the transfer with the fsync.
                return
        self._maybe_send_fetch()

    # -- snapshots (state-machine logs) ---------------------------------------------------------

    def _request_snapshot_chunk(self) -> None:
        if self.installing is None:
            raise InvariantBroken("self.installing is not None")
        request = self.installing.request(self.epoch, self.node_id, self.config.fetch_max_bytes)
        self.fetch_in_flight = True
        self.fetch_sent_tick = self.now
        self._send(self.leader_id, request)

    def _on_fetch_snapshot_request(self, sender: int, req: FetchSnapshotRequest) -> None:
        if self.role is not Role.LEADER or req.epoch != self.epoch:
            error = FETCH_FENCED if req.epoch < self.epoch else FETCH_NOT_LEADER
            self._send(sender, snapshot_refusal(self.epoch, self.leader_id, req, error))
            return
        self.progress[sender].last_fetch_tick = self.now  # alive, and busy catching up
        answer = snapshot_answer(
            self.epoch, self.leader_id, req, self.snapshots, self.log.epochs, self.history
        )
        self._send(sender, answer)

    def _on_fetch_snapshot_response(self, sender: int, resp: FetchSnapshotResponse) -> None:
        if resp.epoch < self.epoch or self.installing is None:
            return
        if self.role is not Role.FOLLOWER or self.leader_id != sender:
            self._become_follower(resp.epoch, sender)
            return
        if not self.fetch_in_flight or not self.installing.answers(resp):
            return  # a late or duplicated answer
        self.fetch_in_flight = False
        if resp.error in (FETCH_NOT_LEADER, FETCH_FENCED):
            # It leads no more: no word from a leader, and the election timer runs on. (Taken
            # for the leader's word, it kept a follower installing a snapshot from refusing
            # every pre-vote for good: fresh seed 546208268.)
            return
        self.last_leader_contact = self.now
        self._reset_election_timer()
        if resp.error:
            return  # (no snapshot yet) asked again on the next tick
        if self.installing.take(resp):
            self._start_over(resp.snapshot_offset, resp.memberships, resp.snapshot_epoch)
            self._ready.snapshot_installed = resp.snapshot_offset
            self.installing = None
            self._maybe_send_fetch()
            return
        self._request_snapshot_chunk()

    def _truncate_diverging(self, epoch: int, end_offset: int) -> None:
        local_epoch, local_end = self.log.epochs.end_offset_for(epoch, self.log.log_end_offset)
        target = min(local_end, end_offset) if local_epoch == epoch else local_end
        target = max(target, self.log.log_start_offset)
        if target < self.log.log_end_offset:
            if target < self.log.high_watermark and FAULT_TRUNCATE_TO_HW not in self.config.faults:
                # A leader that lacks what we committed (it was elected by a broken rule). Not an
                # `assert`, which `python -O` strips: the node fails stop instead of cutting.
                raise CommittedPrefixBroken(
                    f"replica {self.node_id}: told to truncate to {target}, below its HW "
                    f"{self.log.high_watermark}: divergence never reaches below the committed "
                    "prefix"
                )
            self.log.truncate_to(target)
            self._truncated()

    def _follow_log_start(self, leader_log_start: int) -> None:
        """Discard the prefix the leader discarded: only what is committed here too and, for a
        state-machine log, only what this replica's own newest snapshot covers (as in Raft,
        each replica compacts behind its own snapshot). A restart rebuilds the machine from
        that snapshot and the log after it; discarding past it strands the machine below the
        log start with nothing to bring it forward (simulator seeds 6 and 91, found when the
        simulator began to run the production state-machine driver)."""
        target = min(leader_log_start, self.log.high_watermark)
        if (
            self.config.state_machine
            and self.snapshots is not None
            and FAULT_DISCARD_PAST_SNAPSHOT not in self.config.faults
        ):
            latest = self.snapshots.latest_snapshot()
            target = min(target, latest[0] if latest is not None else self.log.log_start_offset)
        if target > self.log.log_start_offset and self.log.advance_log_start(target):
            self._log_start_moved()

    def _follow_high_watermark(self, leader_hw: int) -> None:
        hw = min(leader_hw, self.log.log_end_offset)
        if hw > self.log.high_watermark:
            self.log.set_high_watermark(hw)
            self._ready.high_watermark_changed = True

    def _send(self, to: int, message: Message) -> None:
        self._ready.messages.append(Outgoing(to, message))
