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
from typing import TYPE_CHECKING, Any

from tidelog.errors import TidelogError
from tidelog.replication.metadata import NodeEntry, plan_drain

if TYPE_CHECKING:
    from tidelog.node.core import NodeCore

log = logging.getLogger(__name__)


class NodeRegistry:
    def __init__(self, core: NodeCore) -> None:
        self.core = core
        self._proposing: set[str] = set()  # changes proposed and not yet applied or failed

    def nodes(self) -> dict[int, NodeEntry]:
        """Every node of the cluster (draining ones too): the registry, or before the first
        change of nodes the ones this node was started with."""
        state = self.core.metadata
        if state.nodes:
            return dict(state.nodes)
        config = self.core.config
        peers = config.peers or {config.node_id: config.listen}
        return {
            n: NodeEntry(n, host, port, config.peer_ports.get(n, 0))
            for n, (host, port) in peers.items()
        }

    def placeable(self) -> list[int]:
        """Nodes new replicas may be placed on: not draining, and voters of the metadata log (a
        node added but not yet caught up, or not yet started, is not one)."""
        voters = set(self.core.metadata_host.replica.voters)
        return sorted(n for n, e in self.nodes().items() if not e.draining and n in voters)

    def reassignable(self) -> list[int]:
        """Nodes an operator may move replicas onto: any node that is not draining."""
        return sorted(n for n, e in self.nodes().items() if not e.draining)

    async def ensure_registered(self) -> None:
        """Before the first change of nodes: the nodes this cluster started with go into the
        metadata log (a no-op there if another leader registered them first)."""
        if self.core.metadata.nodes:
            return
        nodes = [e.to_wire() for e in self.nodes().values()]
        await self.core.propose_metadata({"type": "register_nodes", "nodes": nodes}, 30.0)

    def metadata_target(self) -> tuple[int, ...] | None:
        """The voters the metadata log's group should have: every registered node but the
        draining ones that hold no replica any more."""
        state = self.core.metadata
        if not state.nodes:
            return None
        target = tuple(
            sorted(n for n, e in state.nodes.items() if not e.draining or state.hosted_on(n))
        )
        return target or None

    def check(self) -> None:
        """Often (the cleaner's tick): the metadata log's group walks towards its target; its
        leader moves replicas off draining nodes and removes those that are done."""
        core = self.core
        replica = core.metadata_host.replica
        target = self.metadata_target()
        if target is None:
            return
        replica.set_target(target)
        if not replica.is_leader:
            return
        state = core.metadata
        for entry in [e for e in state.nodes.values() if e.draining]:
            if entry.node_id in target:
                for meta, partition, replicas in plan_drain(state, entry.node_id):
                    self._propose(
                        f"move {meta.name}/{partition}",
                        {
                            "type": "reassign_partition",
                            "name": meta.name,
                            "topic_id": meta.topic_id,
                            "partition": partition,
                            "replicas": replicas,
                            "throttle_bytes": entry.drain_throttle_bytes,
                        },
                    )
                continue
            committed = replica.committed_membership
            if entry.node_id not in committed.members and committed == replica.history.current:
                self._propose(
                    f"remove {entry.node_id}", {"type": "remove_node", "node_id": entry.node_id}
                )

    def _propose(self, key: str, command: dict[str, Any]) -> None:
        if key in self._proposing:
            return
        self._proposing.add(key)
        core = self.core

        async def propose() -> None:
            try:
                await core.propose_metadata(command, 30.0)
                log.info("cluster: %s (%s)", key, command.get("replicas", "done"))
            except TidelogError as exc:
                log.warning("cluster: %s failed, will retry: %s", key, exc)
            finally:
                self._proposing.discard(key)

        core.track(asyncio.get_running_loop().create_task(propose()))
