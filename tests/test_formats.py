"""Versioned formats (issue 35): every format names its version; a newer one than this build
reads is refused by name (UnsupportedFormatVersion, naming the file or peer and the versions),
never taken for damage; version 1 is tidelog 0.1.0's bytes; version 2 round-trips.

The tests marked `process` run tidelog 0.1.0 itself (its commit named in tests/releases.py, taken
from this checkout's history) next to this build: its writers' bytes, its readers' answers, and a cluster of both."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import crc32c
import pytest

from releases import release_source
from tidelog import formats
from tidelog.archive.manifest import (
    Manifest,
    cluster_marker,
    part_bytes,
    part_entries,
)
from tidelog.archive.store import open_store
from tidelog.archive.verify import verify_archive
from tidelog.errors import (
    ArchiveCorrupt,
    ArchiveError,
    CorruptRecord,
    InvalidRequest,
    StorageError,
    UnsupportedFormatVersion,
)
from tidelog.formats import FORMATS, check_version, write_version
from tidelog.node.archiver import claim_archive
from tidelog.protocol.peer_handshake import (
    PEER_VERSION,
    DialerHandshake,
    ListenerHandshake,
    PeerHello,
    PeerHelloResponse,
    proof,
)
from tidelog.replication.metadata_commands import MalformedCommand, decode_command
from tidelog.storage.checkpoint import encode_checkpoint, read_checkpoint, write_checkpoint
from tidelog.storage.identity import DirectoryIdentity, read_identity
from tidelog.storage.quorum_journal import JOURNAL_FILE, QuorumJournal, encode_format
from tidelog.storage.snapshot import MAGIC_V1, SnapshotStore, encode_snapshot
from tidelog.version import __version__

ROOT = Path(__file__).resolve().parent.parent


def refused(name: str, where: str, version: int) -> Callable[[UnsupportedFormatVersion], None]:
    def check(exc: UnsupportedFormatVersion) -> None:
        assert exc.details["format"] == name and exc.details["version"] == version
        assert where in exc.message and f"version {version}" in exc.message
        assert list(FORMATS[name].reads) == exc.details["reads"]

    return check


class Inline:
    """A journal's flush thread, run at once."""

    def __call__(
        self, job: Callable[[], None], done: Callable[[BaseException | None], None]
    ) -> None:
        job()
        done(None)


# -- the table ------------------------------------------------------------------------------------


def test_the_table_writes_0_1_0s_versions_at_level_1_and_reads_what_it_writes() -> None:
    for fmt in FORMATS.values():
        low, high = fmt.reads
        assert low == 1, f"{fmt.name}: this build must read what 0.1.0 wrote"
        for level in range(formats.LEVEL_MIN, formats.LEVEL_MAX + 2):
            assert low <= fmt.written_at(level) <= high, (fmt.name, level)
        if fmt.name != "peer-protocol":  # negotiated per connection instead
            assert fmt.written_at(1) == 1, f"{fmt.name}: level 1 writes what 0.1.0 reads"
    assert formats.write_level() == 1, "the default: nothing 0.1.0 cannot read"
    assert write_version("checkpoint") == 1 and write_version("checkpoint", 2) == 2


def test_a_newer_version_is_refused_naming_where_and_the_versions_known() -> None:
    assert check_version("checkpoint", 2, "x") == 2
    with pytest.raises(UnsupportedFormatVersion) as caught:
        check_version("checkpoint", 3, "checkpoint /data/t-0/partition.checkpoint")
    message = caught.value.message
    assert message.startswith("checkpoint /data/t-0/partition.checkpoint is in checkpoint")
    assert "version 3" in message and f"tidelog ({__version__}) reads versions 1-2" in message
    assert "upgrade tidelog" in message
    assert not caught.value.retriable and caught.value.code == 122
    with pytest.raises(UnsupportedFormatVersion, match="reads versions 1-2:"):
        check_version("metadata-command", 3, "metadata command 'create_topic'")


def test_the_write_level_picks_each_writers_version() -> None:
    try:
        formats.set_write_level(2)
        assert write_version("checkpoint") == 2 and write_version("meta.properties") == 1
        formats.set_write_level(7)  # a level this build does not know: its newest formats
        assert formats.write_level() == formats.LEVEL_MAX
        with pytest.raises(ValueError):
            formats.set_write_level(0)
    finally:
        formats.set_write_level(1)


