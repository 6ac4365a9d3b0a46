"""Cluster metadata as a state machine applied from the committed metadata log.

Every node applies the same committed commands in the same order, so every node can answer
metadata. Commands are JSON objects; an invalid one is skipped on every node alike (it was
validated before it was proposed, so that only happens across versions).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from tidelog.config import TopicConfig
from tidelog.errors import InvalidRequest, TopicAlreadyExists, UnknownTopicOrPartition

TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,200}$")
METADATA_TOPIC = "__metadata"
PARTITIONS_MAX = 10_000


@dataclass(frozen=True)
class TopicMeta:
    name: str
    kind: str
    configs: dict[str, str]
    assignments: list[list[int]]  # partition -> replica node ids (first = preferred leader)
    created_offset: int

    @property
    def partitions(self) -> int:
        return len(self.assignments)

    @property
    def replication_factor(self) -> int:
        return len(self.assignments[0]) if self.assignments else 0

    @property
    def config(self) -> TopicConfig:
        return TopicConfig.from_mapping(self.configs)

    def to_wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "configs": dict(self.configs),
            "assignments": [list(a) for a in self.assignments],
            "partitions": self.partitions,
            "replication_factor": self.replication_factor,
        }


@dataclass
class MetadataState:
    topics: dict[str, TopicMeta] = field(default_factory=dict)
    applied_offset: int = 0  # exclusive: everything below has been applied

    def topic(self, name: str) -> TopicMeta:
        meta = self.topics.get(name)
        if meta is None:
            raise UnknownTopicOrPartition(f"unknown topic {name!r}", topic=name)
        return meta

    def apply(self, offset: int, command: dict[str, Any]) -> TopicMeta | None:
        """Apply one committed command; returns the topic it created, if any."""
        assert offset >= self.applied_offset, (offset, self.applied_offset)
        self.applied_offset = offset + 1
        if command.get("type") == "create_topic":
            name = str(command.get("name"))
            if name in self.topics:
                return None  # a concurrent create lost the race; its proposer sees that
            meta = TopicMeta(
                name=name,
                kind=str(command.get("kind", "stream")),
                configs={str(k): str(v) for k, v in dict(command.get("configs", {})).items()},
                assignments=[[int(r) for r in a] for a in command.get("assignments", [])],
                created_offset=offset,
            )
            self.topics[name] = meta
            return meta
        return None


def validate_create(
    state: MetadataState,
    name: str,
    partitions: int,
    replication_factor: int,
    configs: dict[str, str],
    kind: str,
    node_ids: list[int],
) -> None:
    if not TOPIC_NAME.match(name) or name.startswith("__"):
        raise InvalidRequest(
            f"invalid topic name {name!r}: use 1-200 of [A-Za-z0-9._-], not starting with '__'"
        )
    if name in state.topics:
        raise TopicAlreadyExists(f"topic {name!r} already exists", topic=name)
    if not 1 <= partitions <= PARTITIONS_MAX:
        raise InvalidRequest(f"partitions must be in [1, {PARTITIONS_MAX}], got {partitions}")
    if not 1 <= replication_factor <= len(node_ids):
        raise InvalidRequest(
            f"replication factor {replication_factor} needs that many nodes; "
            f"the cluster has {len(node_ids)}"
        )
    if kind not in ("stream", "table"):
        raise InvalidRequest(f"topic kind must be stream or table, got {kind!r}")
    config = TopicConfig.from_mapping(configs)
    if config.min_insync_replicas > replication_factor:
        raise InvalidRequest(
            f"min.insync.replicas {config.min_insync_replicas} exceeds the replication factor "
            f"{replication_factor}"
        )


def assign_replicas(
    node_ids: list[int], partitions: int, replication_factor: int, start: int
) -> list[list[int]]:
    """Round-robin placement: partition p's preferred leader is node (start + p) mod n."""
    nodes = sorted(node_ids)
    n = len(nodes)
    return [
        [nodes[(start + p + i) % n] for i in range(replication_factor)] for p in range(partitions)
    ]
