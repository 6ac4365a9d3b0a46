"""Snapshot transfer for state-machine logs (KIP-630's FetchSnapshot).

A follower of a state-machine log that is behind its leader's log start cannot skip what the
leader discarded: it takes the leader's newest snapshot, a chunk at a time, then starts its log
over at the snapshot's offset. A transfer resumes where the follower's partial copy ends, and
starts over if the leader has a newer snapshot by then or the copy does not verify.

Every answer echoes the position it was asked for: that is how a follower tells it from a late
or duplicated one, which it must drop (answering each with a request of its own kept one more
request chain alive for good: simulator seed 655, whose messages doubled every few dozen ticks).
"""

from __future__ import annotations

from tidelog.record.slices import BytesSlice
from tidelog.replication.log_interface import EpochLookup, SnapshotAccess
from tidelog.replication.membership import MembershipHistory, encode_memberships
from tidelog.replication.messages import (
    FETCH_NO_SNAPSHOT,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
)


class SnapshotFetch:
    """A follower's transfer of its leader's newest snapshot, in progress."""

    def __init__(self, store: SnapshotAccess) -> None:
        self.store = store
        self.offset = -1  # the snapshot's offset (-1: not known yet, the leader names it)
        self.asked = -1  # the position the outstanding request asked for

    def request(self, epoch: int, replica: int, max_bytes: int) -> FetchSnapshotRequest:
        """The next request: from where the partial copy ends."""
        position = self.store.partial_snapshot_size(self.offset) if self.offset >= 0 else 0
        self.asked = position
        return FetchSnapshotRequest(epoch, replica, self.offset, position, max_bytes)

    def answers(self, resp: FetchSnapshotResponse) -> bool:
        """The answer to the outstanding request (not a late or duplicated one)."""
        return resp.position == self.asked

    def take(self, resp: FetchSnapshotResponse) -> bool:
        """Take an answer without error: True once the snapshot is whole, verified and loaded
        into the state machine (the log then starts over at it), else the next request goes."""
        offset = resp.snapshot_offset
        if self.offset != offset:
            self.offset = offset  # the leader's newest: start (over) on it
        elif resp.records is not None and resp.records.size > 0:
            if resp.position != self.store.partial_snapshot_size(offset):
                return False
            received = self.store.write_snapshot_chunk(offset, resp.position, resp.records.read())
            if received >= resp.size:
                if self.store.finish_snapshot(offset, resp.snapshot_epoch):
                    return True
                self.offset = -1  # it did not verify: fetch it again
        return False


def snapshot_refusal(
    epoch: int, leader: int, req: FetchSnapshotRequest, error: str
) -> FetchSnapshotResponse:
    return FetchSnapshotResponse(epoch, leader, -1, 0, req.position, error=error)


def snapshot_answer(
    epoch: int,
    leader: int,
    req: FetchSnapshotRequest,
    store: SnapshotAccess | None,
    epochs: EpochLookup,
    history: MembershipHistory,
) -> FetchSnapshotResponse:
    """The leader's answer, in its own epoch: its newest snapshot's offset and size, with the
    chunk asked for if the follower asked for that snapshot, the membership in effect there and
    the epoch of the last entry it covers (the follower's log starts over with both)."""
    latest = store.latest_snapshot() if store is not None else None
    if store is None or latest is None:
        return snapshot_refusal(epoch, leader, req, FETCH_NO_SNAPSHOT)
    offset, size = latest
    if req.snapshot_offset != offset:
        return FetchSnapshotResponse(epoch, leader, offset, size, req.position)
    chunk = store.read_snapshot_chunk(offset, req.position, req.max_bytes)
    return FetchSnapshotResponse(
        epoch,
        leader,
        offset,
        size,
        req.position,
        records=BytesSlice(chunk, req.position),
        memberships=encode_memberships([history.at(offset)]),
        snapshot_epoch=epochs.epoch_at(offset - 1),
    )
