"""What a replica hands its driver (etcd's Ready): the quorum state to make durable first, then
the messages to send, a group commit to start, and what changed. The driver (driver.py) carries
it out in that order; a replica hands each output over once (Replica.ready)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tidelog.replication.messages import Outgoing
from tidelog.replication.read_index import ConfirmedRead

NO_VOTE = -1


@dataclass(frozen=True)
class QuorumState:
    """What must be durable before this replica answers a vote or announces leadership."""

    epoch: int = 0
    voted_for: int = NO_VOTE
    directories: str = ""  # the voters' admitted data directories (replication/directories.py)
    memberships: str = ""  # the group's membership history (membership.py); "": the initial one


@dataclass
class Ready:
    """One hand-over: what to persist, send and flush now, and what changed since the last."""

    state: QuorumState | None = None
    messages: list[Outgoing] = field(default_factory=list)
    flush: bool = False
    high_watermark_changed: bool = False
    log_start_changed: bool = False
    role_changed: bool = False
    lost_leadership: bool = False
    truncated: bool = False
    snapshot_installed: int = -1  # the offset of a snapshot just installed from the leader
    # Reads (Replica.read) the leader may now answer from a state applied up to their index,
    # and those it never will (its leadership ended): the driver answers them NotLeader.
    reads: list[ConfirmedRead] = field(default_factory=list)
    failed_reads: list[int] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        """Nothing at all to do (handing it over again is the same as a fresh one)."""
        return not (self or self.lost_leadership or self.snapshot_installed >= 0)

    def __bool__(self) -> bool:
        return bool(
            self.state is not None
            or self.messages
            or self.flush
            or self.high_watermark_changed
            or self.log_start_changed
            or self.role_changed
            or self.truncated
            or self.reads
            or self.failed_reads
        )
