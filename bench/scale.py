"""What a node costs as its partition count grows, with nothing produced (issue 18).

    .venv/bin/python bench/scale.py [--partitions 10,100,1000] [--idle-seconds 5]

One cluster per row (--nodes, default 1), one topic of N partitions (RF = nodes). Reported per row: the time to create the
topic and see every leader, the node's CPU (share of one core) while idle, its RSS and open file
descriptors (node 1), the busiest node's idle CPU, the metadata request's p99 and a one-record acks=all produce's p50 while idle, and
how late the event loop woke the tick loop (p99, from the node's own /metrics histogram). The
bound each row is held to: idle CPU under 2 % of a core; metadata p99 under 50 ms; produce p50
at most 1.5x the first row's (same run).
"""

from __future__ import annotations

import argparse
import gc
import os
import time
import urllib.request
from typing import NamedTuple

from prometheus_client.parser import text_string_to_metric_families

from common import percentile, print_table, scratch_dir
from tidelog.cli.cluster import LocalCluster
from tidelog.client.sync_client import Client

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def loop_lag_p99(url: str) -> float:
    """The p99 of tidelog_event_loop_lag_seconds, from its buckets."""
    with urllib.request.urlopen(url + "/metrics", timeout=60) as answer:
        text = answer.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "tidelog_event_loop_lag_seconds":
            buckets = [
                (float(s.labels["le"]), s.value)
                for s in family.samples
                if s.name.endswith("_bucket")
            ]
            total = buckets[-1][1]
            for le, count in buckets:
                if count >= 0.99 * total:
                    return le
    return float("nan")


class Row(NamedTuple):
    partitions: int
    created_s: float
    idle_cpu: float  # share of one core
    rss: int
    fds: int
    metadata_p99: float
    produce_p50: float
    loop_lag_p99: float
    nodes: int = 1
    failover_s: float = float("nan")  # SIGKILL of the node leading most partitions -> all led


def measure(
    partitions: int, idle_s: float, nodes: int = 1, failover: bool = False, quiesce: bool = True
) -> Row:
    serve_args = [] if quiesce else ["--set", "quiesce=false"]
    with (
        LocalCluster(
            scratch_dir("scale-"), nodes, http=True, log_level="WARNING", serve_args=serve_args
        ) as cluster,
        Client(cluster.bootstrap, request_timeout_ms=600_000) as client,
    ):
        cluster.wait_ready()
        pid = cluster.procs[1].pid
        pids = [cluster.procs[n].pid for n in cluster.node_ids]
        started = time.monotonic()
        client.create_topic("t", partitions=partitions, replication_factor=nodes)
        client.wait_for_leaders("t", timeout_s=600)
        created = time.monotonic() - started
        time.sleep(2 if nodes == 1 else 5)  # settle (followers catch up)
        cpu0 = [cpu_seconds(p) for p in pids]
        t0 = time.monotonic()
        time.sleep(idle_s)
        # the busiest node's share of one core
        idle_cpu = max(
            (cpu_seconds(p) - c) / (time.monotonic() - t0) for p, c in zip(pids, cpu0, strict=True)
        )
        metadata = []
        gc.collect()
        gc.freeze()  # this process's cycle collector is not the node's answer time
        for _ in range(200):
            t = time.perf_counter()
            client._run(client.async_client.topic("t", refresh=True))
            metadata.append(time.perf_counter() - t)
        gc.unfreeze()
        # Each partition measured was written once before: a partition's first write allocates
        # its file's first block (and costs the same whatever the partition count).
        for i in range(100):
            client.produce("t", [b"warm"], partition=(i * 7) % partitions, acks="all")
        produce = []
        for i in range(100):
            t = time.perf_counter()
            client.produce("t", [b"x"], partition=(i * 7) % partitions, acks="all")
            produce.append(time.perf_counter() - t)
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        rss = rss_bytes(pid)
        lag = loop_lag_p99(cluster.http_url(1))
        failover_s = float("nan")
        if failover and nodes > 1:
            leaders = client.topic("t", refresh=True).leaders
            victim = max(set(leaders), key=leaders.count)
            led = [p for p, n in enumerate(leaders) if n == victim]
            cluster.kill(victim)
            killed = time.monotonic()
            while time.monotonic() - killed < 120:
                now = client.topic("t", refresh=True).leaders
                if all(now[p] not in (victim, -1) for p in led):
                    break
                time.sleep(0.05)
            else:
                waiting = sum(1 for p in led if now[p] in (victim, -1))
                print(f"failover: {waiting} of {len(led)} partitions still without a leader")
            failover_s = time.monotonic() - killed
            print(f"failover: node {victim} led {len(led)} partitions; all led again after "
                  f"{failover_s:.2f} s")  # fmt: skip
        return Row(
            partitions,
            created,
            idle_cpu,
            rss,
            fds,
            percentile(metadata, 99),
            percentile(produce, 50),
            lag,
            nodes,
            failover_s,
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--partitions", default="10,100,1000")
    parser.add_argument("--idle-seconds", type=float, default=5.0)
    parser.add_argument("--nodes", type=int, default=1, help="cluster size; RF = nodes")
    parser.add_argument(
        "--failover", action="store_true", help="then SIGKILL the node leading most partitions"
    )
    parser.add_argument(
        "--no-quiesce", action="store_true", help="idle groups keep long-polling (for comparison)"
    )
    args = parser.parse_args()
    rows = [
        measure(int(n), args.idle_seconds, args.nodes, args.failover, not args.no_quiesce)
        for n in args.partitions.split(",")
    ]
    first = rows[0].produce_p50
    table = []
    for r in rows:
        ratio = r.produce_p50 / first
        verdicts = [
            "cpu ok" if r.idle_cpu < 0.02 else "cpu NOT",
            "meta ok" if r.metadata_p99 < 0.05 else "meta NOT",
            "produce ok" if ratio <= 1.5 else "produce NOT",
        ]
        table.append(
            [
                r.partitions,
                f"{r.created_s:.1f}",
                f"{r.idle_cpu * 100:.1f} %",
                f"{r.rss / 2**20:.0f} MiB",
                r.fds,
                f"{r.metadata_p99 * 1000:.1f}",
                f"{r.produce_p50 * 1000:.2f}",
                f"{ratio:.2f}",
                f"{r.loop_lag_p99 * 1000:.1f}",
                "-" if r.failover_s != r.failover_s else f"{r.failover_s:.2f}",
                ", ".join(verdicts),
            ]
        )
    print_table(
        [
            "partitions",
            "create s",
            "idle CPU",
            "RSS",
            "fds",
            "metadata p99 ms",
            "produce p50 ms",
            "produce / first",
            "loop lag p99 ms",
            "failover s",
            "bounds",
        ],
        table,
    )


if __name__ == "__main__":
    main()
