"""The leader's view of one follower (etcd's tracker/progress.go): what it holds durably, where it
reads next, when it was last heard from, and the fetch it left waiting. The leader counts a
follower toward the HW by match_offset only, and never above what the follower made durable.

Invariants (the leader keeps them as it handles the follower's fetches):
    match_offset <= fetch_offset: what a follower made durable it has read
    match_offset never decreases within the leader's epoch
    a pending fetch is answered by pending_deadline at the latest
"""

from __future__ import annotations

from dataclasses import dataclass

from tidelog.replication.messages import FetchRequest


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
    # Told to stop fetching while nothing happens (see Replica's quiescence): counted as heard
    # from while the node's liveness says it lives in the same incarnation.
    quiesced: bool = False
    incarnation: int = -1
