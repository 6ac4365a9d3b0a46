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

pytestmark = [pytest.mark.process, pytest.mark.timed]  # tiers: pyproject.toml's markers

TOPIC = "load"
# Longer than the default 800 ms, so that a gap of an election timeout and one of a hand-over
# stay far apart on a busy 2-core machine.
ELECTION_TIMEOUT_MS = 2000


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


def stop_time(cluster: LocalCluster, node: int) -> tuple[float, str]:
    """SIGTERM to node: how long it took to exit (with status 0), and its log."""
    signalled = time.monotonic()
    cluster.signal(node, signal.SIGTERM)
    code = cluster.procs[node].wait(timeout=120)
    took = time.monotonic() - signalled
    assert code == 0, f"node {node} exited with {code}"
    return took, cluster.log_path(node).read_text(errors="replace")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nodes", [1, 3])
def test_with_nobody_to_hand_over_to_the_node_does_not_wait(tmp_path: Path, nodes: int) -> None:
    """The only replica, or one whose followers' nodes are gone (SIGKILL: the liveness knows at
    once, their connections closed), hands nothing over and stops without waiting for the
    timeout."""
    timeout_ms = 60_000
    cluster = LocalCluster(
        tmp_path, nodes=nodes, serve_args=["--set", f"controlled.shutdown.timeout.ms={timeout_ms}"]
    )
    cluster.start()
    cluster.wait_ready()
    try:
        with Client(cluster.bootstrap) as client:
            client.create_topic(TOPIC, 3, replication_factor=nodes)
            client.wait_for_leaders(TOPIC)
            rows = partition_rows(client.status([TOPIC]), TOPIC)
        leader = rows[0].leader
        for n in cluster.node_ids:
            if n != leader:
                cluster.kill(n)
        took, log = stop_time(cluster, leader)
        handed = re.search(r"handed (\d+) of (\d+) leaderships over in ([\d.]+) s", log)
        assert handed is not None, log[-3000:]
        print(f"{handed[0]}; stopped in {took:.2f} s")
        assert int(handed[1]) == 0 and int(handed[2]) >= 1, handed[0]
        assert float(handed[3]) < timeout_ms / 1000 / 10, handed[0]
    finally:
        cluster.stop_all()


@pytest.mark.timeout(300)
def test_a_second_sigterm_stops_waiting_for_the_hand_over(tmp_path: Path) -> None:
    """The followers' processes frozen (SIGSTOP: their connections open, so they look alive
    for an election timeout): the leader resigns to one that cannot stand, and would wait an
    election timeout (10 s here) for it. A second SIGTERM a second later ends the wait."""
    serve = ["--set", "election_timeout_ms=10000", "--set", "controlled.shutdown.timeout.ms=60000"]
    cluster = LocalCluster(tmp_path, nodes=3, serve_args=serve)
    cluster.start()
    cluster.wait_ready()
    try:
        with Client(cluster.bootstrap) as client:
            client.create_topic(TOPIC, 1, replication_factor=3)
            client.wait_for_leaders(TOPIC)
            leader = wait_for_value(
                "every replica in sync",
                lambda: leadership(client),
                lambda row: row.leader > 0 and all(r.in_sync for r in row.replicas.values()),
                60,
                tolerating=(TidelogError,),
            ).leader
        for n in cluster.node_ids:
            if n != leader:
                cluster.freeze(n)
        signalled = time.monotonic()
        cluster.signal(leader, signal.SIGTERM)
        time.sleep(1)
        assert cluster.procs[leader].poll() is None, "it stopped without waiting"
        cluster.signal(leader, signal.SIGTERM)
        code = cluster.procs[leader].wait(timeout=60)
        took = time.monotonic() - signalled
        assert code == 0
        log = cluster.log_path(leader).read_text(errors="replace")
        assert "still under way, cut short" in log, log[-3000:]
        assert took < 5, f"stopped {took:.2f} s after the first SIGTERM"
    finally:
        cluster.stop_all()
