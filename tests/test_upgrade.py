"""A rolling upgrade from the release users run (tests/releases.py's PREVIOUS_RELEASE) to this
build, under load, as docs/operations.md's "Upgrading, one node at a time" tells an operator.

The previous release is built from this checkout's history into a wheel and installed into a
fresh virtual environment (tests/releases.py). Three nodes of it (`tidelog serve`, as its
`cluster up` starts them) hold a topic with three replicas of each partition, the metadata log,
a tidelog cursor and a Kafka consumer group's committed offsets. Under load, a Kafka producer
(kafka-python, acks=all, every acknowledged offset kept) and a Spark streaming query copying the
topic through tidelog's exactly-once sink, each node in turn is stopped (SIGTERM), started with
this build on the same data directory, and waited for until every partition is in sync again.
The Spark driver and the clients run this build's client code throughout, as clients are
upgraded on their own schedule.

Before finalizing, one node goes back to the previous release and catches up (a downgrade is
allowed until then); meanwhile finalizing is refused, and the metadata commands this build's
leader writes (a topic created, the cursor committed) are applied by the old node as written.
Then it goes forward again, and `tidelog features upgrade` finalizes; from then on the nodes
write version 2 of their quorum journal, and the previous release refuses to start on that
data, naming the file.

Throughout: no acknowledged record lost (everything read back and compared with what was
acknowledged, offset by offset), no error a client cannot retry, the sink's output holds every
input record exactly once, the cursor and the group's offsets unchanged. Printed: for each
restart, the longest gap between acknowledged produces around it (about an election timeout
where a stopped 0.1.0 node led partitions; a 0.2.0 node hands its leaderships over first), how
long the node took to stop, to answer (the interpreter starting, most of it) and to be in sync.

The load runs TIDELOG_UPGRADE_LOAD_SECONDS (20 in CI; `make upgrade-soak` runs longer), spread
over the five restarts."""

from __future__ import annotations

import itertools
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from helpers import retry, wait_for, wait_for_value
from releases import PREVIOUS_RELEASE, Installed, install_release
from tidelog.cli.cluster import free_ports
from tidelog.client.sync_client import Client
from tidelog.cluster_status import partition_rows
from tidelog.errors import TidelogError, TopicAlreadyExists
from tidelog.features import MAX_LEVEL
from tidelog.storage.quorum_journal import JOURNAL_FILE, encode_format

pytestmark = [pytest.mark.process, pytest.mark.spark]  # tiers: pyproject.toml's markers

ROOT = Path(__file__).resolve().parent.parent
LOAD_S = float(os.environ.get("TIDELOG_UPGRADE_LOAD_SECONDS", "20"))
NODES = (1, 2, 3)
TOPIC, COPY, MIXED = "load", "copy", "made-while-mixed"
GROUP, CURSOR = "upgrade-group", "upgrade-cursor"
THIS_BUILD = "this build"


@pytest.fixture(scope="module")
def previous() -> Iterator[Installed]:
    # A directory of its own outside the checkout, removed after (other pytest sessions on the
    # machine prune pytest's temp directories).
    with tempfile.TemporaryDirectory(prefix="tidelog-release-") as name:
        started = time.monotonic()
        installed = install_release(PREVIOUS_RELEASE, Path(name))
        print(
            f"tidelog {PREVIOUS_RELEASE} built and installed in {time.monotonic() - started:.1f}s"
        )
        yield installed


# -- the cluster: three `tidelog serve` processes, each of either version -------------------------


