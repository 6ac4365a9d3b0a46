"""Many partitions, real processes (issue 18): a node with thousands of partitions still answers
at once, within a small open-files limit, and a cluster that loses the leader of hundreds of
quiesced partitions elects new leaders within the election timeout plus a second, losing
nothing acknowledged."""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import pytest

from helpers import scrape, value
from tidelog.cli.cluster import LocalCluster
from tidelog.client.sync_client import Client
from tidelog.cluster_status import merge_status

pytestmark = pytest.mark.process  # tiers: pyproject.toml's markers

ELECTION_TIMEOUT_S = 0.8 + 0.4  # election_timeout_ms and election_jitter_ms, the defaults


def produce_p50(client: Client, topic: str, partitions: int, count: int) -> float:
    """One-record acks=all produces spread over the partitions, each written once before (a
    partition's first write allocates its file's first block, whatever the partition count)."""
    for i in range(count):
        client.produce(topic, [b"warm"], partition=(i * 7) % partitions, acks="all")
    took = []
    for i in range(count):
        started = time.perf_counter()
        client.produce(topic, [b"v%d" % i], partition=(i * 7) % partitions, acks="all")
        took.append(time.perf_counter() - started)
    return statistics.median(took)


@pytest.mark.timeout(420)
def test_one_node_with_5000_partitions_answers_at_once_within_1024_descriptors(
    tmp_path: Path,
) -> None:
    with (
        LocalCluster(tmp_path, nodes=1, open_files_limit=1024, http=True) as cluster,
        Client(cluster.bootstrap, request_timeout_ms=300_000) as client,
    ):
        client.create_topic("few", partitions=10, replication_factor=1)
        client.create_topic("wide", partitions=5000, replication_factor=1)
        client.wait_for_leaders("wide", timeout_s=300)
        time.sleep(1.0)  # the topics' replicas settle (elected, quiet)
        # Every leader is in the metadata answer, also those of partitions that opened after
        # the answer was first built (created in turns; a single replica leads from the start).
        assert set(client.topic("wide", refresh=True).leaders) == {1}
        for _ in range(100):
            client.topic("wide", refresh=True)  # 5,000 partitions
        # The node's own answer time (its request histogram): the round trip adds this
        # process's decoding of a 5,000-partition answer, which no node can make faster.
        families = scrape(cluster.http_url(1))
        seconds = "tidelog_request_seconds"
        answered = value(families, f"{seconds}_count", listener="client", request="metadata")
        within = value(
            families, f"{seconds}_bucket", listener="client", request="metadata", le="0.05"
        )
        assert answered >= 100 and within >= 0.99 * answered, (
            f"{answered - within} of {answered} metadata answers took over 50 ms"
        )
        few = produce_p50(client, "few", 10, 60)
        wide = produce_p50(client, "wide", 5000, 60)
        assert wide <= 1.5 * few, f"produce p50 {wide * 1000:.2f} ms vs {few * 1000:.2f} ms"
        # The status of every partition, in pages (at once it would not fit one header)
        rows = merge_status(client.status(["wide"]), "wide")
        assert [r["partition"] for r in rows] == list(range(5000))
        assert all(r["leader"] == 1 for r in rows)
        fds = len(os.listdir(f"/proc/{cluster.procs[1].pid}/fd"))
        assert fds < 1024, f"{fds} descriptors open"
        # what was written reads back, from partitions whose files the cache closed and opened
        for i in range(0, 60, 7):
            partition = (i * 7) % 5000
            assert b"v%d" % i in [r.value for r in client.consume("wide", partition, "earliest")]


@pytest.mark.timeout(420)
def test_a_killed_leader_of_quiesced_partitions_is_replaced_within_the_election_timeout(
    tmp_path: Path,
) -> None:
    partitions = 2000
    with (
        LocalCluster(tmp_path, nodes=3) as cluster,
        Client(cluster.bootstrap, request_timeout_ms=300_000) as client,
    ):
        client.create_topic("t", partitions=partitions, replication_factor=3)
        client.wait_for_leaders("t", timeout_s=300)
        acked: dict[int, list[bytes]] = {}
        for i in range(200):
            partition = (i * 11) % partitions
            client.produce("t", [b"acked-%d" % i], partition=partition, acks="all")
            acked.setdefault(partition, []).append(b"acked-%d" % i)
        time.sleep(3.0)  # idle: the groups quiesce
        leaders = client.topic("t", refresh=True).leaders
        victim = max(set(leaders), key=leaders.count)
        led = [p for p, n in enumerate(leaders) if n == victim]
        survivor = next(n for n in cluster.node_ids if n != victim)
        cluster.kill(victim)
        killed = time.monotonic()
        bound = ELECTION_TIMEOUT_S + 1.0
        with Client(cluster.address(survivor)) as watcher:
            while True:
                now = watcher.topic("t", refresh=True).leaders
                waiting = [p for p in led if now[p] in (victim, -1)]
                if not waiting or time.monotonic() - killed > 30:
                    break
                time.sleep(0.02)
            took = time.monotonic() - killed
            assert not waiting, f"{len(waiting)} of {len(led)} partitions still leaderless"
            assert took <= bound, f"{len(led)} partitions led again after {took:.2f} s"
            for partition, values in sorted(acked.items()):
                got = [r.value for r in watcher.consume("t", partition, "earliest")]
                assert got == values, f"partition {partition}: {got} != {values}"
