"""`tidelog cluster rebalance [--dry-run] [--wait]`: even out replicas and preferred leaders
across the cluster's nodes (Kafka's Cruise Control, in its simplest form).

The plan is a pure function of the current assignments: replicas move from the node holding the
most to the one holding the fewest (never two replicas of one partition on a node) until every
node holds within one of the others; then preferred leaders (a partition's first replica) are
reordered, moving no data, until they are even too. Each changed partition is then reassigned
online (`partitions reassign`) and, once its move is done, its preferred leader stands.
"""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tidelog.cli.connect import client_of
from tidelog.cli.reassign import add_move_options
from tidelog.errors import TidelogError
from tidelog.replication.metadata import METADATA_TOPIC

Partition = tuple[str, int]


@dataclass(frozen=True)
class Move:
    topic: str
    partition: int
    before: list[int]
    after: list[int]

    @property
    def moves_data(self) -> bool:
        return set(self.before) != set(self.after)


def plan_rebalance(assignments: Mapping[Partition, list[int]], nodes: list[int]) -> list[Move]:
    """The moves that even out replicas, then preferred leaders, over nodes."""
    plan = {key: list(replicas) for key, replicas in sorted(assignments.items())}
    if not nodes:
        return []

    def uneven(leaders_only: bool) -> tuple[int, int] | None:
        """(the node holding the most, the one holding the fewest), while they differ by more
        than one."""
        c: Counter[int] = Counter({n: 0 for n in nodes})
        for replicas in plan.values():
            c.update(replicas[:1] if leaders_only else replicas)
        most = max(nodes, key=lambda n: (c[n], n))
        least = min(nodes, key=lambda n: (c[n], n))
        return (most, least) if c[most] - c[least] > 1 else None

    while (pair := uneven(leaders_only=False)) is not None:  # replicas
        most, least = pair
        key = next((k for k, r in plan.items() if most in r and least not in r), None)
        if key is None:
            break
        replicas = plan[key]
        replicas[replicas.index(most)] = least
    while (pair := uneven(leaders_only=True)) is not None:  # preferred leaders: reorder only
        most, least = pair
        key = next((k for k, r in plan.items() if r[0] == most and least in r), None)
        if key is None:
            break
        replicas = plan[key]
        replicas.remove(least)
        replicas.insert(0, least)
    return [
        Move(topic, partition, list(assignments[(topic, partition)]), replicas)
        for (topic, partition), replicas in plan.items()
        if replicas != list(assignments[(topic, partition)])
    ]


def add_rebalance_command(csub: Any, with_bootstrap: Any) -> None:
    rebalance = with_bootstrap(
        csub.add_parser("rebalance", help="even out replicas and leaders across nodes")
    )
    rebalance.add_argument("--dry-run", action="store_true", help="print the plan only")
    add_move_options(rebalance, timeout_s=3600.0)
    rebalance.set_defaults(func=cmd_rebalance)


def _describe(counts: Counter[int], nodes: list[int]) -> str:
    return " ".join(f"{n}:{counts[n]}" for n in nodes)


def cmd_rebalance(args: argparse.Namespace) -> int:
    async def run() -> None:
        async with client_of(args) as client:
            cluster = await client.describe_cluster(leader_only=True)
            # Where replicas may go: voters of the metadata log that are not being removed.
            nodes = sorted(
                n.node_id for n in cluster.nodes if n.metadata_role == "voter" and not n.draining
            )
            assignments: dict[Partition, list[int]] = {}
            for info in await client.list_topics():
                if info.name == METADATA_TOPIC:
                    continue
                for p, replicas in enumerate(info.assignments):
                    if p not in info.reassigning:  # a move under way is left to finish
                        assignments[(info.name, p)] = replicas
            plan = plan_rebalance(assignments, nodes)
            after = dict(assignments)
            for m in plan:
                after[(m.topic, m.partition)] = m.after
            for label, view in (("before", assignments), ("after", after)):
                per_node = Counter(n for r in view.values() for n in r)
                leaders = Counter(r[0] for r in view.values() if r)
                print(
                    f"{label}: replicas per node {_describe(per_node, nodes)}; "
                    f"preferred leaders {_describe(leaders, nodes)}"
                )
            for m in plan:
                what = "move" if m.moves_data else "leader"
                print(f"  {what} {m.topic}/{m.partition}: {m.before} -> {m.after}")
            if not plan:
                print("balanced: nothing to do")
            if args.dry_run or not plan:
                return
            for m in plan:
                await client.reassign_partition(m.topic, m.partition, m.after, args.throttle)
            print(f"{len(plan)} partition(s) reassigned")
            if not args.wait:
                return
            for m in plan:
                await client.wait_for_reassignment(m.topic, m.partition, args.timeout)
                try:  # the preferred leader takes over now that the move is done
                    await client.elect_preferred_leader(m.topic, m.partition, m.after[0])
                except TidelogError as exc:
                    print(f"  {m.topic}/{m.partition}: preferred leader not elected: {exc}")
            print("rebalanced")

    asyncio.run(run())
    return 0
