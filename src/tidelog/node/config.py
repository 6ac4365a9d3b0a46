"""A node's configuration: CLI flags, or the same keys in a TOML file (`--config`).

node_id = 1
listen = "127.0.0.1:7101"
data = "/var/lib/tidelog"
peers = "1=127.0.0.1:7101,2=127.0.0.1:7102,3=127.0.0.1:7103"   # or a table {1 = "host:port"}

[defaults]            # topic defaults for topics created on this cluster (Kafka names)
"segment.bytes" = 1073741824
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tidelog.config import InvalidConfig, TopicConfig


def parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidConfig(f"address {text!r} is not HOST:PORT", key="address")
    return host, int(port)


def parse_peers(text: str) -> dict[int, tuple[str, int]]:
    peers: dict[int, tuple[str, int]] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        node, sep, address = item.partition("=")
        if not sep or not node.strip().isdigit():
            raise InvalidConfig(f"peer {item!r} is not ID=HOST:PORT", key="peers")
        peers[int(node)] = parse_address(address)
    return peers


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
    replica_fetch_max_bytes: int = 4 * 1024 * 1024
    frame_bytes_max: int = 64 * 1024 * 1024
    zero_copy: bool = True
    flush_threads: int = 4
    checkpoint_interval_ms: int = 1000
    metadata_segment_bytes: int = 16 * 1024 * 1024
    metadata_snapshot_entries: int = 1000
    storage_max_bytes: int = -1  # storage.max.bytes: refuse produce (StorageFull) past it

    def __post_init__(self) -> None:
        if self.node_id < 0:
            raise InvalidConfig("node id must be >= 0", key="node_id")
        if self.peers and self.node_id not in self.peers:
            raise InvalidConfig(
                f"node {self.node_id} is not among the peers {sorted(self.peers)}", key="peers"
            )
        if self.tick_ms < 1 or self.election_timeout_ms < 5 * self.tick_ms:
            raise InvalidConfig("election.timeout.ms must be at least 5 ticks", key="tick_ms")

    @property
    def voters(self) -> tuple[int, ...]:
        return tuple(sorted(self.peers)) if self.peers else (self.node_id,)

    @property
    def advertised(self) -> tuple[str, int]:
        return self.peers.get(self.node_id, self.listen)

    def ticks(self, ms: int) -> int:
        return max(1, ms // self.tick_ms)

    def with_listen_port(self, port: int) -> NodeConfig:
        """After binding port 0: the real port, and the peer table agrees."""
        peers = dict(self.peers)
        if self.node_id in peers:
            peers[self.node_id] = (peers[self.node_id][0], port)
        return replace(self, listen=(self.listen[0], port), peers=peers)


def load_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InvalidConfig(f"cannot read config file {path}: {exc}", key="config") from exc


def node_config_from(values: dict[str, Any]) -> NodeConfig:
    """Build a NodeConfig from merged TOML and CLI values (CLI wins, done by the caller)."""
    data = values.get("data") or values.get("data_dir")
    if not data:
        raise InvalidConfig("a data directory is required (--data)", key="data")
    peers_raw = values.get("peers", {})
    if isinstance(peers_raw, str):
        peers = parse_peers(peers_raw)
    else:
        peers = {int(k): parse_address(str(v)) for k, v in dict(peers_raw).items()}
    defaults = TopicConfig.from_mapping(dict(values.get("defaults", {})))
    kwargs: dict[str, Any] = {}
    for key in (
        "tick_ms",
        "election_timeout_ms",
        "election_jitter_ms",
        "replica_fetch_wait_max_ms",
        "replica_fetch_max_bytes",
        "frame_bytes_max",
        "flush_threads",
        "checkpoint_interval_ms",
        "storage_max_bytes",
        "metadata_snapshot_entries",
    ):
        if key in values:
            kwargs[key] = int(values[key])
    if "storage.max.bytes" in values:
        kwargs["storage_max_bytes"] = int(values["storage.max.bytes"])
    if "zero_copy" in values:
        kwargs["zero_copy"] = bool(values["zero_copy"])
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
        topic_defaults=defaults,
        **kwargs,
    )
