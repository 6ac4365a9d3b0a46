"""`tidelog partitions reassign TOPIC/P --replicas 2,3,4 [--throttle BYTES] [--wait]`: move a
partition onto other nodes, online (Kafka's kafka-reassign-partitions).

The new replicas join the partition's replica group as learners and catch up (at most
--throttle bytes/s each, if given), then the voters change one at a time through the group's
own log, then the nodes the partition left delete their copy. Producers with acks=all keep
writing throughout; the partition is unavailable at most for one leader change (when its
leader is among the nodes it leaves, it hands over once its own removal commits).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from tidelog.cli.connect import client_of
from tidelog.errors import InvalidRequest


def add_reassign_command(psub: Any, with_bootstrap: Any) -> None:
    reassign = with_bootstrap(
        psub.add_parser("reassign", help="move a partition onto other nodes, online")
    )
    reassign.add_argument("partition", help="TOPIC/PARTITION, e.g. events/0")
    reassign.add_argument(
        "--replicas", required=True, help="the node ids it should live on, e.g. 2,3,4"
    )
    add_move_options(reassign, timeout_s=600.0)
    reassign.set_defaults(func=cmd_reassign)


def add_move_options(parser: Any, timeout_s: float) -> None:
    """--throttle, --wait and --timeout, as every command that moves partitions takes them."""
    parser.add_argument(
        "--throttle",
        type=int,
        default=0,
        metavar="BYTES",
        help="bytes/s a moving partition's new replicas catch up at, together (default: no limit)",
    )
    parser.add_argument("--wait", action="store_true", help="return once the move is done")
    parser.add_argument("--timeout", type=float, default=timeout_s, help="seconds --wait waits")


def parse_replicas(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InvalidRequest(f"--replicas takes node ids like 2,3,4, got {text!r}") from None


def cmd_reassign(args: argparse.Namespace) -> int:
    from tidelog.cli.args import parse_partition

    topic, partition = parse_partition(args.partition)
    replicas = parse_replicas(args.replicas)

    async def run() -> None:
        async with client_of(args) as client:
            started = time.monotonic()
            resp = await client.reassign_partition(topic, partition, replicas, args.throttle)
            leaving = f"; leaving nodes {resp.leaving}" if resp.leaving else ""
            print(f"reassigning {topic}/{partition} to replicas {resp.replicas}{leaving}")
            if args.wait:
                await client.wait_for_reassignment(topic, partition, args.timeout)
                took = time.monotonic() - started
                print(f"{topic}/{partition} now on replicas {resp.replicas} ({took:.1f} s)")

    asyncio.run(run())
    return 0
