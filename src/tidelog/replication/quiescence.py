"""Quiescence: an idle replica group stops talking (CockroachDB's quiescence, in pull-based terms).

A leader whose follower's parked fetch waited its whole time with nothing to say, the follower
holding everything durably and knowing the HW, answers it with `quiesce`. The follower then
sends no fetch and runs no election timer; the leader expects no fetch from it and counts it as
heard from. What replaces both is the node's liveness (liveness.py): one heartbeat per pair of
nodes. The leader wakes its followers (BeginEpoch, resent until they fetch) when it has news: an
append, a moved log start, a membership walk, an admitted directory. A follower whose leader's
node dies, or restarts, wakes by itself; a leader whose quiesced follower dies counts it by its
fetches again, so check-quorum still works.

These are the rules; the replica's leading.py and following.py quiesce and wake by them.
"""

from __future__ import annotations

from tidelog.replication.faults import FAULT_QUIESCE_WITHOUT_LIVENESS
from tidelog.replication.liveness import LivenessView
from tidelog.replication.log_interface import ReplicaLog
from tidelog.replication.messages import FetchRequest


def alive(liveness: LivenessView | None, node: int) -> bool:
    """Without a liveness nothing quiesces, and every node is taken for alive."""
    return liveness is None or liveness.is_alive(node)


def alive_as_quiesced(
    liveness: LivenessView | None, node: int, incarnation: int, faults: frozenset[str]
) -> bool:
    """A quiesced peer (a follower's leader, or a leader's follower) is still there: its node
    lives, in the incarnation it had when it quiesced (a restarted node forgot whom it led or
    followed)."""
    if FAULT_QUIESCE_WITHOUT_LIVENESS in faults or liveness is None:
        return True
    return liveness.is_alive(node) and liveness.incarnation(node) == incarnation


def leader_may_quiesce(
    liveness: LivenessView | None,
    follower: int,
    req: FetchRequest,
    log: ReplicaLog,
    observer: bool,
    changing_membership: bool,
) -> bool:
    """A parked fetch that waited its whole time may quiesce its follower: one whose node the
    liveness sees, that holds everything durably and knows the HW, while the leader holds it
    all durably too. Never an observer (it is waiting to be admitted) nor during a membership
    walk (it needs its followers fetching, caught up and alive)."""
    if liveness is None or observer or changing_membership or not liveness.is_alive(follower):
        return False
    leo = log.log_end_offset
    durable = req.durable_offset if req.durable_offset >= 0 else req.fetch_offset
    return (
        req.fetch_offset == leo
        and durable == leo
        and req.high_watermark == leo
        and log.high_watermark == leo
        and log.effective_durable_end == leo
    )


def follower_may_quiesce(
    liveness: LivenessView | None, leader: int, had_records: bool, log: ReplicaLog, installing: bool
) -> bool:
    """Only a follower that holds everything, durably, with the HW at its end, and that can see
    its leader's node alive (else it keeps fetching, and the leader sees that)."""
    leo = log.log_end_offset
    return (
        liveness is not None
        and not had_records
        and liveness.is_alive(leader)
        and log.effective_durable_end == leo
        and log.high_watermark == leo
        and not installing
    )


def first_to_stand(
    voters: tuple[int, ...], dead_leader: int, epoch: int, liveness: LivenessView | None
) -> int | None:
    """The voter that stands at once when a quiesced group's leader died. The liveness waited
    out its timeout already, and every follower learns of it at about the same moment: if all
    stood at once their votes would split. So one of the voters still alive, the same for all
    of them (a quiesced group's logs are equal) and rotating with the epoch so leadership
    spreads over the nodes, stands at once; the others only if it has not won after a jitter.
    None: no voter is alive."""
    standing = [v for v in voters if v != dead_leader and alive(liveness, v)]
    return standing[epoch % len(standing)] if standing else None
