"""What one replica knows, and the primitives every part of it changes that through.

A replica is built in layers, each a class over the one below, each calling only its own
methods and those below it:

    ReplicaState   (this module) the fields, by the role that uses them; the time and the
                   membership in effect; persisting the quorum state, sending, changing epoch,
                   vote or role
    Following      (following.py) following a leader: fetching, truncating, snapshots
    Leading        (leading.py) leading: serving fetches, the HW, check-quorum, the membership
                   walk, handing over (it steps down through Following)
    Elections      (elections.py) pre-vote and vote (a candidate leads, or follows)
    Replica        (replica.py) the driver's API: tick, step, propose, ready; views

The rules they apply are pure functions and small classes of their own: progress.py (the
leader's view of each follower), fetch_serving.py, quiescence.py, admission.py (replaced disks),
snapshot_transfer.py, membership.py and quorum.py.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Protocol

from tidelog.invariant import invariant
from tidelog.replication.admission import Admission
from tidelog.replication.clock import Clock, TickSource
from tidelog.replication.faults import FAULT_TRUNCATE_TO_HW
from tidelog.replication.liveness import LivenessView
from tidelog.replication.log_interface import ReplicaLog, SnapshotAccess
from tidelog.replication.membership import (
    INITIAL,
    Membership,
    MembershipHistory,
    decode_memberships,
)
from tidelog.replication.messages import Message, Outgoing, VoteRequest
from tidelog.replication.progress import Progress
from tidelog.replication.quiescence import alive_as_quiesced
from tidelog.replication.read_index import ReadIndex
from tidelog.replication.ready import QuorumState, Ready
from tidelog.replication.replica_config import ReplicaConfig
from tidelog.replication.snapshot_transfer import SnapshotFetch

NO_LEADER = -1


class RandomSource(Protocol):
    """The only randomness the core uses: injected (a seeded random.Random in practice)."""

    def randint(self, a: int, b: int) -> int: ...


class Role(enum.Enum):
    FOLLOWER = "follower"
    PROSPECTIVE = "prospective"  # running a pre-vote
    CANDIDATE = "candidate"
    LEADER = "leader"


class ReplicaState:
    """What one replica knows (its fields, by the role that uses them) and the primitives
    every layer changes it through."""

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
        self.config = config  # replaced whole when the topic's config changes: never copy from it
        self.node_id = config.node_id
        self.log = log
        self.snapshots = snapshots
        self.rng = rng
        # The time: the node's clock, shared by its replicas, or one of our own (tick()).
        self._own_clock = Clock() if clock is None else None
        self.clock: TickSource = clock if clock is not None else Clock()
        if self._own_clock is not None:
            self.clock = self._own_clock
        self._acted_at = self.clock.ticks
        # The node's liveness (one heartbeat per pair of nodes, liveness.py): with it an idle
        # group quiesces, and learns of a dead leader or follower from it. None: never.
        self.liveness = liveness

        # Durable, as the quorum state: epoch, vote, admitted directories (and the leader's
        # observers: admission.py), memberships. Every change is persisted before any message
        # leaves; the epoch never decreases, and the vote is given at most once per epoch.
        self.epoch = state.epoch
        self.voted_for = state.voted_for
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

        self.role = Role.FOLLOWER
        self.leader_id = NO_LEADER
        self.election_deadline = 0
        self.forged_messages = 0  # dropped: they claimed to come from a node other than theirs
        # Its node is stopping (Replica.hand_over, a controlled shutdown): it never stands for
        # election again nor takes a write, and as leader it hands its leadership over (the
        # tick it resigned for that: handed_over_tick).
        self.leaving = False
        self.handed_over_tick: int | None = None
        self._ready = Ready()  # the outputs not handed over yet

        self._leader_fields()
        # As a candidate: the votes granted; our campaign's request, and the voters it reached
        # as far as the liveness knew (one that comes alive later is asked again at once).
        self.votes: set[int] = set()
        self._vote_request: VoteRequest | None = None
        self._asked: set[int] = set()
        self._follower_fields(log)
        self._reset_election_timer()
        if FAULT_TRUNCATE_TO_HW in config.faults:
            log.truncate_to(log.high_watermark)  # the pre-KIP-101 restart
            self.history.truncate(log.log_end_offset)

    def _leader_fields(self) -> None:
        """As a leader (valid while it leads): every other member's progress, the entry of its
        own epoch (at epoch_start_offset) that must commit before anything counts, and the
        reads waiting for a confirmation round (read_index.py)."""
        self.progress: dict[int, Progress] = {}
        self.epoch_start_offset = 0
        self.leader_since_tick = 0
        self.target: tuple[int, ...] | None = None  # voters the leader walks the group towards
        self.learner_bytes_per_tick = 0  # catch-up throttle for learners (0: none)
        self._learner_budget = 0
        self.reads = ReadIndex()

    def _follower_fields(self, log: ReplicaLog) -> None:
        """As a follower: at most one fetch (or snapshot request) outstanding."""
        self.last_leader_contact = 0
        # A replica that restarted (it knew an epoch) grants no pre-vote for an election
        # timeout (elections.py); a new one never confirmed any leader's lease.
        self.restarted_tick: int | None = self.now if self.epoch > 0 else None
        self.fetch_in_flight = False
        self.fetch_sent_tick = 0
        self.reported_durable = -1  # the durable offset our last fetch told the leader
        self.leader_high_watermark = log.high_watermark  # as last heard from the leader
        self.leader_log_start = log.log_start_offset
        self.installing: SnapshotFetch | None = None  # a snapshot being fetched from the leader
        self.quiesced = False  # told by its leader to wait for news (only a follower is)
        self.quiesced_incarnation = -1  # the leader's incarnation when it said so
        self.heard_read_round = 0  # the leader's last read round heard in this epoch

    # -- the time, the group and its leader -----------------------------------------------------

    @property
    def now(self) -> int:
        return self.clock.ticks

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

    @property
    def committed_membership(self) -> Membership:
        return self.history.at(self.log.high_watermark)

    def _others(self) -> list[int]:
        return [v for v in self.voters if v != self.node_id]

    def _leader_hint(self) -> int | None:
        return self.leader_id if self.leader_id != NO_LEADER else None

    def _reset_election_timer(self) -> None:
        jitter = self.rng.randint(0, self.config.election_jitter_ticks)
        self.election_deadline = self.now + self.config.election_timeout_ticks + jitter

    def _quiesced_leader_alive(self) -> bool:
        return alive_as_quiesced(
            self.liveness, self.leader_id, self.quiesced_incarnation, self.config.faults
        )

    # -- replaced disks (admission.py) ----------------------------------------------------------

    @property
    def is_observer(self) -> bool:
        """This replica lost its disk: it catches up without voting (admission.py)."""
        return self.admission.is_observer

    @property
    def is_admitted(self) -> bool:
        return self.admission.is_admitted

    @property
    def observers(self) -> dict[int, tuple[str, int]]:
        """Leader: voters catching up under a directory not admitted yet -> (directory, the
        offset they must hold durably to be admitted)."""
        return self.admission.observers

    def _counts(self, replica: int) -> bool:
        """A follower whose liveness counts toward the ISR and check-quorum: a voter whose
        directory is admitted (not an observer)."""
        return replica not in self.observers and replica in self.voters

    # -- the outputs: the quorum state (persisted first) and messages ---------------------------

    def _persist_state(self) -> None:
        """Every change of epoch, vote or admitted directories comes here: it is made durable
        before any message leaves."""
        self._ready.state = QuorumState(
            self.epoch, self.voted_for, self.admission.encode(), self.history.encode()
        )

    def _send(self, to: int, message: Message) -> None:
        self._ready.messages.append(Outgoing(to, message))

    def _set_state(self, epoch: int, voted_for: int) -> None:
        invariant(epoch >= self.epoch, "epoch >= self.epoch")
        if (epoch, voted_for) != (self.epoch, self.voted_for):
            self.epoch = epoch
            self.voted_for = voted_for
            self._persist_state()

    # -- changing role --------------------------------------------------------------------------

    def _set_role(self, role: Role) -> None:
        if role is not self.role:
            if self.role is Role.LEADER:
                self._ready.lost_leadership = True
                self._fail_pending_fetches()
                self._ready.failed_reads.extend(self.reads.abandon())
            self.quiesced = False
            self.role = role
            self._ready.role_changed = True

    def _fail_pending_fetches(self) -> None:
        for p in self.progress.values():
            p.pending = None
