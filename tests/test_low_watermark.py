"""The low-water mark with real processes: retention bounds disk use, cursors hold until their
caps, followers behind the log start catch up (streams and tables), compaction, disk full, and a
crash in the middle of cleaning."""

from __future__ import annotations

import base64
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from helpers import wait_for, wait_for_value
from tidelog.cli.cluster import LocalCluster
from tidelog.client.sync_client import Client
from tidelog.cluster_status import merge_status
from tidelog.errors import CursorInvalidated, InvalidRequest, StorageFull
from tidelog.protocol import api
from tidelog.protocol.api import ApiKey
from tidelog.record import ProducerRecord
from tidelog.storage.faults import CRASH_EXIT_CODE

pytestmark = pytest.mark.process  # tiers: pyproject.toml's markers

FAST = {"retention.check.interval.ms": "100", "file.delete.delay.ms": "0"}


def row(client: Client, topic: str, partition: int = 0) -> dict[str, Any]:
    """The partition's status row; a node that just restarted may still be opening it."""

    def found() -> dict[str, Any] | None:
        rows = merge_status(client.status([topic]), topic)
        return next((r for r in rows if r["partition"] == partition), None)

    status_row: dict[str, Any] = wait_for(
        f"{topic}/{partition} in the status", found, 15, every_s=0.1
    )
    return status_row


def disk_use(directory: Path) -> int:
    """Bytes of segment and index files, .deleted ones included (they are still on disk)."""
    total = 0
    for entry in os.scandir(directory):
        if ".log" in entry.name or ".index" in entry.name or ".timeindex" in entry.name:
            try:
                total += entry.stat().st_size
            except FileNotFoundError:
                pass  # deleted under our feet
    return total


def test_retention_bytes_bounds_disk_use_under_sustained_produce(tmp_path: Path) -> None:
    segment, retention = 16 * 1024, 64 * 1024
    with LocalCluster(tmp_path, nodes=1) as cluster, Client(cluster.bootstrap) as client:
        client.create_topic(
            "r", configs={"segment.bytes": str(segment), "retention.bytes": str(retention), **FAST}
        )
        part = tmp_path / "node-1" / "r-0"
        seen = [0]
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                seen[0] = max(seen[0], disk_use(part))
                time.sleep(0.005)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            value = b"x" * 900
            for _ in range(400):
                client.produce("r", [ProducerRecord(None, value)] * 2, partition=0, acks=1)
        finally:
            stop.set()
            sampler.join()
        st = row(client, "r")
        indexes = sum(p.stat().st_size for p in part.glob("*index"))
        assert st["log_start_offset"] > 0 and st["segment_count"] >= 4
        bound = retention + segment + indexes + 2048  # one batch may overshoot its segment
        assert seen[0] <= bound, f"disk use {seen[0]} passed retention + one segment ({bound})"
        assert "retention" in st["low_watermark"]["set_by"]


@pytest.mark.timed  # the cursor's 3 s idle cap
def test_a_stopped_cursor_holds_past_retention_until_its_cap(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, nodes=1) as cluster, Client(cluster.bootstrap) as client:
        client.create_topic(
            "c",
            configs={
                "segment.bytes": "2048",
                "segment.ms": "300",
                "retention.ms": "500",
                "cursor.max.idle.ms": "3000",
                **FAST,
            },
        )
        client._run(client.async_client.create_cursor("etl", "c", "earliest"))
        for i in range(60):
            client.produce("c", [b"r%03d" % i + b"." * 100], partition=0)
        time.sleep(1.5)  # well past retention.ms: only the cursor keeps the data
        st = row(client, "c")
        assert st["log_start_offset"] == 0
        assert st["low_watermark"]["set_by"].startswith("cursor etl at 0")
        # Past its idle cap it is invalidated, loudly, and the data goes.
        wait_for(
            "the cursor's invalidation",
            lambda: client._run(client.async_client.cursors("etl"))[0]["invalidated"],
        )
        wait_for("retention to delete", lambda: row(client, "c")["log_start_offset"] > 0)
        with pytest.raises(CursorInvalidated) as info:
            client.fetch("c", 0, 0, cursor="etl")
        assert "idle" in str(info.value) and info.value.details["log_start"] > 0
        with pytest.raises(CursorInvalidated):
            client._run(client.async_client.commit_cursor("etl", {0: 10}))
        assert "cursor etl" in cluster.log_path(1).read_text()