# -- checkpoints ----------------------------------------------------------------------------------


def envelope(version: int, data: dict[str, Any], **extra: Any) -> bytes:
    body = json.dumps(data, sort_keys=True, separators=(",", ":"))
    outer = {"version": version, "crc": crc32c.crc32c(body.encode()), "data": data, **extra}
    return (json.dumps(outer, sort_keys=True) + "\n").encode()


def test_a_checkpoint_of_a_newer_version_is_refused_not_ignored_as_damaged(
    tmp_path: Path,
) -> None:
    """A damaged partition checkpoint is ignored (the log recovers from its segments, and its
    log start is lost): a newer one must stop the log from opening instead."""
    from tidelog.config import TopicConfig
    from tidelog.storage.log import SegmentedLog

    path = tmp_path / "partition.checkpoint"
    path.write_bytes(envelope(3, {"log_start_offset": 5}, layout="whatever comes"))
    with pytest.raises(UnsupportedFormatVersion) as caught:
        read_checkpoint(path)
    refused("checkpoint", str(path), 3)(caught.value)
    with pytest.raises(UnsupportedFormatVersion):
        SegmentedLog(tmp_path, TopicConfig())
    # A version 3 without the fields version 1 has is refused by name all the same.
    path.write_text('{"version": 3, "checksum": "sha256:..."}\n')
    with pytest.raises(UnsupportedFormatVersion):
        read_checkpoint(path)
    path.write_text('{"version": "1", "crc": 0, "data": {}}\n')
    with pytest.raises(CorruptRecord, match="no version"):
        read_checkpoint(path)


def test_checkpoint_version_2_round_trips_and_names_its_file_and_writer(tmp_path: Path) -> None:
    path = tmp_path / "leader-epoch-checkpoint"
    data = {"epochs": [[1, 0], [4, 17]]}
    write_checkpoint(path, data)
    assert path.read_bytes() == envelope(1, data)  # the default: version 1
    write_checkpoint(path, data, version=2)
    outer = json.loads(path.read_bytes())
    assert outer["version"] == 2 and outer["format"] == "leader-epoch-checkpoint"
    assert outer["written_by"] == __version__
    assert read_checkpoint(path) == data
    path.write_bytes(path.read_bytes().replace(b"17", b"18"))
    with pytest.raises(CorruptRecord, match="fails its CRC"):
        read_checkpoint(path)


# -- meta.properties ------------------------------------------------------------------------------


def test_meta_properties_of_a_newer_version_is_refused(tmp_path: Path) -> None:
    identity = DirectoryIdentity("blue", 1, "d" * 22)
    meta = tmp_path / "meta.properties"
    meta.write_text(identity.properties())
    assert read_identity(tmp_path) == identity
    meta.write_text(identity.properties().replace("version=1", "version=2"))
    with pytest.raises(UnsupportedFormatVersion) as caught:
        read_identity(tmp_path)
    refused("meta.properties", str(meta), 2)(caught.value)
    meta.write_text(identity.properties().replace("version=1\n", ""))  # absent: version 1
    assert read_identity(tmp_path) == identity
    meta.write_text(identity.properties().replace("version=1", "version=two"))
    with pytest.raises(StorageError, match="bad version"):
        read_identity(tmp_path)


# -- the quorum journal ---------------------------------------------------------------------------


def test_the_quorum_journal_upgrades_to_version_2_and_refuses_a_newer_one(tmp_path: Path) -> None:
    journal = QuorumJournal(tmp_path, Inline())
    journal.write("t/0", {"epoch": 3, "voted_for": 2}, lambda error: None)
    assert journal.version == 1 and b'"format"' not in (tmp_path / JOURNAL_FILE).read_bytes()
    done: list[BaseException | None] = []
    journal.upgrade(done.append, version=2)
    assert done == [None] and journal.version == 2
    journal.write("t/1", {"epoch": 1, "voted_for": -1}, lambda error: None)
    journal.close()
    raw = (tmp_path / JOURNAL_FILE).read_bytes()
    assert raw.startswith(encode_format(2))
    again = QuorumJournal(tmp_path, Inline())
    assert again.version == 2
    assert again.get("t/0") == {"epoch": 3, "voted_for": 2}
    assert again.get("t/1") == {"epoch": 1, "voted_for": -1}
    again.close()
    newer = encode_format(3) + raw[len(encode_format(2)) :]
    (tmp_path / JOURNAL_FILE).write_bytes(newer)
    with pytest.raises(UnsupportedFormatVersion) as caught:
        QuorumJournal(tmp_path, Inline())
    refused("quorum-journal", str(tmp_path / JOURNAL_FILE), 3)(caught.value)


