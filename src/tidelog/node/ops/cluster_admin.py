"""The cluster's nodes and leaders from outside (Kafka's DescribeCluster, ElectLeaders; KRaft's
add and remove of controllers), and the archive as the metadata log records it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from tidelog.errors import (
    ArchiveError,
    InvalidRequest,
    NodeAlreadyExists,
    NotEnoughNodes,
    NotLeader,
    UnknownTopicOrPartition,
)
from tidelog.features import announcement
from tidelog.node.archiver import Archiver
from tidelog.node.feature_levels import FeatureLevels
from tidelog.node.metadata_log import MetadataLog
from tidelog.node.ops.base import MetadataOps
from tidelog.node.partition import PartitionHost
from tidelog.node.registry import NodeRegistry
from tidelog.protocol import api
from tidelog.replication.metadata import (
    NodeEntry,
    node_conflict,
    plan_drain,
    validate_add_node,
    validate_remove_node,
)
from tidelog.replication.metadata_commands import AddNode, DrainNode
from tidelog.storage.identity import DirectoryIdentity

log = logging.getLogger(__name__)


class ClusterAdmin(MetadataOps):
    def __init__(
        self,
        node_id: int,
        metadata_log: MetadataLog,
        registry: NodeRegistry,
        hosts: dict[str, PartitionHost],
        archiver: Archiver | None,
        identity: Callable[[], DirectoryIdentity],
        peer_current_directories: dict[int, str],
        features: FeatureLevels,
    ) -> None:
        self.node_id = node_id
        self.metadata_log = metadata_log
        self.registry = registry
        self.hosts = hosts  # the node's replica groups (shared)
        self.archiver = archiver
        self._identity = identity
        self.peer_current_directories = peer_current_directories  # as their handshakes said
        self.features = features

    @property
    def identity(self) -> DirectoryIdentity:
        return self._identity()

    def describe_cluster(
        self, req: api.DescribeClusterRequest, payload: bytes
    ) -> api.DescribeClusterResponse:
        replica = self.metadata_host.replica
        if req.leader_only and not replica.is_leader:
            raise NotLeader("not the metadata leader", leader_hint=self.metadata_host.leader_hint)
        current = replica.history.current
        nodes = []
        for n, entry in sorted(self.registry.nodes().items()):
            role = "voter" if n in current.voters else "learner" if n in current.learners else ""
            announced = self.features.last_announced(n)
            supported = {} if announced is None else announcement(announced)
            nodes.append(
                {**entry.to_wire(), "metadata_role": role, "supported_features": supported}
            )
        return api.DescribeClusterResponse(
            self.identity.cluster_id,
            self.node_id,
            replica.leader_id,
            nodes,
            list(current.voters),
            list(current.learners),
            list(replica.history.entries[0].voters),
            sorted(self.metadata.removed_nodes),
            dict(self.metadata.features),
        )

    async def add_node(self, req: api.AddNodeRequest, payload: bytes) -> api.NodeChangeResponse:
        """Register a node; the metadata log's leader then adds it to the log's group as a
        learner, and makes it a voter once it has caught up."""
        self.metadata_log.require_leader()
        entry = NodeEntry(req.node_id, req.host, req.port, req.peer_port)
        await self.registry.ensure_registered()
        if self.metadata.nodes.get(entry.node_id) == entry:
            return api.NodeChangeResponse(entry.to_wire())  # asked again (a retry)
        validate_add_node(self.metadata, entry)
        await self.propose_metadata(AddNode(entry), 30.0)
        if self.metadata.nodes.get(entry.node_id) != entry:
            raise NodeAlreadyExists(
                node_conflict(self.metadata, entry) or "changed meanwhile", node_id=req.node_id
            )
        log.warning("cluster: node %d added at %s:%d", req.node_id, req.host, req.port)
        return api.NodeChangeResponse(entry.to_wire())

    async def remove_node(
        self, req: api.RemoveNodeRequest, payload: bytes
    ) -> api.NodeChangeResponse:
        """Mark a node draining: the metadata leader moves its replicas off, then takes it out
        of the metadata log's voters, then out of the registry (node/registry.py)."""
        self.metadata_log.require_leader()
        if req.throttle_bytes < 0:
            raise InvalidRequest(f"throttle must be >= 0 bytes/s, got {req.throttle_bytes}")
        await self.registry.ensure_registered()
        placeable = self.registry.placeable()
        entry = validate_remove_node(self.metadata, req.node_id, placeable)
        if not entry.draining or entry.drain_throttle_bytes != req.throttle_bytes:
            await self.propose_metadata(DrainNode(req.node_id, req.throttle_bytes), 30.0)
            log.warning("cluster: node %d is being removed", req.node_id)
        now = self.metadata.nodes.get(req.node_id, entry)
        if not now.draining:  # another drain took the nodes this one needed meanwhile
            validate_remove_node(self.metadata, req.node_id, self.registry.placeable())
            raise NotEnoughNodes(f"node {req.node_id}: try again", node_id=req.node_id)
        moves = len(plan_drain(self.metadata, req.node_id, placeable))
        return api.NodeChangeResponse(now.to_wire(), moves)

    async def archive(self, req: api.ArchiveRequest, payload: bytes) -> api.ArchiveResponse:
        """The archive as the metadata log records it; an operator's accepted loss."""
        if req.op not in ("describe", "accept_loss"):
            raise InvalidRequest(f"unknown archive op {req.op!r} (describe, accept_loss)")
        accepted: list[dict[str, Any]] = []
        if req.op == "accept_loss":
            if self.archiver is None:
                raise ArchiveError(f"node {self.node_id} archives nothing (no --archive)")
            host = self.metadata_host
            if not host.replica.is_leader:
                raise NotLeader("not the metadata leader", leader_hint=host.leader_hint)
            _, accepted = await self.archiver.accept_loss()
        state = self.metadata
        extents = []
        for key, extent in sorted(state.archive_extents.items()):
            topic, _, partition = key.rpartition("/")
            extents.append({"topic": topic, "partition": int(partition), **extent})
        return api.ArchiveResponse(state.archive_id, extents, accepted)

    def elect_leaders(
        self, req: api.ElectLeadersRequest, payload: bytes
    ) -> api.ElectLeadersResponse:
        group = f"{req.topic}/{req.partition}"
        host = self.hosts.get(group)
        if host is None:
            raise UnknownTopicOrPartition(
                f"node {self.node_id} holds no replica of {group}",
                topic=req.topic,
                partition=req.partition,
            )
        admitted: list[int] = []
        if req.unclean:
            admitted = host.replica.admit_unclean(self.peer_current_directories)
            if admitted:
                log.warning(
                    "%s: unclean election asked: directories of %s admitted without catching up",
                    group,
                    admitted,
                )
        if req.campaign:
            host.replica.stand()
        host.process_ready()
        r = host.replica
        return api.ElectLeadersResponse(
            self.node_id,
            r.role.value,
            r.epoch,
            r.leader_id,
            host.log.log_end_offset,
            host.log.high_watermark,
            admitted,
        )
