"""Permissions (issue 14): ACLs in the metadata log, the same for tidelog's protocol and the Kafka
port. A table over every request type of both protocols: anonymous, wrong token, wrong
certificate, and authenticated-but-not-permitted callers are refused with named errors, and
nothing is written, deleted or changed (checked on disk and through an admin principal)."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import json
import logging
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import batch_of, run_tidelog
from tidelog.cli.cluster import LocalCluster
from tidelog.client.sync_client import Client
from tidelog.devcerts import client_principal
from tidelog.errors import AuthenticationFailed, InvalidConfig, NotAuthorized, TidelogError
from tidelog.kafka.codec import SUPPORTED_VERSIONS
from tidelog.node.config import node_config_from
from tidelog.principals import new_token
from tidelog.protocol import api
from tidelog.protocol.api import ApiKey
from tidelog.tls import TlsFiles
from wire import kafka_ask

pytestmark = pytest.mark.process  # tiers: pyproject.toml's markers

ADMIN_TOKEN = "root:" + "r" * 40
GUARDED = "guarded"  # nobody but the admin may touch it
OPEN_TO_ALL = "open"  # alice may read it; bob (a certificate) may write it
BOB = client_principal("bob")  # O=tidelog dev,CN=bob: the subject of dev-certs --client bob


@dataclasses.dataclass
class Secured:
    cluster: LocalCluster
    certs: Path
    other_ca: Path
    alice: str  # alice's token

    def client(self, **kwargs: Any) -> Client:
        kwargs.setdefault("tls", TlsFiles.of(ca=self.certs / "ca.pem"))
        return Client(self.cluster.bootstrap, retries=1, **kwargs)

    def admin(self) -> Client:
        return self.client(token=ADMIN_TOKEN)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    certs = tmp_path_factory.mktemp("certs")
    other = tmp_path_factory.mktemp("other-ca")
    for where, client in ((certs, "bob"), (other, "mallory")):
        done = run_tidelog("dev-certs", str(where), "--client", client)
        assert done.returncode == 0, done.stderr
        assert f"principal {client_principal(client)!r}" in done.stderr
    token_file = certs / "admin.token"
    token_file.write_text(ADMIN_TOKEN + "\n")
    serve = [
        *("--tls-cert", str(certs / "node.pem"), "--tls-key", str(certs / "node.key")),
        *("--tls-ca", str(certs / "ca.pem"), "--tls-client-auth", "requested"),
        *("--authorization", "acl", "--admin-token-file", str(token_file)),
    ]
    root = tmp_path_factory.mktemp("acl-cluster")
    with LocalCluster(root, 1, serve_args=serve, log_level="WARNING", kafka=True) as cluster:
        secured = Secured(cluster, certs, other, "")
        with secured.admin() as admin:
            secured.alice = admin.add_principal("alice")
            admin.add_principal("carol")
            for topic in (GUARDED, OPEN_TO_ALL):
                admin.create_topic(topic, partitions=2)
            admin.wait_for_leaders(GUARDED)
            admin.wait_for_leaders(OPEN_TO_ALL)
            for p in (0, 1):
                admin.produce(GUARDED, [b"a", b"b", b"c"], partition=p)
            admin.create_cursor("guarded-cursor", GUARDED, {0: 1, 1: 1})
            admin.add_acl("alice", "read", OPEN_TO_ALL)
            admin.add_acl(BOB, "write", prefix="op")
        yield secured


def guarded_state(secured: Secured) -> dict[str, Any]:
    """Everything a refused request could have changed, as the admin sees it and on disk."""
    with secured.admin() as admin:
        offsets = {
            (topic, p, spec): admin.list_offsets(topic, p, spec)
            for topic in (GUARDED, OPEN_TO_ALL)
            for p in (0, 1)
            for spec in ("earliest", "latest")
        }
        topics = sorted(
            (t.name, t.partitions, t.assignments, sorted(t.configs.items()))
            for t in admin.list_topics()
        )
        state = {
            "offsets": sorted(offsets.items()),
            "topics": topics,
            "cursors": admin.cursors(),
            "principals": [p["name"] for p in admin.principals()],
            "acls": admin.acls(),
            "quotas": admin.quotas(),
            "nodes": [(n.node_id, n.draining) for n in admin.describe_cluster().nodes],
        }
    disk = secured.cluster.data_dir / "node-1"
    state["disk"] = sorted(
        (str(p.relative_to(disk)), hashlib.sha256(p.read_bytes()).hexdigest())
        for p in disk.rglob("*.log")
        if p.parent.name.startswith((GUARDED, OPEN_TO_ALL))
    )
    return state


# Every client request of tidelog's protocol that needs a permission: one that would read or
# change the guarded topic, its cursor, the cluster's nodes, principals or ACLs.
def tidelog_requests() -> list[tuple[str, ApiKey, Any, bytes]]:
    _, hashed = new_token("carol")
    acl = {"principal": "alice", "permission": "read", "resource": "topic", "name": OPEN_TO_ALL}
    return [
        ("produce", ApiKey.PRODUCE, api.ProduceRequest(GUARDED, 0), batch_of(b"intruder")),
        ("fetch", ApiKey.FETCH, api.FetchRequest(GUARDED, 0, 0), b""),
        ("list offsets", ApiKey.LIST_OFFSETS, api.ListOffsetsRequest(GUARDED, 0), b""),
        ("create topic", ApiKey.CREATE_TOPIC, api.CreateTopicRequest("intruded"), b""),
        ("delete topic", ApiKey.DELETE_TOPIC, api.DeleteTopicRequest(GUARDED, force=True), b""),
        (
            "alter topic",
            ApiKey.ALTER_TOPIC,
            api.AlterTopicRequest(GUARDED, {"retention.ms": "1"}),
            b"",
        ),
        (
            "create partitions",
            ApiKey.CREATE_PARTITIONS,
            api.CreatePartitionsRequest(GUARDED, 4),
            b"",
        ),
        (
            "reassign",
            ApiKey.ALTER_PARTITION_REASSIGNMENTS,
            api.ReassignPartitionRequest(GUARDED, 0, [1]),
            b"",
        ),
        (
            "create cursor",
            ApiKey.CURSOR,
            api.CursorRequest("create", "mine", GUARDED, {"0": 0}),
            b"",
        ),
        (
            "commit cursor",
            ApiKey.CURSOR,
            api.CursorRequest("commit", "guarded-cursor", positions={"0": 3}),
            b"",
        ),
        ("describe cursor", ApiKey.CURSOR, api.CursorRequest("describe", "guarded-cursor"), b""),
        ("delete cursor", ApiKey.CURSOR, api.CursorRequest("delete", "guarded-cursor"), b""),
        (
            "invalidate cursor",
            ApiKey.CURSOR,
            api.CursorRequest("invalidate", "guarded-cursor", reason="x"),
            b"",
        ),
        ("delete records", ApiKey.DELETE_RECORDS, api.DeleteRecordsRequest(GUARDED, 0, -1), b""),
        ("table get", ApiKey.TABLE, api.TableRequest("get", GUARDED, 0, key="eA=="), b""),
        (
            "elect leaders",
            ApiKey.ELECT_LEADERS,
            api.ElectLeadersRequest(GUARDED, 0, unclean=True),
            b"",
        ),
        ("add node", ApiKey.ADD_NODE, api.AddNodeRequest(9, "127.0.0.1", 1), b""),
        ("remove node", ApiKey.REMOVE_NODE, api.RemoveNodeRequest(1), b""),
        (
            "take over a principal",
            ApiKey.PRINCIPALS,
            api.PrincipalsRequest("add", "carol", hashed),
            b"",
        ),
        ("add a principal", ApiKey.PRINCIPALS, api.PrincipalsRequest("add", "eve", hashed), b""),
        ("remove a principal", ApiKey.PRINCIPALS, api.PrincipalsRequest("remove", "carol"), b""),
        ("list principals", ApiKey.PRINCIPALS, api.PrincipalsRequest("list"), b""),
        (
            "grant",
            ApiKey.ACLS,
            api.AclsRequest("add", {**acl, "resource": "cluster", "permission": "admin"}),
            b"",
        ),
        ("revoke", ApiKey.ACLS, api.AclsRequest("remove", acl), b""),
        ("list acls", ApiKey.ACLS, api.AclsRequest("list"), b""),
        ("upgrade features", ApiKey.FEATURES, api.FeaturesRequest("upgrade"), b""),
        (
            "set a quota",
            ApiKey.QUOTAS,
            api.QuotasRequest("set", "alice", {"producer_byte_rate": 1}),
            b"",
        ),
        ("list quotas", ApiKey.QUOTAS, api.QuotasRequest("list"), b""),
        ("accept an archive's loss", ApiKey.ARCHIVE, api.ArchiveRequest("accept_loss"), b""),
        (
            "describe producers",
            ApiKey.PRODUCERS,
            api.ProducersRequest("describe", GUARDED, 0),
            b"",
        ),
        (
            "write a transaction marker",
            ApiKey.PRODUCERS,
            api.ProducersRequest("write_marker", GUARDED, 0, producer_id=1, producer_epoch=0),
            b"",
        ),
        *transaction_requests(),
    ]


def transaction_requests() -> list[tuple[str, ApiKey, Any, bytes]]:
    """The transaction coordinator's requests on a transactional id (a list shows only the
    ids one may describe: it is open, as a list of cursors is)."""
    txn = "guarded-txn"
    return [
        (
            f"transaction {op}",
            ApiKey.TRANSACTIONS,
            api.TransactionRequest(op, txn, 1, 0, **extra),
            b"",
        )
        for op, extra in [
            ("init", {}),
            ("add_partitions", {"partitions": {GUARDED: [0]}}),
            ("add_offsets", {"cursor": "guarded-cursor"}),
            ("commit_offsets", {"cursor": "guarded-cursor", "offsets": {GUARDED: {"0": 1}}}),
            ("end", {"commit": True}),
            ("describe", {}),
            ("abort", {}),
        ]
    ]


# What every connection may ask (Kafka's metadata is as open): who it is, what is served, the
# cluster's topics and nodes.
OPEN_REQUESTS = {
    ApiKey.API_VERSIONS,
    ApiKey.AUTHENTICATE,
    ApiKey.METADATA,
    ApiKey.STATUS,
    ApiKey.DESCRIBE_CLUSTER,
}


def test_group_acls_grant_only_their_groups() -> None:
    """Kafka's GROUP resource: read on a group (or prefix) uses that group only, admin deletes
    it; topic ACLs grant nothing on groups, nor group ACLs on topics."""
    from tidelog.acls import Acl, Permission, Resource, permitted
    from tidelog.errors import InvalidRequest

    acls = [
        Acl.of("alice", "read", group="billing"),
        Acl.of("bob", "read", group_prefix="etl."),
        Acl.of("carol", "read", "billing"),  # the topic billing, not the group
        Acl.of("dave", "admin", group="billing"),
    ]
    billing = Resource.group("billing")
    assert permitted(acls, "alice", Permission.READ, billing)
    assert not permitted(acls, "alice", Permission.READ, Resource.group("billing2"))
    assert not permitted(acls, "alice", Permission.READ, Resource.topic("billing"))
    assert permitted(acls, "bob", Permission.READ, Resource.group("etl.daily"))
    assert not permitted(acls, "carol", Permission.READ, billing)
    assert permitted(acls, "dave", Permission.ADMIN, billing)
    assert not permitted(acls, "dave", Permission.READ, billing)
    assert str(acls[1]) == "bob: read on groups etl.*"
    with pytest.raises(InvalidRequest):
        Acl.of("alice", "write", group="billing")  # a group is used or deleted, not written
    with pytest.raises(InvalidRequest):
        Acl.of("alice", "read", "t", group="g")  # one resource


def test_every_client_request_is_either_open_or_in_the_table() -> None:
    served = set(api.REQUEST_TYPES) - set(api.PEER_ONLY_MESSAGES)
    tabled = {key for _, key, _, _ in tidelog_requests()}
    assert served - tabled - OPEN_REQUESTS == set(), "a request type nobody classified"


def callers(secured: Secured) -> list[tuple[str, dict[str, Any], type[TidelogError]]]:
    ca = secured.certs / "ca.pem"
    return [
        ("anonymous", {}, NotAuthorized),
        ("wrong token", {"token": secured.alice[:-3] + "xyz"}, AuthenticationFailed),
        ("unknown principal", {"token": "mallory:" + "m" * 40}, AuthenticationFailed),
        (
            "certificate of another CA",
            {
                "tls": TlsFiles.of(
                    ca,
                    secured.other_ca / "client-mallory.pem",
                    secured.other_ca / "client-mallory.key",
                )
            },
            AuthenticationFailed,
        ),
        ("alice: a token, no permission here", {"token": secured.alice}, NotAuthorized),
        (
            "CN=bob: a certificate, no permission here",
            {
                "tls": TlsFiles.of(
                    ca, secured.certs / "client-bob.pem", secured.certs / "client-bob.key"
                )
            },
            NotAuthorized,
        ),
    ]


def test_every_request_of_tidelogs_protocol_is_refused_by_name_and_changes_nothing(
    secured: Secured,
) -> None:
    before = guarded_state(secured)
    address = ("127.0.0.1", secured.cluster.ports[1])
    for who, options, expected in callers(secured):
        requests = tidelog_requests()
        if expected is AuthenticationFailed:
            # Who cannot prove a name is refused before any request is read, so a few show it;
            # every request for each failed login would be 50 failures from 127.0.0.1, answered
            # at the login guard's 5 s each (node/login_guard.py).
            requests = requests[:3]
        with secured.client(**options) as client:
            for what, key, request, payload in requests:
                try:
                    client._run(client._async.call(address, key, request, payload))
                except TidelogError as exc:
                    assert type(exc) is expected, (who, what, exc)
                else:
                    raise AssertionError(f"{who}: {what} was served")
    assert guarded_state(secured) == before


def test_permissions_granted_are_permissions_held(secured: Secured) -> None:
    with secured.client(token=secured.alice) as alice:
        alice.wait_for_leaders(OPEN_TO_ALL)
        assert alice.list_offsets(OPEN_TO_ALL, 0, "earliest") == 0
        with pytest.raises(NotAuthorized):
            alice.produce(OPEN_TO_ALL, [b"x"], partition=0)  # read, not write
    bob_tls = TlsFiles.of(
        secured.certs / "ca.pem", secured.certs / "client-bob.pem", secured.certs / "client-bob.key"
    )
    with secured.client(tls=bob_tls) as bob:
        bob.produce(OPEN_TO_ALL, [b"from bob"], partition=1)  # write, by prefix "op"
        with pytest.raises(NotAuthorized):
            bob.consume(OPEN_TO_ALL, 1).__next__()
    with secured.client(token=secured.alice) as alice:
        assert [r.value for r in alice.consume(OPEN_TO_ALL, 1)] == [b"from bob"]
        with pytest.raises(NotAuthorized):
            alice.create_cursor("alice-guarded", GUARDED, {0: 0})
        alice.create_cursor("alice-open", OPEN_TO_ALL, {0: 0, 1: 0})
        alice.delete_cursor("alice-open")

    # The CLI: a cluster admin grants, lists and revokes.
    boot = [
        *("--bootstrap", secured.cluster.bootstrap, "--tls-ca", str(secured.certs / "ca.pem")),
    ]
    token_file = secured.certs.parent / "admin.token.cli"
    token_file.write_text(ADMIN_TOKEN + "\n")
    admin = [*boot, "--token-file", str(token_file)]  # never argv: /proc/PID/cmdline is public
    done = run_tidelog("acl", "add", "alice", "write", "--topic", OPEN_TO_ALL, *admin)
    assert done.returncode == 0, done.stderr
    listed = run_tidelog("acl", "list", "--principal", "alice", *admin)
    assert listed.returncode == 0, listed.stderr
    assert "alice" in listed.stdout and "write" in listed.stdout and "topic open" in listed.stdout
    with secured.client(token=secured.alice) as alice:
        alice.produce(OPEN_TO_ALL, [b"from alice"], partition=0)
    done = run_tidelog("acl", "remove", "alice", "write", "--topic", OPEN_TO_ALL, *admin)
    assert done.returncode == 0, done.stderr
    as_json = json.loads(run_tidelog("acl", "list", "--json", *admin).stdout)
    assert {"principal": "alice", "permission": "write"} not in [
        {k: a[k] for k in ("principal", "permission")} for a in as_json
    ]
    refused = run_tidelog(
        "acl", "add", "alice", "admin", "--cluster", *boot, "--token", secured.alice
    )
    assert refused.returncode != 0 and "NotAuthorized" in refused.stderr
    bad = run_tidelog("acl", "add", "alice", "read", "--cluster", *admin)
    assert bad.returncode != 0 and "InvalidRequest" in bad.stderr  # the cluster has admin only
    # Cluster admin: everything, including other principals' tokens.
    run_tidelog("acl", "add", "alice", "admin", "--cluster", *admin)
    try:
        with secured.client(token=secured.alice) as alice:
            alice.create_topic("alice-made")
            alice.delete_topic("alice-made")
    finally:
        run_tidelog("acl", "remove", "alice", "admin", "--cluster", *admin)


def test_a_cursor_is_its_creators_and_its_positions_follow_read(secured: Secured) -> None:
    """Issue 32: anonymous `cursors list` showed every cursor's positions while describe
    refused, and any reader of a topic could delete or rewind another's cursor on it. Now a
    cursor is its creator's: another reader may describe it but not commit (rewind), delete or
    invalidate it without read on the group of its name (Kafka's group ACL) or cluster admin;
    a list shows positions only on topics one may read."""
    with secured.admin() as admin:
        carol = admin.add_principal("carol")
        admin.add_acl("carol", "read", OPEN_TO_ALL)
    with secured.client(token=secured.alice) as alice:
        alice.create_cursor("alice-own", OPEN_TO_ALL, {0: 0, 1: 0})
    with secured.client(token=carol) as other:
        (described,) = other.cursors("alice-own")
        assert described["owner"] == "alice" and described["positions"] == {"0": 0, "1": 0}
        for change in (
            lambda: other.commit_cursor("alice-own", {0: 0}),
            lambda: other.delete_cursor("alice-own"),
        ):
            with pytest.raises(NotAuthorized, match="alice created it"):
                change()
    with secured.client() as anonymous:
        (listed,) = [c for c in anonymous.cursors() if c["name"] == "alice-own"]
        assert listed["positions"] == {} and listed["positions_hidden"]
    with secured.admin() as admin:
        admin.add_acl("carol", "read", group="alice-own")
    with secured.client(token=carol) as other:
        other.commit_cursor("alice-own", {0: 0})  # shared now, as a Kafka group would be
        other.delete_cursor("alice-own")
    with secured.admin() as admin:
        admin.remove_principal("carol")


def test_a_node_beyond_loopback_needs_tls_and_acls_or_insecure(tmp_path: Path) -> None:
    base = {"data": str(tmp_path), "listen": "0.0.0.0:0"}
    with pytest.raises(InvalidConfig) as refused:
        node_config_from(base)
    assert "--insecure" in str(refused.value) and "--authorization acl" in str(refused.value)
    assert node_config_from({**base, "insecure": True}).insecure
    assert node_config_from({"data": str(tmp_path), "listen": "127.0.0.2:0"}).listen[0]
    with pytest.raises(InvalidConfig):
        node_config_from({"data": str(tmp_path), "kafka_listen": "10.1.2.3:9092"})
    # ACLs decide for clients; nodes prove they are nodes with the cluster secret.
    with pytest.raises(InvalidConfig) as refused:
        node_config_from({"data": str(tmp_path), "authorization": "acl"})
    assert refused.value.details["key"] == "cluster_secret_file"
    with pytest.raises(InvalidConfig):
        node_config_from({"data": str(tmp_path), "authorization": "everyone"})
    done = run_tidelog("serve", "--data", str(tmp_path / "n"), "--listen", "0.0.0.0:0")
    assert done.returncode != 0 and "InvalidConfig" in done.stderr and "--insecure" in done.stderr
    # `--set insecure=false` says no: it never turns the check off.
    with pytest.raises(InvalidConfig):
        node_config_from({**base, "insecure": "false"})
    with pytest.raises(InvalidConfig) as refused:
        node_config_from({**base, "insecure": "perhaps"})
    assert refused.value.details["key"] == "insecure"


@contextlib.contextmanager
def caplog_warnings() -> Iterator[list[str]]:
    """The warnings logged meanwhile, as messages."""
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Keep(logging.WARNING)
    logging.getLogger().addHandler(handler)
    try:
        yield seen
    finally:
        logging.getLogger().removeHandler(handler)


def test_a_misspelt_or_impossible_node_setting_is_refused(tmp_path: Path) -> None:
    base = {"data": str(tmp_path)}
    with pytest.raises(InvalidConfig) as refused:
        node_config_from({**base, "max.conections": "10"})
    assert "did you mean 'max.connections'" in str(refused.value)
    with pytest.raises(InvalidConfig) as refused:
        node_config_from({**base, "flush_threads": "0"})
    assert refused.value.details["key"] == "flush_threads"
    assert node_config_from({**base, "zero_copy": "off"}).zero_copy is False
    done = run_tidelog("serve", "--data", str(tmp_path / "n"), "--set", "tick.ms=5")
    assert done.returncode != 0 and "unknown node setting 'tick.ms'" in done.stderr
    # A weak cluster secret is refused at start (one PEER_HELLO lets it be guessed offline);
    # a readable one is named in a warning.
    weak = tmp_path / "weak.secret"
    weak.write_text("7 bytes\n")
    with pytest.raises(InvalidConfig, match="at least 16 are needed"):
        node_config_from({**base, "cluster_secret_file": str(weak)})
    strong = tmp_path / "strong.secret"
    strong.write_text("a" * 64 + "\n")
    strong.chmod(0o644)
    with caplog_warnings() as warned:
        assert node_config_from({**base, "cluster_secret_file": str(strong)}).cluster_secret
    assert any("can be read by others" in w for w in warned)


# -- the Kafka port -----------------------------------------------------------------------------


@contextlib.contextmanager
def kafka_connection(port: int, context: ssl.SSLContext) -> Iterator[ssl.SSLSocket]:
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as sock,
    ):
        yield sock


def kafka_exchange(
    port: int, context: ssl.SSLContext, api_key: int, values: dict[str, Any]
) -> dict[str, Any] | None:
    with kafka_connection(port, context) as sock:
        return kafka_ask(sock, api_key, values)


def error_codes(value: Any) -> set[int]:
    if isinstance(value, dict):
        found = {int(value[k]) for k in ("error_code", "partition_error_code") if k in value}
        for item in value.values():
            found |= error_codes(item)
        return found
    if isinstance(value, list | tuple):
        return set().union(*(error_codes(v) for v in value)) if value else set()
    return set()


# TOPIC_, GROUP_, CLUSTER_, TRANSACTIONAL_ID_AUTHORIZATION_FAILED
KAFKA_AUTHORIZATION_FAILED = {29, 30, 31, 53}


def kafka_requests(topic_id: Any = None) -> dict[int, tuple[str, dict[str, Any]]]:
    """A request of each api the Kafka port serves, on the guarded topic (Fetch 13+ names it by
    topic_id, as Metadata gives it)."""
    guarded = [{"name": GUARDED, "partitions": [{"partition_index": 0}]}]
    batch = batch_of(b"intruder")
    return {
        0: (
            "produce",
            {
                "acks": -1,
                "timeout": 5000,
                "topic_data": [
                    {"name": GUARDED, "partition_data": [{"index": 0, "records": batch}]}
                ],
            },
        ),
        1: (
            "fetch",
            {
                "max_wait": 0,
                "max_bytes": 1 << 20,
                "replica_id": -1,
                "topics": [
                    {
                        "topic": GUARDED,
                        "topic_id": topic_id,
                        "partitions": [{"partition": 0, "partition_max_bytes": 1 << 20}],
                    }
                ],
            },
        ),
        2: ("list offsets", {"replica_id": -1, "topics": guarded}),
        8: (
            "offset commit",
            {
                "group_id": "guarded-cursor",
                "generation_id_or_member_epoch": -1,
                "topics": [
                    {"name": GUARDED, "partitions": [{"partition_index": 0, "committed_offset": 3}]}
                ],
            },
        ),
        9: (
            "offset fetch",
            {
                "groups": [
                    {
                        "group_id": "guarded-cursor",
                        "topics": [{"name": GUARDED, "partition_indexes": [0]}],
                    }
                ]
            },
        ),
        11: (
            "join group",
            {
                "group_id": "g",
                "session_timeout": 10000,
                "rebalance_timeout": 10000,
                "protocol_type": "consumer",
                "protocols": [{"name": "range", "metadata": b""}],
            },
        ),
        12: ("heartbeat", {"group_id": "g", "generation_id": 1, "member_id": "m"}),
        13: ("leave group", {"group_id": "g", "members": [{"member_id": "m"}]}),
        14: ("sync group", {"group_id": "g", "generation_id": 1, "member_id": "m"}),
        15: ("describe groups", {"groups": ["g"]}),
        19: (
            "create topics",
            {
                "timeout": 5000,
                "topics": [{"name": "intruded", "num_partitions": 1, "replication_factor": 1}],
            },
        ),
        20: ("delete topics", {"timeout": 5000, "topics": [{"name": GUARDED}]}),
        21: (
            "delete records",
            {
                "timeout": 5000,
                "topics": [{"name": GUARDED, "partitions": [{"partition_index": 0, "offset": -1}]}],
            },
        ),
        22: (
            "init producer id",
            {"transaction_timeout": 60000, "producer_id": -1, "producer_epoch": -1},
        ),
        23: (
            "offset for leader epoch",
            {
                "replica_id": -1,
                "topics": [{"topic": GUARDED, "partitions": [{"partition": 0, "leader_epoch": 0}]}],
            },
        ),
        37: (
            "create partitions",
            {"timeout": 5000, "topics": [{"name": GUARDED, "count": 4}]},
        ),
        33: (
            "alter configs (the whole set)",
            {
                "resources": [
                    {
                        "resource_type": 2,
                        "resource_name": GUARDED,
                        "configs": [{"name": "retention.ms", "value": "1"}],
                    }
                ],
                "validate_only": False,
            },
        ),
        24: (
            "add partitions to a transaction",
            {
                "v3_and_below_transactional_id": "guarded-txn",
                "v3_and_below_producer_id": 1,
                "v3_and_below_producer_epoch": 0,
                "v3_and_below_topics": [{"name": GUARDED, "partitions": [0]}],
            },
        ),
        25: (
            "add offsets to a transaction",
            {
                "transactional_id": "guarded-txn",
                "producer_id": 1,
                "producer_epoch": 0,
                "group_id": "guarded-cursor",
            },
        ),
        26: (
            "end a transaction",
            {
                "transactional_id": "guarded-txn",
                "producer_id": 1,
                "producer_epoch": 0,
                "committed": True,
            },
        ),
        28: (
            "commit offsets in a transaction",
            {
                "transactional_id": "guarded-txn",
                "group_id": "guarded-cursor",
                "producer_id": 1,
                "producer_epoch": 0,
                "generation_id": -1,
                "member_id": "",
                "topics": [
                    {"name": GUARDED, "partitions": [{"partition_index": 0, "committed_offset": 3}]}
                ],
            },
        ),
        65: ("describe transactions", {"transactional_ids": ["guarded-txn"]}),
        61: (
            "describe producers",
            {"topics": [{"name": GUARDED, "partition_indexes": [0]}]},
        ),
        27: (
            "write transaction markers",
            {
                "markers": [
                    {
                        "producer_id": 1,
                        "producer_epoch": 0,
                        "transaction_result": False,
                        "coordinator_epoch": 0,
                        "topics": [{"name": GUARDED, "partition_indexes": [0]}],
                    }
                ]
            },
        ),
        42: ("delete groups", {"groups_names": ["guarded-cursor"]}),
        44: (
            "alter configs",
            {
                "resources": [
                    {
                        "resource_type": 2,
                        "resource_name": GUARDED,
                        "configs": [{"name": "retention.ms", "config_operation": 0, "value": "1"}],
                    }
                ]
            },
        ),
    }


# Open on the Kafka port as on tidelog's: ApiVersions, Metadata (without auto-creation: that
# is a create), FindCoordinator (a node's address), DescribeConfigs (a topic's settings),
# DescribeCluster; ListGroups and ListTransactions answer, listing only the groups and
# transactional ids one may use or describe (as Kafka's list only those one may describe).
KAFKA_OPEN = {18, 3, 10, 32, 60, 17, 36, 16, 66}  # and SaslHandshake, SaslAuthenticate


def test_every_kafka_request_is_refused_by_name_and_changes_nothing(secured: Secured) -> None:
    assert set(SUPPORTED_VERSIONS) - set(kafka_requests()) - KAFKA_OPEN == set()
    before = guarded_state(secured)
    port = secured.cluster.kafka_ports[1]
    certs = secured.certs
    anonymous = ssl.create_default_context(cafile=certs / "ca.pem")
    bob = ssl.create_default_context(cafile=certs / "ca.pem")
    bob.load_cert_chain(certs / "client-bob.pem", certs / "client-bob.key")
    stranger = ssl.create_default_context(cafile=certs / "ca.pem")
    stranger.load_cert_chain(
        secured.other_ca / "client-mallory.pem", secured.other_ca / "client-mallory.key"
    )
    described = kafka_exchange(
        port, anonymous, 3, {"topics": [{"name": GUARDED}], "allow_auto_topic_creation": False}
    )
    assert described is not None
    topic_id = described["topics"][0]["topic_id"]
    # bob may write a topic (not this one): he may have a producer id, not write with it.
    for who, context, permitted in (("anonymous", anonymous, set()), ("bob", bob, {22})):
        for key, (what, values) in kafka_requests(topic_id).items():
            if key in permitted:
                continue
            answer = kafka_exchange(port, context, key, values)
            assert answer is not None, (who, what, "closed instead of answered")
            codes = error_codes(answer)
            assert codes & KAFKA_AUTHORIZATION_FAILED, (who, what, answer)
        for node_port in secured.cluster.kafka_ports.values():  # the coordinator among them
            listed = kafka_exchange(node_port, context, 16, {})
            assert listed is not None and not listed["groups"], (who, listed)
    # A wrong token over SASL (PLAIN, SCRAM): SASL_AUTHENTICATION_FAILED, then the connection
    # ends; the next request is never served.
    for mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
        with kafka_connection(port, anonymous) as sock:
            shake = kafka_ask(sock, 17, {"mechanism": mechanism})
            assert shake is not None and shake["error_code"] == 0, shake
            if mechanism == "PLAIN":
                auth = b"\0alice\0" + secured.alice.partition(":")[2][:-1].encode() + b"x"
            else:
                auth = b"n,,n=alice,r=abcdefgh"
            answer = kafka_ask(sock, 36, {"auth_bytes": auth})
            if mechanism != "PLAIN":  # the server's challenge, then a proof that is wrong
                assert answer is not None and answer["error_code"] == 0, answer
                nonce = answer["auth_bytes"].decode().split(",")[0]
                final = f"c=biws,{nonce},p=" + base64.b64encode(b"\1" * 64).decode()
                answer = kafka_ask(sock, 36, {"auth_bytes": final.encode()})
            assert answer is not None and answer["error_code"] == 58, (mechanism, answer)
            assert kafka_ask(sock, 0, kafka_requests()[0][1]) is None
    # Out of SASL's order (issue 32: a request between the handshake and the authentication
    # ran as anonymous): ILLEGAL_SASL_STATE (34), and the connection ends.
    with kafka_connection(port, anonymous) as sock:
        assert kafka_ask(sock, 17, {"mechanism": "SCRAM-SHA-256"})["error_code"] == 0  # type: ignore[index]
        answer = kafka_ask(sock, 19, kafka_requests()[19][1])  # CreateTopics, mid-exchange
        assert answer is None or 34 in error_codes(answer), answer
        assert kafka_ask(sock, 3, {"topics": None}) is None
    with kafka_connection(port, anonymous) as sock:
        answer = kafka_ask(sock, 36, {"auth_bytes": b"n,,n=alice,r=abcdefgh"})  # no handshake
        assert answer is not None and answer["error_code"] == 34, answer
        assert kafka_ask(sock, 3, {"topics": None}) is None
    # A certificate no CA here signed: the handshake fails, nothing is served.
    for key, (what, values) in kafka_requests().items():
        with pytest.raises((ssl.SSLError, ConnectionError)):
            if kafka_exchange(port, stranger, key, values) is None:
                raise ConnectionError(what)
    # Metadata is open; a topic it names is not created for one who may not create it.
    answer = kafka_exchange(
        port, anonymous, 3, {"topics": [{"name": "intruded"}], "allow_auto_topic_creation": True}
    )
    assert answer is not None and answer["topics"][0]["error_code"] == 3  # unknown, as Kafka
    assert guarded_state(secured) == before


def test_kafka_clients_authenticate_with_sasl_and_are_held_to_their_acls(
    secured: Secured, caplog: pytest.LogCaptureFixture
) -> None:
    from confluent_kafka import Consumer, KafkaError, Producer
    from kafka.errors import KafkaError as KafkaPythonError

    from kafka import KafkaConsumer

    ca = str(secured.certs / "ca.pem")
    secret = secured.alice.partition(":")[2]
    root_secret = ADMIN_TOKEN.partition(":")[2]

    def sasl(mechanism: str, user: str, password: str) -> dict[str, Any]:
        return {
            "bootstrap.servers": secured.cluster.kafka_bootstrap,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": mechanism,
            "sasl.username": user,
            "sasl.password": password,
            "ssl.ca.location": ca,
        }

    def produce(
        config: dict[str, Any], value: bytes, timeout_ms: int = 5000
    ) -> tuple[list[Any], list[Any]]:
        delivered: list[Any] = []
        errors: list[Any] = []
        producer = Producer({**config, "message.timeout.ms": timeout_ms, "error_cb": errors.append})
        producer.produce(OPEN_TO_ALL, value, partition=0, callback=lambda e, m: delivered.append(e))
        producer.flush(15)
        return delivered, errors

    # The admin token (PLAIN and SCRAM); alice (SCRAM-SHA-512) may read but not write.
    assert produce(sasl("PLAIN", "root", root_secret), b"by root, plain")[0] == [None]
    assert produce(sasl("SCRAM-SHA-256", "root", root_secret), b"by root, scram")[0] == [None]
    delivered, _ = produce(sasl("SCRAM-SHA-512", "alice", secret), b"by alice")
    assert [e.code() for e in delivered] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    # A wrong password: an authentication error by name, nothing delivered.
    # (Its refusal may be held back up to 5 s: 127.0.0.1 failed logins in the tests before.)
    delivered, errors = produce(sasl("SCRAM-SHA-256", "alice", secret + "x"), b"never", 7000)
    assert delivered and delivered[0] is not None
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors

    # alice reads with a group: it needs read on the group (Kafka's GROUP resource; any
    # reader of any topic could join, and so rebalance, any group) and on the topic.
    refused = Consumer(
        {**sasl("SCRAM-SHA-512", "alice", secret), "group.id": "alice-group"}
        | {"auto.offset.reset": "earliest", "enable.auto.commit": False}
    )
    try:
        refused.subscribe([OPEN_TO_ALL])
        error = None
        for _ in range(40):
            message = refused.poll(0.5)
            if message is not None and message.error() is not None:
                error = message.error()
                break
        assert error is not None and error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED, error
    finally:
        refused.close()
    with secured.admin() as admin:
        admin.add_acl("alice", "read", group="alice-group")
        listed = {a["resource"] + " " + a["name"] for a in admin.acls("alice")}
        assert "group alice-group" in listed
    consumer = Consumer(
        {**sasl("SCRAM-SHA-512", "alice", secret), "group.id": "alice-group"}
        | {"auto.offset.reset": "earliest", "enable.auto.commit": False}
    )
    try:
        consumer.subscribe([OPEN_TO_ALL])
        got: list[bytes] = []
        for _ in range(60):
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                got.append(message.value())
            if b"by root, scram" in got:
                break
        assert b"by root, plain" in got and b"by root, scram" in got
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()

    # kafka-python speaks SCRAM too, and is refused by name with a wrong password.
    reader = KafkaConsumer(
        bootstrap_servers=secured.cluster.kafka_bootstrap,
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_plain_username="alice",
        sasl_plain_password=secret,
        ssl_cafile=ca,
        auto_offset_reset="earliest",
        consumer_timeout_ms=5000,
    )
    try:
        from kafka import TopicPartition

        reader.assign([TopicPartition(OPEN_TO_ALL, 0)])
        assert b"by root, plain" in [m.value for m in reader]
    finally:
        reader.close()
    # (kafka-python retries bootstrapping until its timeout; the reason is in its log.)
    with caplog.at_level(logging.WARNING, logger="kafka"), pytest.raises(KafkaPythonError):
        KafkaConsumer(
            bootstrap_servers=secured.cluster.kafka_bootstrap,
            security_protocol="SASL_SSL",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_plain_username="alice",
            sasl_plain_password="wrong" * 8,
            ssl_cafile=ca,
            bootstrap_timeout_ms=8000,  # (its refusal may be held back: see above)
        )
    assert "SaslAuthenticationFailedError" in caplog.text


def test_a_transactional_id_is_used_only_as_its_acls_allow(secured: Secured) -> None:
    """Kafka's TRANSACTIONAL_ID resource, granted with the CLI: without write on the id, a
    transactional producer is refused by name; with it (and write on the topic) it commits."""
    from confluent_kafka import KafkaException, Producer

    secret = secured.alice.partition(":")[2]
    config = {
        "bootstrap.servers": secured.cluster.kafka_bootstrap,
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "alice",
        "sasl.password": secret,
        "ssl.ca.location": str(secured.certs / "ca.pem"),
        "transactional.id": "alice-txn",
    }
    refused = Producer(config)
    with pytest.raises(KafkaException) as caught:
        refused.init_transactions(20)
    assert "TRANSACTIONAL_ID_AUTHORIZATION_FAILED" in str(caught.value), caught.value
    token_file = secured.certs.parent / "admin.token.txn"
    token_file.write_text(ADMIN_TOKEN + "\n")
    admin = [
        *("--bootstrap", secured.cluster.bootstrap, "--tls-ca", str(secured.certs / "ca.pem")),
        *("--token-file", str(token_file)),
    ]
    grants = [
        ("write", "--transactional-id", "alice-txn"),
        ("write", "--topic", OPEN_TO_ALL),
    ]
    for permission, flag, name in grants:
        done = run_tidelog("acl", "add", "alice", permission, flag, name, *admin)
        assert done.returncode == 0, done.stderr
    try:
        listed = run_tidelog("acl", "list", "--principal", "alice", *admin)
        assert "transactional_id alice-txn" in listed.stdout, listed.stdout
        producer = Producer(config)
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(OPEN_TO_ALL, b"by alice, in a transaction", partition=0)
        producer.commit_transaction(30)
    finally:
        for permission, flag, name in grants:
            done = run_tidelog("acl", "remove", "alice", permission, flag, name, *admin)
            assert done.returncode == 0, done.stderr


@pytest.mark.spark
def test_spark_reads_and_writes_over_tls_with_a_token_as_its_acls_allow(
    secured: Secured, spark_session: Any
) -> None:
    with secured.admin() as admin:
        admin.create_topic("spark-out", partitions=2)
        admin.wait_for_leaders("spark-out")
        admin.add_acl("alice", "write", prefix="spark-")
        admin.produce(OPEN_TO_ALL, [b"for spark %d" % i for i in range(20)], partition=1)
        expected = sorted(r.value for p in (0, 1) for r in admin.consume(OPEN_TO_ALL, p))
    spark = spark_session
    options = {
        "bootstrap": secured.cluster.bootstrap,
        "tls.ca": str(secured.certs / "ca.pem"),
        "token": secured.alice,
    }
    df = spark.read.format("tidelog").options(subscribe=OPEN_TO_ALL, **options).load()
    assert sorted(bytes(r["value"]) for r in df.collect()) == expected
    df.select("key", "value").write.format("tidelog").options(topic="spark-out", **options).mode(
        "append"
    ).save()
    with pytest.raises(Exception, match="NotAuthorized"):
        spark.read.format("tidelog").options(subscribe=GUARDED, **options).load().count()
    with pytest.raises(Exception, match="NotAuthorized"):
        df.select("key", "value").write.format("tidelog").options(topic=GUARDED, **options).mode(
            "append"
        ).save()
    wrong = {**options, "token": secured.alice + "x"}
    with pytest.raises(Exception, match="AuthenticationFailed"):
        spark.read.format("tidelog").options(subscribe=OPEN_TO_ALL, **wrong).load().count()
    with secured.admin() as admin:
        copied = sorted(r.value for p in (0, 1) for r in admin.consume("spark-out", p))
        assert copied == expected