# -- snapshots ------------------------------------------------------------------------------------


def test_a_snapshot_of_a_newer_version_is_refused_not_skipped(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, 3)
    store.write(10, b"older")
    newer = b"TLSNAP3\n" + encode_snapshot(20, b"newer", 4, version=2)[8:]
    (store.directory / f"{20:020d}.snapshot").write_bytes(newer)
    with pytest.raises(UnsupportedFormatVersion) as caught:
        store.latest()  # not the older one in its place: that would roll the state back
    refused("snapshot", f"{20:020d}.snapshot", 3)(caught.value)
    (store.directory / f"{20:020d}.snapshot").write_bytes(b"NOTSNAP\n" + newer[8:])
    latest = store.latest()  # damage is skipped, as before
    assert latest is not None and latest.offset == 10


def test_snapshots_are_version_1_until_level_2_with_the_epoch_kept_beside(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, 2)
    meta = store.write(40, b"state", epoch=7)
    data = meta.path.read_bytes()
    assert data == struct.pack(">8sqIq", MAGIC_V1, 40, crc32c.crc32c(b"state"), 5) + b"state"
    latest = store.latest()
    assert latest is not None and (latest.offset, latest.epoch) == (40, 7)
    assert store.load(latest) == b"state"
    v2 = store.write(50, b"later", epoch=8, version=2)
    assert v2.path.read_bytes()[:8] == b"TLSNAP2\n"
    latest = store.latest()
    assert latest is not None and (latest.offset, latest.epoch) == (50, 8)
    store.write(60, b"last", epoch=9)
    assert sorted(p.name for p in store.directory.iterdir()) == [
        f"{50:020d}.snapshot",
        f"{60:020d}.epoch",
        f"{60:020d}.snapshot",
    ], "an epoch goes with its snapshot"


def test_a_received_version_1_snapshot_keeps_the_leaders_epoch_beside(tmp_path: Path) -> None:
    leader, follower = SnapshotStore(tmp_path / "l", 2), SnapshotStore(tmp_path / "f", 2)
    leader.write(30, b"state", epoch=5)
    chunk = leader.read_chunk(30, 0, 1 << 20)
    follower.write_chunk(30, 0, chunk)
    meta = follower.finish(30, epoch=5)
    assert meta.epoch == 5
    latest = follower.latest()
    assert latest is not None and latest.epoch == 5


# -- metadata-log commands ------------------------------------------------------------------------


def test_a_metadata_command_of_a_newer_version_stops_the_node_not_skipped() -> None:
    """MetadataMachine.apply skips a command it cannot decode (MalformedCommand, every node
    alike); one of a newer version is not malformed but unread: applying on would misread."""
    from tidelog.node.failstop import FailStop
    from tidelog.node.state_machine import MetadataMachine
    from tidelog.record.batch import Record

    command = {"type": "delete_cursor", "name": "c"}
    assert decode_command(command).KIND == "delete_cursor"
    assert decode_command({**command, "v": 1}).KIND == "delete_cursor"
    with pytest.raises(MalformedCommand):
        decode_command({**command, "v": "2"})
    with pytest.raises(UnsupportedFormatVersion) as caught:
        decode_command({**command, "v": 3, "a_field_of_v3": True})
    refused("metadata-command", "metadata command 'delete_cursor'", 3)(caught.value)

    machine = MetadataMachine(on_topic=lambda name: None, on_reset=lambda state: None)
    record = Record(7, 0, None, json.dumps({**command, "v": 3}).encode(), ())
    with pytest.raises(UnsupportedFormatVersion):
        machine.apply([record], 8)
    assert machine.applied_offset < 8, "not applied past it"
    fail_stop = FailStop(1)
    fail_stop.check(caught.value, "__metadata/0 tick")
    assert fail_stop.failed is caught.value