def test_a_resumed_cursor_continues_without_loss(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, nodes=1) as cluster, Client(cluster.bootstrap) as client:
        client.create_topic("c", configs={"segment.bytes": "2048", "retention.ms": "300", **FAST})
        client._run(client.async_client.create_cursor("q", "c", "earliest"))
        for i in range(50):
            client.produce("c", [b"%03d" % i], partition=0)
        got = [r.value for r in client.consume("c", 0, 0, max_records=20)]
        client._run(client.async_client.commit_cursor("q", {0: 20}))
        time.sleep(1.0)
        assert row(client, "c")["log_start_offset"] <= 20
        rest = [r.value for r in client.consume("c", 0, 20, cursor="q")]
        assert got + rest == [b"%03d" % i for i in range(50)]


def stop_follower_until_passed(
    cluster: LocalCluster, client: Client, topic: str, produce: Any
) -> tuple[int, int]:
    leader = wait_for(
        "a leader",
        lambda: row(client, topic)["leader"] if row(client, topic)["leader"] > 0 else None,
    )
    follower = next(n for n in cluster.node_ids if n != leader)
    # A node restarted just before may still be opening this partition: its own row comes later.
    behind = wait_for(
        "the follower's own status row",
        lambda: [
            rep["log_end_offset"]
            for rep in [row(client, topic)["replicas"].get(str(follower))]
            if rep is not None
        ],
    )[0]
    cluster.kill(follower)
    produce()
    wait_for(
        "the leader's log start to pass the stopped follower",
        lambda: row(client, topic)["log_start_offset"] > behind + 10,
    )
    return leader, follower


def restart_until_caught_up(
    cluster: LocalCluster, client: Client, topic: str, follower: int
) -> dict[str, Any]:
    """Start the stopped follower again; the partition's row once its log ends where the
    leader's does."""
    cluster.start(follower)
    cluster.wait_ready()
    caught_up: dict[str, Any] = wait_for(
        f"node {follower} to catch up on {topic}",
        lambda: (
            (r := row(client, topic))["replicas"].get(str(follower), {}).get("log_end_offset")
            == r["log_end_offset"]
            and r
        ),
    )
    return caught_up


@pytest.mark.timeout(300)
def test_followers_behind_the_log_start_catch_up(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, nodes=3) as cluster, Client(cluster.bootstrap) as client:
        common = {"replica.max.lag.ms": "1000", "segment.bytes": "4096", **FAST}
        client.create_topic(
            "s", replication_factor=3, configs={"retention.bytes": "8192", **common}
        )
        client.create_topic(
            "t",
            kind="table",
            replication_factor=3,
            configs={"snapshot.entries": "40", "snapshot.catchup.entries": "5", **common},
        )

        def stream() -> None:
            for i in range(200):
                client.produce("s", [b"s%04d" % i + b"-" * 200], partition=0)

        _, follower = stop_follower_until_passed(cluster, client, "s", stream)
        st = restart_until_caught_up(cluster, client, "s", follower)
        mine = [
            r.value
            for r in client.consume("s", 0, "earliest", replica_read=True, prefer_node=follower)
        ]
        theirs = [r.value for r in client.consume("s", 0, "earliest")]
        assert mine[-50:] == theirs[-50:] and st["replicas"][str(follower)]["log_start_offset"] > 0

        def table() -> None:
            for i in range(300):
                client.produce(
                    "t", [ProducerRecord(b"k%02d" % (i % 25), b"v%04d" % i)], partition=0
                )

        _, follower = stop_follower_until_passed(cluster, client, "t", table)
        cluster.start(follower)
        cluster.wait_ready()
        wait_for(
            "the table follower to install a snapshot and catch up",
            lambda: (
                (r := row(client, "t"))["replicas"].get(str(follower), {}).get("high_watermark")
                == r["high_watermark"]
            ),
        )
        leader_state = client._run(client.async_client.table_scan("t"))
        request = api.TableRequest("scan", "t", 0, limit=1000, replica_read=True)
        address = client._run(client.async_client.nodes())[follower]
        header, _ = client._run(client.async_client.call(address, ApiKey.TABLE, request))
        follower_state = sorted(
            (base64.b64decode(k), base64.b64decode(v)) for k, v in header["entries"]
        )
        assert follower_state == leader_state and len(leader_state) == 25
        assert "installed the leader's snapshot" in cluster.log_path(follower).read_text()


