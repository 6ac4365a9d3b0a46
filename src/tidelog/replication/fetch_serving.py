"""The leader's side of pull-based replication: what it answers a follower's fetch.

A follower fetches from its log end, naming the epoch of its last entry (KIP-101, KIP-595). The
leader checks that tail against its own epochs before it sends anything: a follower whose tail
differs is told where the two logs part (it truncates there and fetches again), and one whose
fetch the leader can no longer check, because the prefix holding it was discarded, is told to
start over at the leader's log start (a state-machine log, from the leader's snapshot). Only a
fetch that matches is counted (progress.py) and answered with records, or parked until there
is something to say: new records, news of the HW, or the end of its wait.
"""

from __future__ import annotations

from tidelog.replication.log_interface import ReplicaLog
from tidelog.replication.membership import MembershipHistory, encode_memberships
from tidelog.replication.messages import FetchRequest, FetchResponse


def refusal(
    epoch: int, leader: int, req: FetchRequest, log: ReplicaLog, error: str
) -> FetchResponse:
    """A fetch this replica does not answer: it does not lead the follower's epoch."""
    return FetchResponse(
        epoch,
        leader,
        req.fetch_offset,
        log.high_watermark,
        log.log_start_offset,
        error=error,
        last_fetched_epoch=req.last_fetched_epoch,
    )


def must_start_over(req: FetchRequest, log: ReplicaLog) -> bool:
    """The follower's log end is below our log start, or our epoch history no longer reaches
    its last epoch (the prefix holding it was discarded), so its tail cannot be checked: it
    must start over at our log start (or from our snapshot). Everything below our log start is
    committed and gone anyway."""
    if req.fetch_offset < log.log_start_offset:
        return True
    if req.last_fetched_epoch < 0 or log.log_start_offset == 0:
        return False
    epoch, _ = log.epochs.end_offset_for(req.last_fetched_epoch, log.log_end_offset)
    return epoch < 0


def start_over_point(log: ReplicaLog, history: MembershipHistory) -> tuple[str, int]:
    """What a follower that starts over at our log start keeps: the membership in effect there
    with every change since (encoded), and the epoch of our entry just below it, as its last."""
    start = log.log_start_offset
    at_start = [history.at(start), *history.since(start)]
    return encode_memberships(at_start), log.epochs.epoch_at(start - 1)


def divergence(req: FetchRequest, log: ReplicaLog) -> tuple[int, int] | None:
    """Where the follower's log parts from ours, as (the largest epoch up to its last one that
    we have, where that epoch ends here), or None if its tail matches ours."""
    if req.fetch_offset == 0 and req.last_fetched_epoch < 0:
        return None
    if req.last_fetched_epoch < 0:
        # The follower holds no batch since its log start: only the end can be wrong.
        if req.fetch_offset > log.log_end_offset:
            return log.epochs.latest_epoch, log.log_end_offset
        return None
    epoch, end = log.epochs.end_offset_for(req.last_fetched_epoch, log.log_end_offset)
    if epoch != req.last_fetched_epoch or end < req.fetch_offset:
        return epoch, end
    return None


def answer_now(req: FetchRequest, log: ReplicaLog, state_machine: bool) -> bool:
    """A matching fetch is answered at once if there are records past it, or if its follower
    is far behind on the HW (it just started following). One whose own report just moved the
    HW hears of it with the next records or the next tick; a state machine's followers apply
    what commits, so they hear of it at once. Any other fetch waits (it is parked)."""
    if req.fetch_offset < log.log_end_offset:
        return True
    durable = req.durable_offset if req.durable_offset >= 0 else req.fetch_offset
    return req.high_watermark < log.high_watermark and (
        durable < log.high_watermark or req.high_watermark < 0 or state_machine
    )