class RollingCluster:
    """Three nodes started as the previous release's `cluster up` starts them, each with the
    previous release's `tidelog` or this build's, on data directories kept across restarts."""

    def __init__(self, base: Path, previous: Installed) -> None:
        self.base, self.previous = base, previous
        ports = free_ports(9)
        self.ports = dict(zip(NODES, ports[0:3], strict=True))
        self.peer_ports = dict(zip(NODES, ports[3:6], strict=True))
        self.kafka_ports = dict(zip(NODES, ports[6:9], strict=True))
        self.secret = base / "cluster.secret"
        self.secret.write_text(secrets.token_hex(32) + "\n")
        self.secret.chmod(0o600)
        self.cluster_id = secrets.token_hex(11)
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.runs: dict[int, str] = {}  # node -> the version it runs

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{self.ports[n]}" for n in NODES)

    @property
    def kafka_bootstrap(self) -> list[str]:
        return [f"127.0.0.1:{self.kafka_ports[n]}" for n in NODES]

    def data(self, n: int) -> Path:
        return self.base / f"node-{n}"

    def log_path(self, n: int) -> Path:
        return self.base / f"node-{n}.log"

    def command(self, n: int, version: str) -> tuple[list[str], dict[str, str]]:
        peers = ",".join(f"{i}=127.0.0.1:{self.ports[i]}/{self.peer_ports[i]}" for i in NODES)
        args = ["serve", "--node-id", str(n), "--listen", f"127.0.0.1:{self.ports[n]}"]
        args += ["--peer-listen", f"127.0.0.1:{self.peer_ports[n]}", "--peers", peers]
        args += ["--kafka-listen", f"127.0.0.1:{self.kafka_ports[n]}"]
        args += ["--cluster-secret-file", str(self.secret), "--cluster-id", self.cluster_id]
        args += ["--data", str(self.data(n)), "--log-level", "WARNING"]
        if version == THIS_BUILD:
            env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
            return [sys.executable, "-m", "tidelog", *args], env
        assert version == self.previous.version
        return [self.previous.tidelog, *args], self.previous.env

    def start(self, n: int, version: str) -> None:
        cmd, env = self.command(n, version)
        with self.log_path(n).open("ab") as log:
            log.write(f"--- starting {version}\n".encode())
            self.procs[n] = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.base
            )
        self.runs[n] = version

    def stop(self, n: int) -> None:
        """SIGTERM, as systemd stops a node: it must stop cleanly, with status 0."""
        proc = self.procs.pop(n)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, f"node {n} stopped with {proc.returncode}"

    def refused_start(self, n: int, version: str) -> str:
        """Start node n with version and expect it to exit on its own, non-zero: its output."""
        cmd, env = self.command(n, version)
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode != 0, f"{version} started on node {n}'s data:\n{done.stdout}"
        return done.stdout + done.stderr

    def stop_all(self) -> None:
        for proc in self.procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()


def lagging(client: Client, n: int) -> list[str]:
    """What is not in sync yet, as `tidelog status` and `tidelog status __metadata` say: a node
    that does not answer, a partition under-replicated or with node n's replica out of sync."""
    behind: list[str] = []
    for topics in (None, ["__metadata"]):
        nodes = client.status(topics)
        behind += [f"node {node['node_id']} does not answer" for node in nodes if "error" in node]
        for row in partition_rows(nodes, None):
            replica = row.replicas.get(n)
            if row.under_replicated or replica is None or not replica.in_sync:
                synced = [r for r, rep in row.replicas.items() if rep.in_sync]
                behind.append(f"{row.group} (leader {row.leader}, in sync {synced})")
    return sorted(set(behind))


# -- the load ----------------------------------------------------------------------------------


@dataclass
class Acked:
    at: float  # time.monotonic() when the acknowledgement came
    partition: int
    offset: int
    value: bytes


