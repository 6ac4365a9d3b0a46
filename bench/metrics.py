"""What a Prometheus scrape of a node costs with many partitions, against `tidelog status` of the
same node in the same run.

    .venv/bin/python bench/metrics.py [--partitions 1000] [--scrapes 20]

One node with PARTITIONS partitions (one topic), a record in each and a cursor on the topic.
Reported: the time of a scrape of /metrics (p50, max) and its size, the time of the node's own
status over tidelog's protocol (which decides each partition's LWM afresh), and their ratio.
Bound: a scrape of 1,000 partitions well under Prometheus's default 10 s scrape timeout (< 1 s).
"""

from __future__ import annotations

import argparse
import time
import urllib.request

from common import percentile, print_table, scratch_dir
from tidelog.cli.cluster import LocalCluster
from tidelog.client.sync_client import Client

BOUND_S = 1.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--scrapes", type=int, default=20)
    args = parser.parse_args()
    with (
        LocalCluster(scratch_dir("metrics-"), 1, http=True, log_level="WARNING") as cluster,
        Client(cluster.bootstrap, request_timeout_ms=120_000) as client,
    ):
        started = time.monotonic()
        client.create_topic("many", partitions=args.partitions)
        client.wait_for_leaders("many", timeout_s=300)
        created = time.monotonic() - started
        for p in range(args.partitions):
            client.produce("many", [b"x"], partition=p)
        client._run(client.async_client.create_cursor("etl", "many", "earliest"))
        url = cluster.http_url(1) + "/metrics"
        scrapes, size, families = [], 0, 0
        for _ in range(args.scrapes):
            t = time.perf_counter()
            with urllib.request.urlopen(url, timeout=60) as answer:
                body = answer.read()
            scrapes.append(time.perf_counter() - t)
            size = len(body)
            families = body.count(b"\n# TYPE ")
        statuses = []
        for _ in range(args.scrapes):
            t = time.perf_counter()
            client.status(["many"])
            statuses.append(time.perf_counter() - t)
    p50, st50 = percentile(scrapes, 50), percentile(statuses, 50)
    print_table(
        [
            "partitions",
            "created in s",
            "scrape p50 ms",
            "scrape max ms",
            "size KiB",
            "families",
            "status p50 ms",
            "scrape / status",
            f"scrape < {BOUND_S:.0f} s",
        ],
        [
            [
                args.partitions,
                f"{created:.1f}",
                f"{p50 * 1000:.1f}",
                f"{max(scrapes) * 1000:.1f}",
                f"{size / 1024:.0f}",
                families + 1,
                f"{st50 * 1000:.1f}",
                f"{p50 / st50:.2f}",
                "met" if max(scrapes) < BOUND_S else "NOT met",
            ]
        ],
    )


if __name__ == "__main__":
    main()
