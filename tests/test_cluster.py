"""Real processes: a 3-node cluster under acks=all load, its leader killed and frozen again and
again; nothing acknowledged is lost, nothing read ever changes, nothing is read at or above the
HW reported with it. Plus min.insync.replicas, follower reads, status and metadata."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from helpers import wait_for, wait_for_value
from tidelog.cli.cluster import LocalCluster
from tidelog.client.sync_client import Client
from tidelog.cluster_status import merge_status
from tidelog.errors import NotEnoughReplicas, TidelogError
from tidelog.record import ProducerRecord

pytestmark = pytest.mark.process  # tiers: pyproject.toml's markers

KILLS = 5
FREEZES = 5


def leader_of(client: Client, topic: str, partition: int = 0, timeout_s: float = 20) -> int:
    def leader() -> int:
        rows = merge_status(client.status([topic]), topic)
        row = next((r for r in rows if r["partition"] == partition), None)
        return int(row["leader"]) if row is not None else -1

    what = f"a leader of {topic}/{partition}"
    return int(wait_for_value(what, leader, lambda leader: leader >= 0, timeout_s))


def wait_converged(
    client: Client, topic: str, replicas: int, timeout_s: float = 30
) -> dict[str, Any]:
    def converged(row: dict[str, Any] | None) -> bool:
        if row is None or row["leader"] < 0 or len(row["replicas"]) != replicas:
            return False
        ends = {(r["log_end_offset"], r["high_watermark"]) for r in row["replicas"].values()}
        return len(ends) == 1 and row["log_end_offset"] == row["high_watermark"]

    def first_row() -> dict[str, Any] | None:
        rows = merge_status(client.status([topic]), topic)
        return rows[0] if rows else None

    what = f"the replicas of {topic} to converge"
    row: dict[str, Any] = wait_for_value(what, first_row, converged, timeout_s, every_s=0.1)
    return row


class Producer(threading.Thread):
    """acks=all in a loop; a fresh value per attempt and no client retries, so an acknowledged
    value can only be where its acknowledgement said."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.stop = threading.Event()
        self.acked: dict[int, bytes] = {}
        self.errors: list[str] = []

    def run(self) -> None:
        attempt = 0
        with Client(self.bootstrap, retries=1, request_timeout_ms=3000) as client:
            while not self.stop.is_set():
                values = [b"p%07d-%d" % (attempt, i) for i in range(random.randint(1, 10))]
                attempt += 1
                try:
                    result = client.produce(
                        self.topic, [ProducerRecord(None, v) for v in values], partition=0
                    )
                except TidelogError as exc:
                    self.errors.append(exc.name)
                    time.sleep(0.02)
                    continue
                assert result is not None
                for i, v in enumerate(values):
                    self.acked[result.base_offset + i] = v


