"""Messages between replicas of one partition (pull-based Raft, KIP-595 shaped).

All messages are one-way: a FetchResponse is just another message the leader sends. The
records in a FetchResponse are an opaque slice of the leader's log (a file range on a real node,
bytes in the simulator); the core never looks inside them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class RecordsSlice(Protocol):
    """What a log read returns: a byte range of whole batches."""

    @property
    def size(self) -> int: ...

    @property
    def first_offset(self) -> int: ...

    def read(self) -> bytes: ...


@dataclass(frozen=True, slots=True)
class VoteRequest:
    epoch: int  # the epoch the candidate runs in (for a pre-vote: the one it would run in)
    candidate: int
    last_epoch: int
    log_end_offset: int
    pre_vote: bool
    admitted: bool = False  # a leader admitted the candidate's current directory


@dataclass(frozen=True, slots=True)
class VoteResponse:
    epoch: int
    voter: int
    granted: bool
    pre_vote: bool
    leader: int = -1  # the voter's current leader, when it knows one
    admitted: bool = False  # a leader admitted the voter's current directory


@dataclass(frozen=True, slots=True)
class BeginEpoch:
    """A new leader announces itself so followers need not wait for their timeouts (and wakes
    quiesced ones)."""

    epoch: int
    leader: int
    read_round: int = 0  # the leader's last read round (read_index.py): echo it in your fetch


@dataclass(frozen=True, slots=True)
class EpochNotice:
    """A voter tells a stale leader that the epoch has moved on (and whom it follows in it)."""

    epoch: int
    voter: int  # the sender
    leader: int = -1  # a hint: the leader the sender knows for epoch, if any


@dataclass(frozen=True, slots=True)
class Resign:
    """A leader steps down for good (its own removal from the group committed): followers stop
    waiting for it, and its successor stands at once (KRaft's EndQuorumEpoch, Raft's
    TimeoutNow)."""

    epoch: int
    leader: int  # the sender
    successor: int  # the most caught-up voter


@dataclass(frozen=True, slots=True)
class FetchRequest:
    epoch: int
    replica: int
    fetch_offset: int  # the follower's log end: where the answer's records start
    last_fetched_epoch: int
    high_watermark: int  # what the follower knows, so the leader can answer at once when stale
    max_bytes: int
    # Everything below this is fsynced on the follower; only this counts toward the HW. The
    # follower fetches ahead of its fsyncs and reports durability with its next request.
    durable_offset: int = -1  # -1: the same as fetch_offset
    directories_crc: int = 0  # of the admitted-directories map the follower holds
    # A digest of the membership in effect at the follower's log end: the leader sends its own
    # for fetch_offset when they differ (a follower that crashed while starting over at the
    # leader's log start kept its log's new start but not the membership that came with it; a
    # joining node knows the group's first membership only as another node told it)
    membership_digest: int = 0
    # The last read round (read_index.py) heard from this epoch's leader: the leader counts
    # this fetch as confirming its leadership for that round and every earlier one.
    read_round: int = 0


# FetchResponse.error values
FETCH_OK = ""
FETCH_NOT_LEADER = "NotLeader"
FETCH_FENCED = "FencedEpoch"
FETCH_NO_SNAPSHOT = "NoSnapshot"


@dataclass(frozen=True, slots=True)
class FetchResponse:
    epoch: int
    leader: int
    fetch_offset: int  # echoed, so a late answer to an old request is recognised
    high_watermark: int
    log_start_offset: int
    error: str = FETCH_OK
    records: RecordsSlice | None = None
    diverging: bool = False  # the follower's log differs: truncate (see below), fetch again
    diverging_epoch: int = -1  # largest epoch <= the follower's last one that the leader has
    diverging_end_offset: int = -1  # where that epoch ends on the leader
    snapshot_required: bool = False  # fetch_offset is below the leader's log start
    # With snapshot_required: the epoch of the leader's entry just below its log start, which
    # the follower starting over there keeps as its log's last epoch (-1: none).
    log_start_epoch: int = -1
    last_fetched_epoch: int = -1  # echoed with fetch_offset: the log state the answer is for
    directories: str = ""  # the leader's admitted directories, when the follower's differ
    # Membership changes the follower does not hold yet (membership.py); with snapshot_required,
    # first the membership in effect at the log start.
    memberships: str = ""
    # The group is idle: stop fetching until the leader wakes you (BeginEpoch) or its node's
    # liveness lapses (quiescence.py).
    quiesce: bool = False
    read_round: int = 0  # the leader's last read round (read_index.py): echo it next time


@dataclass(frozen=True, slots=True)
class FetchSnapshotRequest:
    """A follower behind the leader's log start of a state-machine log asks for its snapshot,
    a chunk at a time (KIP-630's FetchSnapshot); position makes it resumable."""

    epoch: int
    replica: int
    snapshot_offset: int  # -1: whatever is newest
    position: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class FetchSnapshotResponse:
    epoch: int
    leader: int
    snapshot_offset: int
    size: int  # the whole snapshot file
    position: int
    error: str = FETCH_OK
    records: RecordsSlice | None = None  # the chunk
    memberships: str = ""  # with a chunk: the membership in effect at the snapshot
    snapshot_epoch: int = -1  # with a chunk: the epoch of the last entry the snapshot covers


@dataclass(frozen=True, slots=True)
class TransferLeadership:
    """A voter asks the leader of its epoch to hand over to it (a preferred leader, or an
    operator's election while a leader is alive: Kafka's preferred leader election). The leader
    resigns in its favour once it has everything the leader has (Raft's leadership transfer)."""

    epoch: int
    candidate: int  # the sender


Message = (
    VoteRequest
    | VoteResponse
    | BeginEpoch
    | EpochNotice
    | Resign
    | TransferLeadership
    | FetchRequest
    | FetchResponse
    | FetchSnapshotRequest
    | FetchSnapshotResponse
)


def claimed_sender(message: Message) -> int | None:
    """The node a message says it comes from, where it says so: the replica, candidate, voter
    or leader field. A receiver drops a message whose claim is not the sender it came from
    (the peer channel's authenticated node id), so no node can speak for another. Error
    answers name a leader only as a hint, and claim nothing."""
    if isinstance(message, VoteRequest | TransferLeadership):
        return message.candidate
    if isinstance(message, VoteResponse | EpochNotice):
        return message.voter
    if isinstance(message, BeginEpoch | Resign):
        return message.leader
    if isinstance(message, FetchRequest | FetchSnapshotRequest):
        return message.replica
    if isinstance(message, FetchResponse | FetchSnapshotResponse) and not message.error:
        return message.leader
    return None


@dataclass(frozen=True, slots=True)
class Outgoing:
    to: int
    message: Message
