"""What this node knows of its peers' data directories (storage/identity.py): the first directory
each peer proved itself with on the peer channel (kept durably), and the one it shows now.

A replica group that never recorded a voter's directory still knows the one it first had from
here; a peer that comes back with another one lost its disk, and rejoins every group as an
observer until it holds what is committed (replication/directories.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path

from tidelog.node.metrics import Counters
from tidelog.replication.directories import decode_directories
from tidelog.storage.checkpoint import read_checkpoint, write_checkpoint

log = logging.getLogger(__name__)

PEER_DIRECTORIES_FILE = "peer-directories"


class PeerDirectories:
    def __init__(self, data_dir: Callable[[], Path], counters: Counters) -> None:
        self.data_dir = data_dir
        self.counters = counters
        self.first: dict[int, str] = {}  # each peer's first directory (durable)
        self.initial: dict[int, str] = {}  # from the cluster's format (meta.properties)
        self.current: dict[int, str] = {}  # as each peer's last handshake said

    def load(self, initial_directories: str) -> None:
        """The initial directories this node was formatted with, then those first seen on the
        peer channel (their file)."""
        self.initial = decode_directories(initial_directories)
        stored = read_checkpoint(self.data_dir() / PEER_DIRECTORIES_FILE) or {}
        self.first.update(self.initial)
        self.first.update({int(k): str(v) for k, v in stored.items()})

    def seen(self, node: int, directory: str) -> None:
        """A peer proved itself with this data directory. The first one is recorded (durably,
        before any of its messages is read); another one later means it lost its disk."""
        if not directory:
            return
        self.current[node] = directory
        first = self.first.get(node)
        if first is None:
            self.first[node] = directory
            write_checkpoint(
                self.data_dir() / PEER_DIRECTORIES_FILE,
                {str(n): d for n, d in self.first.items() if n not in self.initial},
            )
        elif first != directory:
            self.counters.inc("tidelog_peer_directory_changes_total")
            log.warning(
                "node %d came back with another data directory (%s, first seen %s): it "
                "rejoins each partition as an observer until it holds what is committed",
                node,
                directory,
                first,
            )

    def replaced(self, admitted: Mapping[int, str]) -> list[int]:
        """Peers that came back with a data directory the cluster's metadata log has not
        admitted (yet): replaced disks, catching up as observers."""
        out = []
        for node, current in sorted(self.current.items()):
            known = admitted.get(node) or self.first.get(node)
            if known is not None and known != current:
                out.append(node)
        return out