class KafkaLoad(threading.Thread):
    """A Kafka producer (kafka-python: idempotent, acks=all, retrying) writing unique values
    round-robin over the topic's partitions, ten at a time, until halted. Every acknowledgement
    is kept with its offset and time; every error with whether the client may retry it."""

    def __init__(self, bootstrap: list[str]) -> None:
        super().__init__(daemon=True)
        self.bootstrap = bootstrap
        self.halt = threading.Event()
        self.acked: list[Acked] = []
        self.retriable: list[str] = []
        self.fatal: list[str] = []
        self.sent = 0

    def run(self) -> None:
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=self.bootstrap, acks="all", linger_ms=2)
        try:
            while not self.halt.is_set():
                for _ in range(10):
                    value = b"v-%d" % self.sent
                    future = producer.send(TOPIC, value, partition=self.sent % 3)
                    future.add_callback(self.on_ack, value)
                    future.add_errback(self.on_error)
                    self.sent += 1
                producer.flush()
                time.sleep(0.02)
        except Exception as exc:
            self.fatal.append(repr(exc))
        finally:
            producer.close(timeout=30)

    def on_ack(self, value: bytes, metadata: Any) -> None:
        self.acked.append(Acked(time.monotonic(), metadata.partition, metadata.offset, value))

    def on_error(self, exc: BaseException) -> None:
        (self.retriable if getattr(exc, "retriable", False) else self.fatal).append(repr(exc))

    def longest_gap(self, start: float, end: float) -> float:
        """The longest time without an acknowledgement within [start, end]."""
        times = [start, *sorted(a.at for a in self.acked if start < a.at < end), end]
        return max(b - a for a, b in itertools.pairwise(times))


def start_copy(spark: Any, bootstrap: str, checkpoint: Path) -> Any:
    """The Spark streaming query: TOPIC copied to COPY through tidelog's exactly-once sink."""
    return (
        spark.readStream.format("tidelog")
        .option("bootstrap", bootstrap)
        .option("subscribe", TOPIC)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "3000")
        .load()
        .select("key", "value")
        .writeStream.format("tidelog")
        .option("bootstrap", bootstrap)
        .option("topic", COPY)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="1 second")
        .start()
    )


# -- what must survive: a cursor and a consumer group's committed offsets ------------------------


def commit_group(bootstrap: list[str], positions: dict[int, int]) -> None:
    from kafka.structs import OffsetAndMetadata

    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=GROUP, enable_auto_commit=False)
    try:
        consumer.commit(
            {TopicPartition(TOPIC, p): OffsetAndMetadata(o, "", -1) for p, o in positions.items()}
        )
    finally:
        consumer.close()


def group_offsets(bootstrap: list[str]) -> dict[int, int | None]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=GROUP, enable_auto_commit=False)
    try:
        return {p: consumer.committed(TopicPartition(TOPIC, p)) for p in range(3)}
    finally:
        consumer.close()


def cursor_positions(client: Client) -> dict[int, int]:
    (cursor,) = client.cursors(CURSOR)
    return {int(p): int(o) for p, o in cursor["positions"].items()}


# -- the upgrade --------------------------------------------------------------------------------


@dataclass
class Restart:
    node: int
    to: str
    stopped_at: float  # SIGTERM sent
    exited_at: float = 0.0
    started_at: float = 0.0
    answering_at: float = 0.0  # its status first came back
    in_sync_at: float = 0.0
    gap_s: float = 0.0  # the longest time without an acknowledged produce around it


