"""Topic changes through the metadata log (Kafka's CreateTopics, DeleteTopics, AlterConfigs,
CreatePartitions, AlterPartitionReassignments): each checked against the metadata leader's state,
then proposed, then answered once this node has applied it."""

from __future__ import annotations

import dataclasses
import logging
import zlib
from collections.abc import Callable

from tidelog.errors import (
    InvalidRequest,
    NotEnoughNodes,
    PartitionLimitReached,
    TopicAlreadyExists,
    UnknownTopicOrPartition,
)
from tidelog.node.config import NodeConfig
from tidelog.node.metadata_log import MetadataLog
from tidelog.node.ops.base import ConfiguredOps
from tidelog.node.registry import NodeRegistry
from tidelog.protocol import api
from tidelog.replication.metadata import (
    TopicMeta,
    assign_replicas,
    default_replication_factor,
    validate_add_partitions,
    validate_alter,
    validate_create,
    validate_delete,
    validate_reassign,
)
from tidelog.replication.metadata_commands import (
    AddPartitions,
    AlterTopic,
    CreateTopic,
    DeleteTopic,
    ReassignPartition,
    TopicCommand,
)

log = logging.getLogger(__name__)


class TopicAdmin(ConfiguredOps):
    def __init__(
        self,
        metadata_log: MetadataLog,
        registry: NodeRegistry,
        config: Callable[[], NodeConfig],
    ) -> None:
        self.metadata_log = metadata_log
        self.registry = registry
        self._config = config

    async def create_topic(
        self, req: api.CreateTopicRequest, payload: bytes
    ) -> api.CreateTopicResponse:
        nodes = self.registry.placeable()
        if req.replication_factor == -1:
            # The cluster's default, as Kafka's default.replication.factor but sized to the
            # cluster: a topic on three nodes keeps three copies unless asked otherwise.
            req = dataclasses.replace(req, replication_factor=default_replication_factor(nodes))
        config = self.config.topic_defaults.with_overrides(req.configs)
        self.config.check_batch_fits(config.max_message_bytes)
        validate_create(
            self.metadata,
            req.name,
            req.partitions,
            req.replication_factor,
            req.configs,
            req.kind,
            nodes,
        )
        assignments = self.placement(req.name, req.partitions, req.replication_factor)
        self.check_partition_limit(assignments)
        command = CreateTopic(req.name, req.kind, dict(req.configs), assignments)
        offset = await self.propose_metadata(command, 30.0)
        meta = self.metadata.topics.get(req.name)
        if meta is None or meta.created_offset != offset:
            raise TopicAlreadyExists(f"topic {req.name!r} already exists", topic=req.name)
        return api.CreateTopicResponse(
            req.name, meta.partitions, meta.replication_factor, meta.assignments
        )

    def placement(self, name: str, partitions: int, replication_factor: int) -> list[list[int]]:
        """Where a topic's partitions live: round-robin from a node its name picks, so that
        added partitions continue the pattern."""
        nodes = self.registry.placeable()
        if not nodes:
            raise NotEnoughNodes("no node can take new replicas (every node is draining)")
        start = zlib.crc32(name.encode()) % len(nodes)
        return assign_replicas(nodes, partitions, replication_factor, start)

    async def change_topic(self, command: TopicCommand) -> TopicMeta | None:
        """Propose a change to the incarnation of a topic the command names; the topic after it
        is applied (None: the name no longer holds this incarnation)."""
        await self.propose_metadata(command, 30.0)
        now = self.metadata.topics.get(command.name)
        return now if now is not None and now.topic_id == command.topic_id else None

    async def delete_topic(
        self, req: api.DeleteTopicRequest, payload: bytes
    ) -> api.DeleteTopicResponse:
        """Every replica of the topic deletes its data; its cursors are deleted with it."""
        self.metadata_log.require_leader()
        meta = validate_delete(self.metadata, req.name, req.force)
        cursors = sorted(c.name for c in self.metadata.cursors.values() if c.topic == req.name)
        if await self.change_topic(DeleteTopic(meta.name, meta.topic_id)) is not None:
            raise UnknownTopicOrPartition(f"topic {req.name!r} changed meanwhile; try again")
        log.warning("topic %s deleted (with cursors %s)", req.name, cursors or "none")
        return api.DeleteTopicResponse(req.name, meta.topic_id, cursors)

    async def alter_topic(
        self, req: api.AlterTopicRequest, payload: bytes
    ) -> api.AlterTopicResponse:
        """New config overrides, applied live by every replica (the cleaner at its next pass)."""
        self.metadata_log.require_leader()
        meta, configs = validate_alter(
            self.metadata, req.name, dict(req.configs), list(req.delete_configs)
        )
        config = self.config.topic_defaults.with_overrides(configs)
        self.config.check_batch_fits(config.max_message_bytes)
        now = await self.change_topic(AlterTopic(meta.name, meta.topic_id, configs))
        if now is None:
            raise UnknownTopicOrPartition(f"topic {req.name!r} was deleted meanwhile")
        return api.AlterTopicResponse(req.name, dict(now.configs))

    def check_partition_limit(self, new: list[list[int]]) -> None:
        """max.partitions.per.node: refused before the metadata log is asked, naming the node."""
        limit = self.config.max_partitions_per_node
        counts: dict[int, int] = {}
        for meta in self.metadata.topics.values():
            for p in range(meta.partitions):
                for n in meta.hosts(p):
                    counts[n] = counts.get(n, 0) + 1
        adding: dict[int, int] = {}
        for replicas in new:
            for n in replicas:
                adding[n] = adding.get(n, 0) + 1
        for n, more in sorted(adding.items()):
            if counts.get(n, 0) + more > limit:
                raise PartitionLimitReached(
                    f"node {n} holds {counts.get(n, 0)} partition replicas; {more} more would "
                    f"pass max.partitions.per.node ({limit})",
                    node_id=n,
                    limit=limit,
                )

    async def create_partitions(
        self, req: api.CreatePartitionsRequest, payload: bytes
    ) -> api.CreatePartitionsResponse:
        """More partitions for a stream, placed as creation places them."""
        self.metadata_log.require_leader()
        meta = validate_add_partitions(self.metadata, req.name, req.partitions)
        placed = self.placement(req.name, req.partitions, meta.replication_factor)
        self.check_partition_limit(placed[meta.partitions :])
        added = placed[meta.partitions :]
        now = await self.change_topic(AddPartitions(meta.name, meta.topic_id, added))
        if now is None or now.partitions != req.partitions:
            raise UnknownTopicOrPartition(f"topic {req.name!r} changed meanwhile; try again")
        return api.CreatePartitionsResponse(req.name, now.partitions, now.assignments)

    async def reassign_partition(
        self, req: api.ReassignPartitionRequest, payload: bytes
    ) -> api.ReassignPartitionResponse:
        """New replicas for a partition: its leader walks its group there (new replicas join
        as learners and catch up, then voters change one at a time); the nodes it leaves keep
        their copy until the leader reports the move done (node/topics.py)."""
        self.metadata_log.require_leader()
        if req.throttle_bytes < 0:
            raise InvalidRequest(f"throttle must be >= 0 bytes/s, got {req.throttle_bytes}")
        meta = validate_reassign(
            self.metadata,
            req.topic,
            req.partition,
            list(req.replicas),
            self.registry.placeable(),
        )
        now: TopicMeta | None = meta
        if meta.assignments[req.partition] != list(req.replicas) or req.partition in meta.retiring:
            now = await self.change_topic(
                ReassignPartition(
                    meta.name,
                    meta.topic_id,
                    req.partition,
                    list(req.replicas),
                    req.throttle_bytes,
                )
            )
        if now is None:
            raise UnknownTopicOrPartition(f"topic {req.topic!r} was deleted meanwhile")
        log.info("%s/%d: reassigning to %s", req.topic, req.partition, list(req.replicas))
        return api.ReassignPartitionResponse(
            req.topic,
            req.partition,
            now.assignments[req.partition],
            now.retiring.get(req.partition, []),
        )
