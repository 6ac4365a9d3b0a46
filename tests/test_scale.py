"""Many partitions, real processes (issue 18): a node with thousands of partitions serves them all
within a small open-files limit (how fast: bench/scale.py), and a cluster that loses the leader of hundreds of
quiesced partitions elects new leaders within the election timeout plus a second, losing
nothing acknowledged."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from helpers import poll
from tidelog.cli.cluster import LocalCluster
from tidelog.client.sync_client import Client
from tidelog.cluster_status import merge_status

pytestmark = pytest.mark.process  # tiers: pyproject.toml's markers

ELECTION_TIMEOUT_S = 0.8 + 0.4  # election_timeout_ms and election_jitter_ms, the defaults


@pytest.mark.timeout(420)
def test_one_node_with_5000_partitions_serves_them_within_1024_descriptors(
    tmp_path: Path,
) -> None:
    """Functional: every partition led, listed, paged and readable under a 1,024-descriptor
    limit. How fast (metadata p99, produce p50 against 10 partitions) is bench/scale.py's."""
    with (
        LocalCluster(tmp_path, nodes=1, open_files_limit=1024) as cluster,
        Client(cluster.bootstrap, request_timeout_ms=300_000) as client,
    ):
        client.create_topic("wide", partitions=5000, replication_factor=1)
        client.wait_for_leaders("wide", timeout_s=300)
        time.sleep(1.0)  # the topics' replicas settle (elected, quiet)
        # Every leader is in the metadata answer, also those of partitions that opened after
        # the answer was first built (created in turns; a single replica leads from the start).
        assert set(client.topic("wide", refresh=True).leaders) == {1}
        for i in range(60):  # one record each to 60 partitions spread over the topic
            client.produce("wide", [b"v%d" % i], partition=(i * 7) % 5000, acks="all")
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


@pytest.mark.timed  # new leaders within the election timeout and a second
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

            def still_leaderless() -> list[int]:
                now = watcher.topic("t", refresh=True).leaders
                return [p for p in led if now[p] in (victim, -1)]

            waiting = poll(still_leaderless, 30, accept=lambda waiting: not waiting, every_s=0.02)
            took = time.monotonic() - killed
            assert not waiting, f"{len(waiting)} of {len(led)} partitions still leaderless"
            assert took <= bound, f"{len(led)} partitions led again after {took:.2f} s"
            for partition, values in sorted(acked.items()):
                got = [r.value for r in watcher.consume("t", partition, "earliest")]
                assert got == values, f"partition {partition}: {got} != {values}"