def test_a_follower_behind_a_log_start_inside_a_batch_catches_up(tmp_path: Path) -> None:
    """delete-records may put the log start inside a batch (so may a cursor's LWM). A follower
    that must start over there is sent the whole batch: it begins at the batch's base and
    catches up, as Kafka's follower does. It refused that batch on every fetch and never caught
    up (found by the simulator's --delete-records, seed 39)."""
    with LocalCluster(tmp_path, nodes=3) as cluster, Client(cluster.bootstrap) as client:
        client.create_topic(
            "m",
            replication_factor=3,
            configs={"replica.max.lag.ms": "1000", "segment.bytes": "4096", **FAST},
        )
        cut: list[int] = []

        def produce_and_delete() -> None:
            for i in range(40):
                client.produce("m", [b"m%03d-%d" % (i, j) for j in range(5)], partition=0)
            fetched = client.fetch("m", 0, 100)
            base = next(h.base_offset for _, h in fetched.batches if h.records_count == 5)
            cut.append(base + 2)  # inside that batch
            assert client.delete_records("m", 0, base + 2) == base + 2

        _, follower = stop_follower_until_passed(cluster, client, "m", produce_and_delete)
        caught_up = restart_until_caught_up(cluster, client, "m", follower)
        assert caught_up["log_start_offset"] == cut[0]
        mine = [
            r.value
            for r in client.consume("m", 0, "earliest", replica_read=True, prefer_node=follower)
        ]
        assert mine == [r.value for r in client.consume("m", 0, "earliest")]
        assert mine and mine[0] is not None and mine[0].endswith(b"-2")  # the batch's third


def test_delete_records_force_invalidates_a_cursor_where_another_node_leads_metadata(
    tmp_path: Path,
) -> None:
    """delete-records --force at a partition's leader that does not lead the metadata log: the
    cursor in the way is invalidated through the metadata leader, then the log start moves. It
    failed every time with NotLeader (the metadata leader's hint, which the client took for the
    partition's leader) while the node logged the invalidation on each retry (found by a
    newcomer's tour)."""
    with LocalCluster(tmp_path, nodes=3) as cluster, Client(cluster.bootstrap) as client:
        client.create_topic("forced", partitions=3, replication_factor=3)
        for p in range(3):
            client.produce("forced", [b"r%d" % i for i in range(5)], partition=p)
        client.create_cursor("held", "forced", "earliest")
        metadata_leader = client.describe_cluster(leader_only=True).metadata_leader
        leaders = wait_for_value(
            "every partition's leader",
            lambda: client.topic("forced", refresh=True).leaders,
            lambda found: all(n >= 0 for n in found),
        )
        p = next(p for p, n in enumerate(leaders) if n != metadata_leader)
        assert client.delete_records("forced", p, 3, force=True) == 3
        [held] = client.cursors("held")
        assert "delete-records --force" in held["invalidated"], held
        assert [r.value for r in client.consume("forced", p, "earliest")] == [b"r3", b"r4"]


def test_compaction_keeps_the_latest_per_key_and_drops_tombstones(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, nodes=1) as cluster, Client(cluster.bootstrap) as client:
        client.create_topic(
            "k",
            configs={
                "cleanup.policy": "compact",
                "segment.bytes": "2048",
                "delete.retention.ms": "1500",
                "min.cleanable.dirty.ratio": "0.01",
                **FAST,
            },
        )
        offsets: dict[int, bytes | None] = {}
        for round_ in range(5):
            for key in range(10):
                value = None if (round_ == 4 and key < 3) else b"v%d-%d" % (round_, key)
                r = client.produce("k", [ProducerRecord(b"key%d" % key, value)], partition=0)
                assert r is not None
                offsets[r.base_offset] = value
        for i in range(40):  # filler, so every version above sits in closed segments
            client.produce("k", [ProducerRecord(b"filler%d" % i, b"f" * 100)], partition=0)
        wait_for(
            "compaction",
            lambda: (
                len([r for r in client.consume("k", 0) if r.key and r.key.startswith(b"key")]) == 10
            ),
        )
        records = [r for r in client.consume("k", 0) if r.key and r.key.startswith(b"key")]
        for r in records:
            assert offsets[r.offset] == r.value, "an offset never changes its record"
        latest = {r.key: r.value for r in records}
        assert latest == {b"key%d" % k: (None if k < 3 else b"v4-%d" % k) for k in range(10)}
        time.sleep(2.0)  # past delete.retention.ms: the tombstones go as well
        client.produce("k", [ProducerRecord(b"poke", b"x" * 1500)], partition=0)  # roll + pass
        wait_for(
            "tombstones to go",
            lambda: not [r for r in client.consume("k", 0) if r.key in (b"key0", b"key1", b"key2")],
        )


