"""Produce throughput and ack latency of one tidelog node against the machine's bound.

    .venv/bin/python bench/produce.py [--seconds 4]

1 KiB records; batches of 1, 100 and 1000; acks=1 with the default durability (fsync by group
commit before the ack); 1 and 4 concurrent producers. The bound, measured in the same run: a
plain Python loop appending the same batches to a file with os.write + os.fdatasync.
"""

from __future__ import annotations

import argparse

from common import (
    RECORD_BYTES,
    fsync_append_bound,
    make_batch,
    percentile,
    print_table,
    run_producers,
    scratch_dir,
)
from tidelog.cli.args import run_loop
from tidelog.cli.cluster import LocalCluster
from tidelog.client.async_client import AsyncClient


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--batches", default="1,100,1000")
    parser.add_argument("--producers", default="1,4")
    parser.add_argument("--acks", default="1")
    args = parser.parse_args()
    data = scratch_dir("produce-")
    cluster = LocalCluster(data, nodes=1, log_level="WARNING")
    rows = []
    with cluster:
        for size in [int(b) for b in args.batches.split(",")]:
            batch = make_batch(size)
            bound_rate, bound_lat = fsync_append_bound(batch, args.seconds, data)
            bound_records = bound_rate * size
            for producers in [int(p) for p in args.producers.split(",")]:
                topic = f"bench-b{size}-p{producers}"

                async def setup(topic: str = topic) -> None:
                    async with AsyncClient(cluster.bootstrap) as c:
                        await c.create_topic(topic)

                run_loop(setup())
                batches, elapsed, lat = run_loop(
                    run_producers(
                        cluster.bootstrap, topic, batch, producers, args.seconds, args.acks
                    )
                )
                records = batches * size / elapsed
                rows.append(
                    [
                        size,
                        producers,
                        records,
                        records * RECORD_BYTES / 1e6,
                        percentile(lat, 50) * 1000,
                        percentile(lat, 99) * 1000,
                        bound_records,
                        percentile(bound_lat, 50) * 1000,
                        records / bound_records,
                    ]
                )
    print(
        f"\nproduce, 1 KiB records, acks={args.acks}, fsync by group commit before the ack, one node"
    )
    print_table(
        [
            "batch",
            "producers",
            "records/s",
            "MB/s",
            "ack p50 ms",
            "ack p99 ms",
            "bound rec/s",
            "bound p50 ms",
            "tidelog/bound",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
