"""Issue 10's disk-loss case with real processes: a replica whose disk was replaced must not
help elect a leader that lacks acknowledged records; it rejoins as an observer and becomes a
full replica again once it holds what is committed."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import wait_for_value
from test_cluster import leader_of, wait_converged
from tidelog.cli.cluster import LocalCluster
from tidelog.client.sync_client import Client
from tidelog.cluster_status import merge_status
from tidelog.errors import NotLeader, TidelogError, UnknownTopicOrPartition
from tidelog.record.batch import ProducerRecord

pytestmark = pytest.mark.process  # tiers: pyproject.toml's markers

TIDELOG = [sys.executable, "-m", "tidelog"]


def produce(client: Client, values: list[bytes]) -> dict[int, bytes]:
    acked = {}
    for v in values:
        result = client.produce("t", [ProducerRecord(None, v)], partition=0)
        assert result is not None
        acked[result.base_offset] = v
    return acked


def lose_the_leader_and_a_disk(
    cluster: LocalCluster, admin: Client, before: int, after: int
) -> tuple[int, int, int, dict[int, bytes]]:
    """Issue 10's case: `before` records on all three replicas, then one follower freezes and
    `after` more are acknowledged by the leader and the other follower; the leader dies, that
    follower loses its disk and comes back empty under its old id, and the frozen one wakes.
    Returns (leader, wiped, lagging, what was acknowledged)."""
    admin.create_topic(
        "t", partitions=1, replication_factor=3, configs={"min.insync.replicas": "2"}
    )
    leader = leader_of(admin, "t")
    wiped, lagging = [n for n in cluster.node_ids if n != leader]
    wait_converged(admin, "t", 3)
    with Client(cluster.bootstrap) as client:
        acked = produce(client, [b"before-%d" % i for i in range(before)])
        cluster.freeze(lagging)
        acked |= produce(client, [b"lost-%d" % i for i in range(after)])
    cluster.kill(leader)
    cluster.kill(wiped)
    shutil.rmtree(cluster.data_dir / f"node-{wiped}")
    cluster.start(wiped)
    cluster.resume(lagging)
    cluster.wait_ready(node_ids=[wiped, lagging])
    return leader, wiped, lagging, acked


def test_a_replaced_disk_never_elects_a_leader_without_acknowledged_records(
    tmp_path: Path,
) -> None:
    with LocalCluster(tmp_path, nodes=3) as cluster, Client(cluster.bootstrap) as admin:
        leader, wiped, lagging, acked = lose_the_leader_and_a_disk(cluster, admin, 20, 30)

        # The replaced disk, asked alone the moment it listens again, does not say the topic is
        # unknown: it cannot tell yet (it said "unknown topic 't'"). It says so, retriably, or
        # (caught up already) it knows the topic.
        only_wiped = f"127.0.0.1:{cluster.ports[wiped]}"
        with Client(only_wiped, retries=1, request_timeout_ms=2000) as client:
            try:
                client.topic("t")
            except NotLeader as exc:
                assert "does not know topic 't' yet" in exc.message, exc
            except UnknownTopicOrPartition as exc:
                raise AssertionError(f"a node catching up called t unknown: {exc}") from exc

        # For longer than several election timeouts: no leader, and so no lost record.
        reachable = f"127.0.0.1:{cluster.ports[lagging]},127.0.0.1:{cluster.ports[wiped]}"
        with Client(reachable, retries=1, request_timeout_ms=2000) as client:
            deadline = time.monotonic() + 6
            while time.monotonic() < deadline:
                rows = merge_status(client.status(["t"]), "t")
                assert not rows or rows[0]["leader"] < 0, (
                    f"a leader without the acknowledged records: {rows}"
                )
                time.sleep(0.2)
            status = subprocess.run(
                [*TIDELOG, "status", "--bootstrap", reachable],
                capture_output=True,
                text=True,
                timeout=30,
            )
        assert "no eligible leader" in status.stdout, status.stdout + status.stderr
        assert f"{wiped} was re-formatted" in status.stdout, status.stdout
        assert f"{leader} is unreachable" in status.stdout, status.stdout

        # The old leader returns: it leads, the replaced disk catches up and is a full
        # replica again, and every acknowledged record is where its acknowledgement said.
        cluster.start(leader)
        cluster.wait_ready()
        wait_converged(admin, "t", 3, timeout_s=60)
        wait_for_value(
            "the replaced disk to be admitted (every replica in sync, none an observer)",
            lambda: merge_status(admin.status(["t"]), "t")[0],
            lambda row: all(r["in_sync"] and not r["observer"] for r in row["replicas"].values()),
            30,
            every_s=0.2,
        )
        with Client(cluster.bootstrap) as client:
            acked |= produce(client, [b"after-%d" % i for i in range(5)])
            got = {r.offset: r.value for r in client.consume("t", 0)}
        for offset, value in acked.items():
            assert got.get(offset) == value, f"acknowledged offset {offset} lost"
        # Every replica, the replaced one included, holds them: read each one's log.
        for node in cluster.node_ids:
            with Client(f"127.0.0.1:{cluster.ports[node]}") as one:
                try:
                    st = merge_status(one.status(["t"]), "t")[0]["replicas"][str(node)]
                except (TidelogError, IndexError, KeyError) as exc:
                    raise AssertionError(f"node {node} has no replica of t/0") from exc
                assert st["log_end_offset"] >= max(acked) + 1, (node, st)


def test_an_unclean_election_says_what_it_loses_and_elects(tmp_path: Path) -> None:
    """The same loss of two replicas, and an operator who will not wait for the old leader:
    `partitions elect --unclean` names the committed offsets it gives up, then elects the
    lagging replica; the partition takes writes again at those offsets."""
    with LocalCluster(tmp_path, nodes=3) as cluster, Client(cluster.bootstrap) as admin:
        leader, wiped, lagging, _ = lose_the_leader_and_a_disk(cluster, admin, 10, 5)
        reachable = f"127.0.0.1:{cluster.ports[lagging]},127.0.0.1:{cluster.ports[wiped]}"
        time.sleep(2)  # the lagging replica learns the HW it can no longer reach
        elect = subprocess.run(
            [*TIDELOG, "partitions", "elect", "--unclean", "t/0", "--bootstrap", reachable],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert elect.returncode == 0, elect.stdout + elect.stderr
        out = elect.stdout
        match = re.search(
            rf"t/0: node {lagging} will lead with its log ending at offset (\d+)", out
        )
        assert match, out
        end = int(match.group(1))
        assert f"Replicas [{leader}] are unreachable" in out, out
        assert f"t/0: {lagging} leads" in out, out
        # (The metadata log needs an unclean election too unless the frozen node led it: a
        # leader holding everything re-admits the replaced disk on its own.)
        with Client(reachable, retries=5) as client:
            result = client.produce("t", [ProducerRecord(None, b"new")], partition=0)
            # at the old log end (after the new leader's leader-change marker, if it wrote one)
            assert result is not None and result.base_offset in (end, end + 1), (result, end)
            got = [r.value for r in client.consume("t", 0)]
        # What the frozen replica already had in its socket buffer when it froze survives.
        kept = got[10:-1]
        assert got[:10] == [b"before-%d" % i for i in range(10)] and got[-1] == b"new", got
        assert kept == [b"lost-%d" % i for i in range(len(kept))], got
        bad = subprocess.run(
            [*TIDELOG, "partitions", "elect", "t-0", "--bootstrap", reachable],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (
            bad.returncode == 1
            and "InvalidRequest" in bad.stderr
            and "TOPIC/PARTITION" in bad.stderr
        )