@dataclass
class Upgrade:
    cluster: RollingCluster
    client: Client
    load: KafkaLoad
    pause_s: float  # load between restarts
    restarts: list[Restart] = field(default_factory=list)

    def restart(self, n: int, version: str, refused: str = "") -> str:
        """Stop node n, start it with version, wait until it is in sync. With refused: first
        start it with that version, which must refuse to start: what it printed."""
        time.sleep(self.pause_s)
        restart = Restart(n, f"{version} ({refused} refused)" if refused else version, 0.0)
        restart.stopped_at = time.monotonic()
        self.cluster.stop(n)
        restart.exited_at = time.monotonic()
        printed = self.cluster.refused_start(n, refused) if refused else ""
        restart.started_at = time.monotonic()
        self.cluster.start(n, version)

        def behind() -> list[str]:
            left = lagging(self.client, n)
            if not restart.answering_at and f"node {n} does not answer" not in left:
                restart.answering_at = time.monotonic()
            return left

        wait_for_value(
            f"node {n} ({version}) in sync",
            behind,
            lambda left: left == [],
            90,
            every_s=0.2,
            tolerating=(TidelogError,),
        )
        restart.in_sync_at = time.monotonic()
        self.restarts.append(restart)
        return printed

    def table(self) -> list[str]:
        lines = [
            "node  to                          gap (s)  stop (s)  answers after start (s)  "
            "in sync after start (s)"
        ]
        for r in self.restarts:
            r.gap_s = self.load.longest_gap(r.stopped_at - 1, r.in_sync_at + 1)
            lines.append(
                f"{r.node:<5} {r.to:<27} {r.gap_s:>7.2f}  {r.exited_at - r.stopped_at:>8.2f}  "
                f"{r.answering_at - r.started_at:>24.2f}  {r.in_sync_at - r.started_at:>23.2f}"
            )
        return lines


def features_upgrade(cluster: RollingCluster, *to: str) -> subprocess.CompletedProcess[str]:
    """`tidelog features upgrade`, from this build's CLI."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "tidelog",
            "features",
            "upgrade",
            *to,
            "--bootstrap",
            cluster.bootstrap,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        timeout=60,
    )


def journal_version_2(cluster: RollingCluster, n: int) -> bool:
    journal = cluster.data(n) / JOURNAL_FILE
    return journal.exists() and journal.read_bytes().startswith(encode_format(2))


def mark_positions(client: Client, cluster: RollingCluster, load: KafkaLoad) -> dict[int, int]:
    """Once some of the load is in: a cursor and the group's offsets, committed there."""
    wait_for("the first acknowledged records", lambda: len(load.acked) >= 300, 60)
    positions = {p: max(a.offset for a in load.acked if a.partition == p) for p in range(3)}
    client.create_cursor(CURSOR, TOPIC, start=dict.fromkeys(range(3), 0))
    client.commit_cursor(CURSOR, positions)
    commit_group(cluster.kafka_bootstrap, positions)
    assert cursor_positions(client) == positions
    assert group_offsets(cluster.kafka_bootstrap) == positions
    return positions


def metadata_while_mixed(client: Client, old: int, marked: dict[int, int]) -> dict[int, int]:
    """While node old runs the previous release, this build's metadata leader writes commands
    it must apply as written: a new topic (its replica made on node old, which then takes
    acks=all writes) and the cursor committed further on. The cursor's new positions."""
    client.create_topic(MIXED, 1, replication_factor=3)
    client.wait_for_leaders(MIXED)
    retry(
        f"a write to {MIXED}",
        lambda: client.produce(MIXED, [b"m"], 0),
        30,
        tolerating=(TidelogError,),
    )

    def held_by_old() -> list[bytes | None]:
        records = client.consume(
            MIXED, 0, "earliest", reset="none", replica_read=True, prefer_node=old
        )
        return [r.value for r in records]

    wait_for(
        f"node {old} to hold {MIXED}", lambda: held_by_old() == [b"m"], tolerating=(TidelogError,)
    )
    further = {p: o + 1 for p, o in marked.items()}
    client.commit_cursor(CURSOR, further)
    return further


def read_back(client: Client, topic: str) -> dict[tuple[int, int], bytes]:
    return {
        (p, r.offset): r.value or b""
        for p in range(3)
        for r in client.consume(topic, p, "earliest")
    }


def copied_all(client: Client, query: Any, total: int) -> bool:
    """The copy holds as many records as the topic (not offsets: each election's leader writes
    a record of its own in the log, and the two topics' leaders changed apart)."""
    assert query.isActive, f"the Spark query stopped: {query.exception()}"
    return len(read_back(client, COPY)) >= total


