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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tidelog.acls import ANONYMOUS
from tidelog.config import InvalidConfig, TopicConfig, parse_address
from tidelog.errors import StorageError
from tidelog.features import MAX_LEVEL, MIN_LEVEL
from tidelog.node.access import Authorization
from tidelog.principals import PRINCIPAL_NAME
from tidelog.storage import versioned_text
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
    # controlled.shutdown.timeout.ms: on SIGTERM the node first hands every leadership it holds
    # to an in-sync replica (Kafka's controlled shutdown), waiting at most this long; 0: it
    # stops at once, and the other nodes elect new leaders after an election timeout.
    controlled_shutdown_timeout_ms: int = 5_000
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
    # feature.max.level: the highest tidelog.version level this node announces and runs at
    # (0: this build's highest). For testing upgrades only: a node that acts as an older build
    # (docs/operations.md, "Feature levels and upgrades").
    feature_max_level: int = 0

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
            ("controlled.shutdown.timeout.ms", self.controlled_shutdown_timeout_ms, 0),
        ):
            if value < least:
                raise InvalidConfig(f"{key} must be at least {least}, got {value}", key=key)
        self.check_batch_fits(self.topic_defaults.max_message_bytes)
        if self.feature_max_level and not MIN_LEVEL <= self.feature_max_level <= MAX_LEVEL:
            raise InvalidConfig(
                f"feature.max.level must be {MIN_LEVEL}..{MAX_LEVEL} (0: {MAX_LEVEL}), got "
                f"{self.feature_max_level}",
                key="feature.max.level",
            )
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
    """The cluster secret in a file: the secret alone (what an operator makes, and every
    release reads), or the versioned form `cluster up` writes from feature level 2
    (storage/versioned_text.py; one of a newer version is UnsupportedFormatVersion)."""
    raw = _read_secret_file(path, "cluster_secret_file", "the cluster secret")
    try:
        secret = versioned_text.decode(versioned_text.CLUSTER_SECRET, raw, str(path)).value
    except StorageError as exc:
        raise InvalidConfig(exc.message, key="cluster_secret_file") from exc
    return check_cluster_secret(secret, str(path))


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


# -- reading the settings: a table of NodeConfig fields, the names each is read under (its own,
# then the name Kafka or tidelog's docs give it) and how its value is read ---------------------

Values = Mapping[str, Any]
# What fills some fields of a NodeConfig from the settings given (none when none is given).
Reader = Callable[[Values], dict[str, Any]]


@dataclass(frozen=True)
class Setting:
    """A NodeConfig field read from one setting, under any of its names."""

    field: str
    names: tuple[str, ...]
    read: Callable[[str, Any], Any]  # (the name it was given under, its value) -> the field
    # every: each name given is read and the last wins, and 0 or false counts as given (numbers,
    # flags); else only the first name whose value is not empty is read.
    every: bool = False

    def __call__(self, values: Values) -> dict[str, Any]:
        read: dict[str, Any] = {}
        for name in self.names:
            if self.every and name in values:
                read[self.field] = self.read(name, values[name])
            elif not self.every and values.get(name):
                return {self.field: self.read(name, values[name])}
        return read


_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def _flag(key: str, value: Any) -> bool:
    """A boolean setting: TOML's true/false, or --set's words for them (`insecure=false` is
    false; anything else is refused)."""
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise InvalidConfig(f"{key}: {value!r} is not true or false", key=key)


