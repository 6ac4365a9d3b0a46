"""A replica's settings: its node, the group it starts with, and its timings in ticks. A topic's
config changes some of them while the replica runs (node/partition.py replaces the whole
ReplicaConfig), so the replica reads them where it uses them and never keeps a copy."""

from __future__ import annotations

from dataclasses import dataclass

from tidelog.invariant import invariant
from tidelog.replication.faults import FAULTS


@dataclass(frozen=True)
class ReplicaConfig:
    node_id: int
    voters: tuple[int, ...]  # the group's initial membership (its log may have changed it since)
    learners: tuple[int, ...] = ()  # replicas that fetch but neither vote nor count (yet)
    election_timeout_ticks: int = 100
    election_jitter_ticks: int = 60
    fetch_max_wait_ticks: int = 50
    fetch_retry_ticks: int = 80
    check_quorum_ticks: int = 150
    replica_lag_ticks: int = 3000
    replica_max_lag_ticks: int = 60_000  # a follower out of touch longer no longer holds the log
    fetch_max_bytes: int = 1024 * 1024
    hw_policy: str = "quorum"
    min_insync_replicas: int = 1
    state_machine: bool = False  # behind the log start: install a snapshot (else start empty)
    directory_id: str = ""  # this replica's data directory ("": not tracked, as in old tests)
    faults: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        invariant(not set(self.voters) & set(self.learners), "a learner is not a voter")
        invariant(
            self.fetch_retry_ticks > self.fetch_max_wait_ticks,
            "self.fetch_retry_ticks > self.fetch_max_wait_ticks",
        )
        invariant(self.faults <= FAULTS, "self.faults <= FAULTS")