# -- the archive ----------------------------------------------------------------------------------


def test_archive_objects_of_a_newer_format_are_refused_naming_the_key() -> None:
    manifest = Manifest(cluster_id="c", topic="t", topic_id=1, partition=0)
    raw = json.loads(manifest.to_bytes())
    assert raw["format"] == 1
    with pytest.raises(UnsupportedFormatVersion) as caught:
        Manifest.from_bytes(json.dumps({**raw, "format": 3}).encode(), "t/1/0/manifest.json")
    refused("archive-manifest", "archive object t/1/0/manifest.json", 3)(caught.value)
    with pytest.raises(ArchiveCorrupt):
        Manifest.from_bytes(json.dumps({**raw, "format": "1"}).encode(), "m")
    part = json.loads(part_bytes(()))
    assert part_entries(json.dumps(part).encode(), "p") == ()
    with pytest.raises(UnsupportedFormatVersion):
        part_entries(json.dumps({**part, "format": 3}).encode(), "p")
    marker = {"format": 1, "cluster_id": "c", "archive_id": "a"}
    assert cluster_marker(json.dumps(marker).encode()) == marker
    with pytest.raises(UnsupportedFormatVersion, match=r"cluster\.json"):
        cluster_marker(json.dumps({**marker, "format": 2}).encode())


def test_a_newer_archive_is_named_by_verify_and_never_claimed(tmp_path: Path) -> None:
    """A newer tidelog's cluster.json: `archive verify` names it, and a node's archiver refuses
    to claim (and so to write into) the store, by name, rather than taking it for another's."""
    store = open_store(f"file://{tmp_path}")
    store.put("cluster.json", json.dumps({"format": 3, "cluster_id": "c"}).encode())
    report = verify_archive(store)
    assert any("format version 3" in p for p in report.problems), report.problems
    with pytest.raises(ArchiveError, match=r"cluster\.json is in archive-cluster format version 3"):
        claim_archive(store, "c", "")


# -- the peer handshake ---------------------------------------------------------------------------

SECRET = b"s" * 32


def test_a_0_1_0_dialer_gets_the_proof_it_checks() -> None:
    """0.1.0's dialer sends no version and checks the listener's proof without a cluster id
    (this build's listener bound its cluster id into it, and 0.1.0 could not dial it)."""
    listener = ListenerHandshake(SECRET, 2, frozenset({1, 3}), "blue")
    hello = PeerHello(1, 2, "a" * 32, "blue", "dir1")  # what 0.1.0 sends: no version
    answer = listener.hello(hello)
    assert answer.version == 1 and listener.version == 1
    old_dialers_check = proof(SECRET, "listener", 1, 2, "a" * 32, answer.nonce)
    assert answer.proof == old_dialers_check


def test_this_builds_ends_speak_version_2_and_refuse_a_newer_answer() -> None:
    listener = ListenerHandshake(SECRET, 2, frozenset({1}), "blue")
    dialer = DialerHandshake(SECRET, 1, 2, "blue", "dir1")
    hello = dialer.hello()
    assert hello.version == PEER_VERSION == 2
    answer = listener.hello(hello)
    assert answer.version == 2 and answer.cluster_id == "blue"
    assert listener.auth(dialer.answer(answer)) == 1
    assert dialer.version == listener.version == 2
    # A dialer of a later version is answered in this one's.
    later = ListenerHandshake(SECRET, 2, frozenset({1}), "blue")
    assert later.hello(PeerHello(1, 2, "b" * 32, "blue", "d", 3)).version == 2
    with pytest.raises(InvalidRequest):
        ListenerHandshake(SECRET, 2, frozenset({1}), "blue").hello(
            PeerHello(1, 2, "c" * 32, version=0)
        )
    # An answer in a newer version than offered is refused, naming the peer.
    fresh = DialerHandshake(SECRET, 1, 2, "blue")
    forged = PeerHelloResponse(2, "d" * 32, "e" * 64, "blue", 3)
    with pytest.raises(UnsupportedFormatVersion) as caught:
        fresh.answer(forged)
    refused("peer-protocol", "peer node 2", 3)(caught.value)


