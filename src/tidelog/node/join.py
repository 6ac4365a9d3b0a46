"""A node that joins a running cluster (`tidelog serve --join HOST:PORT` after `tidelog cluster
add-node ID=HOST:PORT`), as etcd's `--initial-cluster-state existing` and KRaft's observers do.

It asks the cluster (its metadata leader) once for what a node started with `--peers` is told on
its command line: the cluster's id, its nodes, and the metadata log's membership at its log
start (the voters its replica of the metadata log opens with; the leader then sends it the log
and every membership change in it, and promotes it to voter once it has caught up). That answer
is kept in the data directory (`cluster.joined`), so later starts need neither `--join` nor a
running cluster to find their way. Until the node has been added, it waits and says so.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tidelog.config import InvalidConfig
from tidelog.errors import TidelogError
from tidelog.features import DEFAULT_LEVEL, FEATURE, build_range, check_supported
from tidelog.node.config import NodeConfig
from tidelog.node.registry import node_entries
from tidelog.replication.metadata import NodeEntry
from tidelog.storage.checkpoint import read_checkpoint, write_checkpoint

log = logging.getLogger(__name__)

JOINED_FILE = "cluster.joined"
RETRY_S = 1.0


@dataclass(frozen=True)
class Joined:
    cluster_id: str
    metadata_voters: tuple[int, ...]  # the metadata log's membership at its log start
    nodes: dict[int, NodeEntry]

    def to_wire(self) -> dict[str, Any]:
        return {
            "cluster_id": self.cluster_id,
            "metadata_voters": list(self.metadata_voters),
            "nodes": [n.to_wire() for n in self.nodes.values()],
        }

    @staticmethod
    def from_wire(data: dict[str, Any]) -> Joined:
        nodes = [NodeEntry.from_wire(n) for n in data["nodes"]]
        return Joined(
            str(data["cluster_id"]),
            tuple(int(v) for v in data["metadata_voters"]),
            {n.node_id: n for n in nodes},
        )

    def config(self, config: NodeConfig) -> NodeConfig:
        """The node's config as if it had been started with the cluster's nodes as peers."""
        if config.cluster_id and config.cluster_id != self.cluster_id:
            raise InvalidConfig(
                f"--cluster-id {config.cluster_id} but this node joined cluster {self.cluster_id}",
                key="cluster_id",
            )
        return replace(
            config,
            join=(),
            peers={n: e.address for n, e in self.nodes.items()},
            peer_ports={n: e.peer_port for n, e in self.nodes.items() if e.peer_port},
            cluster_id=self.cluster_id,
        )


def load_joined(data_dir: Path) -> Joined | None:
    data = read_checkpoint(data_dir / JOINED_FILE)
    return Joined.from_wire(data) if data is not None else None


async def join_cluster(config: NodeConfig) -> Joined:
    """Ask the cluster at config.join until it has this node registered; keep the answer."""
    from tidelog.client.async_client import AsyncClient

    bootstrap = [f"{host}:{port}" for host, port in config.join]
    warned = False
    while True:
        try:
            async with AsyncClient(bootstrap, retries=3, tls=config.tls) as client:
                info = await client.describe_cluster(leader_only=True)
        except (TidelogError, OSError) as exc:
            log.warning(
                "node %d: cannot reach the cluster at %s: %s", config.node_id, bootstrap, exc
            )
            await asyncio.sleep(RETRY_S)
            continue
        me = info.node(config.node_id)
        if me is None:
            if config.node_id in info.removed_nodes:
                raise InvalidConfig(
                    f"node {config.node_id} was removed from cluster {info.cluster_id}; node "
                    "ids are not reused: add this node under a new id",
                    key="node_id",
                )
            if not warned:
                log.warning(
                    "node %d is not a node of cluster %s yet; waiting for `tidelog cluster "
                    "add-node %d=%s:%d`",
                    config.node_id,
                    info.cluster_id,
                    config.node_id,
                    *config.listen,
                )
                warned = True
            await asyncio.sleep(RETRY_S)
            continue
        if (me.host, me.port) != config.listen:
            raise InvalidConfig(
                f"node {config.node_id} was added at {me.host}:{me.port}; start it with "
                f"--listen {me.host}:{me.port}",
                key="listen",
            )
        # A node that could not run at the cluster's finalized level is refused now, by name.
        finalized = info.finalized_features.get(FEATURE, DEFAULT_LEVEL)
        check_supported(finalized, build_range(config.feature_max_level), config.node_id)
        joined = Joined(info.cluster_id, tuple(info.metadata_base_voters), node_entries(info))
        config.data_dir.mkdir(parents=True, exist_ok=True)
        write_checkpoint(config.data_dir / JOINED_FILE, joined.to_wire())
        log.info(
            "node %d joined cluster %s (metadata voters %s)",
            config.node_id,
            joined.cluster_id,
            list(joined.metadata_voters),
        )
        return joined
