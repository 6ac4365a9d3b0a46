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

from releases import RELEASES, Release, git, release_source, revision
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
from tidelog.storage.versioned_text import (
    CLEAN_SHUTDOWN,
    CLUSTER_ID,
    CLUSTER_SECRET,
    TOPIC_ID,
    TextFile,
)
from tidelog.storage.versioned_text import Contents as TextContents
from tidelog.storage.versioned_text import decode as decode_text
from tidelog.storage.versioned_text import encode as encode_text
from tidelog.storage.versioned_text import read as read_text
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
    with pytest.raises(UnsupportedFormatVersion, match="reads version 1:"):
        check_version("metadata-command", 2, "metadata command 'create_topic'")


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


# -- topic.id, .clean-shutdown, cluster.id, cluster.secret ----------------------------------------

TEXT_FILES = (TOPIC_ID, CLEAN_SHUTDOWN, CLUSTER_ID, CLUSTER_SECRET)


def versioned(file: TextFile, version: int, value: bytes = b"") -> bytes:
    """The versioned form, spelled out here as docs/formats.md gives it."""
    text = f"# tidelog {file.name}\nversion={version}\nwritten.by={__version__}\n".encode()
    return text + (file.key.encode() + b"=" + value + b"\n" if file.key else b"")


def test_the_text_files_are_bare_at_level_1_and_name_their_version_from_level_2() -> None:
    for file in TEXT_FILES:
        value = b"" if not file.key else b"17"
        bare = value + b"\n" if file.key else b""  # tidelog 0.1.0's bytes
        assert encode_text(file, value, write_version(file.name)) == bare, file.name
        assert encode_text(file, value, write_version(file.name, 2)) == versioned(file, 2, value)
        for raw, version in ((bare, 1), (versioned(file, 2, value), 2)):
            assert decode_text(file, raw, "f") == TextContents(version, value), (file.name, raw)


def test_a_text_file_of_a_newer_version_is_refused_and_a_damaged_one_named(
    tmp_path: Path,
) -> None:
    for file in TEXT_FILES:
        path = tmp_path / file.name
        path.write_bytes(versioned(file, 3, b"17") + b"layout=whatever comes\n")
        with pytest.raises(UnsupportedFormatVersion) as caught:
            read_text(file, path)
        refused(file.name, str(path), 3)(caught.value)
        path.write_bytes(f"# tidelog {file.name}\n".encode())
        with pytest.raises(StorageError, match=r"damaged \(no version=N line"):
            read_text(file, path)
    (tmp_path / "topic.id").write_bytes(versioned(TOPIC_ID, 2))
    with pytest.raises(StorageError, match=r"damaged \(no topic\.id= line\)"):
        read_text(TOPIC_ID, tmp_path / "topic.id")
    # Only the header makes the versioned form: a secret made by hand is read whole.
    hand_made = b"version=9 is no header\n"
    assert decode_text(CLUSTER_SECRET, hand_made, "s") == TextContents(1, hand_made.strip())
    assert read_text(CLUSTER_ID, tmp_path / "absent") is None


def test_topic_id_is_read_in_both_forms_and_rewritten_at_a_claim_once_level_2(
    tmp_path: Path,
) -> None:
    from tidelog.node.topics import TOPIC_ID_FILE, TopicReplicas, read_topic_id

    directory = tmp_path / "t-0"
    directory.mkdir()
    assert read_topic_id(directory) is None
    (directory / TOPIC_ID_FILE).write_bytes(b"17\n")
    assert read_topic_id(directory) == 17
    (directory / TOPIC_ID_FILE).write_bytes(versioned(TOPIC_ID, 2, b"17"))
    assert read_topic_id(directory) == 17
    (directory / TOPIC_ID_FILE).write_bytes(b"seventeen\n")  # unmarked, as 0.1.0 took it
    assert read_topic_id(directory) is None
    (directory / TOPIC_ID_FILE).write_bytes(versioned(TOPIC_ID, 3, b"17"))
    with pytest.raises(UnsupportedFormatVersion):
        read_topic_id(directory)  # never unmarked, and claimed over

    # claim_directory touches only the directory here: the node's other parts are not needed.
    topics = TopicReplicas(None, {}, None, None, None, None)  # type: ignore[arg-type]
    fresh = tmp_path / "t-1"
    assert topics.claim_directory(fresh, 17)
    assert (fresh / TOPIC_ID_FILE).read_bytes() == b"17\n"
    try:
        formats.set_write_level(2)
        assert topics.claim_directory(fresh, 17)  # claimed again, at level 2: rewritten
        assert (fresh / TOPIC_ID_FILE).read_bytes() == versioned(TOPIC_ID, 2, b"17")
        assert topics.claim_directory(tmp_path / "t-2", 18)
        assert (tmp_path / "t-2" / TOPIC_ID_FILE).read_bytes() == versioned(TOPIC_ID, 2, b"18")
        with pytest.raises(UnsupportedFormatVersion):
            topics.claim_directory(directory, 17)
    finally:
        formats.set_write_level(1)