def test_storage_max_bytes_refuses_writes_then_resumes(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text("storage_max_bytes = 60000\n")
    cluster = LocalCluster(tmp_path, nodes=1, serve_args=["--config", str(config)])
    with cluster, Client(cluster.bootstrap) as client:
        client.create_topic("f", configs={"segment.bytes": "8192", **FAST})
        written = 0
        with pytest.raises(StorageFull):
            for _ in range(200):
                client.produce("f", [b"z" * 1000], partition=0, timeout_ms=2000)
                written += 1
        assert 40 <= written < 70
        # Reads and cursor commits go on.
        assert len(list(client.consume("f", 0))) == written
        client._run(client.async_client.create_cursor("reader", "f", "earliest"))
        client._run(client.async_client.commit_cursor("reader", {0: 10}))
        with pytest.raises(InvalidRequest, match="reader at 10"):
            client._run(client.async_client.delete_records("f", 0, 30))  # a live cursor needs it
        client._run(client.async_client.delete_cursor("reader"))
        assert client._run(client.async_client.delete_records("f", 0, 40)) == 40
        assert client.produce("f", [b"again"], partition=0) is not None, (
            "writes resume by themselves"
        )


@pytest.mark.parametrize(
    "point", ["log-start-durable", "segment-renamed", "cleaned-written", "swap-renamed"]
)
def test_a_process_killed_in_the_middle_of_cleaning_restarts_consistent(
    tmp_path: Path, point: str
) -> None:
    compact = point in ("cleaned-written", "swap-renamed")
    topic_config = {"segment.bytes": "2048", **FAST}
    if compact:
        topic_config.update({"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"})
    else:
        topic_config.update({"retention.bytes": "6000"})
    cluster = LocalCluster(tmp_path, nodes=1, env={"TIDELOG_CRASH_AT": point})
    cluster.start()
    cluster.wait_ready()
    acked: dict[int, bytes] = {}
    with Client(cluster.bootstrap, retries=1) as client:
        client.create_topic("x", configs=topic_config)
        for i in range(200):
            key = b"k%d" % (i % 7)
            try:
                r = client.produce(
                    "x", [ProducerRecord(key, b"v%04d" % i + b"." * 150)], partition=0
                )
            except Exception:
                break
            assert r is not None
            acked[r.base_offset] = b"v%04d" % i
    assert cluster.procs[1].wait(30) == CRASH_EXIT_CODE, f"the node should have died at {point}"
    cluster.env.pop("TIDELOG_CRASH_AT")
    cluster.start(1)
    cluster.wait_ready()
    with Client(cluster.bootstrap) as client:
        # The restarted node's HW comes back from its checkpoint and then catches up to what
        # it had committed: a read before that (a busy machine's window) would see too little.
        committed = max(acked, default=-1) + 1
        wait_for(
            "the restarted node's HW to reach what it acknowledged",
            lambda: row(client, "x")["high_watermark"] >= committed,
            30,
            every_s=0.1,
        )
        st = row(client, "x")
        records = list(client.consume("x", 0))
        stored = {r.offset: (r.value or b"")[:5] for r in records}
        keys = {r.offset: r.key for r in records}
        assert all(o >= st["log_start_offset"] for o in stored)
        for offset, value in acked.items():
            if offset >= st["log_start_offset"] and not compact:
                assert stored.get(offset) == value, f"acknowledged offset {offset} lost"
        if compact:
            latest: dict[bytes, int] = {}
            for offset in sorted(acked):
                latest[b"k%d" % (int(acked[offset][1:5]) % 7)] = offset
            # A key's newest acknowledged value stays, unless a newer record of that key is in
            # the log: one the node appended and fsynced but died before acknowledging, which
            # compaction then rightly keeps instead.
            for key, o in latest.items():
                superseded = any(off > o and k == key for off, k in keys.items())
                assert stored.get(o) == acked[o] or superseded, "a latest value was lost"
        assert client.produce("x", [ProducerRecord(b"k1", b"after")], partition=0) is not None
    cluster.stop_all()
    leftovers = [
        p.name
        for p in (tmp_path / "node-1" / "x-0").iterdir()
        if p.suffix in (".cleaned", ".swap", ".tmp")
    ]
    assert not leftovers
