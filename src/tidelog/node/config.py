"""A node's configuration: CLI flags, or the same keys in a TOML file (`--config`).

node_id = 1
listen = "127.0.0.1:7101"          # the client listener
peer_listen = "127.0.0.1:7201"     # the peer channel (default: the listen host, a port of its own)
data = "/var/lib/tidelog"
peers = "1=127.0.0.1:7101,2=127.0.0.1:7102,3=127.0.0.1:7103"   # or a table {1 = "host:port"}
# join = "127.0.0.1:7101"          # instead of peers: a node added to a running cluster
cluster_secret_file = "/etc/tidelog/cluster.secret"
"max.connections" = 1000           # listener limits, by the names Kafka gives them

[defaults]            # topic defaults for topics created on this cluster (Kafka names)
"segment.bytes" = 1073741824

Each peer is `ID=HOST:PORT` (its client address, which clients are also told of) or
`ID=HOST:PORT/PEER_PORT` when its peer channel listens on a fixed port; without one, a node asks
the peer's client listener where its peer channel is.
"""

from __future__ import annotations

import difflib
import functools
import ipaddress
import logging
import os
import ssl
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tidelog.acls import ANONYMOUS
from tidelog.config import InvalidConfig, TopicConfig, parse_address
from tidelog.node.access import Authorization
from tidelog.principals import PRINCIPAL_NAME
from tidelog.tls import TlsFiles

MiB = 1024 * 1024
SECRET_ENV = "TIDELOG_CLUSTER_SECRET"


def parse_peer_entries(text: str) -> tuple[dict[int, tuple[str, int]], dict[int, int]]:
    """`ID=HOST:PORT[/PEER_PORT],...` -> (client addresses, fixed peer ports)."""
    peers: dict[int, tuple[str, int]] = {}
    peer_ports: dict[int, int] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        node, sep, address = item.partition("=")
        if not sep or not node.strip().isdigit():
            raise InvalidConfig(f"peer {item!r} is not ID=HOST:PORT[/PEER_PORT]", key="peers")
        address, slash, peer_port = address.partition("/")
        peers[int(node)] = parse_address(address)
        if slash:
            if not peer_port.isdigit() or not 0 < int(peer_port) <= 65535:
                raise InvalidConfig(f"peer {item!r}: bad peer port {peer_port!r}", key="peers")
            peer_ports[int(node)] = int(peer_port)
    return peers, peer_ports


def parse_peers(text: str) -> dict[int, tuple[str, int]]:
    return parse_peer_entries(text)[0]


# What a frame carries besides one batch (request or replication headers): a batch of
# max.message.bytes fits a frame with this to spare, and the peer channel takes frames this
# much larger than clients may send.
BATCH_FRAME_MARGIN_BYTES = 64 * 1024