def test_the_clean_shutdown_marker_is_empty_at_level_1_and_versioned_from_level_2(
    tmp_path: Path,
) -> None:
    from tidelog.config import TopicConfig
    from tidelog.storage.log import SegmentedLog

    marker = tmp_path / CLEAN_SHUTDOWN.name
    SegmentedLog(tmp_path, TopicConfig()).close()
    assert marker.read_bytes() == b""
    try:
        formats.set_write_level(2)
        reopened = SegmentedLog(tmp_path, TopicConfig())
        assert reopened.recovery.clean_shutdown and not marker.exists()
        reopened.close()
    finally:
        formats.set_write_level(1)
    assert marker.read_bytes() == versioned(CLEAN_SHUTDOWN, 2)
    reopened = SegmentedLog(tmp_path, TopicConfig())  # level 1 reads version 2
    assert reopened.recovery.clean_shutdown
    reopened.close()
    marker.write_bytes(b"# tidelog .clean-shutdown\nvers")  # torn: recovered as after a crash
    reopened = SegmentedLog(tmp_path, TopicConfig())
    assert not reopened.recovery.clean_shutdown
    reopened.close()
    marker.write_bytes(versioned(CLEAN_SHUTDOWN, 3))
    with pytest.raises(UnsupportedFormatVersion) as caught:
        SegmentedLog(tmp_path, TopicConfig())
    refused(".clean-shutdown", str(marker), 3)(caught.value)


@pytest.mark.process  # LocalCluster takes free ports with sockets
def test_cluster_up_files_stay_bare_until_every_node_took_up_level_2(tmp_path: Path) -> None:
    from tidelog.cli.cluster import LocalCluster
    from tidelog.config import InvalidConfig
    from tidelog.node.config import read_secret

    cluster = LocalCluster(tmp_path, nodes=2)
    cluster_id, secret_path = cluster.cluster_id, cluster.secret_path
    id_path = tmp_path / "cluster.id"
    assert id_path.read_bytes() == cluster_id.encode() + b"\n"  # 0.1.0's form
    secret = secret_path.read_bytes()
    assert len(secret) == 65 and secret.endswith(b"\n") and secret_path.stat().st_mode & 0o077 == 0
    assert read_secret(secret_path) == secret.strip()

    def journal(node: int, version: int) -> None:
        quorum = QuorumJournal(tmp_path / f"node-{node}", Inline())
        quorum.upgrade(lambda error: None, version=version)
        quorum.close()

    cluster.update_file_versions()  # no node has run: no level
    journal(1, 2)
    journal(2, 1)
    cluster.update_file_versions()  # node 2 has not taken up level 2
    assert id_path.read_bytes() == cluster_id.encode() + b"\n"
    assert secret_path.read_bytes() == secret
    journal(2, 2)
    cluster.update_file_versions()
    assert id_path.read_bytes() == versioned(CLUSTER_ID, 2, cluster_id.encode())
    assert secret_path.read_bytes() == versioned(CLUSTER_SECRET, 2, secret.strip())
    assert secret_path.stat().st_mode & 0o077 == 0
    again = LocalCluster(tmp_path, nodes=2)
    assert again.cluster_id == cluster_id
    assert read_secret(again.secret_path) == secret.strip()

    secret_path.write_bytes(versioned(CLUSTER_SECRET, 3, secret.strip()))
    with pytest.raises(UnsupportedFormatVersion) as caught:
        read_secret(secret_path)
    refused("cluster.secret", str(secret_path), 3)(caught.value)
    secret_path.write_bytes(b"# tidelog cluster.secret\nversion=2\n")
    with pytest.raises(InvalidConfig, match=r"damaged \(no secret= line\)"):
        read_secret(secret_path)
    id_path.write_bytes(versioned(CLUSTER_ID, 3, b"c"))
    with pytest.raises(UnsupportedFormatVersion):
        _ = again.cluster_id


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
        decode_command({**command, "v": 2, "a_field_of_v2": True})
    refused("metadata-command", "metadata command 'delete_cursor'", 2)(caught.value)

    machine = MetadataMachine(on_topic=lambda name: None, on_reset=lambda state: None)
    record = Record(7, 0, None, json.dumps({**command, "v": 2}).encode(), ())
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