def test_a_0_1_0_listeners_answer_is_checked_and_its_cluster_id_not_taken() -> None:
    dialer = DialerHandshake(SECRET, 1, 2, "", "dir1")  # formatting: it would adopt an id
    nonce_l = "f" * 32
    old = PeerHelloResponse(2, nonce_l, proof(SECRET, "listener", 1, 2, dialer.nonce, nonce_l))
    dialer.answer(old)
    assert dialer.version == 1
    # A cluster id beside a version 1 proof is bound into nothing: not taken.
    fresh = DialerHandshake(SECRET, 1, 2, "", "dir1")
    claimed = PeerHelloResponse(
        2, nonce_l, proof(SECRET, "listener", 1, 2, fresh.nonce, nonce_l), "mallory"
    )
    assert fresh.listener_cluster(claimed) == ""


# -- tidelog 0.1.0 itself -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def release_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tidelog 0.1.0's source tree, from this checkout's history, with this build's compiled
    codecs (their C sources are the same: checked)."""
    return release_source("0.1.0", tmp_path_factory.mktemp("tidelog-0.1.0"))


def run_release(src: Path, code: str) -> str:
    """Run code under tidelog 0.1.0; what it prints."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.process
def test_version_1_is_byte_for_byte_what_0_1_0_writes(release_src: Path, tmp_path: Path) -> None:
    data = {"log_start_offset": 3, "high_watermark": 9, "nested": {"b": [1, 2], "a": "é"}}
    old = tmp_path / "old"
    run_release(
        release_src,
        "from pathlib import Path; from tidelog.storage.checkpoint import write_checkpoint;"
        f"write_checkpoint(Path({str(old)!r}), {data!r});"
        "from tidelog.storage.identity import DirectoryIdentity as D;"
        f"Path({str(tmp_path / 'old.properties')!r}).write_text("
        "D('blue', 1, 'd' * 22, initial_directories='1=x,2=y').properties());"
        "from tidelog.storage.snapshot import encode_snapshot;"
        f"Path({str(tmp_path / 'old.snapshot')!r}).write_bytes(encode_snapshot(40, b'state'))",
    )
    new = tmp_path / "new"
    write_checkpoint(new, data)
    assert new.read_bytes() == old.read_bytes() == encode_checkpoint("new", data, 1)
    identity = DirectoryIdentity("blue", 1, "d" * 22, initial_directories="1=x,2=y")
    assert identity.properties() == (tmp_path / "old.properties").read_text()
    assert encode_snapshot(40, b"state", 7) == (tmp_path / "old.snapshot").read_bytes()


@pytest.mark.process
def test_0_1_0_refuses_version_2_checkpoints_and_journals(
    release_src: Path, tmp_path: Path
) -> None:
    """What makes the old binary stop after the upgrade is finalized: its journal (read before
    any partition's files) opens with a record 0.1.0 takes for damage."""
    write_checkpoint(tmp_path / "peer-directories", {"2": "d"}, version=2)
    journal = QuorumJournal(tmp_path, Inline())
    journal.write("t/0", {"epoch": 3, "voted_for": 2}, lambda error: None)
    journal.upgrade(lambda error: None, version=2)
    journal.close()
    out = run_release(
        release_src,
        "from pathlib import Path\n"
        "from tidelog.errors import CorruptRecord\n"
        "from tidelog.storage.checkpoint import read_checkpoint\n"
        "from tidelog.storage.quorum_journal import QuorumJournal\n"
        f"d = Path({str(tmp_path)!r})\n"
        "for read in (lambda: read_checkpoint(d / 'peer-directories'),\n"
        "             lambda: QuorumJournal(d, lambda job, done: None)):\n"
        "    try:\n"
        "        read()\n"
        "        print('read')\n"
        "    except CorruptRecord as exc:\n"
        "        print('refused', exc.message)\n",
    )
    checkpoint, journal_answer = out.splitlines()
    assert checkpoint.startswith("refused") and "fails its CRC" in checkpoint
    assert journal_answer.startswith("refused") and "quorum-states: record at 0" in journal_answer


