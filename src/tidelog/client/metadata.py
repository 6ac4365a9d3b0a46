"""The cluster as the client sees it: topics, nodes and partition leaders, as Metadata and
DescribeCluster answers describe them, and the cache routing keeps of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TopicInfo:
    name: str
    kind: str
    partitions: int
    replication_factor: int
    assignments: list[list[int]]
    configs: dict[str, str]
    leaders: list[int]
    # partition -> nodes a move is leaving (they keep a copy until the move is done)
    reassigning: dict[int, list[int]] = field(default_factory=dict)

    @classmethod
    def of_wire(cls, topic: dict[str, Any]) -> TopicInfo:
        """A topic of a MetadataResponse (one without an error)."""
        return cls(
            name=str(topic["name"]),
            kind=str(topic.get("kind", "stream")),
            partitions=int(topic["partitions"]),
            replication_factor=int(topic["replication_factor"]),
            assignments=[[int(r) for r in a] for a in topic["assignments"]],
            configs={str(k): str(v) for k, v in dict(topic.get("configs", {})).items()},
            leaders=[int(leader) for leader in topic.get("leaders", [])],
            reassigning={
                int(p): [int(r) for r in a] for p, a in dict(topic.get("reassigning", {})).items()
            },
        )


@dataclass(frozen=True)
class NodeInfo:
    node_id: int
    host: str
    port: int
    peer_port: int  # 0: learnt from its client listener
    draining: bool  # being removed: its replicas move off
    metadata_role: str  # in the metadata log: "voter", "learner" (catching up) or ""
    # feature -> [min, max] levels the node announced it supports (empty: never heard, or
    # the answering node is of tidelog 0.1.0)
    supported_features: dict[str, list[int]] = field(default_factory=dict)

    @classmethod
    def of_wire(cls, node: dict[str, Any]) -> NodeInfo:
        """A node of a DescribeClusterResponse."""
        return cls(
            int(node["node_id"]),
            str(node["host"]),
            int(node["port"]),
            int(node.get("peer_port", 0)),
            bool(node.get("draining", False)),
            str(node.get("metadata_role", "")),
            {
                str(k): [int(v) for v in r]
                for k, r in dict(node.get("supported_features", {})).items()
            },
        )


@dataclass(frozen=True)
class ClusterInfo:
    cluster_id: str
    metadata_leader: int
    nodes: list[NodeInfo]
    metadata_voters: list[int]
    metadata_learners: list[int]
    metadata_base_voters: list[int]  # the metadata log's membership at its log start
    removed_nodes: list[int]
    # feature -> the level the cluster finalized (absent: its lowest, tidelog/features.py)
    finalized_features: dict[str, int] = field(default_factory=dict)

    def node(self, node_id: int) -> NodeInfo | None:
        return next((n for n in self.nodes if n.node_id == node_id), None)


@dataclass
class MetadataCache:
    """What the last Metadata answers said, and the leaders learnt since (from NotLeader
    hints). Stale entries are dropped as requests fail, and refreshed."""

    nodes: dict[int, tuple[str, int]] = field(default_factory=dict)
    topics: dict[str, TopicInfo] = field(default_factory=dict)
    leaders: dict[tuple[str, int], int] = field(default_factory=dict)
    metadata_leader: int = -1