@pytest.mark.process  # runs git
def test_a_release_is_taken_from_its_tag_or_else_its_commit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """tests/releases.py names 0.1.0 by its tag, v0.1.0; a clone without the tag falls back to
    the commit, and a tag on another commit is refused rather than tested."""
    at = revision("0.1.0")
    assert at in ("v0.1.0", "0070a26")
    try:
        found = git("rev-parse", "--verify", "--quiet", f"{at}^{{commit}}").decode()
    except subprocess.CalledProcessError:
        pytest.skip("0.1.0 is not in this checkout (a shallow clone)")
    assert found.startswith("0070a26")
    monkeypatch.setitem(RELEASES, "0.0.9", Release("0.0.9", "v0.0.9-never-tagged", "0070a26"))
    assert revision("0.0.9") == "0070a26"
    if at == "v0.1.0":
        monkeypatch.setitem(RELEASES, "0.0.8", Release("0.0.8", "v0.1.0", "24df97b"))
        with pytest.raises(AssertionError, match=r"tag v0\.1\.0 points at 0070a26"):
            revision("0.0.8")


@pytest.fixture(scope="module")
def release_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tidelog 0.1.0's source tree, from this checkout's history, with this build's compiled
    codecs (their C sources are the same: checked)."""
    return release_source("0.1.0", tmp_path_factory.mktemp("tidelog-0.1.0"))


def run_release(src: Path, code: str, *argv: str) -> str:
    """Run code under tidelog 0.1.0 (with argv as sys.argv[1:]); what it prints."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run(
        [sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True, timeout=60
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


OLD_TEXT_FILES = """
import json, sys
from pathlib import Path
from tidelog.cli.cluster import LocalCluster
from tidelog.config import TopicConfig
from tidelog.node.topics import TopicReplicas, read_topic_id
from tidelog.storage.log import SegmentedLog

old, new, v2 = (Path(a) for a in sys.argv[1:4])
TopicReplicas.claim_directory(None, old / "t-0", 17)  # touches only the directory
SegmentedLog(old / "p", TopicConfig()).close()
written = LocalCluster(old / "up", nodes=1)
print(json.dumps({
    "cluster_id": written.cluster_id,
    "secret": str(written.secret_path),
    # what 0.1.0 reads of this build's files
    "topic_id": read_topic_id(new / "t-0"),
    "clean": SegmentedLog(new / "p", TopicConfig()).recovery.clean_shutdown,
    "new_cluster_id": LocalCluster(new / "up", nodes=1).cluster_id,
    "v2_topic_id": read_topic_id(v2 / "t-0"),
    "v2_clean": SegmentedLog(v2 / "p", TopicConfig()).recovery.clean_shutdown,
    "v2_cluster_id": LocalCluster(v2 / "up", nodes=1).cluster_id,
}))
"""


@pytest.mark.process
def test_topic_id_markers_and_cluster_files_at_level_1_are_0_1_0s_bytes(
    release_src: Path, tmp_path: Path
) -> None:
    """topic.id, .clean-shutdown, cluster.id and cluster.secret as tidelog 0.1.0's own code
    writes and reads them: this build at level 1 writes the same bytes and each reads the
    other's; what 0.1.0 makes of version 2 is what docs/formats.md says."""
    from tidelog.cli.cluster import LocalCluster
    from tidelog.config import TopicConfig
    from tidelog.node.config import read_secret
    from tidelog.node.topics import TopicReplicas, read_topic_id
    from tidelog.storage.log import SegmentedLog

    old, new, v2 = tmp_path / "old", tmp_path / "new", tmp_path / "v2"
    topics = TopicReplicas(None, {}, None, None, None, None)  # type: ignore[arg-type]
    topics.claim_directory(new / "t-0", 17)
    SegmentedLog(new / "p", TopicConfig()).close()
    made = LocalCluster(new / "up", nodes=1)
    made_id, made_secret = made.cluster_id, made.secret_path.read_bytes()
    try:
        formats.set_write_level(2)
        topics.claim_directory(v2 / "t-0", 17)
        SegmentedLog(v2 / "p", TopicConfig()).close()
    finally:
        formats.set_write_level(1)
    (v2 / "up").mkdir()
    (v2 / "up" / "cluster.id").write_bytes(versioned(CLUSTER_ID, 2, made_id.encode()))
    assert (new / "p" / ".clean-shutdown").read_bytes() == b""  # 0.1.0 opens it: it goes
    seen = json.loads(run_release(release_src, OLD_TEXT_FILES, str(old), str(new), str(v2)))

    assert (old / "t-0" / "topic.id").read_bytes() == (new / "t-0" / "topic.id").read_bytes()
    assert (old / "p" / ".clean-shutdown").read_bytes() == b""
    old_id, old_secret = (old / "up" / "cluster.id").read_bytes(), Path(seen["secret"])
    assert old_id == seen["cluster_id"].encode() + b"\n"
    assert (new / "up" / "cluster.id").read_bytes() == made_id.encode() + b"\n"
    assert len(old_secret.read_bytes()) == len(made_secret) == 65
    assert old_secret.stat().st_mode & 0o777 == made.secret_path.stat().st_mode & 0o777 == 0o600
    # Each reads the other's.
    assert read_topic_id(old / "t-0") == 17 == seen["topic_id"]
    assert SegmentedLog(old / "p", TopicConfig()).recovery.clean_shutdown and seen["clean"]
    assert LocalCluster(old / "up", nodes=1).cluster_id == seen["cluster_id"]
    assert seen["new_cluster_id"] == made_id
    assert read_secret(old_secret) == old_secret.read_bytes().strip()
    # Version 2 in 0.1.0: topic.id unmarked, the marker a marker, the cluster id misread (and
    # the data directories, formatted for the real one, refuse it).
    assert seen["v2_topic_id"] is None and seen["v2_clean"] is True
    assert seen["v2_cluster_id"] != made_id and seen["v2_cluster_id"].startswith("# tidelog")


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


def start_node(data: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    """`tidelog serve` of this build, one node on a port of its own: the process and its
    client address ("" if it exited before listening: its stderr says why)."""
    args = ["--data", str(data), "--listen", "127.0.0.1:0", "--node-id", "1", *extra]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidelog", "serve", *args, "--log-level", "WARNING"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the line that says it listens, or "" at its exit
    return proc, line.split(" listening on ", 1)[1].split()[0] if " listening on " in line else ""


@pytest.mark.process
@pytest.mark.timeout(120)
def test_a_node_writes_the_text_files_of_its_level_and_refuses_a_newer_one(
    tmp_path: Path,
) -> None:
    """A node capped at level 1 writes topic.id and .clean-shutdown as 0.1.0 did; a new
    cluster, finalized at level 2 at birth, writes them in version 2; a topic.id of version 3
    stops the node at start, naming the file."""
    from helpers import wait_for_value
    from tidelog.client.sync_client import Client
    from tidelog.storage.quorum_journal import journal_version

    for version, extra in ((1, ["--set", "feature.max.level=1"]), (2, [])):
        data = tmp_path / f"level-{version}"
        proc, address = start_node(data, *extra)
        try:
            assert address, proc.communicate(timeout=30)
            with Client([address]) as client:
                wait_for_value(
                    f"level {version}",
                    lambda client=client: client.describe_features().finalized_level,
                    version.__eq__,
                )
                # Level 2 is written once the node rewrote its journal (core.py, formats.py).
                wait_for_value(
                    "the journal", lambda data=data: journal_version(data), version.__eq__
                )
                client.create_topic("t", partitions=1, replication_factor=1)
                client.produce("t", [b"x"], partition=0, acks="all")
        finally:
            proc.terminate()
            proc.communicate(timeout=30)
        assert proc.returncode == 0
        topic_id = read_text(TOPIC_ID, data / "t-0" / "topic.id")
        marker = read_text(CLEAN_SHUTDOWN, data / "t-0" / ".clean-shutdown")
        assert topic_id is not None and marker is not None
        assert (topic_id.version, marker.version) == (version, version)
        if version == 1:
            assert (data / "t-0" / "topic.id").read_bytes() == topic_id.value + b"\n"
            assert (data / "t-0" / ".clean-shutdown").read_bytes() == b""

    newer = data / "t-0" / "topic.id"
    newer.write_bytes(versioned(TOPIC_ID, 3, topic_id.value))
    proc, address = start_node(data)
    if address:
        proc.terminate()
    _, err = proc.communicate(timeout=30)
    assert not address and proc.returncode not in (0, None), err
    assert "UnsupportedFormatVersion" in err and str(newer) in err and "version 3" in err, err


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
