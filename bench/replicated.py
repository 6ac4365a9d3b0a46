"""Replicated produce throughput, commit latency and failover time on loopback.

    .venv/bin/python bench/replicated.py [--seconds 4] [--kills 10]

1 KiB records; a 3-node cluster with acks=all and acks=1, against a single node with acks=all,
in the same run; batches of 1 and 100; 1, 8 and 64 concurrent producers (asyncio tasks in one
client process), each its own client and connection as separate Kafka producers would be, and 64
sharing 8 clients (an idempotent client keeps at most 5 batches in flight per partition, as
Kafka's producer does, so 64 producers over 8 clients have at most 40 in flight). Every ack means fsynced (group commit) on the leader,
and for acks=all on a quorum. Then the leader is SIGKILLed `--kills` times: the failover time is
from the kill to the first acks=all write accepted again.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from common import (
    RECORD_BYTES,
    make_batch,
    median,
    percentile,
    print_table,
    replicas_disk_bound,
    run_producers,
    scratch_dir,
)
from tidelog.cli.args import run_loop
from tidelog.cli.cluster import LocalCluster
from tidelog.client.async_client import AsyncClient
from tidelog.cluster_status import merge_status
from tidelog.errors import TidelogError


async def load(
    bootstrap: str,
    topic: str,
    batch: bytes,
    records_per_batch: int,
    producers: int,
    seconds: float,
    acks: str,
    clients: int,
) -> tuple[float, list[float]]:
    """Records per second and ack latencies: `producers` producers over `clients` clients."""
    sent, elapsed, latencies = await run_producers(
        bootstrap, topic, batch, producers, seconds, acks, connections_max=clients
    )
    return sent * records_per_batch / elapsed, latencies


async def create(bootstrap: str, topic: str, rf: int) -> None:
    async with AsyncClient(bootstrap) as c:
        await c.create_topic(topic, replication_factor=rf)


def measure(
    cluster: LocalCluster,
    label: str,
    rf: int,
    acks: str,
    args: argparse.Namespace,
    rows: list[list[object]],
) -> None:
    for size in (1, 100):
        batch = make_batch(size)
        for producers, clients in ((1, 1), (8, 8), (64, 64), (64, 8)):
            topic = f"{label.replace(' ', '')}-{acks}-b{size}-p{producers}-c{clients}"
            run_loop(create(cluster.bootstrap, topic, rf))
            rate, lat = run_loop(
                load(cluster.bootstrap, topic, batch, size, producers, args.seconds, acks, clients)
            )
            rows.append(
                [
                    label,
                    acks,
                    size,
                    producers,
                    clients,
                    rate,
                    rate * RECORD_BYTES / 1e6,
                    percentile(lat, 50) * 1000,
                    percentile(lat, 99) * 1000,
                ]
            )
            print(
                f"  {label} acks={acks} batch={size} producers={producers} clients={clients}: "
                f"{rate:,.0f} rec/s",
                flush=True,
            )


async def failover(bootstrap: str, cluster: LocalCluster, kills: int) -> list[float]:
    times = []
    await create(bootstrap, "failover", 3)  # with retries: any node may lead the metadata log
    async with AsyncClient(bootstrap, retries=1, request_timeout_ms=500) as client:
        batch = make_batch(1)
        for _ in range(kills):
            for _ in range(20):
                await client.produce_batch("failover", 0, batch, "all")
            rows = merge_status(await client.status(["failover"]), "failover")
            leader = rows[0]["leader"]
            cluster.kill(leader)
            killed = time.perf_counter()
            while True:
                try:
                    await client.produce_batch("failover", 0, batch, "all", timeout_ms=500)
                    break
                except TidelogError:
                    await asyncio.sleep(0.01)
            times.append(time.perf_counter() - killed)
            cluster.start(leader)
            cluster.wait_ready()
            await asyncio.sleep(1.0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--kills", type=int, default=10)
    args = parser.parse_args()
    rows: list[list[object]] = []
    three = LocalCluster(scratch_dir("replicated-"), nodes=3, log_level="WARNING")
    with three:
        measure(three, "3 nodes", 3, "all", args, rows)
        measure(three, "3 nodes", 3, "1", args, rows)
        times = run_loop(failover(three.bootstrap, three, args.kills)) if args.kills else []
    one = LocalCluster(scratch_dir("single-"), nodes=1, log_level="WARNING")
    with one:
        measure(one, "1 node", 1, "all", args, rows)
    print("\nreplicated produce, 1 KiB records, fsync (group commit) before every ack")
    print_table(
        [
            "cluster",
            "acks",
            "batch",
            "producers",
            "clients",
            "records/s",
            "MB/s",
            "commit p50 ms",
            "commit p99 ms",
        ],
        rows,
    )
    best = {
        (r[0], r[1]): max(float(x[5]) for x in rows if (x[0], x[1]) == (r[0], r[1])) for r in rows
    }
    print(
        f"\nbest acks=all RF3 / single node acks=all = {best[('3 nodes', 'all')] / best[('1 node', 'all')]:.2f}; "
        f"acks=all / acks=1 on 3 nodes = {best[('3 nodes', 'all')] / best[('3 nodes', '1')]:.2f}"
    )
    disk = replicas_disk_bound(args.seconds)
    print(
        f"disk, same run: 3 writers appending 1 MiB + fdatasync each write {disk / 1e6:,.0f} MB/s "
        f"in total: an RF3 bound of {disk / 3 / RECORD_BYTES:,.0f} records/s on this machine. "
        "By Little's law a commit p99 under 20 ms with 64 x 100 records in flight needs more than "
        "6,400 / 0.02 = 320,000 records/s."
    )
    if times:
        print(
            f"failover (SIGKILL leader -> first acks=all write accepted), {len(times)} kills: "
            f"p50 {median(times):.2f}s, max {max(times):.2f}s, all {[round(t, 2) for t in times]}"
        )


if __name__ == "__main__":
    main()
