"""Real processes: SIGTERM to the node that leads a partition under acks=all load. With a
controlled shutdown (the default, controlled.shutdown.timeout.ms) the node hands its
leaderships to an in-sync replica before it stops: it exits 0, another node leads in a higher
epoch before it exits, the producer waits far less than an election timeout, and nothing
acknowledged is lost. Without one (controlled.shutdown.timeout.ms=0) the same stop costs the
producer an election timeout: what the hand-over saves, and what shows the measure can fail."""

from __future__ import annotations

import itertools
import re
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import wait_for_value
from tidelog.cli.cluster import LocalCluster
from tidelog.client.sync_client import Client
from tidelog.cluster_status import PartitionRow, partition_rows
from tidelog.errors import TidelogError

pytestmark = pytest.mark.process  # tiers: pyproject.toml's markers

TOPIC = "load"
# Longer than the default 800 ms, so that a gap of an election timeout and one of a hand-over
# stay far apart on a busy 2-core machine.
ELECTION_TIMEOUT_MS = 1500


@dataclass
class Acked:
    at: float  # time.monotonic() when the acknowledgement came
    offset: int
    value: bytes


class Producer(threading.Thread):
    """acks=all, one record at a time, to partition 0, until halted; every acknowledgement kept
    with its offset and time (the client retries NotLeader and lost connections itself)."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap = bootstrap
        self.halt = threading.Event()
        self.acked: list[Acked] = []
        self.errors: list[str] = []

    def run(self) -> None:
        with Client(self.bootstrap) as client:
            for n in itertools.count():
                if self.halt.is_set():
                    return
                value = b"v-%d" % n
                try:
                    result = client.produce(TOPIC, [value], partition=0, acks="all")
                except TidelogError as exc:
                    self.errors.append(repr(exc))
                    continue
                assert result is not None
                self.acked.append(Acked(time.monotonic(), result.base_offset, value))

    def longest_gap(self, start: float, end: float) -> float:
        """The longest time without an acknowledgement within [start, end]."""
        times = [start, *sorted(a.at for a in self.acked if start < a.at < end), end]
        return max(b - a for a, b in itertools.pairwise(times))


def leadership(client: Client) -> PartitionRow:
    (row,) = partition_rows(client.status([TOPIC]), TOPIC)
    return row


def stop_the_leader(
    tmp_path: Path, shutdown_timeout_ms: int
) -> tuple[float, PartitionRow, PartitionRow, str, Producer, LocalCluster]:
    """A 3-node cluster, RF 3, under load; SIGTERM to partition 0's leader. The longest gap
    between acknowledgements around the stop, the leadership before and after, the stopped
    node's log, the producer and the cluster (still running, without the stopped node)."""
    serve = ["--set", f"election_timeout_ms={ELECTION_TIMEOUT_MS}"]
    serve += ["--set", f"controlled.shutdown.timeout.ms={shutdown_timeout_ms}"]
    cluster = LocalCluster(tmp_path, nodes=3, serve_args=serve)
    cluster.start()
    cluster.wait_ready()
    producer = Producer(cluster.bootstrap)
    with Client(cluster.bootstrap) as client:
        client.create_topic(TOPIC, 1, replication_factor=3)
        client.wait_for_leaders(TOPIC)
        before = wait_for_value(
            "every replica in sync",
            lambda: leadership(client),
            lambda row: row.leader > 0 and all(r.in_sync for r in row.replicas.values()),
            60,
            tolerating=(TidelogError,),
        )
        producer.start()
        wait_for_value("300 acknowledgements", lambda: len(producer.acked), lambda n: n >= 300, 60)
        victim = before.leader
        signalled = time.monotonic()
        cluster.signal(victim, signal.SIGTERM)
        code = cluster.procs[victim].wait(timeout=60)
        exited = time.monotonic()
        assert code == 0, f"node {victim} exited with {code}"
        wait_for_value(
            "acknowledgements after the stop",
            lambda: [a for a in producer.acked if a.at > exited],
            lambda after: len(after) >= 100,
            60,
        )
        last_ack = producer.acked[-1].at
        after = wait_for_value(
            "a new leader",
            lambda: leadership(client),
            lambda row: row.leader > 0 and row.leader != victim,
            30,
            tolerating=(TidelogError,),
        )
    gap = producer.longest_gap(signalled - 1, last_ack)
    log = cluster.log_path(victim).read_text(errors="replace")
    return gap, before, after, log, producer, cluster


def check_nothing_lost(cluster: LocalCluster, producer: Producer) -> None:
    producer.halt.set()
    producer.join(60)
    assert producer.errors == [], f"errors the client did not retry through: {producer.errors}"
    with Client(cluster.bootstrap) as client:
        log = {r.offset: r.value for r in client.consume(TOPIC, 0, "earliest")}
    lost = [a for a in producer.acked if log.get(a.offset) != a.value]
    assert lost == [], f"{len(lost)} of {len(producer.acked)} acknowledged lost, first {lost[:3]}"


@pytest.mark.timeout(300)
def test_sigterm_hands_the_leadership_over_before_the_node_exits(tmp_path: Path) -> None:
    gap, before, after, log, producer, cluster = stop_the_leader(tmp_path, 5_000)
    try:
        handed = re.search(r"node \d+ handed (\d+) of (\d+) leaderships over in ([\d.]+) s", log)
        assert handed is not None, log[-3000:]
        moved, led, took = int(handed[1]), int(handed[2]), float(handed[3])
        print(f"longest gap {gap:.3f} s; handed {moved} of {led} over in {took:.3f} s")
        # Partition 0 at least, and the metadata log if it led it: all of them, before exiting
        # (the node counts those whose new leader it heard from).
        assert moved == led >= 1, handed[0]
        assert after.leader != before.leader and after.epoch > before.epoch
        timeout_s = ELECTION_TIMEOUT_MS / 1000
        assert took < timeout_s, f"the hand-over took {took:.3f} s"
        # An election timeout (plus jitter) is what a stop without a hand-over costs.
        assert gap < timeout_s / 2, f"{gap:.3f} s without an acknowledgement"
        check_nothing_lost(cluster, producer)
    finally:
        producer.halt.set()
        cluster.stop_all()


@pytest.mark.timeout(300)
def test_without_a_controlled_shutdown_the_stop_costs_an_election_timeout(
    tmp_path: Path,
) -> None:
    gap, before, after, log, producer, cluster = stop_the_leader(tmp_path, 0)
    try:
        print(f"longest gap {gap:.3f} s")
        assert "leaderships over" not in log
        assert after.leader != before.leader and after.epoch > before.epoch
        assert gap >= ELECTION_TIMEOUT_MS / 1000 / 2, f"{gap:.3f} s: an election was this quick?"
        check_nothing_lost(cluster, producer)
    finally:
        producer.halt.set()
        cluster.stop_all()
