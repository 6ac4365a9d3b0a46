"""The archive (issue 17): closed segments copied to a directory or an S3-compatible store, a hold
on the low-water mark, reads below the local log start served from it, verify and restore.

Real node processes; file:// archives; moto's S3 server started as its own process and reached
through the same obstore client code as real S3 (a TCP relay in front of it makes it go away and
come back)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from helpers import retry, run_tidelog, wait_for, wait_for_value
from tidelog.archive.manifest import (
    ArchivedSegment,
    Gap,
    Manifest,
    check_object,
    describe_object,
    manifest_key,
)
from tidelog.archive.reader import committed_aborted, iter_batches, read_batches
from tidelog.archive.restore import RestorePoint, restore_topic
from tidelog.archive.store import FileStore, VersionConflict, open_store
from tidelog.archive.verify import verify_partition
from tidelog.cli.cluster import LocalCluster, free_ports
from tidelog.client.sync_client import Client
from tidelog.cluster_status import merge_status
from tidelog.config import TopicConfig
from tidelog.errors import (
    ArchiveAccessDenied,
    ArchiveBucketMissing,
    ArchiveCorrupt,
    ArchiveLagExceeded,
    InvalidArchiveUrl,
    InvalidConfig,
    InvalidRequest,
    TidelogError,
)
from tidelog.features import MAX_LEVEL, TRANSACTIONS_LEVEL
from tidelog.record.batch import (
    ProducerRecord,
    build_batch,
    decode_records,
    read_header,
    stamp,
)
from tidelog.record.markers import build_marker
from tidelog.replication.last_stable_offset import last_stable_offset
from tidelog.storage.log import SegmentedLog

pytestmark = pytest.mark.process  # tiers: pyproject.toml's markers

FAST = {"retention.check.interval.ms": "100", "file.delete.delay.ms": "0"}
ARCHIVED = {
    "remote.storage.enable": "true",
    "segment.bytes": "16384",
    "local.retention.bytes": "32768",
    **FAST,
}
VERIFY = [sys.executable, "-m", "tidelog", "archive", "verify"]
BASE_TS = int(time.time() * 1000) - 3_600_000  # an hour ago: inside every timestamp window


def value(i: int) -> bytes:
    return b"v%06d-" % i + b"x" * 150


def record(i: int) -> ProducerRecord:
    return ProducerRecord(b"k%d" % (i % 7), value(i), (), BASE_TS + i)


def status_row(client: Client, topic: str, partition: int = 0) -> dict[str, Any]:
    rows = merge_status(client.status([topic]), topic)
    return next((dict(r) for r in rows if r["partition"] == partition), {})


# -- the store, the manifest and objects, without a node ----------------------------------------------


def batches(first: int, count: int, per_batch: int = 5, epoch: int = 1) -> bytes:
    out = bytearray()
    for base in range(first, first + count, per_batch):
        n = min(per_batch, first + count - base)
        recs = [record(i) for i in range(base, base + n)]
        out.extend(build_batch(recs, base_offset=base, partition_leader_epoch=epoch))
    return bytes(out)


def test_objects_manifests_and_the_file_store(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}")
    assert isinstance(store, FileStore)
    data = batches(100, 50)
    seg = describe_object(data, "t/1/0/a.log")
    assert (seg.base_offset, seg.end_offset, seg.size) == (100, 150, len(data))
    store.put(seg.key, data)
    check_object(seg, store.get(seg.key))
    # A read from the middle returns whole batches from the one holding the offset.
    got = read_batches(store, seg, 123, 1)  # at least one batch, however small max_bytes
    assert read_header(got).base_offset == 120 and len(got) == read_header(got).size_bytes
    assert [h.base_offset for h, _ in iter_batches(store, seg, 123)] == [
        120,
        125,
        130,
        135,
        140,
        145,
    ]
    assert b"".join(b for _, b in iter_batches(store, seg)) == data
    # Compare-and-swap of the manifest: a stale writer loses.
    store.put_if("m.json", b"1", None)
    with pytest.raises(VersionConflict):
        store.put_if("m.json", b"2", None)
    current = store.get_versioned("m.json")
    assert current is not None
    store.put_if("m.json", b"2", current.version)
    with pytest.raises(VersionConflict):
        store.put_if("m.json", b"3", current.version)
    # Damage: a flipped byte and a truncation are named, never read as data.
    damaged = bytearray(data)
    damaged[len(data) // 2] ^= 0xFF
    store.put(seg.key, bytes(damaged))
    with pytest.raises(ArchiveCorrupt):
        check_object(seg, store.get(seg.key))
    with pytest.raises(ArchiveCorrupt):
        list(iter_batches(store, seg))
    store.put(seg.key, data[:-10])
    with pytest.raises(ArchiveCorrupt):
        read_batches(store, seg, 145, 1 << 20)
    # Continuity: a hole, an overlap and an epoch going back are found; a recorded gap is not.
    a = describe_object(batches(0, 10, epoch=2), "a")
    b = describe_object(batches(10, 10, epoch=2), "b")
    c = describe_object(batches(30, 10, epoch=1), "c")
    m = Manifest("cid", "t", 1, 0).appended(a, 2).appended(b, 2)
    assert m.check_continuity() == [] and (m.start_offset, m.end_offset) == (0, 20)
    holed = Manifest("cid", "t", 1, 0, 2, 0, (a, b, c))
    problems = holed.check_continuity()
    assert any("hole [20, 30)" in p for p in problems)
    assert any("epoch 1 after 2" in p for p in problems)
    overlap = Manifest("cid", "t", 1, 0, 2, 0, (a, a))
    assert any("overlap" in p for p in overlap.check_continuity())
    gapped = Manifest("cid", "t", 1, 0, 2, 0, (a, b), (Gap(20, 30, "released"),))
    assert Manifest.from_bytes(gapped.to_bytes()) == gapped
    with pytest.raises(InvalidArchiveUrl):
        open_store("gopher://x/y")
    with pytest.raises(InvalidArchiveUrl):
        open_store("file://relative/dir")
    with pytest.raises(ArchiveBucketMissing):
        open_store(f"file://{tmp_path}/missing").check()
    assert isinstance(a, ArchivedSegment)


def test_old_manifest_entries_are_sealed_into_parts_and_read_back_whole(tmp_path: Path) -> None:
    """Issue 32: every upload rewrote the whole manifest (~400 B per object ever archived).
    The manifest now holds at most HEAD_MAX entries; older ones are sealed into immutable parts
    (bench/archive_manifest.py measures the cost at 1,000 and 10,000 objects)."""
    from dataclasses import replace

    from tidelog.archive.manifest import (
        FORMAT_PARTS,
        HEAD_MAX,
        PART_ENTRIES,
        ManifestPart,
        part_bytes,
        part_key,
    )

    store = open_store(f"file://{tmp_path}")
    template = describe_object(batches(0, 10), "t/1/0/x.log")

    def entry(i: int) -> ArchivedSegment:
        return replace(
            template, key=f"t/1/0/{i:06d}.log", base_offset=10 * i, end_offset=10 * i + 10
        )

    manifest = Manifest(cluster_id="c", topic="t", topic_id=1, partition=0)
    for i in range(HEAD_MAX):
        manifest = manifest.appended(entry(i), 1)
        assert not manifest.to_seal()
    assert json.loads(manifest.to_bytes())["format"] == 1  # no parts: what older nodes read
    # At feature level 1 nothing is sealed: a manifest with parts is one 0.1.0 cannot read.
    assert not manifest.appended(entry(HEAD_MAX), 1).to_seal()
    for i in range(HEAD_MAX, 4 * PART_ENTRIES + 50):
        manifest = manifest.appended(entry(i), 1)
        sealed = manifest.to_seal(FORMAT_PARTS)  # as from feature level 2
        if sealed:
            base, end = sealed[0].base_offset, sealed[-1].end_offset
            part = ManifestPart(part_key("t/1/0", base, end, "n"), base, end, len(sealed))
            store.put(part.key, part_bytes(sealed))
            manifest = manifest.sealed(part)
    raw = manifest.to_bytes()
    written = json.loads(raw)
    assert written["format"] == 2 and len(written["segments"]) <= HEAD_MAX
    assert len(manifest.parts) == 3  # sealed at 201, 301, 401 entries: 150 left in the head
    again = Manifest.from_bytes(raw, "m", store.get)
    assert again.segments == manifest.segments and again.parts == manifest.parts
    with pytest.raises(ArchiveCorrupt):
        Manifest.from_bytes(raw, "m")  # names parts, and nothing reads them
    # The cleaner: a part partly below the start stays (its entries below it are skipped when
    # read); one wholly below goes, to be deleted with the objects.
    cleaned, gone = manifest.without_below(10 * (PART_ENTRIES + 30))
    assert len(gone) == PART_ENTRIES + 30
    assert manifest.parts_without(cleaned) == [manifest.parts[0]]
    again = Manifest.from_bytes(cleaned.to_bytes(), "m", store.get)
    assert again.segments == cleaned.segments and again.start_offset == 10 * (PART_ENTRIES + 30)
    assert again.check_continuity() == []
    # Emptied by its cleaner, a manifest still says how far it held: the metadata log's record
    # of the archive (issue 32's ArchiveLost) must not take retention for a loss.
    from tidelog.node.archiver import holds_until

    emptied, _ = manifest.without_below(manifest.end_offset)
    assert not emptied.segments and not emptied.parts
    assert holds_until(emptied) == manifest.end_offset
    assert (
        holds_until(Manifest.from_bytes(emptied.to_bytes(), "m", store.get)) == manifest.end_offset
    )


def test_archive_topic_configs_are_checked() -> None:
    from tidelog.config import TopicConfig

    config = TopicConfig.from_mapping({"remote.storage.enable": "true"})
    assert config.effective_local_retention_ms == config.retention_ms
    with pytest.raises(InvalidConfig, match=r"local\.retention\.bytes"):
        TopicConfig.from_mapping({"retention.bytes": "1000", "local.retention.bytes": "2000"})
    with pytest.raises(InvalidConfig, match=r"remote\.storage\.enable"):
        TopicConfig.from_mapping({"remote.storage.enable": "true", "cleanup.policy": "compact"})
    with pytest.raises(InvalidConfig, match=r"archive\.lag\.policy"):
        TopicConfig.from_mapping({"archive.lag.policy": "maybe"})


def test_the_metadata_log_records_what_the_store_holds_and_only_an_operator_shrinks_it(
    tmp_path: Path,
) -> None:
    """The archive's identity and extents in the metadata log (replication/metadata.py), and
    cluster.json's archive_id (node/archiver.py's claim_archive)."""
    from tidelog.errors import ArchiveLost
    from tidelog.node.archiver import claim_archive
    from tidelog.replication.metadata import MetadataState, TopicMeta
    from tidelog.replication.metadata_commands import (
        ArchiveClaimed,
        ArchiveExtent,
        ArchiveLoss,
        ArchiveLossAccepted,
    )

    state = MetadataState()
    state.topics["t"] = TopicMeta(
        name="t", kind="stream", configs={}, assignments=[[1]], created_offset=7
    )
    tid = state.topics["t"].topic_id

    def extent(start: int, end: int, archive_id: str = "A", topic_id: int = tid) -> None:
        command = ArchiveExtent("t", topic_id, 0, archive_id, start, end)
        state.apply(state.applied_offset, command)

    extent(0, 100)
    assert state.archive_extents == {}  # no identity recorded yet: another store's report
    state.apply(state.applied_offset, ArchiveClaimed("A"))
    state.apply(state.applied_offset, ArchiveClaimed("B"))
    assert state.archive_id == "A"  # the first claim stays
    extent(0, 100)
    extent(0, 50)  # a stale report (an older leader's) changes nothing
    extent(0, 120, archive_id="B")  # nor one about another store
    extent(0, 120, topic_id=tid + 1)  # nor one about another incarnation of the topic
    assert (
        state.archive_extents["t/0"]["start_offset"],
        state.archive_extents["t/0"]["end_offset"],
    ) == (0, 100)
    extent(20, 150)
    loss = ArchiveLoss("t", 0, tid, 20, 150, now_start=-1, now_end=-1)
    state.apply(state.applied_offset, ArchiveLossAccepted("C", [loss]))
    assert state.archive_id == "C"
    assert state.archive_extents["t/0"] == {
        "topic_id": tid,
        "start_offset": -1,
        "end_offset": -1,
        "lost": [[20, 150]],
    }
    again = MetadataState.from_snapshot(state.to_snapshot())
    assert (again.archive_id, again.archive_extents) == (state.archive_id, state.archive_extents)

    # cluster.json: an identity written once; an old one given one; a missing one is a loss
    # once the metadata log recorded an identity.
    store = open_store(f"file://{tmp_path}")
    first = claim_archive(store, "c1")
    assert first and claim_archive(store, "c1", first) == first
    (tmp_path / "cluster.json").write_text(json.dumps({"format": 1, "cluster_id": "c1"}))
    upgraded = claim_archive(store, "c1")
    assert (
        upgraded and json.loads((tmp_path / "cluster.json").read_text())["archive_id"] == upgraded
    )
    (tmp_path / "cluster.json").unlink()
    with pytest.raises(ArchiveLost):
        claim_archive(store, "c1", upgraded)
    assert not (tmp_path / "cluster.json").exists()


# -- a 3-node cluster with a file:// archive ----------------------------------------------------------


def produce_all(
    client: Client, topic: str, first: int, count: int, per: int = 10, pause_s: float = 0.0
) -> list[int]:
    """Values first..first+count in batches, retried until acknowledged; returns the acked."""
    acked = []
    for base in range(first, first + count, per):
        time.sleep(pause_s)
        recs = [record(i) for i in range(base, min(base + per, first + count))]
        retry(
            f"{topic}/0 to acknowledge the values from {base}",
            lambda: client.produce(topic, recs, partition=0),  # noqa: B023 (asked in this turn)
            60,
            every_s=0.2,
            tolerating=(TidelogError,),
        )
        acked.extend(range(base, base + len(recs)))
    return acked


@contextlib.contextmanager
def serve_restored(data: Path) -> Iterator[str]:
    port, peer = free_ports(2)
    log = open(data.parent / f"{data.name}.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tidelog",
            "serve",
            "--data",
            str(data),
            "--listen",
            f"127.0.0.1:{port}",
            "--peers",
            f"1=127.0.0.1:{port}/{peer}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield f"127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        log.close()


@pytest.mark.timeout(420)
def test_tiered_log_on_three_nodes_with_a_leader_killed(tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    archive.mkdir()
    url = f"file://{archive}"
    with (
        LocalCluster(tmp_path / "c", nodes=3, serve_args=["--archive", url]) as cluster,
        Client(cluster.bootstrap) as client,
    ):
        client.create_topic(
            "tiered",
            replication_factor=3,
            # A killed replica stops holding the log after a second (replica.max.lag.ms), so
            # what bounds the disks here is local retention and the archive.
            configs={**ARCHIVED, "min.insync.replicas": "2", "replica.max.lag.ms": "1000"},
        )
        client.wait_for_leaders("tiered")
        sizes: list[int] = []
        stop = threading.Event()

        def sample() -> None:  # every replica's disk, all along (a client of its own)
            with Client(cluster.bootstrap) as watcher:
                while not stop.is_set():
                    with contextlib.suppress(TidelogError):
                        for node in watcher.status(["tiered"]):
                            for row in node.get("partitions", []):
                                sizes.append(int(row["size_bytes"]))
                    time.sleep(0.2)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        # ~300 records (50 KB) a second: ~600 KB in all, against a disk bound of ~170 KB
        acked = produce_all(client, "tiered", 0, 1500, pause_s=0.03)
        leader = client.topic("tiered", refresh=True).leaders[0]
        cluster.kill(leader)  # mid-upload: the leader uploads as the log rolls
        acked += produce_all(client, "tiered", 1500, 1500, pause_s=0.03)
        cluster.start(leader)
        cluster.wait_ready()
        acked += produce_all(client, "tiered", 3000, 500, pause_s=0.03)
        stop.set()
        sampler.join()

        row = wait_for(
            "the archive to hold everything below the local log start, the log start to move",
            lambda: (
                (r := status_row(client, "tiered")).get("local_log_start_offset", 0) > 2000
                and r.get("archive", {}).get("archived_end_offset", -1)
                >= r["local_log_start_offset"]
                and r
            ),
            60,
        )
        assert row["log_start_offset"] == 0, row
        holds = {h["kind"]: h for h in row["low_watermark"]["holds"]}
        assert holds["archive"]["name"] == url and holds["archive"]["live"]
        # Every replica's disk stays bounded: local.retention.bytes, the active segment, one
        # closed segment waiting for a pass, and what arrives while a failover's new leader
        # waits out the dead replica's hold (replica.max.lag.ms, 1 s) and catches up its
        # uploads (~2 s at 50 KB/s) -- never by what was produced (~600 KB).
        bound = 32768 + 2 * 16384 + 3 * 50_000
        assert max(sizes) <= bound, (max(sizes), bound)
        # One continuous log: earliest is the archive's start, earliest-local the disk's.
        assert client.list_offsets("tiered", 0, "earliest") == 0
        assert client.list_offsets("tiered", 0, "earliest-local") == row["local_log_start_offset"]
        got = [r.value for r in client.consume("tiered", 0, "earliest")]
        assert len(got) >= len(acked)
        values = [value(i) for i in acked]
        pos = 0
        for v in got:  # every acknowledged value, in order (a retried unknown outcome may repeat)
            if pos < len(values) and v == values[pos]:
                pos += 1
        assert pos == len(values), f"acknowledged value {acked[pos]} missing"
        # Any replica serves the archived range, from the store.
        for node in cluster.node_ids:
            mine = [
                r.value
                for r in client.consume(
                    "tiered", 0, "earliest", replica_read=True, prefer_node=node
                )
            ]
            assert mine[:500] == got[:500]

        verify = run_tidelog("archive", "verify", url, "--topic", "tiered", "--json")
        assert verify.returncode == 0, verify.stdout + verify.stderr
        report = json.loads(verify.stdout)
        (part,) = report["partitions"]
        assert part["problems"] == [] and part["gaps"] == [] and part["start_offset"] == 0
        # The archive equals the log: the archived batches, read straight from the store, hold
        # the records the nodes served, offset for offset.
        store = open_store(url)
        manifest = Manifest.from_bytes(
            store.get(next(k for k in store.list("tiered") if k.endswith("manifest.json")))
        )
        archived = [
            rec.value
            for seg in manifest.segments
            for header, batch in iter_batches(store, seg)
            if not header.is_control  # a new leader's marker, as consumers skip it
            for rec in decode_records(batch)
        ]
        assert archived == got[: len(archived)] and manifest.end_offset > 2000
        assert manifest.leader_epoch >= 2  # the leader after the kill wrote it too

        # Restore to an offset, and to a time: a node started on each serves exactly the prefix.
        restored = tmp_path / "restored-offset"
        out = run_tidelog(
            "restore", "--archive", url, "--topic", "tiered", "--to-offset", "1234",
            "--data", str(restored),
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        with serve_restored(restored) as address, Client(address) as other:
            other.wait_for_leaders("tiered")
            assert [r.value for r in other.consume("tiered", 0, "earliest")] == got[:1234]
        cut_value = got[777]
        cut_ts = BASE_TS + int(cut_value[1:7])
        restored = tmp_path / "restored-time"
        when = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(cut_ts // 1000))
        when += f".{cut_ts % 1000:03d}+00:00"
        out = run_tidelog(
            "restore", "--archive", url, "--topic", "tiered", "--to-time", when,
            "--data", str(restored),
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        with serve_restored(restored) as address, Client(address) as other:
            other.wait_for_leaders("tiered")
            prefix = [r for r in other.consume("tiered", 0, "earliest")]
            assert [r.value for r in prefix] == got[:778]
            assert all(r.timestamp <= cut_ts for r in prefix)
        # Restoring into a directory that is not empty is refused.
        again = run_tidelog(
            "restore", "--archive", url, "--topic", "tiered", "--to-offset", "5",
            "--data", str(restored),
        )  # fmt: skip
        assert again.returncode == 1 and "not empty" in again.stderr
        # A point before the first record, or past the last, is named and restores nothing
        # (it exited 0 without a word), unless the user says that is fine.
        for point in ("2001-01-01T00:00:00", "2999-01-01T00:00:00"):
            outside = tmp_path / f"restored-{point[:4]}"
            out = run_tidelog(
                "restore", "--archive", url, "--topic", "tiered", "--to-time", point,
                "--data", str(outside),
            )  # fmt: skip
            assert out.returncode == 1 and "RestorePointOutside" in out.stderr, out.stderr
            assert not outside.exists() or not any(outside.iterdir())
        out = run_tidelog(
            "restore", "--archive", url, "--topic", "tiered", "--to-time", "2999-01-01T00:00:00",
            "--data", str(outside), "--allow-outside",
        )  # fmt: skip
        assert out.returncode == 0 and "past its last record" in out.stderr, out.stderr


# -- S3 (moto's server), a store that goes away, bad input ---------------------------------------


class Relay:
    """A TCP relay in front of a server: stop() makes the server unreachable (connections
    refused, open ones cut), start() brings it back on the same port."""

    def __init__(self, target: int) -> None:
        self.target = target
        (self.port,) = free_ports(1)
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                client.close()
                continue
            self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        for s in self._conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        self._conns = []


@pytest.fixture
def s3() -> Iterator[dict[str, str]]:
    """moto's S3 server with authentication on: a user with a key allowed s3:*, a bucket."""
    import boto3

    (port,) = free_ports(1)
    env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="4")
    server = Path(sys.executable).parent / "moto_server"
    proc = subprocess.Popen(
        [str(server), "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        endpoint = f"http://127.0.0.1:{port}"
        anonymous = {
            "endpoint_url": endpoint,
            "region_name": "us-east-1",
            "aws_access_key_id": "setup",
            "aws_secret_access_key": "setup",
        }

        def up() -> bool:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                return True
            return False

        wait_for("moto's server", up)
        iam = boto3.client("iam", **anonymous)  # type: ignore[call-overload]
        iam.create_user(UserName="tidelog")
        key = iam.create_access_key(UserName="tidelog")["AccessKey"]
        iam.put_user_policy(
            UserName="tidelog",
            PolicyName="s3",
            PolicyDocument=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
                }
            ),
        )
        boto3.client(  # type: ignore[call-overload]
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id=key["AccessKeyId"],
            aws_secret_access_key=key["SecretAccessKey"],
        ).create_bucket(Bucket="tidelog-archive")
        yield {
            "port": str(port),
            "endpoint": endpoint,
            "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
            "AWS_REGION": "us-east-1",
        }
    finally:
        proc.kill()
        proc.wait()


