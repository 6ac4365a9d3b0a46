"""Jepsen-style runs against real processes (issue 10): 3 nodes, 3 partitions, RF 3,
min.insync.replicas 2, for hw.policy=quorum and hw.policy=isr; non-idempotent acks=all producers
(each value sent once, no retry that could hide a loss) while a nemesis SIGKILLs and restarts,
and SIGSTOPs and resumes, random nodes, leaders most of all. A checker then reads every
partition: every acknowledged value must be at the offset its acknowledgement named (0 lost,
0 changed), and no value may be stored twice.

CI runs TIDELOG_SOAK_SECONDS (default 30) per policy; set it higher for a soak."""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest

from helpers import retry
from test_cluster import leader_of
from tidelog.cli.cluster import LocalCluster
from tidelog.client.sync_client import Client
from tidelog.errors import TidelogError
from tidelog.record import ProducerRecord

# timed: kills and pauses for a set time
pytestmark = [pytest.mark.process, pytest.mark.timed]  # tiers: pyproject.toml's markers

SOAK_SECONDS = float(os.environ.get("TIDELOG_SOAK_SECONDS", "20"))
PARTITIONS = 3


class Workload:
    def __init__(self, bootstrap: str, producers: int = 3) -> None:
        self.bootstrap = bootstrap
        self.stop = threading.Event()
        self.acked: dict[bytes, tuple[int, int]] = {}  # value -> (partition, offset)
        self.attempts = 0
        self.failures = 0
        self.threads = [
            threading.Thread(target=self.produce, args=(i,), daemon=True) for i in range(producers)
        ]

    def produce(self, worker: int) -> None:
        n = 0
        with Client(self.bootstrap, idempotent=False, retries=6, request_timeout_ms=3000) as c:
            while not self.stop.is_set():
                value = b"w%d-%06d" % (worker, n)
                n += 1
                partition = n % PARTITIONS
                self.attempts += 1
                try:
                    result = c.produce(
                        "jepsen", [ProducerRecord(None, value)], partition, "all", 3000
                    )
                except TidelogError:
                    self.failures += 1
                    time.sleep(0.01)
                    continue
                assert result is not None
                self.acked[value] = (partition, result.base_offset)


def nemesis(cluster: LocalCluster, admin: Client, seconds: float, seed: int) -> list[str]:
    rng = random.Random(seed)
    events = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(rng.uniform(0.3, 1.5))
        try:
            leader = leader_of(admin, "jepsen", rng.randrange(PARTITIONS), timeout_s=5)
        except AssertionError:
            leader = rng.choice(cluster.node_ids)
        victim = leader if rng.random() < 0.7 else rng.choice(cluster.node_ids)
        if rng.random() < 0.5:
            cluster.kill(victim)
            time.sleep(rng.uniform(0.3, 2.0))
            cluster.start(victim)
            cluster.wait_ready(node_ids=[victim])
            events.append(f"kill {victim}")
        else:
            cluster.freeze(victim)
            time.sleep(rng.uniform(0.3, 2.5))
            cluster.resume(victim)
            events.append(f"pause {victim}")
    return events


@pytest.mark.timeout(900)
@pytest.mark.parametrize("policy", ["quorum", "isr"])
def test_no_acknowledged_record_is_lost_under_kills_and_pauses(tmp_path: Path, policy: str) -> None:
    with (
        LocalCluster(tmp_path, 3, log_level="WARNING") as cluster,
        Client(cluster.bootstrap) as admin,
    ):
        admin.create_topic(
            "jepsen",
            partitions=PARTITIONS,
            replication_factor=3,
            configs={"min.insync.replicas": "2", "hw.policy": policy},
        )
        work = Workload(cluster.bootstrap)
        for t in work.threads:
            t.start()
        try:
            events = nemesis(cluster, admin, SOAK_SECONDS, seed=hash(policy) & 0xFFFF)
        finally:
            work.stop.set()
            for t in work.threads:
                t.join(60)
        for n in cluster.node_ids:
            cluster.resume(n)
            if not cluster.alive(n):
                cluster.start(n)
        cluster.wait_ready()
        final: dict[int, dict[int, bytes | None]] = retry(
            "the cluster to recover (every partition read to its end)",
            lambda: {
                p: {r.offset: r.value for r in admin.consume("jepsen", p)}
                for p in range(PARTITIONS)
            },
            60,
            every_s=0.5,
            tolerating=(TidelogError,),
        )
    lost = [v for v, (p, o) in work.acked.items() if final[p].get(o) != v]
    stored = [v for log in final.values() for v in log.values()]
    duplicates = len(stored) - len(set(stored))
    print(
        f"hw.policy={policy}: {len(events)} nemesis events, {work.attempts} attempts, "
        f"{len(work.acked)} acknowledged, {work.failures} failed, {len(lost)} lost or "
        f"changed, {duplicates} duplicates"
    )
    assert not lost, f"acknowledged records lost or changed: {lost[:5]}"
    assert duplicates == 0, "a value sent once is stored twice"
    assert len(work.acked) > 200
