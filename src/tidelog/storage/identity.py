"""A data directory's identity, written once when the directory is first formatted (Kafka's
meta.properties): the cluster it belongs to, the node it belongs to, and a random directory id.

The directory id is what lets the other replicas tell a node that kept its disk from one that
came back empty under the same node id: a replaced disk gets a new directory id, and a replica
whose directory id changed rejoins as an observer until it holds everything committed again
(replication/admission.py). A directory that belongs to another cluster or another node id is
refused: serving it would mix two logs.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

from tidelog.errors import InconsistentClusterId, NodeIdentityError, StorageError
from tidelog.formats import check_version
from tidelog.storage.checkpoint import read_checkpoint
from tidelog.storage.durable import write_file

META_FILE = "meta.properties"
LEGACY_NODE_FILE = "node.checkpoint"  # before directory ids: {"node_id": N}
VERSION = 1  # of meta.properties (tidelog/formats.py); 0.1.0 wrote 1 and never checked it


@dataclass(frozen=True)
class DirectoryIdentity:
    cluster_id: str
    node_id: int
    directory_id: str
    formatted: bool = False  # this start wrote it (a new or replaced disk, or an upgrade)
    # Every initial voter's directory, "id=dir,...", when the cluster was formatted as a whole
    # (KIP-853's initial controllers): a replaced disk is then known as replaced from the start.
    initial_directories: str = ""

    def properties(self) -> str:
        text = (
            "# tidelog data directory identity: written once, never edit\n"
            f"version={VERSION}\n"
            f"cluster.id={self.cluster_id}\n"
            f"node.id={self.node_id}\n"
            f"directory.id={self.directory_id}\n"
        )
        if self.initial_directories:
            text += f"initial.directories={self.initial_directories}\n"
        return text


def new_id() -> str:
    return uuid.uuid4().hex[:22]


def load_or_format(
    data_dir: Path, node_id: int, cluster_id: str = "", default_cluster_id: str = ""
) -> DirectoryIdentity:
    """The directory's identity; a directory without one is formatted now (with cluster_id,
    else default_cluster_id, else a new id). NodeIdentityError / InconsistentClusterId if it
    belongs to another node, or to another cluster than cluster_id (when given)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    stored = read_identity(data_dir)
    if stored is not None:
        check(stored, data_dir, node_id, cluster_id)
        return stored
    legacy = read_checkpoint(data_dir / LEGACY_NODE_FILE)
    if legacy is not None and int(legacy.get("node_id", -1)) != node_id:
        raise NodeIdentityError(
            f"data directory {data_dir} belongs to node {legacy.get('node_id')}, not node {node_id}"
        )
    identity = DirectoryIdentity(
        cluster_id or default_cluster_id or new_id(), node_id, new_id(), formatted=True
    )
    try:
        write_file(data_dir / META_FILE, identity.properties().encode(), exclusive=True)
    except StorageError as exc:
        if (data_dir / META_FILE).exists():
            raise StorageError(f"{data_dir} was formatted by another process just now") from exc
        raise
    (data_dir / LEGACY_NODE_FILE).unlink(missing_ok=True)
    return identity


def format_cluster(cluster_id: str, data_dirs: dict[int, Path]) -> dict[int, DirectoryIdentity]:
    """Format a new cluster's directories together (`cluster up`, Kafka's kafka-storage format
    with --initial-controllers): each records every initial voter's directory id, so that no
    node ever takes a replaced disk's first word for its identity."""
    ids = {node: new_id() for node in data_dirs}
    initial = ",".join(f"{node}={d}" for node, d in sorted(ids.items()))
    out = {}
    for node, data_dir in data_dirs.items():
        data_dir.mkdir(parents=True, exist_ok=True)
        identity = DirectoryIdentity(cluster_id, node, ids[node], True, initial)
        write_file(data_dir / META_FILE, identity.properties().encode(), exclusive=True)
        out[node] = identity
    return out


def check(stored: DirectoryIdentity, data_dir: Path, node_id: int, cluster_id: str) -> None:
    if stored.node_id != node_id:
        raise NodeIdentityError(
            f"data directory {data_dir} belongs to node {stored.node_id}, not node {node_id}",
            directory_id=stored.directory_id,
        )
    if cluster_id and stored.cluster_id != cluster_id:
        raise InconsistentClusterId(
            f"data directory {data_dir} belongs to cluster {stored.cluster_id}, "
            f"not cluster {cluster_id}",
            stored=stored.cluster_id,
            expected=cluster_id,
        )


def read_identity(data_dir: Path) -> DirectoryIdentity | None:
    try:
        text = (data_dir / META_FILE).read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise StorageError(f"cannot read {data_dir / META_FILE}: {exc}") from exc
    values: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    path = data_dir / META_FILE
    try:
        version = int(values.get("version", "1"))
    except ValueError as exc:
        raise StorageError(f"{path} is damaged (bad version {values['version']!r})") from exc
    check_version("meta.properties", version, str(path))
    try:
        return DirectoryIdentity(
            values["cluster.id"],
            int(values["node.id"]),
            values["directory.id"],
            initial_directories=values.get("initial.directories", ""),
        )
    except (KeyError, ValueError) as exc:
        raise StorageError(f"{path} is damaged (missing or bad {exc})") from exc