def aws_env(s3: dict[str, str], **changes: str) -> dict[str, str]:
    keys = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION")
    return {**{k: s3[k] for k in keys}, **changes}


@pytest.mark.timeout(300)
def test_an_s3_archive_that_goes_away_and_comes_back(
    tmp_path: Path, s3: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    relay = Relay(int(s3["port"]))
    relay.start()
    url = "s3://tidelog-archive/prod"
    endpoint = f"http://127.0.0.1:{relay.port}"
    try:
        with (
            LocalCluster(
                tmp_path / "c",
                nodes=1,
                serve_args=["--archive", url, "--archive-endpoint", endpoint],
                env=aws_env(s3),
            ) as cluster,
            Client(cluster.bootstrap) as client,
        ):
            client.create_topic("s", replication_factor=1, configs=ARCHIVED)
            client.wait_for_leaders("s")
            acked = produce_all(client, "s", 0, 600)
            before = wait_for(
                "the first uploads",
                lambda: (
                    (r := status_row(client, "s")).get("archive", {}).get("objects", 0) > 2 and r
                ),
            )
            relay.stop()  # the store goes away
            acked += produce_all(client, "s", 600, 1200)
            stuck = wait_for(
                "the archive hold to name the error",
                lambda: (
                    (r := status_row(client, "s"))["archive"]["error"] == "ArchiveUnavailable" and r
                ),
            )
            archived_end = stuck["archive"]["archived_end_offset"]
            # Nothing unarchived was deleted: the local log still starts at or below what the
            # archive holds, however far past local.retention.bytes the partition is.
            assert stuck["local_log_start_offset"] <= archived_end
            assert stuck["size_bytes"] > 65536
            hold = next(h for h in stuck["low_watermark"]["holds"] if h["kind"] == "archive")
            assert "ArchiveUnavailable" in hold["detail"] and hold["live"]
            assert before["archive"]["archived_end_offset"] <= archived_end
            out = run_tidelog("status", "s", "--bootstrap", cluster.bootstrap)
            assert "archive s3://tidelog-archive/prod" in out.stdout, out.stdout
            relay.start()  # and comes back: uploads resume, the local log start moves on
            done = wait_for(
                "uploads to resume and the local log start to move",
                lambda: (
                    (r := status_row(client, "s"))["archive"]["error"] == ""
                    and r["local_log_start_offset"] > archived_end
                    and r
                ),
                90,
            )
            assert done["archive"]["archived_end_offset"] > archived_end
            got = [r.value for r in client.consume("s", 0, "earliest")]
            assert got == [value(i) for i in acked]
        # verify, from outside, through the same client code
        env = {**os.environ, **aws_env(s3)}

        def verify(target: str, **changes: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [*VERIFY, target, "--archive-endpoint", endpoint],
                capture_output=True,
                text=True,
                env={**env, **changes},
            )

        out = verify(url)
        assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout + out.stderr
        # Bad input: a missing bucket and wrong credentials are named.
        missing = verify("s3://no-such-bucket/x")
        assert missing.returncode == 1 and "ArchiveBucketMissing" in missing.stderr
        wrong = verify(url, AWS_SECRET_ACCESS_KEY="not-the-secret")
        assert wrong.returncode == 1 and "ArchiveAccessDenied" in wrong.stderr, wrong.stderr
        for name, setting in aws_env(s3, AWS_SECRET_ACCESS_KEY="wrong").items():
            monkeypatch.setenv(name, setting)
        with pytest.raises(ArchiveAccessDenied):
            open_store(url, endpoint).check()
    finally:
        relay.stop()


@pytest.mark.timeout(240)
def test_damage_and_another_clusters_archive_are_named(tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    archive.mkdir()
    url = f"file://{archive}"
    bad = run_tidelog("serve", "--data", str(tmp_path / "x"), "--archive", "ftp://h/p")
    assert bad.returncode != 0 and "InvalidArchiveUrl" in bad.stderr
    with (
        LocalCluster(tmp_path / "c", nodes=1, serve_args=["--archive", url]) as cluster,
        Client(cluster.bootstrap) as client,
    ):
        client.create_topic("d", replication_factor=1, configs=ARCHIVED)
        client.wait_for_leaders("d")
        produce_all(client, "d", 0, 800)
        wait_for(
            "the local log start to pass the first object",
            lambda: status_row(client, "d").get("local_log_start_offset", 0) > 200,
        )
        store = open_store(url)
        manifest = Manifest.from_bytes(
            store.get(next(k for k in store.list("d") if k.endswith("manifest.json")))
        )
        first = manifest.segments[0]
        path = archive / first.key
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x5A
        path.write_bytes(bytes(data))
        verify = run_tidelog("archive", "verify", url)
        assert verify.returncode == 1 and first.key in verify.stdout, verify.stdout
        assert "CRC-32C" in verify.stdout
        with pytest.raises(ArchiveCorrupt):
            list(client.consume("d", 0, "earliest"))
        second = manifest.segments[1]
        (archive / second.key).write_bytes((archive / second.key).read_bytes()[:-100])
        with pytest.raises(ArchiveCorrupt):
            list(client.consume("d", 0, second.base_offset))
        assert "truncated" in run_tidelog("archive", "verify", url).stdout
        # A damaged manifest, then repaired: named while damaged, forgotten once repaired (a
        # node that had read the bad one answered ArchiveCorrupt until it restarted).
        wait_for(
            "every closed segment archived",
            lambda: status_row(client, "d")["archive"]["segments_behind"] == 0,
        )
        manifest_path = archive / next(k for k in store.list("d") if k.endswith("manifest.json"))
        good = manifest_path.read_bytes()
        manifest_path.write_bytes(b"{not json")
        produce_all(client, "d", 800, 300)  # an upload meets the damaged manifest
        wait_for(
            "the damage named in status",
            lambda: status_row(client, "d")["archive"]["error"] == "ArchiveCorrupt",
        )
        manifest_path.write_bytes(good)
        wait_for(
            "the repaired manifest read again, without a restart",
            lambda: status_row(client, "d")["archive"]["error"] == "",
            60,
        )

    # Another cluster pointed at the same archive is refused, and deletes nothing unarchived.
    with (
        LocalCluster(tmp_path / "other", nodes=1, serve_args=["--archive", url]) as other,
        Client(other.bootstrap) as client,
    ):
        client.create_topic("d", replication_factor=1, configs=ARCHIVED)
        client.wait_for_leaders("d")
        produce_all(client, "d", 0, 500)
        row = wait_for(
            "the archive's refusal in status",
            lambda: (
                (r := status_row(client, "d")).get("archive", {}).get("error")
                == "ArchiveClusterMismatch"
                and r
            ),
        )
        assert row["local_log_start_offset"] == 0
        assert "ArchiveClusterMismatch" in json.dumps(row["low_watermark"])


@pytest.mark.timeout(240)
def test_an_archive_too_far_behind_refuses_produce_or_releases_its_hold(tmp_path: Path) -> None:
    """archive.max.lag.bytes with archive.lag.policy=refuse (the default) and =release, while the
    archive directory does not exist; then it appears and the archive catches up."""
    archive = tmp_path / "archive-later"
    url = f"file://{archive}"
    cap = {"archive.max.lag.bytes": "40000"}
    with (
        LocalCluster(tmp_path / "c", nodes=1, serve_args=["--archive", url]) as cluster,
        Client(cluster.bootstrap) as client,
    ):
        client.create_topic("refuse", replication_factor=1, configs={**ARCHIVED, **cap})
        client.create_topic(
            "release",
            replication_factor=1,
            configs={**ARCHIVED, **cap, "archive.lag.policy": "release"},
        )
        client.wait_for_leaders("refuse")
        client.wait_for_leaders("release")
        with pytest.raises(ArchiveLagExceeded):
            for i in range(2000):
                client.produce("refuse", [record(i)], partition=0, timeout_ms=2000)
        refused = status_row(client, "refuse")
        assert refused["local_log_start_offset"] == 0  # nothing unarchived went
        assert refused["archive"]["error"] == "ArchiveBucketMissing"
        produce_all(client, "release", 0, 2000)
        released = wait_for(
            "the released hold to let the local cleaner go on",
            lambda: (r := status_row(client, "release"))["local_log_start_offset"] > 0 and r,
        )
        assert released["size_bytes"] < 40000 + 32768 + 2 * 16384
        said = cluster.log_path(1).read_text()
        assert "archive_hold_released" in said or "the local cleaner goes on without it" in said
        archive.mkdir()  # the store appears: uploads begin, produce is accepted again
        wait_for(
            "the archive to catch up",
            lambda: (
                status_row(client, "refuse")["archive"]["lag_bytes"] < 40000
                and status_row(client, "refuse")["archive"]["error"] == ""
            ),
            60,
        )
        client.produce("refuse", [record(5000)], partition=0)
        wait_for(
            "the released topic's archive to resume",
            lambda: status_row(client, "release")["archive"]["objects"] > 0,
        )
    # What was released before the archive existed is absent from it, and says so in verify.
    verify = run_tidelog("archive", "verify", url, "--topic", "release")
    assert verify.returncode == 0, verify.stdout
    assert "offsets [0," not in verify.stdout  # it starts where the local log started


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_the_spark_source_reads_archived_ranges_from_the_store(
    tmp_path: Path, spark_session: Any
) -> None:
    """A range that is only in the archive: the executors read it from the store themselves
    (and the nodes serve it the same when told not to), the same rows as the node gives."""
    archive = tmp_path / "archive"
    archive.mkdir()
    url = f"file://{archive}"
    with (
        LocalCluster(tmp_path / "c", nodes=1, serve_args=["--archive", url]) as cluster,
        Client(cluster.bootstrap) as client,
    ):
        client.create_topic("sp", partitions=2, replication_factor=1, configs=ARCHIVED)
        client.wait_for_leaders("sp")
        for p in (0, 1):
            produce_all_to(client, "sp", p, 1200)
        rows = wait_for(
            "both partitions' local log starts past half of what they hold",
            lambda: (
                all(
                    (r := status_row(client, "sp", p)).get("local_log_start_offset", 0) > 600
                    and r["archive"]["archived_end_offset"] >= r["local_log_start_offset"]
                    for p in (0, 1)
                )
                and [status_row(client, "sp", p) for p in (0, 1)]
            ),
        )
        local_start = {r["partition"]: r["local_log_start_offset"] for r in rows}
        expected = sorted(
            (p, r.offset, r.value) for p in (0, 1) for r in client.consume("sp", p, "earliest")
        )
        ending = json.dumps({"sp": {str(p): local_start[p] for p in (0, 1)}})

        def read(**options: str) -> list[tuple[int, int, bytes]]:
            df = (
                spark_session.read.format("tidelog")
                .option("bootstrap", cluster.bootstrap)
                .option("subscribe", "sp")
                .option("minPartitions", "4")
                .options(**options)
                .load()
            )
            return sorted(
                (r["partition"], r["offset"], bytes(r["value"]))
                for r in df.select("partition", "offset", "value").collect()
            )

        def node_reads() -> int:
            counters = client.status(["sp"])[0]["node"]["counters"]
            return int(counters.get("tidelog_archive_reads_total", 0))

        # Everything (archive, then local), and a range wholly below the local log start: the
        # executors read the archived part from the store, the node serves none of it.
        before = node_reads()
        assert read() == expected
        only_archived = [row for row in expected if row[1] < local_start[row[0]]]
        assert read(endingOffsets=ending) == only_archived
        assert node_reads() == before
        # archive.direct=false: the same rows, through the node.
        assert read(endingOffsets=ending, **{"archive.direct": "false"}) == only_archived
        assert node_reads() > before


def produce_all_to(client: Client, topic: str, partition: int, count: int) -> None:
    for base in range(0, count, 50):
        client.produce(topic, [record(i) for i in range(base, base + 50)], partition=partition)


@pytest.mark.timeout(240)
def test_whole_log_retention_deletes_from_the_archive_below_every_cursor(tmp_path: Path) -> None:
    """retention.bytes bounds the whole log, archive included: the archive's cleaner deletes
    its oldest objects (manifest first), never below a live cursor; earliest follows."""
    archive = tmp_path / "archive"
    archive.mkdir()
    url = f"file://{archive}"
    with (
        LocalCluster(tmp_path / "c", nodes=1, serve_args=["--archive", url], http=True) as cluster,
        Client(cluster.bootstrap) as client,
    ):
        client.create_topic(
            "w", replication_factor=1, configs={**ARCHIVED, "retention.bytes": "120000"}
        )
        client.wait_for_leaders("w")
        client.create_cursor("reader", "w", {0: 0})
        produce_all(client, "w", 0, 1500, per=50)
        held = wait_for(
            "the local log start to move while the cursor holds the archive",
            lambda: (r := status_row(client, "w"))["local_log_start_offset"] > 600 and r,
        )
        time.sleep(1)  # several archive cleaner rounds
        assert status_row(client, "w")["log_start_offset"] == 0, held  # the cursor at 0 holds
        assert client.list_offsets("w", 0, "earliest") == 0
        client.commit_cursor("reader", {0: 700})
        row = wait_for(
            "the archive's start to move up to the cursor",
            lambda: (r := status_row(client, "w"))["log_start_offset"] > 0 and r,
        )
        start = row["log_start_offset"]
        assert 0 < start <= 700 and row["archive"]["start_offset"] == start
        assert client.list_offsets("w", 0, "earliest") == start
        first = next(iter(client.consume("w", 0, "earliest")))
        assert first.offset >= start
        client.delete_cursor("reader")
        row = wait_for(
            "the whole log to come within retention.bytes",
            lambda: (
                (r := status_row(client, "w"))["archive"]["bytes"] + r["size_bytes"]
                <= 120000 + 16384
                and r
            ),
        )
        # The objects below the archive's start are gone from the store, not just unlisted.
        store = open_store(url)
        key = next(k for k in store.list("w") if k.endswith("manifest.json"))
        manifest = Manifest.from_bytes(store.get(key))
        named = {s.key for s in manifest.segments}
        on_disk = {k for k in store.list("w") if k.endswith(".log")}
        assert on_disk == named and manifest.start_offset == row["log_start_offset"]
        # /metrics says both starts, the archive's end and its lag
        import urllib.request

        with urllib.request.urlopen(cluster.http_url(1) + "/metrics", timeout=10) as answer:
            text = answer.read().decode()
        labels = '{partition="0",topic="w"}'
        for name in (
            "tidelog_partition_log_start_offset",
            "tidelog_partition_local_log_start_offset",
            "tidelog_partition_archive_end_offset",
            "tidelog_partition_archive_lag_bytes",
        ):
            assert f"{name}{labels}" in text, name
        assert "tidelog_archive_uploaded_bytes_total" in text


def test_archive_urls_are_checked_and_normalised_at_start() -> None:
    """No archive at the filesystem root (`archive verify file:///` walked /proc), no `.` or
    `..` in a path, only bucket names S3 accepts; slashes normalised."""
    for url in (
        "file:///",
        "file:////",
        "file:///tmp/a/../b",
        "s3://tidelog/a/../b",
        "s3://Bad_Bucket!/p",
        "s3://ab/p",
        "s3://1.2.3.4/p",
        "s3://-dash/p",
        "s3://",
        "ftp://host/x",
    ):
        with pytest.raises(InvalidArchiveUrl):
            open_store(url)
    store = open_store("s3://tidelog-archive//prod/eu/")
    assert store.url == "s3://tidelog-archive//prod/eu/"
    assert open_store("file:///tmp/arch/").root == Path("/tmp/arch")  # type: ignore[attr-defined]


def test_store_errors_are_classified_by_type_and_s3_code_not_by_their_text() -> None:
    """An unreachable store whose error text holds "403" (its port 40300, a timing of 114.403
    ms) is unavailable, which is retried; only the store's own classification (obstore's
    PermissionDenied) or S3's <Code> element says access is denied."""
    from obstore.exceptions import GenericError, PermissionDeniedError

    from tidelog.errors import ArchiveUnavailable

    store = open_store("s3://tidelog-archive/p", endpoint="http://127.0.0.1:40300")
    down = GenericError(
        "Generic S3 error: Error performing GET http://127.0.0.1:40300/tidelog-archive/p/t/403/"
        "manifest.json in 114.403036ms - Connection refused (os error 111)"
    )
    cases: list[tuple[Exception, type[TidelogError]]] = [
        (down, ArchiveUnavailable),
        (PermissionDeniedError("Client error with status 403 Forbidden"), ArchiveAccessDenied),
        (GenericError("<Error><Code>AccessDenied</Code></Error>"), ArchiveAccessDenied),
        (GenericError("<Error><Code>NoSuchBucket</Code></Error>"), ArchiveBucketMissing),
        (GenericError("<Error><Code>SlowDown</Code><Key>403</Key></Error>"), ArchiveUnavailable),
    ]
    for raised, expected in cases:
        with pytest.raises(TidelogError) as info, store._translated("k"):  # type: ignore[attr-defined]
            raise raised
        assert type(info.value) is expected, (raised, info.value)


@pytest.mark.timeout(300)
def test_a_store_that_comes_back_empty_is_archive_lost_until_an_operator_decides(
    tmp_path: Path,
) -> None:
    """Issue 32: the store came back empty (bucket re-created, directory replaced) and the
    leaders started new manifests at the local log start: the earliest offset jumped from 0 to
    most of the log, silently. Now the metadata log records what the store holds (its identity
    and each partition's extent, reported by partition leaders on both nodes: one of them is
    not the metadata leader), and a store without it is ArchiveLost until `accept-loss`."""
    import shutil

    from helpers import scrape
    from helpers import value as metric
    from tidelog.errors import ArchiveLost

    archive = tmp_path / "archive"
    archive.mkdir()
    url = f"file://{archive}"
    with (
        LocalCluster(tmp_path / "c", nodes=2, serve_args=["--archive", url], http=True) as cluster,
        Client(cluster.bootstrap) as client,
    ):
        client.create_topic("gone", partitions=2, replication_factor=1, configs=ARCHIVED)
        client.wait_for_leaders("gone")
        for p in (0, 1):
            produce_all_to(client, "gone", p, 800)

        def recorded(p: int) -> dict[str, Any]:
            found = [
                e for e in client.archive().extents if (e["topic"], e["partition"]) == ("gone", p)
            ]
            return found[0] if found else {}

        for p in (0, 1):
            wait_for(
                f"partition {p}'s archive to be recorded past its local log start",
                lambda p=p: (
                    status_row(client, "gone", p).get("local_log_start_offset", 0) > 200
                    and recorded(p).get("end_offset", -1)
                    >= status_row(client, "gone", p)["local_log_start_offset"]
                ),
            )
        held = recorded(0)["end_offset"]
        assert recorded(0)["start_offset"] == 0 and client.archive().archive_id

        # Orphans: an upload killed before its manifest named it, and an unfinished write. An
        # hour old, the partition's leader deletes them when it starts (and every 10 minutes).
        key = next(k for k in open_store(url).list("gone") if k.endswith("manifest.json"))
        prefix = archive / key.rpartition("/")[0]
        named = set(os.listdir(prefix))
        orphans = [
            prefix / f"{'9' * 20}-{'9' * 20}-e1-deadbeef.log",
            prefix / ".x.log.1234abcd.tmp",
        ]
        fresh = prefix / f"{'8' * 20}-{'8' * 20}-e1-cafef00d.log"  # maybe an upload in flight
        for path in [*orphans, fresh]:
            path.write_bytes(b"half an upload")
        for path in orphans:
            os.utime(path, (time.time() - 7200, time.time() - 7200))
        owner = status_row(client, "gone", 0)["leader"]
        cluster.stop(owner)
        cluster.start(owner)
        cluster.wait_ready()
        client.wait_for_leaders("gone")
        wait_for("the orphans to go", lambda: not any(p.exists() for p in orphans), 60)
        assert fresh.exists() and named <= set(os.listdir(prefix))
        fresh.unlink()
        assert client.list_offsets("gone", 0, "earliest") == 0
        local_start = {p: status_row(client, "gone", p)["local_log_start_offset"] for p in (0, 1)}

        # The store comes back empty.
        shutil.rmtree(archive)
        archive.mkdir()
        for p in (0, 1):
            row = wait_for(
                f"partition {p}'s status to name the loss",
                lambda p=p: (
                    (r := status_row(client, "gone", p)).get("archive", {}).get("error")
                    == "ArchiveLost"
                    and r
                ),
                30,
            )
            assert "accept-loss" in row["archive"]["error_message"]
        leader0 = status_row(client, "gone", 0)["leader"]
        failing = metric(
            scrape(cluster.http_url(leader0)),
            "tidelog_partition_archive_failing",
            topic="gone",
            partition="0",
            error="ArchiveLost",
        )
        assert failing == 1
        # Nothing was written into the empty store, and the local log keeps what it has.
        produce_all_to(client, "gone", 0, 200)
        time.sleep(1.5)
        assert not [k for k in open_store(url).list("") if k.endswith("manifest.json")]
        assert status_row(client, "gone", 0)["local_log_start_offset"] == local_start[0]
        # A reader of the lost range is told so by name, or (reset=earliest) goes on with a
        # warning; never a silent jump.
        with pytest.raises(ArchiveLost) as lost:
            list(client.consume("gone", 0, 0, reset="none"))
        assert lost.value.details["lost_start"] == 0
        # verify fails, naming it; with --bootstrap, against what the cluster recorded.
        verify = run_tidelog("archive", "verify", url)
        assert verify.returncode == 1 and "ArchiveLost" in verify.stdout, verify.stdout
        verify = run_tidelog("archive", "verify", url, "--bootstrap", cluster.bootstrap)
        assert verify.returncode == 1, verify.stdout
        assert (
            f"ArchiveLost: gone/0: no manifest, the cluster recorded [0, {held})" in (verify.stdout)
            or "ArchiveLost: gone/0" in verify.stdout
        ), verify.stdout
        described = run_tidelog("archive", "describe", "--bootstrap", cluster.bootstrap)
        assert described.returncode == 0 and "gone/0" in described.stdout, described.stderr

        # The operator decides: the loss is recorded, uploads go on into the new store.
        accepted = run_tidelog("archive", "accept-loss", "--bootstrap", cluster.bootstrap)
        assert accepted.returncode == 0, accepted.stderr
        assert "gone/0: offsets [0, " in accepted.stdout and "recorded as lost" in accepted.stdout
        for p in (0, 1):
            wait_for(
                f"partition {p}'s uploads to go on",
                lambda p=p: (
                    (r := status_row(client, "gone", p))["archive"]["error"] == ""
                    and r["archive"]["objects"] > 0
                ),
                60,
            )
        after = {e["partition"]: e for e in client.archive().extents if e["topic"] == "gone"}
        assert after[0]["lost"] and after[0]["lost"][0][0] == 0
        with pytest.raises(ArchiveLost):
            list(client.consume("gone", 0, 0, reset="none"))
        first = next(iter(client.consume("gone", 0, 0, reset="earliest")))
        assert first.offset >= local_start[0]
        verify = run_tidelog("archive", "verify", url, "--bootstrap", cluster.bootstrap)
        assert verify.returncode == 0, verify.stdout
        assert "lost (recorded by the cluster, accepted): gone/0: [0, " in verify.stdout


@pytest.mark.timeout(240)
def test_a_long_archive_seals_parts_and_reads_whole_after_a_restart(tmp_path: Path) -> None:
    """A live archive past HEAD_MAX objects: a new cluster finalizes feature level 2, so parts
    are written before the manifest names them (at level 1 the manifest names every object
    itself, as tidelog 0.1.0 reads it: the unit test above); a restarted node reads the whole
    archive back through them, verify passes."""
    from tidelog.archive.manifest import HEAD_MAX

    archive = tmp_path / "archive"
    archive.mkdir()
    url = f"file://{archive}"
    small = {**ARCHIVED, "segment.bytes": "2048", "local.retention.bytes": "8192"}
    with (
        LocalCluster(tmp_path / "c", nodes=1, serve_args=["--archive", url]) as cluster,
        Client(cluster.bootstrap) as client,
    ):
        client.create_topic("long", replication_factor=1, configs=small)
        client.wait_for_leaders("long")
        total = 0
        while status_row(client, "long").get("archive", {}).get("objects", 0) <= HEAD_MAX + 120:
            client.produce("long", [record(total + i) for i in range(10)], partition=0)
            total += 10
            assert total < 20_000, status_row(client, "long")
        key = next(k for k in open_store(url).list("long") if k.endswith("manifest.json"))
        written = json.loads((archive / key).read_text())
        assert written["format"] == 2 and written["parts"]
        assert len(written["segments"]) <= HEAD_MAX
        cluster.stop(1)
        cluster.start(1)
        cluster.wait_ready()
        client.wait_for_leaders("long")
        # At once after the restart: `earliest` is the archive's start (the metadata log
        # records it) even before the node has read the manifest.
        assert client.list_offsets("long", 0, "earliest") == 0
        values = [r.value for r in client.consume("long", 0, "earliest", reset="none")]
        assert values == [value(i) for i in range(total)]
    verify = run_tidelog("archive", "verify", url)
    assert verify.returncode == 0, verify.stdout


# -- read_committed below the local log start ------------------------------------------------------


def test_manifest_entries_name_their_aborted_transactions_and_old_ones_do_not(
    tmp_path: Path,
) -> None:
    """An entry's aborted transactions survive the manifest's JSON; an entry written before the
    field (none in its JSON) serves read_committed only where it holds no transactional batch."""
    store = open_store(f"file://{tmp_path}")
    plain = batches(0, 10)
    txn = build_batch(
        [record(10), record(11)],
        base_offset=10,
        producer_id=7,
        producer_epoch=0,
        base_sequence=0,
        transactional=True,
    )
    known = replace(
        describe_object(plain + txn, "t/1/0/a.log"), aborted_transactions=((7, 10, 12),)
    )
    assert known.aborted_between(0, 12) == [[7, 10]]
    assert known.aborted_between(13, 20) == []  # its marker (12) is before the range
    manifest = Manifest("c", "t", 1, 0).appended(known, 1)
    [again] = Manifest.from_bytes(manifest.to_bytes()).segments
    assert again.aborted_transactions == ((7, 10, 12),) and again.transactions_known
    assert committed_aborted(again, plain + txn, 0, 12) == [[7, 10]]

    # As an older node wrote it: no field at all, and the reader knows nothing of aborts.
    old_json = json.loads(manifest.to_bytes())
    for entry in old_json["segments"]:
        del entry["aborted_transactions"]
    [old] = Manifest.from_bytes(json.dumps(old_json).encode()).segments
    assert old.aborted_transactions is None and not old.transactions_known
    assert "aborted_transactions" not in old.to_json()  # rewritten as it was
    store.put(old.key, plain + txn)
    assert committed_aborted(old, read_batches(store, old, 0, 1), 0, 5) == []  # plain batches
    with pytest.raises(InvalidRequest, match="archived before the archive kept"):
        committed_aborted(old, plain + txn, 0, 12)


def transactional(pid: int, offset: int, count: int) -> bytes:
    recs = [record(i) for i in range(offset, offset + count)]
    return build_batch(
        recs,
        base_offset=offset,
        producer_id=pid,
        producer_epoch=0,
        transactional=True,
        partition_leader_epoch=1,
    )


def marker_at(pid: int, offset: int, commit: bool) -> bytes:
    marker = bytearray(build_marker(pid, 0, commit=commit, coordinator_epoch=4))
    stamp(marker, 0, offset, 1)
    return bytes(marker)


def test_a_restore_ends_each_transaction_the_point_cut_as_the_archive_decided_it(
    tmp_path: Path,
) -> None:
    """Without a node: the point cuts producer 7's transaction before its COMMIT (which the
    archive holds further on) and producer 8's before any marker the archive holds. The copy
    commits 7's, aborts 8's, and leaves nothing open to hold its LSO."""
    (tmp_path / "archive").mkdir()
    store = open_store(f"file://{tmp_path / 'archive'}")

    # 0-9 plain, 10-11 producer 7, 12-14 producer 8, 15-19 plain, 20 7's COMMIT, 21-25 plain
    data = batches(0, 10) + transactional(7, 10, 2) + transactional(8, 12, 3) + batches(15, 5)
    data += marker_at(7, 20, commit=True) + batches(21, 5)
    seg = describe_object(data, "t/1/0/a.log")
    store.put(seg.key, data)
    manifest = Manifest("c", "t", 1, 0, start_offset=0).appended(seg, 1)
    store.put(manifest_key("t", 1, 0), manifest.to_bytes())

    def make_topic(data_dir: Path, topic: str, partitions: int, configs: dict[str, str]) -> None:
        data_dir.mkdir(parents=True)

    restored = tmp_path / "restored"
    [part] = restore_topic(store, "t", RestorePoint(to_offset=18), restored, make_topic)
    assert (
        "transactions the point cut through: 1 committed, 1 aborted as undecided in the archive"
        in part.note
    )
    assert part.end_offset == 20  # the prefix (0-17), then 7's COMMIT and 8's ABORT
    copy = SegmentedLog(restored / "t-0", TopicConfig())
    try:
        assert copy.transactions.open == {} and copy.high_watermark == 20
        assert last_stable_offset(copy) == 20
        assert [(t.producer_id, t.first_offset) for t in copy.aborted_transactions(0, 20)] == [
            (8, 12)
        ]
        ends = [(m.offset, m.producer_id, m.commit, m.coordinator_epoch) for _, m in
                copy._scan_markers() if m]  # fmt: skip
        assert ends == [(18, 7, True, 4), (19, 8, False, 0)]
    finally:
        copy.close()


def test_verify_checks_each_entrys_aborted_transactions_against_its_batches(
    tmp_path: Path,
) -> None:
    """An entry whose aborted list disagrees with the archived batches and markers (one left
    out, one starting elsewhere, one that never aborted) is a problem `archive verify` names:
    a read_committed read of the archive would show aborted records or drop committed ones."""
    (tmp_path / "archive").mkdir()
    store = open_store(f"file://{tmp_path / 'archive'}")
    # 0-9 plain, 10-11 producer 7, 12-13 producer 8, 14 7's ABORT, 15 8's COMMIT, 16-20 plain
    data = batches(0, 10) + transactional(7, 10, 2) + transactional(8, 12, 2)
    data += marker_at(7, 14, commit=False) + marker_at(8, 15, commit=True) + batches(16, 5)
    seg = describe_object(data, "t/1/0/a.log")
    store.put(seg.key, data)
    right = ((7, 10, 14),)
    for listed, problem in (
        (right, ""),
        ((), "producer 7 ending at 14: recorded none, the batches say from 10"),
        (((7, 11, 14),), "producer 7 ending at 14: recorded from 11, the batches say from 10"),
        ((*right, (8, 12, 15)), "producer 8 ending at 15: recorded from 12, the batches say none"),
    ):
        entry = replace(seg, aborted_transactions=listed)
        manifest = Manifest("c", "t", 1, 0, start_offset=0).appended(entry, 1)
        report = verify_partition(store, manifest, "")
        if not problem:
            assert report.problems == []
        else:
            [found] = report.problems
            assert problem in found and "aborted transactions listed wrong" in found


def transactional_rounds(
    client: Client, topic: str, rounds: int
) -> tuple[list[bytes], list[bytes]]:
    """Per round, plain records then a transaction's, committed on even rounds and aborted on
    odd ones: (every value, the values a read_committed reader must see)."""
    pad = b"-" + b"x" * 150
    everything: list[bytes] = []
    committed: list[bytes] = []
    for n in range(rounds):
        plain = [b"p%04d-%02d" % (n, i) + pad for i in range(10)]
        client.produce(topic, plain, partition=0)
        outcome = b"c" if n % 2 == 0 else b"a"
        written = [outcome + b"%04d-%02d" % (n, i) + pad for i in range(10)]
        txn = client.transaction(f"{topic}-writer")
        txn.begin()
        txn.produce(topic, written, partition=0)
        if n % 2 == 0:
            txn.commit()
            committed += plain + written
        else:
            txn.abort()
            committed += plain
        everything += plain + written
    return everything, committed


def restore_through_transactions(tmp_path: Path, url: str, client: Client) -> None:
    """Restores whose point cuts a transaction of transactional_rounds' (its batches before
    the point, its marker after): the copy ends it as the archive decided it further on, so
    nothing holds the copy's LSO and read_committed reads the prefix with that decision."""
    offsets = {r.value: r.offset for r in client.consume("tx", 0, 0)}
    pad = b"-" + b"x" * 150
    committed_cut = offsets[b"c0004-05" + pad]  # round 4, committed: cut inside its batch
    aborted_cut = offsets[b"a0005-09" + pad] + 1  # round 5, aborted: cut before its marker
    for to_offset, note in ((committed_cut, "1 committed"), (aborted_cut, "1 aborted")):
        restored = tmp_path / f"restored-{to_offset}"
        out = run_tidelog(
            "restore", "--archive", url, "--topic", "tx", "--to-offset", str(to_offset),
            "--data", str(restored),
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert f"transactions the point cut through: {note}" in out.stdout, out.stdout
        prefix = [v for v, o in offsets.items() if o < to_offset]
        with serve_restored(restored) as address, Client(address) as other:
            other.wait_for_leaders("tx")
            # the copy is a new cluster at the highest level (it stayed at 1: no transactions)
            assert other.describe_features().finalized_level == MAX_LEVEL
            hw = other.list_offsets("tx", 0, "latest")
            assert hw == to_offset + 1  # the prefix, and the one marker that ends the cut
            assert other.list_offsets("tx", 0, "latest", isolation_level="read_committed") == hw
            read = [r.value for r in other.consume("tx", 0, 0)]
            assert read == prefix
            got = [r.value for r in other.consume("tx", 0, 0, isolation_level="read_committed")]
            assert got == [v for v in prefix if v is not None and not v.startswith(b"a")]
            holds = status_row(other, "tx")["low_watermark"]["holds"]
            assert not [h for h in holds if h["kind"] == "transaction"], holds


@pytest.mark.timeout(240)
def test_read_committed_below_the_local_log_start_drops_archived_aborted_transactions(
    tmp_path: Path,
) -> None:
    """Transactions, some aborted, archived and deleted locally: a read_committed read from 0
    gets every committed record and no aborted one, through the archive's entries; a
    read_uncommitted one gets everything. An entry without the list (as older nodes wrote it)
    is refused by name for read_committed."""
    archive = tmp_path / "archive"
    archive.mkdir()
    url = f"file://{archive}"
    with (
        LocalCluster(tmp_path / "c", nodes=1, serve_args=["--archive", url]) as cluster,
        Client(cluster.bootstrap) as client,
    ):
        wait_for_value(
            "feature level 3",
            lambda: client.describe_features().finalized_level,
            TRANSACTIONS_LEVEL.__eq__,
        )
        client.create_topic("tx", replication_factor=1, configs=ARCHIVED)
        client.wait_for_leaders("tx")
        everything, committed = transactional_rounds(client, "tx", 40)
        row = wait_for(
            "the first segments archived and deleted locally",
            lambda: (
                (r := status_row(client, "tx"))["local_log_start_offset"] > 200
                and r["log_start_offset"] == 0
                and r
            ),
            60,
        )
        store = open_store(url)
        key = next(k for k in store.list("tx") if k.endswith("manifest.json"))
        entries = Manifest.from_bytes(store.get(key)).segments
        assert all(s.transactions_known for s in entries)
        assert any(s.aborted_transactions for s in entries), entries

        def read(isolation_level: str) -> list[bytes]:
            return [
                r.value or b"" for r in client.consume("tx", 0, 0, isolation_level=isolation_level)
            ]

        assert read("read_committed") == committed, row
        assert read("read_uncommitted") == everything
        first = client.fetch("tx", 0, 0, isolation_level="read_committed")
        assert first.records and first.records[0].offset == 0  # from the archive
        restore_through_transactions(tmp_path, url, client)
        cluster.stop(1)
        # As a node from before this version wrote it: entries without the list.
        old = json.loads(store.get(key))
        for entry in old["segments"]:
            entry.pop("aborted_transactions", None)
        store.put(key, json.dumps(old).encode())
        cluster.start(1)
        cluster.wait_ready()
        with pytest.raises(InvalidRequest, match="archived before the archive kept"):
            read("read_committed")
        assert read("read_uncommitted") == everything