class Consumer(threading.Thread):
    """Reads continuously from the leader; remembers every record it saw and the HW with it."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.stop = threading.Event()
        self.seen: dict[int, bytes] = {}
        self.violations: list[str] = []

    def run(self) -> None:
        offset = 0
        with Client(self.bootstrap, retries=3, request_timeout_ms=3000) as client:
            while not self.stop.is_set():
                try:
                    result = client.fetch(self.topic, 0, offset, max_wait_ms=200)
                except TidelogError:
                    time.sleep(0.05)
                    continue
                for rec in result.records:
                    if rec.offset >= result.high_watermark:
                        self.violations.append(
                            f"read {rec.offset} at or above HW {result.high_watermark}"
                        )
                    previous = self.seen.setdefault(rec.offset, rec.value or b"")
                    if previous != (rec.value or b""):
                        self.violations.append(f"offset {rec.offset} changed")
                offset = result.next_offset


@pytest.mark.timeout(600)
def test_leader_killed_and_frozen_under_load(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, nodes=3) as cluster, Client(cluster.bootstrap) as admin:
        admin.create_topic(
            "orders", partitions=1, replication_factor=3, configs={"min.insync.replicas": "2"}
        )
        producer, consumer = (
            Producer(cluster.bootstrap, "orders"),
            Consumer(cluster.bootstrap, "orders"),
        )
        producer.start()
        consumer.start()
        rng = random.Random(3)
        try:
            for _ in range(KILLS):
                time.sleep(rng.uniform(0.5, 1.5))
                leader = leader_of(admin, "orders")
                cluster.kill(leader)
                time.sleep(rng.uniform(1.5, 2.5))
                cluster.start(leader)
                cluster.wait_ready()
                before = len(producer.acked)
                wait_for(
                    "acknowledgements to resume after a kill",
                    lambda: len(producer.acked) > before,  # noqa: B023 (asked in this turn)
                    15,
                    every_s=0.1,
                )
            for _ in range(FREEZES):
                time.sleep(rng.uniform(0.5, 1.5))
                leader = leader_of(admin, "orders")
                cluster.freeze(leader)
                time.sleep(rng.uniform(1.5, 3.0))  # longer than an election timeout
                cluster.resume(leader)
            time.sleep(1.0)
        finally:
            producer.stop.set()
            producer.join(30)
        row = wait_converged(admin, "orders", 3)
        time.sleep(1.0)
        consumer.stop.set()
        consumer.join(30)
        assert not consumer.violations, consumer.violations[:5]
        assert len(producer.acked) > 100
        final = {r.offset: r.value or b"" for r in admin.consume("orders", 0)}
        missing = [o for o, v in producer.acked.items() if final.get(o) != v]
        assert not missing, f"acknowledged records lost: {missing[:10]}"
        values = list(final.values())
        assert len(values) == len(set(values)), "a record is stored twice"
        changed = [o for o, v in consumer.seen.items() if final.get(o) != v]
        assert not changed, f"records the consumer saw changed: {changed[:10]}"
        # Every replica holds the same committed log.
        for node in cluster.node_ids:
            copy = {
                r.offset: r.value or b""
                for r in admin.consume("orders", 0, replica_read=True, prefer_node=node)
            }
            assert copy == final, f"node {node} differs"
        assert row["epoch"] > KILLS


def test_min_insync_follower_reads_and_status(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, nodes=3) as cluster, Client(cluster.bootstrap) as client:
        client.create_topic(
            "t",
            partitions=3,
            replication_factor=3,
            # a dead follower leaves the in-sync set after 3 s, not Kafka's 30 s
            configs={"min.insync.replicas": "3", "replica.lag.time.max.ms": "3000"},
        )
        client.create_topic("isr", replication_factor=3, configs={"hw.policy": "isr"})
        for p in range(3):
            client.produce("t", [b"a", b"b"], partition=p)
        client.produce("isr", [b"i"], partition=0)
        # Metadata from every node, and the topic survives a minority failure.
        for node in cluster.node_ids:
            with Client(cluster.address(node)) as one:
                assert one.topic("t", refresh=True).replication_factor == 3
        status = json.loads(json.dumps(client.status()))
        rows = merge_status(status, None)
        assert {(r["topic"], r["partition"]) for r in rows} == {
            ("t", 0),
            ("t", 1),
            ("t", 2),
            ("isr", 0),
        }
        for r in rows:
            assert r["leader"] in cluster.node_ids and r["epoch"] >= 1
            assert set(r["replicas"]) == {"1", "2", "3"}
            for rep in r["replicas"].values():
                assert {
                    "log_end_offset",
                    "high_watermark",
                    "log_start_offset",
                    "in_sync",
                    "lag",
                } <= set(rep)
        leader = leader_of(client, "t", 0)
        follower = next(n for n in cluster.node_ids if n != leader)
        # Follower reads: never past the follower's HW.
        got = [r.value for r in client.consume("t", 0, replica_read=True, prefer_node=follower)]
        assert got == [b"a", b"b"]
        result = client.fetch("t", 0, 0, replica_read=True, node_id=follower)
        assert result.node_id == follower and all(
            r.offset < result.high_watermark for r in result.records
        )
        # A follower down: acks=all needs 3 in sync here, so it fails fast; acks=1 still works.
        victim = next(n for n in cluster.node_ids if n != leader)
        cluster.kill(victim)
        time.sleep(0.3)

        def refused() -> bool:
            try:
                client.produce("t", [b"c"], partition=0, timeout_ms=2000)
            except NotEnoughReplicas:
                return True
            return False

        wait_for(
            "acks=all to fail with NotEnoughReplicas",
            refused,
            60,
            every_s=0.5,
            tolerating=(TidelogError,),
        )
        assert client.produce("t", [b"d"], partition=0, acks=1) is not None
        rows = merge_status(client.status(["t"]), "t")
        assert all(r["under_replicated"] for r in rows if r["leader"] >= 0)
        assert client.topic("t", refresh=True).partitions == 3
        cluster.start(victim)
        cluster.wait_ready()
        wait_for(
            "no partition of t under-replicated",
            lambda: not any(r["under_replicated"] for r in merge_status(client.status(["t"]), "t")),
            30,
            every_s=0.2,
        )
        assert client.produce("t", [b"e"], partition=0) is not None