def _integer(key: str, value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise InvalidConfig(f"{key}: {value!r} is not an integer", key=key) from None


def _text(key: str, value: Any) -> str:
    return str(value)


def _address(key: str, value: Any) -> tuple[str, int]:
    return parse_address(str(value))


def _addresses(key: str, value: Any) -> tuple[tuple[str, int], ...]:
    """A list (TOML) or HOST:PORT,HOST:PORT (a flag)."""
    items = value if isinstance(value, list) else str(value).split(",")
    return tuple(parse_address(str(a).strip()) for a in items if str(a).strip())


def _host_names(key: str, value: Any) -> tuple[str, ...]:
    hosts = [h for h in value.split(",") if h.strip()] if isinstance(value, str) else value
    return tuple(str(h).strip().lower() for h in hosts)


def _authorization(key: str, value: Any) -> Authorization:
    try:
        return Authorization(str(value))
    except ValueError:
        raise InvalidConfig(f"authorization must be none or acl, not {value!r}", key=key) from None


def _principal_names(key: str, value: Any) -> frozenset[str]:
    """A list (TOML) or NAME;NAME (";" separates them in Kafka's super.users)."""
    names = [s for s in value.split(";") if s.strip()] if isinstance(value, str) else value
    return frozenset(str(s).strip() for s in names)


def _admin_token(key: str, value: Any) -> tuple[str, str]:
    return read_admin_token(Path(str(value)))


def _archive(values: Values) -> dict[str, Any]:
    """The archive's URL and its store's endpoint, opened once so that a bad URL fails at
    start, by name."""
    if not values.get("archive"):
        return {}
    from tidelog.archive.store import open_store

    url = str(values["archive"])
    endpoint = str(values.get("archive_endpoint") or values.get("archive.endpoint") or "")
    open_store(url, endpoint)
    return {"archive": url, "archive_endpoint": endpoint}


def _tls(values: Values) -> dict[str, Any]:
    tls = TlsFiles.of(
        *(values.get(f"tls_{k}") or values.get(f"tls.{k}") for k in ("ca", "cert", "key"))
    )
    return {} if tls is None else {"tls": tls}


def _cluster_secret(values: Values) -> dict[str, Any]:
    """From its file, else from the environment (checked as strictly)."""
    secret_file = values.get("cluster_secret_file")
    if secret_file:
        return {"cluster_secret": read_secret(Path(str(secret_file)))}
    if os.environ.get(SECRET_ENV):
        check_cluster_secret(os.environ[SECRET_ENV].strip().encode(), SECRET_ENV)
        return {"cluster_secret": os.environ[SECRET_ENV].encode()}
    return {}


def _int(field: str, *other_names: str) -> Setting:
    return Setting(field, (field, *other_names), _integer, every=True)


# In the order they are read: of several bad settings, the first here is the one named.
_SETTINGS: tuple[Reader, ...] = (
    _int("tick_ms"),
    _int("election_timeout_ms"),
    _int("election_jitter_ms"),
    _int("replica_fetch_wait_max_ms"),
    _int("replica_fetch_max_bytes"),
    _int("flush_threads"),
    _int("checkpoint_interval_ms"),
    _int("metadata_snapshot_entries"),
    _int("storage_max_bytes", "storage.max.bytes"),
    _int("max_partitions_per_node", "max.partitions.per.node"),
    _int("controlled_shutdown_timeout_ms", "controlled.shutdown.timeout.ms"),
    _int("peer_handshake_timeout_ms"),
    _int("frame_bytes_max", "socket.request.max.bytes"),
    _int("queued_max_request_bytes", "queued.max.request.bytes"),
    _int("max_inflight_requests", "max.inflight.requests.per.connection"),
    _int("max_connections", "max.connections"),
    _int("max_connections_per_ip", "max.connections.per.ip"),
    _int("idle_timeout_ms", "connections.max.idle.ms"),
    _int("request_receive_timeout_ms", "request.receive.timeout.ms"),
    _int("fd_reserve", "fd.reserve"),
    _int("fetch_max_bytes", "fetch.max.bytes"),
    _int("feature_max_level", "feature.max.level"),
    Setting("zero_copy", ("zero_copy",), _flag, every=True),
    Setting("quiesce", ("quiesce",), _flag, every=True),
    Setting("peer_listen", ("peer_listen",), _address),
    Setting("kafka_listen", ("kafka_listen",), _address),
    Setting("kafka_advertised", ("kafka_advertised",), _address),
    Setting("http_listen", ("http_listen",), _address),
    Setting("http_allowed_hosts", ("http_allowed_hosts", "http.allowed.hosts"), _host_names),
    _archive,
    Setting("join", ("join",), _addresses),
    Setting("cluster_id", ("cluster_id",), _text),
    _tls,
    Setting("tls_client_auth", ("tls_client_auth", "tls.client.auth"), _text),
    Setting("authorization", ("authorization",), _authorization),
    Setting("super_users", ("super_users", "super.users"), _principal_names),
    Setting("admin_token", ("admin_token_file",), _admin_token),
    Setting("insecure", ("insecure",), _flag, every=True),
    _cluster_secret,
)
_TABLE_NAMES = [name for s in _SETTINGS if isinstance(s, Setting) for name in s.names]
NODE_SETTINGS = sorted(
    name
    for s in _SETTINGS
    if isinstance(s, Setting) and s.read is _integer
    for name in s.names
    if "." in name
)
# Every key node_config_from reads (TOML, --set and serve's flags): any other is refused, so
# that a misspelt setting is never silently left at its default. Besides the table's Settings:
# node_config_from's own, and those _archive, _tls and _cluster_secret read.
KNOWN_SETTINGS = frozenset(_TABLE_NAMES) | {
    "data",
    "data_dir",
    "node_id",
    "listen",
    "peers",
    "defaults",
    "event_loop",
    "archive",
    "archive_endpoint",
    "archive.endpoint",
    "tls_ca",
    "tls_cert",
    "tls_key",
    "tls.ca",
    "tls.cert",
    "tls.key",
    "cluster_secret_file",
}


def _check_known(values: Values) -> None:
    unknown = sorted(k for k in values if k not in KNOWN_SETTINGS)
    if unknown:
        key = unknown[0]
        near = difflib.get_close_matches(key, sorted(KNOWN_SETTINGS), n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise InvalidConfig(f"unknown node setting {key!r}{hint}", key=key)


def _peers(raw: Any) -> tuple[dict[int, tuple[str, int]], dict[int, int]]:
    """A string (a flag's ID=HOST:PORT,...) or a table {ID = "HOST:PORT"} (TOML)."""
    if isinstance(raw, str):
        return parse_peer_entries(raw)
    return parse_peer_entries(",".join(f"{k}={v}" for k, v in dict(raw).items()))


def _listen(values: Values, node_id: int, peers: dict[int, tuple[str, int]]) -> tuple[str, int]:
    """Given, else this node's address among the peers, else the default."""
    if values.get("listen"):
        return parse_address(str(values["listen"]))
    return peers.get(node_id, ("127.0.0.1", 7100))


def node_config_from(values: dict[str, Any]) -> NodeConfig:
    """Build a NodeConfig from merged TOML and CLI values (CLI wins, done by the caller)."""
    _check_known(values)
    data = values.get("data") or values.get("data_dir")
    if not data:
        raise InvalidConfig("a data directory is required (--data)", key="data")
    peers, peer_ports = _peers(values.get("peers", {}))
    defaults = TopicConfig.from_mapping(dict(values.get("defaults", {})))
    kwargs: dict[str, Any] = {}
    for reader in _SETTINGS:
        kwargs.update(reader(values))
    node_id = int(values.get("node_id", 1))
    return NodeConfig(
        data_dir=Path(str(data)),
        node_id=node_id,
        listen=_listen(values, node_id, peers),
        peers=peers,
        peer_ports=peer_ports,
        topic_defaults=defaults,
        **kwargs,
    )
