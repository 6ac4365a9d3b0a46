"""Moving a partition under load: how long a reassignment of a large partition takes, and what
acks=all produce throughput does meanwhile, as a ratio of the same run's throughput before.

    .venv/bin/python bench/reassign.py [--mib 1024] [--seconds 10] [--throttle 0]

A 4-node cluster of real processes on loopback; a topic with replication factor 3 on three of
them is filled with `--mib` MiB of 1 KiB records, then its partition is reassigned so that one
replica (the preferred leader: the leadership moves too) is replaced by the fourth node, while
8 producers keep writing batches of 100 records with acks=all.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from common import RECORD_BYTES, make_batch, print_table, scratch_dir
from tidelog.cli.args import run_loop
from tidelog.cli.cluster import LocalCluster
from tidelog.client.async_client import AsyncClient
from tidelog.errors import TidelogError

BATCH_RECORDS = 100


async def fill(bootstrap: str, topic: str, mib: int) -> float:
    batch = make_batch(BATCH_RECORDS)
    batches = mib * 1024 * 1024 // (BATCH_RECORDS * RECORD_BYTES)
    start = time.perf_counter()
    async with AsyncClient(bootstrap) as client:
        await client.topic(topic)
        queue = iter(range(batches))

        async def one() -> None:
            for _ in queue:
                await client.produce_batch(topic, 0, batch, "1")

        await asyncio.gather(*(one() for _ in range(16)))
    return time.perf_counter() - start


async def produce_until(bootstrap: str, topic: str, done: asyncio.Event) -> tuple[int, float]:
    """Records acknowledged (acks=all) by 8 producers until done is set, and the seconds."""
    batch = make_batch(BATCH_RECORDS)
    acked = [0]
    async with AsyncClient(bootstrap, idempotent=True) as client:
        await client.topic(topic)

        async def one() -> None:
            while not done.is_set():
                try:
                    await client.produce_batch(topic, 0, batch, "all")
                    acked[0] += BATCH_RECORDS
                except TidelogError:
                    await asyncio.sleep(0.01)  # a leader change: the client finds the new one

        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(8)))
        return acked[0], time.perf_counter() - start


async def run(cluster: LocalCluster, args: argparse.Namespace) -> list[list[object]]:
    bootstrap = cluster.bootstrap
    async with AsyncClient(bootstrap) as client:
        info = await client.create_topic("moving", replication_factor=3)
    old = info.assignments[0]
    (new,) = set(cluster.node_ids) - set(old)
    target = sorted([*old[1:], new])
    fill_s = await fill(bootstrap, "moving", args.mib)

    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(args.seconds, stop.set)
    before, before_s = await produce_until(bootstrap, "moving", stop)

    moved = asyncio.Event()
    async with AsyncClient(bootstrap) as admin:
        start = time.perf_counter()
        await admin.reassign_partition("moving", 0, target, throttle_bytes=args.throttle)

        async def wait() -> None:
            await admin.wait_for_reassignment("moving", 0, timeout_s=3600)
            moved.set()

        (during, during_s), _ = await asyncio.gather(
            produce_until(bootstrap, "moving", moved), wait()
        )
        move_s = time.perf_counter() - start
    rate_before, rate_during = before / before_s, during / during_s
    return [
        [
            args.mib,
            f"{old} -> {target}",
            round(fill_s, 1),
            round(move_s, 1),
            round(args.mib / move_s, 1),
            round(rate_before),
            round(rate_during),
            round(rate_during / rate_before, 2),
        ]
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--throttle", type=int, default=0, help="bytes/s (0: none)")
    args = parser.parse_args()
    with LocalCluster(scratch_dir("reassign-"), nodes=4) as cluster:
        rows = run_loop(run(cluster, args))
    print_table(
        [
            "MiB",
            "replicas",
            "fill s",
            "move s",
            "move MiB/s",
            "rec/s before",
            "rec/s during",
            "during/before",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
