"""`tidelog cluster add-node ID=HOST:PORT[/PEER_PORT]`, `tidelog cluster remove-node ID` and
`tidelog cluster describe`: the cluster's nodes (etcd's `member add/remove/list`, KRaft's
`kafka-metadata-quorum add-controller/remove-controller`).

Adding a node registers it in the metadata log; the node itself is then started with
`tidelog serve --node-id ID --listen HOST:PORT --join ANY_NODE:PORT`: it catches up on the
metadata log as a learner and becomes a voter, and from then on new replicas may be placed on it
(`cluster rebalance` moves existing ones there). Removing a node moves every replica it holds to
the other nodes, then takes it out of the metadata log's voters and the cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from tidelog.cli.connect import client_of
from tidelog.cli.reassign import add_move_options
from tidelog.client.async_client import ClusterInfo
from tidelog.errors import InvalidRequest
from tidelog.node.config import parse_peer_entries


def add_node_commands(csub: Any, with_bootstrap: Any) -> None:
    add = with_bootstrap(
        csub.add_parser("add-node", help="add a node: it joins the metadata log, then votes")
    )
    add.add_argument(
        "node",
        help="ID=HOST:PORT[/PEER_PORT]: its id and client address (and a fixed peer-channel port)",
    )
    add.add_argument(
        "--wait", action="store_true", help="return once the node is a voter (it must be started)"
    )
    add.add_argument("--timeout", type=float, default=300.0, help="seconds --wait waits")
    add.set_defaults(func=cmd_add_node)

    remove = with_bootstrap(
        csub.add_parser("remove-node", help="move every replica off a node, then remove it")
    )
    remove.add_argument("node_id", type=int, help="the node's id")
    add_move_options(remove, timeout_s=3600.0)
    remove.set_defaults(func=cmd_remove_node)

    describe = with_bootstrap(
        csub.add_parser("describe", help="the cluster's nodes and metadata-log voters")
    )
    describe.set_defaults(func=cmd_describe_cluster)


def parse_node(text: str) -> tuple[int, str, int, int]:
    """ID=HOST:PORT[/PEER_PORT] -> (id, host, port, peer port or 0)."""
    peers, peer_ports = parse_peer_entries(text)
    if len(peers) != 1:
        raise InvalidRequest(f"give one node as ID=HOST:PORT[/PEER_PORT], got {text!r}")
    ((node_id, (host, port)),) = peers.items()
    return node_id, host, port, peer_ports.get(node_id, 0)


def cmd_add_node(args: argparse.Namespace) -> int:
    node_id, host, port, peer_port = parse_node(args.node)

    async def run() -> None:
        async with client_of(args) as client:
            started = time.monotonic()
            await client.add_node(node_id, host, port, peer_port)
            print(f"node {node_id} added at {host}:{port}")
            if args.wait:
                await client.wait_for_node(node_id, "voter", args.timeout)
                took = time.monotonic() - started
                print(f"node {node_id} is a voter of the metadata log ({took:.1f} s)")
            else:
                seeds = ",".join(
                    f"{n.host}:{n.port}"
                    for n in (await client.describe_cluster()).nodes
                    if n.node_id != node_id
                )
                print(
                    f"start it with: tidelog serve --node-id {node_id} --listen {host}:{port} "
                    f"--join {seeds} --data DIR"
                )

    asyncio.run(run())
    return 0


def cmd_remove_node(args: argparse.Namespace) -> int:
    async def run() -> None:
        async with client_of(args) as client:
            started = time.monotonic()
            moves = await client.remove_node(args.node_id, args.throttle)
            print(f"removing node {args.node_id}: {moves} partition(s) move off it")
            if args.wait:
                await client.wait_for_node(args.node_id, "removed", args.timeout)
                took = time.monotonic() - started
                print(f"node {args.node_id} removed ({took:.1f} s)")

    asyncio.run(run())
    return 0


def describe_rows(info: ClusterInfo) -> list[str]:
    rows = [f"cluster {info.cluster_id}; metadata leader {info.metadata_leader}"]
    rows.append(f"{'NODE':>6}  {'ADDRESS':<22} {'PEER PORT':>9}  METADATA   STATE")
    for n in info.nodes:
        state = "draining" if n.draining else "active"
        peer = str(n.peer_port) if n.peer_port else "-"
        address = f"{n.host}:{n.port}"
        rows.append(
            f"{n.node_id:>6}  {address:<22} {peer:>9}  {n.metadata_role or '-':<10} {state}"
        )
    if info.removed_nodes:
        rows.append(f"removed: {', '.join(str(n) for n in info.removed_nodes)}")
    return rows


def cmd_describe_cluster(args: argparse.Namespace) -> int:
    async def run() -> None:
        async with client_of(args) as client:
            for row in describe_rows(await client.describe_cluster(leader_only=True)):
                print(row)

    asyncio.run(run())
    return 0
