"""What a replica reports about itself (`Replica.status()`), typed. The node adds its storage and
low-water-mark figures (node/status.py); status answers, `/metrics` and the console all read
these, and `to_wire()` is the JSON `tidelog status --json` shows."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ReplicaView:
    """One replica as the leader sees it (the leader's own entry included)."""

    log_end_offset: int  # the leader's own LEO; a voter's durable match offset; an observer's fetch
    in_sync: bool
    lag: int  # the leader's LEO minus what the replica holds durably
    high_watermark: int | None = None  # the HW the replica last told the leader it knows
    durable_end_offset: int | None = None  # on the leader's own entry
    last_fetch_ticks_ago: int | None = None
    observer_until: int | None = None  # a replaced disk: the offset it must hold to vote again
    learner: bool = False
    quiesced: bool = False  # told to stop fetching while the group is idle

    def to_wire(self) -> dict[str, object]:
        out: dict[str, object] = {"log_end_offset": self.log_end_offset}
        if self.durable_end_offset is not None:
            out["durable_end_offset"] = self.durable_end_offset
        if self.high_watermark is not None:
            out["high_watermark"] = self.high_watermark
        out["in_sync"] = self.in_sync
        out["lag"] = self.lag
        if self.last_fetch_ticks_ago is not None:
            out["last_fetch_ticks_ago"] = self.last_fetch_ticks_ago
        if self.observer_until is not None:
            out["observer_until"] = self.observer_until
        if self.learner:
            out["learner"] = True
        if self.quiesced:
            out["quiesced"] = True
        return out


@dataclass(frozen=True)
class ReplicaStatus:
    role: str
    epoch: int
    leader: int
    voted_for: int
    high_watermark: int
    log_end_offset: int
    log_start_offset: int
    directory_id: str
    voters: tuple[int, ...]
    learners: tuple[int, ...]
    committed_voters: tuple[int, ...]
    observer: bool  # a replaced disk catching up without a vote
    # On the leader: every replica it tracks, by node id. Empty elsewhere.
    replicas: Mapping[int, ReplicaView] = field(default_factory=dict)
    replaced: Mapping[int, str] = field(default_factory=dict)  # voters seen with another directory
    # An idle group that stopped talking: a follower told to wait, a leader whose followers were
    quiesced: bool = False
    # The LSO (replication/last_stable_offset.py): read_committed readers read below it.
    # -1: not known (a status from a node before transactions).
    last_stable_offset: int = -1

    @property
    def is_leader(self) -> bool:
        return self.role == "leader"

    @property
    def in_sync_voters(self) -> int:
        return sum(1 for r, view in self.replicas.items() if view.in_sync and r in self.voters)

    def to_wire(self) -> dict[str, object]:
        return {
            "role": self.role,
            "epoch": self.epoch,
            "leader": self.leader,
            "voted_for": self.voted_for,
            "high_watermark": self.high_watermark,
            "last_stable_offset": self.last_stable_offset,
            "log_end_offset": self.log_end_offset,
            "log_start_offset": self.log_start_offset,
            "replicas": {r: view.to_wire() for r, view in self.replicas.items()},
            "directory_id": self.directory_id,
            "voters": list(self.voters),
            "learners": list(self.learners),
            "committed_voters": list(self.committed_voters),
            "observer": self.observer,
            "replaced": {str(n): d for n, d in sorted(self.replaced.items())},
            "quiesced": self.quiesced,
        }
