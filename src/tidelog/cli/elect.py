"""`tidelog partitions elect [--unclean] TOPIC/P`: stand a replica for election now, or, when no
replica that holds everything committed can be reached, elect one that does not (Kafka's
unclean leader election), saying first what will be lost.

An unclean election admits every voter's present data directory (a replaced disk counts again
without having caught up) and elects the reachable replica with the longest log. Records that
only the unreachable or replaced replicas held are gone; their offsets are reused. When the
cluster's metadata log itself has no leader, it is elected uncleanly first (every partition's
replicas need it to know what they host).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from tidelog.cli.args import parse_partition
from tidelog.cli.connect import client_of
from tidelog.cli.reassign import add_reassign_command
from tidelog.client.async_client import AsyncClient
from tidelog.cluster_status import ReplicaRow, answered_nodes, partition_rows
from tidelog.errors import InvalidRequest, NoEligibleLeader, TidelogError
from tidelog.replication.metadata import METADATA_TOPIC

WAIT_S = 20.0


def add_partitions_command(sub: Any, with_bootstrap: Any) -> None:
    partitions = sub.add_parser("partitions", help="partition leadership and placement")
    psub = partitions.add_subparsers(dest="partitions_command")
    elect = with_bootstrap(psub.add_parser("elect", help="elect a leader for a partition now"))
    elect.add_argument("partition", help="TOPIC/PARTITION, e.g. events/0")
    elect.add_argument(
        "--unclean",
        action="store_true",
        help="elect the reachable replica with the longest log even if it lacks committed "
        "records (they are lost); for when no replica holding everything can come back",
    )
    elect.add_argument(
        "--node",
        type=int,
        help="hand leadership to this replica, even while another leads (preferred leader "
        "election: the leader hands over once the node holds everything it holds)",
    )
    elect.set_defaults(func=cmd_elect)
    add_reassign_command(psub, with_bootstrap)


def cmd_elect(args: argparse.Namespace) -> int:
    topic, partition = parse_partition(args.partition)

    async def run() -> None:
        async with client_of(args, retries=1) as client:
            if args.node is not None:
                if args.unclean:
                    raise InvalidRequest("--node and --unclean do not go together")
                await client.elect_preferred_leader(topic, partition, args.node, WAIT_S)
                print(f"{topic}/{partition}: {args.node} leads")
                return
            if args.unclean and topic != METADATA_TOPIC:
                metadata, _, _ = await replicas_of(client, METADATA_TOPIC, 0)
                if not any(rep.is_leader for rep in metadata.values()):
                    print(f"the cluster's metadata log ({METADATA_TOPIC}/0) has no leader:")
                    await elect(client, METADATA_TOPIC, 0, unclean=True)
            await elect(client, topic, partition, unclean=args.unclean)

    asyncio.run(run())
    return 0


async def replicas_of(
    client: AsyncClient, topic: str, partition: int
) -> tuple[dict[int, ReplicaRow], set[int], set[int]]:
    """(reachable replicas' status by node, every voter, the nodes that answered)."""
    nodes = await client.status([topic])
    row = next((r for r in partition_rows(nodes, topic) if r.partition == partition), None)
    if row is None:
        return {}, set(), answered_nodes(nodes)
    return dict(row.replicas), set(row.voters), answered_nodes(nodes)


async def elect(client: AsyncClient, topic: str, partition: int, unclean: bool) -> None:
    group = f"{topic}/{partition}"
    found, voters, answered = await replicas_of(client, topic, partition)
    deadline = time.monotonic() + WAIT_S
    # A replica that lost its disk may not host the partition yet: give it a moment to learn.
    while unclean and answered & voters - set(found) and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        found, voters, answered = await replicas_of(client, topic, partition)
    if not found:
        raise NoEligibleLeader(f"no reachable node holds a replica of {group}")
    leaders = [n for n, st in found.items() if st.is_leader]
    if leaders and not unclean:
        print(f"{group}: {leaders[0]} already leads in epoch {found[leaders[0]].epoch}")
        return
    candidate = max(found, key=lambda n: (found[n].log_end_offset, -n))
    end = found[candidate].log_end_offset
    if unclean:
        print(describe_loss(group, found, voters, answered, candidate))
        for node in sorted(found):
            reply = await client.elect_leaders(node, topic, partition, unclean=True, campaign=False)
            if reply.admitted:
                print(f"  node {node} admits the present directories of {reply.admitted}")
    try:
        await client.elect_leaders(candidate, topic, partition, campaign=True)
    except TidelogError as exc:
        raise NoEligibleLeader(f"{group}: node {candidate} could not stand: {exc}") from exc
    while time.monotonic() < deadline:
        found, _, _ = await replicas_of(client, topic, partition)
        leaders = [n for n, st in found.items() if st.is_leader]
        if leaders:
            st = found[leaders[0]]
            print(f"{group}: {leaders[0]} leads in epoch {st.epoch} (log end {end})")
            return
        await asyncio.sleep(0.2)
    raise NoEligibleLeader(
        f"{group}: no leader after {WAIT_S:.0f} s"
        + ("" if unclean else " (try --unclean if no replica holding everything can return)")
    )


def describe_loss(
    group: str,
    found: dict[int, ReplicaRow],
    voters: set[int],
    answered: set[int],
    candidate: int,
) -> str:
    end = found[candidate].log_end_offset
    highest_hw = max(st.high_watermark for st in found.values())
    lines = [
        f"unclean election for {group}: node {candidate} will lead with its log ending at "
        f"offset {end}."
    ]
    if highest_hw > end:
        lines.append(
            f"  LOST: offsets {end}..{highest_hw - 1} were committed (acknowledged) and are "
            "not on any reachable replica; new records will take their offsets."
        )
    else:
        lines.append(
            f"  No record known to be committed is lost (the highest high-water mark any "
            f"reachable replica saw is {highest_hw})."
        )
    missing = sorted(voters - set(found))
    if missing:
        unreachable = [n for n in missing if n not in answered]
        empty = [n for n in missing if n in answered]
        if unreachable:
            lines.append(
                f"  Replicas {unreachable} are unreachable: whatever they hold past offset "
                f"{end}, acknowledged or not, is discarded when they return."
            )
        if empty:
            lines.append(f"  Replicas {empty} hold nothing of {group} (re-formatted).")
    return "\n".join(lines)