@dataclass(frozen=True)
class NodeConfig:
    data_dir: Path
    node_id: int = 1
    listen: tuple[str, int] = ("127.0.0.1", 7100)
    peers: dict[int, tuple[str, int]] = field(default_factory=dict)
    topic_defaults: TopicConfig = field(default_factory=TopicConfig)
    tick_ms: int = 10
    election_timeout_ms: int = 800
    election_jitter_ms: int = 400
    replica_fetch_wait_max_ms: int = 500
    replica_fetch_max_bytes: int = 4 * MiB
    zero_copy: bool = True
    # Idle replica groups stop talking, and one heartbeat per pair of nodes watches the nodes
    # instead (replication/liveness.py); false: every follower long-polls its leader for good.
    quiesce: bool = True
    flush_threads: int = 4
    checkpoint_interval_ms: int = 1000
    metadata_segment_bytes: int = 16 * MiB
    metadata_snapshot_entries: int = 1000
    storage_max_bytes: int = -1  # storage.max.bytes: refuse produce (StorageFull) past it
    # max.partitions.per.node: partition replicas a node may be given (topic creation and
    # add-partitions past it are refused with PartitionLimitReached). 20,000: measured here,
    # 10,000 idle replicas cost a node 0.4 % of a core and ~18 KB each (bench/RESULTS.md).
    max_partitions_per_node: int = 20_000
    # -- the peer channel --------------------------------------------------------------------
    peer_listen: tuple[str, int] | None = None  # None: the listen host, a port the kernel picks
    peer_ports: dict[int, int] = field(default_factory=dict)  # fixed peer ports, by node id
    cluster_secret: bytes = b""  # proves membership in the peer handshake
    cluster_id: str = ""  # checked against the data directory's identity (and peers') if given
    peer_handshake_timeout_ms: int = 5_000
    # Client addresses of a running cluster this node joins (after `cluster add-node`): it
    # learns the cluster's id, nodes and metadata voters from there, once.
    join: tuple[tuple[str, int], ...] = ()
    # The Kafka-protocol listener (tidelog.kafka): None for none. Its advertised address is
    # what Kafka clients are told to connect to (default: the bound address, with the client
    # listener's host when bound to every interface).
    kafka_listen: tuple[str, int] | None = None
    # Prometheus /metrics and the web console (node/listeners/http.py): None for none.
    http_listen: tuple[str, int] | None = None
    # Host names the HTTP listener answers besides IP literals, localhost and its own (the
    # DNS-rebinding guard: http.allowed.hosts, comma-separated; "*" answers any).
    http_allowed_hosts: tuple[str, ...] = ()
    # The archive (node/archiver.py): file:///DIR or s3://BUCKET/PREFIX; "" for none. The
    # endpoint is an S3-compatible store's URL (else AWS_ENDPOINT_URL, else AWS itself).
    archive: str = ""
    archive_endpoint: str = ""
    kafka_advertised: tuple[str, int] | None = None
    # -- what a client connection may cost (each a limit with a named setting) --------------
    frame_bytes_max: int = 64 * MiB  # socket.request.max.bytes: checked before buffering
    queued_max_request_bytes: int = 64 * MiB  # node-wide bytes of large requests being read
    max_inflight_requests: int = 256  # per connection; past it, the node stops reading it
    max_connections: int = 1000
    max_connections_per_ip: int = 500
    idle_timeout_ms: int = 600_000  # connections.max.idle.ms
    request_receive_timeout_ms: int = 30_000  # a frame begun must arrive whole within this
    fd_reserve: int = 128  # descriptors kept for files and peers when clients take the rest
    fetch_max_bytes: int = 55 * MiB  # fetch.max.bytes: the most one fetch answer carries
    # -- TLS (tidelog/tls.py): every listener, and the node's own dialing, when given -------
    tls: TlsFiles | None = None
    tls_client_auth: str = "none"  # tls.client.auth on client listeners: none|requested|required
    # -- who may do what (node/access.py, tidelog/acls.py) ------------------------------------
    authorization: Authorization = Authorization.NONE
    super_users: frozenset[str] = frozenset()  # Kafka's super.users: may do everything
    # The bootstrap super user's token (--admin-token-file), NAME and SECRET: checked by this
    # node alone, so a new cluster's first admin needs no principal in the metadata log yet.
    admin_token: tuple[str, str] | None = field(default=None, repr=False)
    insecure: bool = False  # listen beyond loopback without TLS and ACLs, said out loud

    def __post_init__(self) -> None:
        if self.node_id < 0:
            raise InvalidConfig("node id must be >= 0", key="node_id")
        for key in ("tick_ms", "flush_threads", "election_timeout_ms"):
            if getattr(self, key) < 1:
                raise InvalidConfig(f"{key} must be >= 1, not {getattr(self, key)}", key=key)
        if self.join and self.peers:
            raise InvalidConfig(
                "a node that joins a running cluster (--join) learns its peers there: "
                "--peers is for the nodes a cluster starts with",
                key="join",
            )
        if self.peers and self.node_id not in self.peers:
            raise InvalidConfig(
                f"node {self.node_id} is not among the peers {sorted(self.peers)}", key="peers"
            )
        if self.tick_ms < 1 or self.election_timeout_ms < 5 * self.tick_ms:
            raise InvalidConfig("election.timeout.ms must be at least 5 ticks", key="tick_ms")
        for key, value, least in (
            ("socket.request.max.bytes", self.frame_bytes_max, 64 * 1024),
            ("queued.max.request.bytes", self.queued_max_request_bytes, self.frame_bytes_max),
            ("max.inflight.requests.per.connection", self.max_inflight_requests, 1),
            ("max.connections", self.max_connections, 1),
            ("max.connections.per.ip", self.max_connections_per_ip, 1),
            ("connections.max.idle.ms", self.idle_timeout_ms, 1),
            ("request.receive.timeout.ms", self.request_receive_timeout_ms, 1),
            ("fd.reserve", self.fd_reserve, 0),
            ("fetch.max.bytes", self.fetch_max_bytes, 1024),
        ):
            if value < least:
                raise InvalidConfig(f"{key} must be at least {least}, got {value}", key=key)
        self.check_batch_fits(self.topic_defaults.max_message_bytes)
        if self.tls is not None:
            self.tls.server_context(self.tls_client_auth)  # refuses bad files now, by name
            self.tls.server_context("required")  # the peer listener's mutual TLS
        elif self.tls_client_auth != "none":
            raise InvalidConfig(
                "tls.client.auth needs TLS (--tls-cert, --tls-key, --tls-ca)",
                key="tls.client.auth",
            )

        if self.authorization is Authorization.ACL and not self.cluster_secret:
            # ACLs decide for clients; what makes a connection a node is the cluster secret
            # (any certificate the CA signed, a client's too, passes TLS on the peer channel).
            raise InvalidConfig(
                "--authorization acl needs a cluster secret (--cluster-secret-file or "
                f"{SECRET_ENV}): without one any process that reaches the peer channel could "
                "join as a replica",
                key="cluster_secret_file",
            )
        self.check_exposure()

    def check_exposure(self) -> None:
        """A node reachable from other machines must say who may do what: TLS and ACLs, or
        --insecure."""
        wide = [
            f"{name} {host}"
            for name, address in (
                ("--listen", self.listen),
                ("--peer-listen", self.peer_listen),
                ("--kafka-listen", self.kafka_listen),
                ("--http-listen", self.http_listen),
            )
            if address is not None and not is_loopback(host := address[0])
        ]
        if not wide or self.insecure:
            return
        missing = [
            what
            for what, absent in (
                ("TLS (--tls-cert, --tls-key, --tls-ca)", self.tls is None),
                ("--authorization acl", self.authorization is not Authorization.ACL),
            )
            if absent
        ]
        if missing:
            raise InvalidConfig(
                f"{', '.join(wide)} is reachable beyond this machine: it needs "
                f"{' and '.join(missing)}, or --insecure to serve anyone who connects",
                key="insecure",
            )

    @property
    def all_super_users(self) -> frozenset[str]:
        admin = frozenset() if self.admin_token is None else frozenset({self.admin_token[0]})
        return self.super_users | admin

    @functools.cached_property
    def tls_dialing(self) -> ssl.SSLContext | None:
        """How this node connects to other nodes (peer channel, discovery, join): made once,
        not re-read from the PEM files at every dial."""
        return None if self.tls is None else self.tls.client_context()

    def check_batch_fits(self, max_message_bytes: int) -> None:
        """A batch of max.message.bytes must fit one of this node's frames, headers included
        (a client's produce and a follower's fetch answer alike)."""
        largest = self.frame_bytes_max - BATCH_FRAME_MARGIN_BYTES
        if max_message_bytes > largest:
            raise InvalidConfig(
                f"max.message.bytes {max_message_bytes} does not fit this node's frames: at "
                f"most {largest} (socket.request.max.bytes minus {BATCH_FRAME_MARGIN_BYTES} "
                "for headers)",
                key="max.message.bytes",
            )

    @property
    def voters(self) -> tuple[int, ...]:
        return tuple(sorted(self.peers)) if self.peers else (self.node_id,)

    @property
    def advertised(self) -> tuple[str, int]:
        return self.peers.get(self.node_id, self.listen)

    @property
    def peer_bind(self) -> tuple[str, int]:
        if self.peer_listen is not None:
            return self.peer_listen
        return self.listen[0], self.peer_ports.get(self.node_id, 0)

    def ticks(self, ms: int) -> int:
        return max(1, ms // self.tick_ms)

    def with_listen_port(self, port: int) -> NodeConfig:
        """After binding port 0: the real port, and the peer table agrees."""
        peers = dict(self.peers)
        if self.node_id in peers:
            peers[self.node_id] = (peers[self.node_id][0], port)
        return replace(self, listen=(self.listen[0], port), peers=peers)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere


def read_admin_token(path: Path) -> tuple[str, str]:
    text = _read_secret_file(path, "admin_token_file", "the admin token").decode(errors="replace")
    name, sep, secret = text.partition(":")
    if not sep or len(secret) < 16 or not PRINCIPAL_NAME.fullmatch(name) or name == ANONYMOUS:
        raise InvalidConfig(
            f"the admin token file {path} must hold NAME:SECRET, a principal's name and a "
            "secret of 16 characters or more",
            key="admin_token_file",
        )
    return name, secret


def load_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InvalidConfig(f"cannot read config file {path}: {exc}", key="config") from exc


# A cluster secret shorter than this is refused at start: one unauthenticated PEER_HELLO gives
# an attacker a proof to test guesses against offline (a 7-byte one fell in 0.01 s).
CLUSTER_SECRET_MIN_BYTES = 16
MAKE_SECRET = "python3 -c 'import secrets; print(secrets.token_hex(32))' > FILE"


def read_secret(path: Path) -> bytes:
    return check_cluster_secret(
        _read_secret_file(path, "cluster_secret_file", "the cluster secret"), str(path)
    )


def check_cluster_secret(secret: bytes, source: str) -> bytes:
    if len(secret) < CLUSTER_SECRET_MIN_BYTES:
        raise InvalidConfig(
            f"the cluster secret in {source} is {len(secret)} bytes: at least "
            f"{CLUSTER_SECRET_MIN_BYTES} are needed, and 64 random hex digits are best "
            f"(make one with: {MAKE_SECRET})",
            key="cluster_secret_file",
        )
    return secret


def _read_secret_file(path: Path, key: str, what: str) -> bytes:
    try:
        secret = path.read_bytes().strip()
        mode = path.stat().st_mode
    except OSError as exc:
        raise InvalidConfig(f"cannot read {what} {path}: {exc}", key=key) from exc
    if not secret:
        raise InvalidConfig(f"{what} file {path} is empty", key=key)
    if mode & 0o077:
        logging.getLogger(__name__).warning(
            "%s file %s can be read by others (mode %o): chmod 600 %s",
            what,
            path,
            mode & 0o777,
            path,
        )
    return secret


# Integer settings: the field, under its own name and under the name Kafka (or tidelog's docs)
# gives it.
_INT_SETTINGS = {
    "tick_ms": "tick_ms",
    "election_timeout_ms": "election_timeout_ms",
    "election_jitter_ms": "election_jitter_ms",
    "replica_fetch_wait_max_ms": "replica_fetch_wait_max_ms",
    "replica_fetch_max_bytes": "replica_fetch_max_bytes",
    "flush_threads": "flush_threads",
    "checkpoint_interval_ms": "checkpoint_interval_ms",
    "metadata_snapshot_entries": "metadata_snapshot_entries",
    "storage_max_bytes": "storage_max_bytes",
    "storage.max.bytes": "storage_max_bytes",
    "max_partitions_per_node": "max_partitions_per_node",
    "max.partitions.per.node": "max_partitions_per_node",
    "peer_handshake_timeout_ms": "peer_handshake_timeout_ms",
    "frame_bytes_max": "frame_bytes_max",
    "socket.request.max.bytes": "frame_bytes_max",
    "queued_max_request_bytes": "queued_max_request_bytes",
    "queued.max.request.bytes": "queued_max_request_bytes",
    "max_inflight_requests": "max_inflight_requests",
    "max.inflight.requests.per.connection": "max_inflight_requests",
    "max_connections": "max_connections",
    "max.connections": "max_connections",
    "max_connections_per_ip": "max_connections_per_ip",
    "max.connections.per.ip": "max_connections_per_ip",
    "idle_timeout_ms": "idle_timeout_ms",
    "connections.max.idle.ms": "idle_timeout_ms",
    "request_receive_timeout_ms": "request_receive_timeout_ms",
    "request.receive.timeout.ms": "request_receive_timeout_ms",
    "fd_reserve": "fd_reserve",
    "fd.reserve": "fd_reserve",
    "fetch_max_bytes": "fetch_max_bytes",
    "fetch.max.bytes": "fetch_max_bytes",
}
NODE_SETTINGS = sorted(k for k in _INT_SETTINGS if "." in k)
# Every key node_config_from reads (TOML, --set and serve's flags): any other is refused, so
# that a misspelt setting is never silently left at its default.
KNOWN_SETTINGS = frozenset(_INT_SETTINGS) | {
    "data",
    "data_dir",
    "node_id",
    "listen",
    "peers",
    "join",
    "defaults",
    "zero_copy",
    "quiesce",
    "peer_listen",
    "kafka_listen",
    "kafka_advertised",
    "http_listen",
    "archive",
    "archive_endpoint",
    "archive.endpoint",
    "http_allowed_hosts",
    "http.allowed.hosts",
    "cluster_id",
    "cluster_secret_file",
    "event_loop",
    "tls_ca",
    "tls_cert",
    "tls_key",
    "tls.ca",
    "tls.cert",
    "tls.key",
    "tls_client_auth",
    "tls.client.auth",
    "authorization",
    "super_users",
    "super.users",
    "admin_token_file",
    "insecure",
}
_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def _flag(values: dict[str, Any], key: str) -> bool:
    """A boolean setting: TOML's true/false, or --set's words for them (`insecure=false` is
    false; anything else is refused)."""
    value = values[key]
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise InvalidConfig(f"{key}: {value!r} is not true or false", key=key)


def _check_known(values: dict[str, Any]) -> None:
    unknown = sorted(k for k in values if k not in KNOWN_SETTINGS)
    if unknown:
        key = unknown[0]
        near = difflib.get_close_matches(key, sorted(KNOWN_SETTINGS), n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise InvalidConfig(f"unknown node setting {key!r}{hint}", key=key)


def node_config_from(values: dict[str, Any]) -> NodeConfig:
    """Build a NodeConfig from merged TOML and CLI values (CLI wins, done by the caller)."""
    _check_known(values)
    hosts = values.get("http_allowed_hosts") or values.get("http.allowed.hosts") or ()
    if isinstance(hosts, str):
        hosts = [h for h in hosts.split(",") if h.strip()]
    allowed_hosts = tuple(str(h).strip().lower() for h in hosts)
    data = values.get("data") or values.get("data_dir")
    if not data:
        raise InvalidConfig("a data directory is required (--data)", key="data")
    peers_raw = values.get("peers", {})
    if isinstance(peers_raw, str):
        peers, peer_ports = parse_peer_entries(peers_raw)
    else:
        entries = ",".join(f"{k}={v}" for k, v in dict(peers_raw).items())
        peers, peer_ports = parse_peer_entries(entries)
    defaults = TopicConfig.from_mapping(dict(values.get("defaults", {})))
    kwargs: dict[str, Any] = {}
    for key, name in _INT_SETTINGS.items():
        if key in values:
            try:
                kwargs[name] = int(values[key])
            except (TypeError, ValueError):
                raise InvalidConfig(f"{key}: {values[key]!r} is not an integer", key=key) from None
    for flag in ("zero_copy", "quiesce"):
        if flag in values:
            kwargs[flag] = _flag(values, flag)
    for key in ("peer_listen", "kafka_listen", "kafka_advertised", "http_listen"):
        if values.get(key):
            kwargs[key] = parse_address(str(values[key]))
    if allowed_hosts:
        kwargs["http_allowed_hosts"] = allowed_hosts
    if values.get("archive"):
        from tidelog.archive.store import open_store

        kwargs["archive"] = str(values["archive"])
        endpoint = values.get("archive_endpoint") or values.get("archive.endpoint") or ""
        kwargs["archive_endpoint"] = str(endpoint)
        open_store(kwargs["archive"], kwargs["archive_endpoint"])  # a bad URL fails here, named
    join = values.get("join")
    if join:
        items = join if isinstance(join, list) else str(join).split(",")
        kwargs["join"] = tuple(parse_address(str(a).strip()) for a in items if str(a).strip())
    if values.get("cluster_id"):
        kwargs["cluster_id"] = str(values["cluster_id"])
    tls = TlsFiles.of(
        *(values.get(f"tls_{k}") or values.get(f"tls.{k}") for k in ("ca", "cert", "key"))
    )
    if tls is not None:
        kwargs["tls"] = tls
    client_auth = values.get("tls_client_auth") or values.get("tls.client.auth")
    if client_auth:
        kwargs["tls_client_auth"] = str(client_auth)
    authorization = values.get("authorization")
    if authorization:
        try:
            kwargs["authorization"] = Authorization(str(authorization))
        except ValueError:
            raise InvalidConfig(
                f"authorization must be none or acl, not {authorization!r}", key="authorization"
            ) from None
    supers = values.get("super_users") or values.get("super.users") or []
    if isinstance(supers, str):
        supers = [s for s in supers.split(";") if s.strip()]  # Kafka's separator
    kwargs["super_users"] = frozenset(str(s).strip() for s in supers)
    admin_file = values.get("admin_token_file")
    if admin_file:
        kwargs["admin_token"] = read_admin_token(Path(str(admin_file)))
    if "insecure" in values:
        kwargs["insecure"] = _flag(values, "insecure")
    secret_file = values.get("cluster_secret_file")
    if secret_file:
        kwargs["cluster_secret"] = read_secret(Path(str(secret_file)))
    elif os.environ.get(SECRET_ENV):
        check_cluster_secret(os.environ[SECRET_ENV].strip().encode(), SECRET_ENV)
        kwargs["cluster_secret"] = os.environ[SECRET_ENV].encode()
    node_id = int(values.get("node_id", 1))
    listen = values.get("listen")
    if listen:
        listen_addr = parse_address(str(listen))
    elif node_id in peers:
        listen_addr = peers[node_id]
    else:
        listen_addr = ("127.0.0.1", 7100)
    return NodeConfig(
        data_dir=Path(str(data)),
        node_id=node_id,
        listen=listen_addr,
        peers=peers,
        peer_ports=peer_ports,
        topic_defaults=defaults,
        **kwargs,
    )