@pytest.mark.process
def test_a_node_refuses_to_start_on_a_checkpoint_of_a_newer_version(tmp_path: Path) -> None:
    from tidelog.cli.cluster import free_ports

    data = tmp_path / "data"

    def serve() -> subprocess.CompletedProcess[str]:
        (port,) = free_ports(1)
        args = ["--data", str(data), "--listen", f"127.0.0.1:{port}", "--node-id", "1"]
        proc = subprocess.Popen(
            [sys.executable, "-m", "tidelog", "serve", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        first = proc.stdout.readline()  # the line that says it listens, or "" at its exit
        proc.terminate()
        out, err = proc.communicate(timeout=30)
        return subprocess.CompletedProcess(proc.args, proc.returncode, first + out, err)

    started = serve()
    assert "listening" in started.stdout, started.stderr
    checkpoint = data / "__metadata-0" / "partition.checkpoint"
    stored = read_checkpoint(checkpoint)
    assert stored is not None
    checkpoint.write_bytes(envelope(3, stored))
    refused_start = serve()
    assert refused_start.returncode not in (0, None), refused_start
    assert "listening" not in refused_start.stdout
    assert "UnsupportedFormatVersion" in refused_start.stderr, refused_start.stderr
    assert str(checkpoint) in refused_start.stderr and "version 3" in refused_start.stderr


@pytest.mark.process
@pytest.mark.timeout(180)
def test_a_0_1_0_node_and_nodes_of_this_build_replicate_together(
    release_src: Path, tmp_path: Path
) -> None:
    """A rolling upgrade half done: node 1 still runs 0.1.0, nodes 2 and 3 this build. Each
    dials the others (0.1.0 could not dial this build before the handshake's version), and a
    topic over all three takes writes acknowledged by all and reads them from each."""
    import secrets

    from helpers import wait_for
    from tidelog.cli.cluster import free_ports
    from tidelog.client.sync_client import Client

    secret = tmp_path / "cluster.secret"
    secret.write_text(secrets.token_hex(32))
    secret.chmod(0o600)
    ports = free_ports(6)
    client = {n: ports[n - 1] for n in (1, 2, 3)}
    peer = {n: ports[n + 2] for n in (1, 2, 3)}
    peers = ",".join(f"{n}=127.0.0.1:{client[n]}/{peer[n]}" for n in (1, 2, 3))
    procs: dict[int, subprocess.Popen[bytes]] = {}
    for n in (1, 2, 3):
        src = release_src if n == 1 else ROOT / "src"
        cmd = [sys.executable, "-m", "tidelog", "serve", "--node-id", str(n)]
        cmd += ["--listen", f"127.0.0.1:{client[n]}", "--peer-listen", f"127.0.0.1:{peer[n]}"]
        cmd += ["--peers", peers, "--data", str(tmp_path / f"node-{n}")]
        cmd += ["--cluster-secret-file", str(secret), "--cluster-id", "mixed"]
        log = (tmp_path / f"node-{n}.log").open("ab")
        procs[n] = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(src)}
        )
    try:
        bootstrap = [f"127.0.0.1:{client[n]}" for n in (1, 2, 3)]
        with Client(bootstrap) as c:
            c.create_topic("t", partitions=3, replication_factor=3)
            c.wait_for_leaders("t")
            for p in range(3):
                c.produce("t", [b"v%d" % p], partition=p, acks="all")
        for n in (1, 2, 3):  # every node's replica holds every write
            with Client([f"127.0.0.1:{client[n]}"]) as c:
                for p in range(3):
                    wait_for(
                        f"node {n} to hold partition {p}",
                        lambda c=c, p=p, n=n: (
                            [
                                r.value
                                for r in c.consume(
                                    "t",
                                    p,
                                    "earliest",
                                    reset="none",
                                    replica_read=True,
                                    prefer_node=n,
                                )
                            ]
                            == [b"v%d" % p]
                        ),
                    )
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            proc.wait(timeout=30)
    for n in (1, 2, 3):
        log_text = (tmp_path / f"node-{n}.log").read_text()
        assert "did not prove" not in log_text and "handshake failed" not in log_text, n