def create_once(client: Client, topic: str) -> None:
    """The topic, three partitions of three replicas. A try whose answer was lost (it timed
    out while the new cluster elected its leaders) may have created it: then it is there."""
    try:
        client.create_topic(topic, 3, replication_factor=3)
    except TopicAlreadyExists:
        pass


@pytest.mark.timeout(900)
def test_a_rolling_upgrade_under_load_loses_nothing_and_finalizes(
    previous: Installed, spark_session: Any, tmp_path: Path
) -> None:
    began = time.monotonic()
    cluster = RollingCluster(tmp_path, previous)
    for n in NODES:
        cluster.start(n, previous.version)
    load = KafkaLoad(cluster.kafka_bootstrap)
    query = None
    try:
        with Client(cluster.bootstrap) as client:
            for topic in (TOPIC, COPY):
                retry(
                    f"{topic} created",
                    lambda topic=topic: create_once(client, topic),
                    60,
                    tolerating=(TidelogError,),
                )
                client.wait_for_leaders(topic)
            load.start()
            query = start_copy(spark_session, cluster.bootstrap, tmp_path / "checkpoint")
            marked = mark_positions(client, cluster, load)
            upgrade = Upgrade(cluster, client, load, LOAD_S / 6)
            for n in NODES:
                upgrade.restart(n, THIS_BUILD)
            # Before finalizing, a node may go back to the previous release, and forward again.
            upgrade.restart(3, previous.version)
            cursor_at = metadata_while_mixed(client, 3, marked)
            # Finalizing waits for the last node of the previous release: level 2 is refused.
            early = features_upgrade(cluster, "--to", "2")
            assert early.returncode != 0, f"finalized with a {previous.version} node: {early}"
            print(early.stderr)
            upgrade.restart(3, THIS_BUILD)
            finalized = features_upgrade(cluster)
            assert finalized.returncode == 0, finalized.stdout + finalized.stderr
            assert f"finalized at {MAX_LEVEL}" in finalized.stdout, finalized.stdout
            print(finalized.stdout)
            for n in NODES:
                wait_for(
                    f"node {n}'s quorum journal in version 2",
                    lambda n=n: journal_version_2(cluster, n),
                )
            refusal = upgrade.restart(1, THIS_BUILD, refused=previous.version)
            time.sleep(upgrade.pause_s)
            load.halt.set()
            load.join(60)
            total = len(read_back(client, TOPIC))
            wait_for(
                "the copy to catch up", lambda: copied_all(client, query, total), 120, every_s=1
            )
            time.sleep(2)  # a duplicate would land now, if any
            query.stop()
            check_everything(client, cluster, load, marked, cursor_at)
    finally:
        load.halt.set()
        if query is not None and query.isActive:
            query.stop()
        cluster.stop_all()
    print("\n".join(upgrade.table()))
    print(
        f"acknowledged {len(load.acked)} of {load.sent} sent; retriable errors "
        f"{len(load.retriable)}; test {time.monotonic() - began:.0f}s"
    )
    print(f"{previous.version} on node 1's data after finalizing:", refusal.strip()[-300:])
    assert f"{JOURNAL_FILE}" in refusal and "CorruptRecord" in refusal, refusal


def check_everything(
    client: Client,
    cluster: RollingCluster,
    load: KafkaLoad,
    marked: dict[int, int],
    cursor_at: dict[int, int],
) -> None:
    assert load.fatal == [], f"errors a client cannot retry: {load.fatal}"
    log = read_back(client, TOPIC)
    lost = [a for a in load.acked if log.get((a.partition, a.offset)) != a.value]
    assert lost == [], f"{len(lost)} acknowledged records lost or changed, first {lost[:5]}"
    values = Counter(log.values())
    assert max(values.values()) == 1, "the idempotent producer's retries wrote twice"
    copied = Counter(read_back(client, COPY).values())
    assert copied == values, "the exactly-once sink lost or duplicated records"
    assert cursor_positions(client) == cursor_at
    assert group_offsets(cluster.kafka_bootstrap) == marked
