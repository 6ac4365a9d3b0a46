"""The METADATA answer (topics, their partitions' leaders, the nodes), built per topic when
asked after the topic changed and kept current as its replicas learn leaders: a 10,000-partition
topic's entry is 10,000 leaders, and a failover changes thousands."""

from __future__ import annotations

import logging
from typing import Any

from tidelog.errors import (
    UnknownTopicOrPartition,
)
from tidelog.node.metadata_log import MetadataLog
from tidelog.node.ops.base import MetadataOps
from tidelog.node.partition import PartitionHost
from tidelog.node.registry import NodeRegistry
from tidelog.protocol import api

log = logging.getLogger(__name__)


class MetadataAnswers(MetadataOps):
    def __init__(
        self,
        node_id: int,
        metadata_log: MetadataLog,
        registry: NodeRegistry,
        hosts: dict[str, PartitionHost],
    ) -> None:
        self.node_id = node_id
        self.metadata_log = metadata_log
        self.registry = registry
        self.hosts = hosts  # the node's replica groups (shared)
        self._metadata_cache: dict[str, dict[str, Any]] = {}  # by topic

    def forget(self, topic: str) -> None:
        """The topic changed (or was deleted), or a replica of it left this node: its cached
        answer is built again when next asked."""
        self._metadata_cache.pop(topic, None)

    def leader_known(self, host: PartitionHost) -> None:
        entry = self._metadata_cache.get(host.topic)
        if entry is not None and host.partition < len(entry["leaders"]):
            # In place. An answer still waiting in its connection (behind an earlier request's)
            # goes out with the newer leader: leaders are hints, and a newer one is better.
            entry["leaders"][host.partition] = host.replica.leader_id
            entry["leader_epochs"][host.partition] = host.replica.epoch

    def metadata_request(self, req: api.MetadataRequest, payload: bytes) -> api.MetadataResponse:
        if req.leader_only:
            self.metadata_log.require_leader()
        names = req.topics if req.topics is not None else sorted(self.metadata.topics)
        topics: list[dict[str, Any]] = []
        for name in names:
            meta = self.metadata.topics.get(name)
            if meta is None:
                self.metadata_log.require_current(f"topic {name!r}")
                topics.append({"name": name, "error": UnknownTopicOrPartition().to_wire()})
                continue
            entry = self._metadata_cache.get(name)
            if entry is None:
                entry = meta.to_wire()
                del entry["initial_assignments"]  # the metadata log's own business
                # Two lists of numbers, not a dict per partition: a 10,000-partition answer is
                # a third of the bytes and a quarter of the time to encode and decode.
                known = [self.known_leader(name, p) for p in range(meta.partitions)]
                entry["leaders"] = [leader for leader, _ in known]
                entry["leader_epochs"] = [epoch for _, epoch in known]
                self._metadata_cache[name] = entry
            topics.append(entry)
        nodes = [
            {"node_id": n, "host": e.host, "port": e.port}
            for n, e in sorted(self.registry.nodes().items())
        ]
        return api.MetadataResponse(
            self.node_id, self.metadata_host.replica.leader_id, nodes, topics
        )

    def known_leader(self, topic: str, partition: int) -> tuple[int, int]:
        """(leader, epoch) as this node's replica knows them; (-1, -1) without one."""
        host = self.hosts.get(f"{topic}/{partition}")
        if host is None:
            return -1, -1
        return host.replica.leader_id, host.replica.epoch
