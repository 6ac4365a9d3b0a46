"""Produce with TLS on every listener against the same cluster shape without, in one run.

    .venv/bin/python bench/tls.py [--seconds 4]

Two 3-node clusters, one after the other: plain TCP, then TLS on every listener (certificates
from `tidelog dev-certs`, mutual TLS between nodes). The same load on each: RF 3, acks=all,
1 KiB records; one record per request from 1 producer, and batches of 100 from 8 and 64
producers, each its own client. Plain, TLS, TLS, plain; the better of each pair is reported.
The ratio is TLS / plain (the issue's goal: >= 0.8).

A second table gives the CPU each record cost, in microseconds, from /proc: the busiest node (the
leader), all three nodes, and this process (the producers' clients), plain and TLS. On a machine
whose cores all of them share, TLS/plain throughput cannot be better than plain/TLS total CPU.
"""

from __future__ import annotations

import argparse
import os
from typing import NamedTuple

from common import (
    RECORD_BYTES,
    make_batch,
    percentile,
    print_table,
    process_cpu_seconds,
    run_producers,
    scratch_dir,
)
from tidelog.cli.args import run_loop
from tidelog.cli.cluster import LocalCluster
from tidelog.client.async_client import AsyncClient
from tidelog.devcerts import make_dev_certs
from tidelog.tls import TlsFiles

LOADS = [(1, 1), (100, 8), (100, 64)]  # (records per batch, producers)


async def create(bootstrap: str, topic: str, tls: TlsFiles | None) -> None:
    async with AsyncClient(bootstrap, tls=tls) as c:
        await c.create_topic(topic, replication_factor=3)
        await c.wait_for_leaders(topic)


class Measured(NamedTuple):
    """One load on one cluster: throughput, latency, and CPU per record in microseconds."""

    rate: float
    p50_ms: float
    p99_ms: float
    leader_us: float  # the busiest node
    nodes_us: float
    client_us: float


def measure(tls: TlsFiles | None, serve_args: list[str], seconds: float) -> list[Measured]:
    out = []
    with LocalCluster(
        scratch_dir("tls-bench-"), 3, serve_args=serve_args, log_level="WARNING"
    ) as cluster:
        for size, producers in LOADS:
            topic = f"b{size}-p{producers}"
            run_loop(create(cluster.bootstrap, topic, tls))
            pids = [proc.pid for proc in cluster.procs.values()] + [os.getpid()]
            before = [process_cpu_seconds(pid) for pid in pids]
            sent, elapsed, latencies = run_loop(
                run_producers(
                    cluster.bootstrap, topic, make_batch(size), producers, seconds, "all", tls=tls
                )
            )
            used = [process_cpu_seconds(pid) - b for pid, b in zip(pids, before, strict=True)]
            records = sent * size
            per_record = [u / records * 1e6 for u in used]  # microseconds
            nodes = per_record[:-1]
            out.append(
                Measured(
                    records / elapsed,
                    percentile(latencies, 50) * 1000,
                    percentile(latencies, 99) * 1000,
                    max(nodes),
                    sum(nodes),
                    per_record[-1],
                )
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    certs = scratch_dir("tls-certs-")
    make_dev_certs(certs)
    tls = TlsFiles.of(certs / "ca.pem")
    serve = ["--tls-cert", str(certs / "node.pem"), "--tls-key", str(certs / "node.key")]
    serve += ["--tls-ca", str(certs / "ca.pem")]
    # Plain, TLS, TLS, plain: the best of two for each, so that neither always runs on a disk
    # still writing back the other's data.
    runs = [measure(None, [], args.seconds), measure(tls, serve, args.seconds)]
    runs += [measure(tls, serve, args.seconds), measure(None, [], args.seconds)]
    plain = [max(a, b, key=lambda m: m.rate) for a, b in zip(runs[0], runs[3], strict=True)]
    secured = [max(a, b, key=lambda m: m.rate) for a, b in zip(runs[1], runs[2], strict=True)]
    rows = []
    for (size, producers), p, t in zip(LOADS, plain, secured, strict=True):
        rows.append(
            [
                size,
                producers,
                p.rate,
                t.rate,
                t.rate / p.rate,
                p.p99_ms,
                t.p99_ms,
                p.p99_ms / t.p99_ms,
            ]
        )
    print(f"\nRF 3, acks=all, {RECORD_BYTES} B records; TLS on every listener vs plain TCP")
    print_table(
        [
            "batch",
            "producers",
            "plain rec/s",
            "TLS rec/s",
            "TLS/plain",
            "plain p99 ms",
            "TLS p99 ms",
            "plain/TLS p99",
        ],
        rows,
    )
    cpu_rows = []
    for (size, producers), p, t in zip(LOADS, plain, secured, strict=True):
        total_plain, total_tls = p.nodes_us + p.client_us, t.nodes_us + t.client_us
        cpu_rows.append(
            [
                size,
                producers,
                p.leader_us,
                t.leader_us,
                p.nodes_us,
                t.nodes_us,
                p.client_us,
                t.client_us,
                total_plain / total_tls,
            ]
        )
    print("\nCPU per record (microseconds, from /proc), the same runs")
    print_table(
        [
            "batch",
            "producers",
            "leader plain",
            "leader TLS",
            "nodes plain",
            "nodes TLS",
            "client plain",
            "client TLS",
            "plain/TLS total",
        ],
        cpu_rows,
    )


if __name__ == "__main__":
    main()
