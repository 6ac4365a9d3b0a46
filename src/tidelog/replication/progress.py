"""The leader's view of one follower (etcd's tracker/progress.go): what it holds durably, where it
reads next, when it was last heard from, and the fetch it left waiting. The leader counts a
follower toward the HW by match_offset only, and never above what the follower made durable.

Invariants (the leader keeps them as it handles the follower's fetches):
    match_offset <= fetch_offset: what a follower made durable it has read
    match_offset never decreases within the leader's epoch
    a pending fetch is answered by pending_deadline at the latest
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tidelog.replication.messages import FetchRequest
from tidelog.replication.replica_config import ReplicaConfig


@dataclass
class Progress:
    """The leader's view of one follower."""

    match_offset: int = 0  # durable on the follower (counts toward the HW)
    fetch_offset: int = 0  # where the follower reads next (what it still needs from us)
    last_fetch_tick: int = 0
    last_caught_up_tick: int = -(10**12)
    leo_at_last_fetch: int = 0
    known_hw: int = -1
    pending: FetchRequest | None = None
    pending_deadline: int = 0
    begin_sent_tick: int = 0
    # Told to stop fetching while nothing happens (quiescence.py): counted as heard from while
    # the node's liveness says it lives in the same incarnation.
    quiesced: bool = False
    incarnation: int = -1

    def record_fetch(self, req: FetchRequest, durable: int, leader_log_end: int, now: int) -> None:
        """A fetch that matches the leader's log. Caught up: it fetched from the leader's log
        end, or from at least where the leader's log ended at its previous fetch (then it was
        caught up as of that previous fetch)."""
        if req.fetch_offset >= leader_log_end:
            self.last_caught_up_tick = now
        elif req.fetch_offset >= self.leo_at_last_fetch:
            self.last_caught_up_tick = max(self.last_caught_up_tick, self.last_fetch_tick)
        self.match_offset = durable
        self.fetch_offset = req.fetch_offset
        self.leo_at_last_fetch = leader_log_end
        self.last_fetch_tick = now
        self.known_hw = req.high_watermark

    def observe_fetch(self, req: FetchRequest, now: int) -> None:
        """An observer's fetch (admission.py): held for (the log start waits for it), but not
        counted: no HW, no ISR."""
        self.fetch_offset = req.fetch_offset
        self.last_fetch_tick = now
        self.known_hw = req.high_watermark


def reported_durable(req: FetchRequest) -> int:
    """What a fetch reports its follower holds durably (never past where it fetches from)."""
    if req.durable_offset < 0:
        return req.fetch_offset
    return min(req.durable_offset, req.fetch_offset)


# -- the leader's followers, together (etcd's tracker.ProgressTracker) --------------------------
#
# `counts(r)`: follower r counts toward the ISR and check-quorum (a voter whose directory is
# admitted, not an observer). A quiesced follower is taken for caught up and heard from: the
# node's liveness vouches for it (quiescence.py).


def in_sync(
    progress: Mapping[int, Progress], now: int, lag_ticks: int, counts: Callable[[int], bool]
) -> set[int]:
    """The followers caught up within the last lag_ticks."""
    return {
        r
        for r, p in progress.items()
        if (p.quiesced or now - p.last_caught_up_tick <= lag_ticks) and counts(r)
    }


def heard_from(
    progress: Mapping[int, Progress], now: int, window_ticks: int, counts: Callable[[int], bool]
) -> int:
    """How many followers fetched within the last window_ticks (check-quorum counts them)."""
    return sum(
        1
        for r, p in progress.items()
        if (p.quiesced or now - p.last_fetch_tick <= window_ticks) and counts(r)
    )


def next_due(
    progress: Mapping[int, Progress],
    now: int,
    high_watermark: int,
    leader_since_tick: int,
    config: ReplicaConfig,
    counts: Callable[[int], bool],
) -> int | None:
    """The tick at which the leader next has something to do for its followers if nothing
    happens: answer a parked fetch, resend BeginEpoch to one that does not fetch, drop one
    from the ISR, or check the quorum when a counted follower's last fetch grows too old.
    None: only an event can give it work."""
    due: int | None = None
    retry = config.fetch_retry_ticks
    quorum_at: int | None = None  # when the count of recently heard voters next drops
    quiet = False  # a counted follower is quiesced: only the liveness can drop it
    for r, p in progress.items():
        if p.quiesced:
            quiet = quiet or counts(r)
            continue
        if p.pending is not None:
            at = now + 1 if p.pending.high_watermark < high_watermark else p.pending_deadline
        else:
            at = max(p.last_fetch_tick, p.begin_sent_tick) + retry
        falls_behind = p.last_caught_up_tick + config.replica_lag_ticks + 1
        if config.hw_policy == "isr" and falls_behind > now:  # (out of the ISR already)
            at = min(at, falls_behind)
        drops = p.last_fetch_tick + config.check_quorum_ticks + 1
        if counts(r) and drops > now:  # (one that dropped already changes nothing)
            quorum_at = drops if quorum_at is None else min(quorum_at, drops)
        due = at if due is None else min(due, at)
    if progress and not (quorum_at is None and quiet):
        first_check = leader_since_tick + config.check_quorum_ticks
        check = first_check if quorum_at is None else max(quorum_at, first_check)
        due = check if due is None else min(due, check)
    return None if due is None else max(due, now + 1)
