"""The cost of the low-water mark's machinery, and how well retention.bytes bounds disk use.

    .venv/bin/python bench/retention.py [--seconds 5] [--trace-seconds 300]

1. Produce throughput into three topics of one node, in the same run: no cleaning (the
   default 7-day retention never triggers), retention active (small segments, retention.bytes,
   a cleaner pass every 100 ms and at every roll) and compaction active (cleanup.policy=compact,
   keys drawn from 1,000). 1 KiB records, batches of 100, 8 producers, acks=1 (fsync).
2. A sustained produce with retention.bytes set, for --trace-seconds: disk use of the partition
   (segments, indexes, files awaiting deletion) sampled every 50 ms; max seen / bound, where the
   bound is retention.bytes + one segment + indexes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import threading
import time
from pathlib import Path

from common import RECORD_BYTES, percentile, print_table, scratch_dir
from tidelog.cli.args import run_loop
from tidelog.cli.cluster import LocalCluster
from tidelog.client.async_client import AsyncClient
from tidelog.record import ProducerRecord, build_batch

SEGMENT = 1024 * 1024
RETENTION = 8 * 1024 * 1024


def keyed_batches(n: int) -> list[bytes]:
    payload = os.urandom(RECORD_BYTES)
    return [
        build_batch(
            [ProducerRecord(b"key-%d" % ((i * 100 + j) % 1000), payload) for j in range(100)]
        )
        for i in range(n)
    ]


async def load(
    bootstrap: str, topic: str, batches: list[bytes], producers: int, seconds: float
) -> tuple[float, list[float]]:
    async with AsyncClient(bootstrap) as client:
        await client.topic(topic)
        deadline = time.perf_counter() + seconds
        latencies: list[float] = []
        sent = [0]

        async def one(k: int) -> None:
            i = k
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                await client.produce_batch(topic, 0, batches[i % len(batches)], "1")
                latencies.append(time.perf_counter() - t0)
                sent[0] += 100
                i += producers

        start = time.perf_counter()
        await asyncio.gather(*(one(k) for k in range(producers)))
        return sent[0] / (time.perf_counter() - start), latencies


async def create(bootstrap: str, name: str, configs: dict[str, str]) -> None:
    async with AsyncClient(bootstrap) as client:
        await client.create_topic(name, configs=configs)


def disk_use(directory: Path) -> int:
    total = 0
    for entry in os.scandir(directory):
        if ".log" in entry.name or "index" in entry.name:
            try:
                total += entry.stat().st_size
            except FileNotFoundError:
                pass
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--trace-seconds", type=float, default=300.0)
    args = parser.parse_args()
    data = scratch_dir("retention-")
    fast = {
        "retention.check.interval.ms": "100",
        "file.delete.delay.ms": "1000",
        "segment.bytes": str(SEGMENT),
    }
    topics = {
        "plain": {},
        "retention": {**fast, "retention.bytes": str(RETENTION)},
        "compacted": {**fast, "cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.5"},
    }
    batches = keyed_batches(64)
    rows = []
    with LocalCluster(data, nodes=1, log_level="WARNING") as cluster:
        for name, configs in topics.items():
            run_loop(create(cluster.bootstrap, name, configs))
        for _ in range(2):  # two rounds, interleaved; the table shows the second
            results = {}
            for name in topics:
                rate, lat = run_loop(load(cluster.bootstrap, name, batches, 8, args.seconds))
                results[name] = (rate, lat)
        for name, (rate, lat) in results.items():
            rows.append(
                [
                    name,
                    rate,
                    rate * RECORD_BYTES / 1e6,
                    percentile(lat, 50) * 1000,
                    percentile(lat, 99) * 1000,
                    rate / results["plain"][0],
                ]
            )
        print("\nproduce with the cleaner at work (1 KiB, batch 100, 8 producers, acks=1)")
        print_table(["topic", "records/s", "MB/s", "p50 ms", "p99 ms", "vs plain"], rows)

        if args.trace_seconds > 0:
            run_loop(
                create(
                    cluster.bootstrap,
                    "trace",
                    {**fast, "retention.bytes": str(RETENTION), "file.delete.delay.ms": "0"},
                )
            )
            part = data / "node-1" / "trace-0"
            seen: list[int] = []
            stop = threading.Event()

            def sample() -> None:
                while not stop.is_set():
                    seen.append(disk_use(part))
                    time.sleep(0.05)

            sampler = threading.Thread(target=sample)
            sampler.start()
            rate, _ = run_loop(load(cluster.bootstrap, "trace", batches, 4, args.trace_seconds))
            stop.set()
            sampler.join()
            indexes = sum(p.stat().st_size for p in part.glob("*index"))
            bound = RETENTION + SEGMENT + indexes
            print(
                f"\ndisk-use trace, {args.trace_seconds:.0f} s at {rate:,.0f} records/s "
                f"({rate * RECORD_BYTES * args.trace_seconds / 1e9:.1f} GB written) with retention.bytes "
                f"{RETENTION / 1e6:.1f} MB, segment.bytes {SEGMENT / 1e6:.1f} MB: max seen "
                f"{max(seen) / 1e6:.2f} MB, bound {bound / 1e6:.2f} MB, max / bound = {max(seen) / bound:.3f} "
                f"(p50 {percentile(seen, 50) / 1e6:.2f} MB over {len(seen)} samples)"
            )


if __name__ == "__main__":
    main()
