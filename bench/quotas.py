"""A principal over its produce quota is slowed to it; another principal is not held with it.

    .venv/bin/python bench/quotas.py [--rate 262144] [--chunks 48]

One node. alice has `producer_byte_rate=RATE` and produces CHUNKS requests of 64 KiB as fast as
she is let; bob, without a quota, produces one record every 20 ms on his own connection,
before and while alice is throttled. Reported: alice's rate as a ratio of what the quota allows
(a 1 s burst, then RATE), and bob's latency while alice is held against before (same run).
"""

from __future__ import annotations

import argparse
import threading
import time

from common import percentile, print_table, scratch_dir
from tidelog.cli.cluster import LocalCluster
from tidelog.client.sync_client import Client

CHUNK = 64 * 1024


def latencies(client: Client, count: int, pause_s: float) -> list[float]:
    taken = []
    for _ in range(count):
        started = time.perf_counter()
        client.produce("bob-t", [b"bob"], partition=0)
        taken.append(time.perf_counter() - started)
        time.sleep(pause_s)
    return taken


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=int, default=256 * 1024)
    parser.add_argument("--chunks", type=int, default=48)
    args = parser.parse_args()
    with LocalCluster(scratch_dir("quotas-"), 1, log_level="WARNING") as cluster:
        with Client(cluster.bootstrap) as admin:
            alice_token = admin.add_principal("alice")
            bob_token = admin.add_principal("bob")
            for topic in ("alice-t", "bob-t"):
                admin.create_topic(topic)
            admin.set_quota("alice", {"producer_byte_rate": args.rate})
        alice = Client(cluster.bootstrap, token=alice_token)
        bob = Client(cluster.bootstrap, token=bob_token)
        with alice, bob:
            latencies(bob, 20, 0.01)  # warm up the connection
            before = latencies(bob, 200, 0.02)
            took: list[float] = []

            def flood() -> None:
                started = time.perf_counter()
                for _ in range(args.chunks):
                    alice.produce("alice-t", [b"a" * CHUNK], partition=0)
                took.append(time.perf_counter() - started)

            flooder = threading.Thread(target=flood)
            flooder.start()
            during = latencies(bob, 300, 0.02)
            flooder.join()
    sent = args.chunks * CHUNK
    allowed = args.rate * (1 + took[0])  # a second's burst, then the rate
    print(f"alice: {sent} bytes at producer_byte_rate={args.rate}; bob: no quota\n")
    print_table(
        ["measure", "value", "bound", "ratio"],
        [
            ["alice seconds", took[0], (sent - args.rate) / args.rate, float("nan")],
            ["alice bytes/s", sent / took[0], args.rate, sent / took[0] / args.rate],
            ["alice bytes vs allowed", sent, allowed, sent / allowed],
            [
                "bob p50 ms (before, during)",
                percentile(before, 50) * 1000,
                percentile(during, 50) * 1000,
                percentile(during, 50) / percentile(before, 50),
            ],
            [
                "bob p99 ms (before, during)",
                percentile(before, 99) * 1000,
                percentile(during, 99) * 1000,
                percentile(during, 99) / percentile(before, 99),
            ],
        ],
    )


if __name__ == "__main__":
    main()
