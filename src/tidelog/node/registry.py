"""The cluster's nodes, kept in the metadata log (Kafka's broker registrations, etcd's member
list), and the metadata leader's work of adding and removing them.

A cluster starts with the nodes every node was given (`--peers`, the initial voters of the
metadata log). The first change of nodes registers those in the metadata log; from then on the
registry there is the truth every node follows: who may pass the peer handshake, whom the peer
channel dials, where clients are sent, where replicas are placed.

    add-node      the node is registered; the metadata log's leader adds it to the log's group as
                  a learner, promotes it once it has caught up (replication/membership.py), and
                  from then on new replicas may be placed on it
    remove-node   the node is marked draining; the metadata leader moves each replica it holds
                  to the least loaded node that holds none of its partition (`partitions
                  reassign`), then takes it out of the metadata log's voters (one change, the
                  leader last), then removes it from the registry; its id is never reused
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from tidelog.errors import TidelogError
from tidelog.node.config import NodeConfig
from tidelog.node.metadata_log import MetadataLog
from tidelog.replication.metadata import NodeEntry, plan_drain
from tidelog.replication.metadata_commands import ReassignPartition, RegisterNodes, RemoveNode

if TYPE_CHECKING:
    from tidelog.client.async_client import ClusterInfo

log = logging.getLogger(__name__)

DISCOVER_AFTER_S = 2.0  # without a metadata leader this long, ask the nodes we know of


def node_entries(info: ClusterInfo) -> dict[int, NodeEntry]:
    """The registry's entries as a node's DescribeCluster answer gave them."""
    return {
        n.node_id: NodeEntry(n.node_id, n.host, n.port, n.peer_port, n.draining) for n in info.nodes
    }


class NodeRegistry:
    def __init__(
        self,
        metadata: MetadataLog,
        config: Callable[[], NodeConfig],
        nodes_changed: Callable[[], None],
    ) -> None:
        self.metadata = metadata
        self.config = config  # the node's, as it is now (its listen port is known once bound)
        self.nodes_changed = nodes_changed  # the peer channel follows
        # Nodes other nodes told us of that our metadata does not hold yet: a node that was
        # down while nodes were added must let them in to hear from them at all.
        self.learned: dict[int, NodeEntry] = {}
        self._leaderless_since: float | None = None
        self._discovered_at = 0.0
        self._discovering = False

    def nodes(self) -> dict[int, NodeEntry]:
        """Every node of the cluster (draining ones too): the registry, or before the first
        change of nodes the ones this node was started with."""
        state = self.metadata.state
        if state.nodes:
            return dict(state.nodes)
        config = self.config()
        peers = config.peers or {config.node_id: config.listen}
        return {
            n: NodeEntry(n, host, port, config.peer_ports.get(n, 0))
            for n, (host, port) in peers.items()
        }

    def peer_nodes(self) -> dict[int, NodeEntry]:
        """Who the peer channel dials and its handshake lets in: the cluster's nodes, and those
        learnt from other nodes while our metadata log is behind (never a removed one)."""
        nodes = self.nodes()
        removed = self.metadata.state.removed_nodes
        learned = {n: e for n, e in self.learned.items() if n not in removed and n not in nodes}
        return {**learned, **nodes}

    def placeable(self) -> list[int]:
        """Nodes new replicas may be placed on: not draining, and voters of the metadata log (a
        node added but not yet caught up, or not yet started, is not one)."""
        voters = set(self.metadata.host.replica.voters)
        return sorted(n for n, e in self.nodes().items() if not e.draining and n in voters)

    async def ensure_registered(self) -> None:
        """Before the first change of nodes: the nodes this cluster started with go into the
        metadata log (a no-op there if another leader registered them first)."""
        if self.metadata.state.nodes:
            return
        await self.metadata.propose(RegisterNodes(list(self.nodes().values())), 30.0)

    def metadata_target(self) -> tuple[int, ...] | None:
        """The voters the metadata log's group should have: every registered node but the
        draining ones that hold no replica any more. While such a node is still a member, no
        new one joins: a learner that is not caught up (or not even started) would hold the
        removal back (members are added before any is removed)."""
        state = self.metadata.state
        if not state.nodes:
            return None
        replica = self.metadata.host.replica
        members = set(replica.history.current.members)
        leaving = {n for n, e in state.nodes.items() if e.draining and not state.hosted_on(n)}
        if leaving & members:
            voters = set(replica.voters)
            target = sorted(n for n in state.nodes if n in voters and n not in leaving)
        else:
            target = sorted(n for n in state.nodes if n not in leaving)
        return tuple(target) or None

    def check(self) -> None:
        """Often (the node's checks): the metadata log's group walks towards its target; its
        leader moves replicas off draining nodes and removes those that are done."""
        metadata = self.metadata
        replica = metadata.host.replica
        self._discover_if_leaderless(replica.leader_id >= 0)
        if metadata.state.applied_offset < replica.high_watermark:
            return  # a new leader acts on the registry once it has applied what is committed
        target = self.metadata_target()
        if target is None:
            return
        metadata.host.driver.set_target(target)
        if not replica.is_leader:
            return
        state = metadata.state
        draining = [e for e in state.nodes.values() if e.draining]
        placeable = self.placeable() if draining else []
        for entry in draining:
            if entry.node_id in target:
                for meta, partition, replicas in plan_drain(state, entry.node_id, placeable):
                    command = ReassignPartition(
                        meta.name, meta.topic_id, partition, replicas, entry.drain_throttle_bytes
                    )
                    metadata.propose_in_background(
                        f"{meta.name}/{partition} moves off node {entry.node_id}", command
                    )
                continue
            committed = replica.committed_membership
            if entry.node_id not in committed.members and committed == replica.history.current:
                metadata.propose_in_background(
                    f"node {entry.node_id} removed", RemoveNode(entry.node_id)
                )

    def _discover_if_leaderless(self, has_leader: bool) -> None:
        now = time.monotonic()
        if has_leader:
            self._leaderless_since = None
            return
        if self._leaderless_since is None:
            self._leaderless_since = now
        if (
            self._discovering
            or now - self._leaderless_since < DISCOVER_AFTER_S
            or now - self._discovered_at < DISCOVER_AFTER_S
        ):
            return
        self._discovering = True
        self.metadata.background.start(self._discover())

    async def _discover(self) -> None:
        """Ask the nodes we know of (their client listeners) which nodes the cluster has."""
        from tidelog.client.async_client import AsyncClient

        config = self.config()
        try:
            known = self.peer_nodes()
            for node_id, entry in known.items():
                if node_id == config.node_id:
                    continue
                try:
                    async with AsyncClient(
                        [f"{entry.host}:{entry.port}"], retries=1, tls=config.tls
                    ) as client:
                        info = await asyncio.wait_for(client.describe_cluster(), 2.0)
                except (TidelogError, OSError, TimeoutError):
                    continue
                new = {
                    n: e
                    for n, e in node_entries(info).items()
                    if n not in known and n not in info.removed_nodes
                }
                if new:
                    log.warning(
                        "cluster: node %d tells of nodes %s that our metadata log does not "
                        "hold yet: letting them in",
                        node_id,
                        sorted(new),
                    )
                    self.learned.update(new)
                    self.nodes_changed()
                    return
        finally:
            self._discovering = False
            self._discovered_at = time.monotonic()
