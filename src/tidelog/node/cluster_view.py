"""The cluster as this node knows it, read-only: what the listeners over the core (the Kafka
broker, the HTTP listener, `/metrics`) read of the metadata log's state, of the replicas this
node hosts, of the registry of nodes and of what the node counted.

The core builds one (`NodeCore.view`) and the listeners read through it rather than reaching
into the core's parts. Everything it returns is read-only: Mappings over the metadata, frozen
dataclasses (the typed status of node/status.py among them), tuples and numbers. A change still
goes through the core's door, `NodeCore.handle` (the Kafka group coordinator's records, through
`NodeCore.propose_metadata`).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

from tidelog.node.archiver import Archiver
from tidelog.node.cleaner import Cleaner
from tidelog.node.config import NodeConfig
from tidelog.node.feature_levels import FeatureLevels
from tidelog.node.metadata_log import MetadataLog
from tidelog.node.metrics import Counters, Histograms, Labels
from tidelog.node.partition import PartitionHost
from tidelog.node.registry import NodeRegistry
from tidelog.node.status import PartitionStatus
from tidelog.replication.liveness import Liveness
from tidelog.replication.metadata import NodeEntry, TopicMeta, validate_alter
from tidelog.replication.metadata_transactions import Transaction
from tidelog.storage.identity import DirectoryIdentity


class CursorRecord(Protocol):
    """A cursor as the metadata log keeps it (replication/metadata.py's Cursor), read-only."""

    @property
    def name(self) -> str: ...

    @property
    def topic(self) -> str: ...

    @property
    def positions(self) -> Mapping[int, int]: ...

    @property
    def invalidated(self) -> str: ...

    @property
    def live(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class ReplicaOffsets:
    """A replica hosted here: the offsets that bound what a reader may read."""

    log_start_offset: int  # the whole log's (the archive's, when it holds what is below)
    high_watermark: int
    log_end_offset: int


@dataclass(frozen=True, slots=True)
class ArchiveFigures:
    """How far a replica of an archived topic is in the archive."""

    archived_end: int  # offsets below it are archived (-1: nothing known yet)
    lag_bytes: int  # on this replica's disk, not yet archived
    error: str  # the name of the error the last attempt met ("" if it worked)


@dataclass(frozen=True, slots=True)
class PartitionFigures:
    """One replica's figures, as `/metrics` exports them: its typed status (the one `tidelog
    status` answers with, its LWM as the cleaner cached it), and what the status lacks."""

    status: PartitionStatus
    log_start_offset: int  # the whole log's (the archive's, when it holds what is below)
    archive: ArchiveFigures | None  # None: its topic is not archived
    compaction_ratio: float  # the last compaction's bytes after / bytes before (1: none yet)
    min_insync_replicas: int


HistogramFigures = tuple[
    str, Labels, Sequence[tuple[str, int]], float
]  # name, labels, (le, n), sum


class ClusterView:
    """Read-only: every method reads the node's state as it is now, on the event loop."""

    def __init__(
        self,
        *,
        node_id: int,
        config: Callable[[], NodeConfig],
        identity: Callable[[], DirectoryIdentity],
        metadata: MetadataLog,
        hosts: Mapping[str, PartitionHost],
        registry: NodeRegistry,
        liveness: Liveness,
        features: FeatureLevels,
        cleaner: Cleaner,
        archiver: Archiver | None,
        log_start_offset: Callable[[PartitionHost], int],
        stored_bytes: Callable[[], int],
        counters: Counters,
        histograms: Histograms,
    ) -> None:
        self.node_id = node_id
        self._config = config  # the node's, as it is now (a joining node's changes at start)
        self._identity = identity
        self._metadata = metadata
        self._hosts = hosts
        self._registry = registry
        self._liveness = liveness
        self._features = features
        self._cleaner = cleaner
        self._archiver = archiver
        self._log_start_offset = log_start_offset
        self._stored_bytes = stored_bytes
        self._counters = counters
        self._histograms = histograms

    # -- this node ------------------------------------------------------------------------------

    @property
    def config(self) -> NodeConfig:
        return self._config()

    @property
    def cluster_id(self) -> str:
        return self._identity().cluster_id

    @property
    def directory_id(self) -> str:
        return self._identity().directory_id

    def stored_bytes(self) -> int:
        """Bytes of segments this node stores."""
        return self._stored_bytes()

    def disk_usage(self) -> dict[str, int]:
        return disk_usage(self.config.data_dir)

    @property
    def cleaner_passes(self) -> int:
        return self._cleaner.passes

    def counters(self) -> Iterator[tuple[str, Labels, int]]:
        """What the node counted, by name and labels (node/metrics.py)."""
        return self._counters.items()

    def histograms(self) -> Iterator[HistogramFigures]:
        """Each histogram's cumulative buckets and sum (node/metrics.py)."""
        for name, labels, histogram in self._histograms.items():
            yield name, labels, histogram.cumulative(), histogram.sum

    # -- the metadata log -----------------------------------------------------------------------

    @property
    def metadata_leader(self) -> int:
        """The node that leads the metadata log (-1: none known)."""
        return self._metadata.host.replica.leader_id

    @property
    def metadata_epoch(self) -> int:
        return self._metadata.host.replica.epoch

    @property
    def is_metadata_leader(self) -> bool:
        return self._metadata.host.replica.is_leader

    def metadata_behind(self) -> str:
        """Why this node's metadata may lack committed commands ("" if current)."""
        return self._metadata.behind()

    @property
    def applied_offset(self) -> int:
        """Metadata log entries this node has applied."""
        return self._metadata.state.applied_offset

    @property
    def finalized_level(self) -> int:
        """The cluster's finalized level of tidelog.version, as this node applied it
        (tidelog/features.py; node/feature_levels.py's subscribe follows its changes)."""
        return self._features.finalized

    @property
    def topics(self) -> Mapping[str, TopicMeta]:
        return MappingProxyType(self._metadata.state.topics)

    def topic(self, name: str) -> TopicMeta:
        """The topic of that name (UnknownTopicOrPartition if there is none)."""
        return self._metadata.state.topic(name)

    def check_alter_topic(self, name: str, configs: dict[str, str], delete: list[str]) -> None:
        """Would altering the topic's configs so be accepted? (As the metadata leader checks
        it: InvalidConfig, UnknownTopicOrPartition if not.)"""
        validate_alter(self._metadata.state, name, configs, delete)

    @property
    def cursors(self) -> Mapping[str, CursorRecord]:
        return MappingProxyType(self._metadata.state.cursors)

    @property
    def transactions(self) -> Mapping[str, Transaction]:
        """Kafka transactions by transactional id, as this node applied them (do not change
        them: replication/metadata_transactions.py)."""
        return MappingProxyType(self._metadata.state.transactions.by_id)

    @property
    def kafka_groups(self) -> Mapping[str, Mapping[str, Any]]:
        """Kafka consumer groups' membership as their coordinator last settled it."""
        return MappingProxyType(self._metadata.state.groups)

    @property
    def principals(self) -> Mapping[str, Mapping[str, Any]]:
        """Principals that authenticate with a token (hashes and SCRAM credentials only)."""
        return MappingProxyType(self._metadata.state.principals)

    # -- the cluster's nodes --------------------------------------------------------------------

    def nodes(self) -> Mapping[int, NodeEntry]:
        """Every node of the cluster (node/registry.py), draining ones too."""
        return self._registry.nodes()

    def placeable_nodes(self) -> tuple[int, ...]:
        """Nodes new replicas may be placed on."""
        return tuple(self._registry.placeable())

    def peers_alive(self) -> tuple[tuple[int, bool], ...]:
        """Each peer, by id, and whether this node hears its heartbeats (or anything else)."""
        return tuple(
            (peer, self._liveness.is_alive(peer))
            for peer in sorted(self._registry.peer_nodes())
            if peer != self.node_id
        )

    # -- the replicas hosted here ---------------------------------------------------------------

    def is_hosted(self, topic: str, partition: int) -> bool:
        """Does this node host a replica of the partition?"""
        return f"{topic}/{partition}" in self._hosts

    def leader(self, topic: str, partition: int) -> tuple[int, int] | None:
        """(leader, epoch) as this node's replica knows them; None: no replica here."""
        host = self._hosts.get(f"{topic}/{partition}")
        if host is None:
            return None
        return host.replica.leader_id, host.replica.epoch

    def in_sync_replicas(self, topic: str, partition: int) -> tuple[int, ...] | None:
        """The replicas in sync, sorted, where this node leads the partition; else None."""
        host = self._hosts.get(f"{topic}/{partition}")
        if host is None or not host.replica.is_leader:
            return None
        return tuple(sorted(host.replica.in_sync_replicas()))

    def offsets(self, topic: str, partition: int) -> ReplicaOffsets | None:
        """The replica's offsets now; None: no replica here."""
        host = self._hosts.get(f"{topic}/{partition}")
        if host is None:
            return None
        hlog = host.log
        return ReplicaOffsets(
            self._log_start_offset(host), hlog.high_watermark, hlog.log_end_offset
        )

    def epoch_end_offset(self, topic: str, partition: int, epoch: int) -> tuple[int, int] | None:
        """Where this replica's log ends a leader epoch (KIP-279): (the largest epoch <= epoch
        it holds, -1 if none; the offset after that epoch's last entry); None: no replica here.
        (The Kafka listener's OffsetForLeaderEpoch.)"""
        host = self._hosts.get(f"{topic}/{partition}")
        if host is None:
            return None
        hlog = host.log
        return hlog.epochs.end_offset_for(epoch, hlog.log_end_offset)

    def quiesced_replicas(self) -> int:
        """Replicas of idle groups that stopped talking (the metadata log's included)."""
        return sum(1 for h in self._hosts.values() if h.replica.quiescent)

    def partition_figures(self) -> Iterator[PartitionFigures]:
        """Every partition replica hosted here (not the metadata log's), by topic and
        partition."""
        metadata_host = self._metadata.host
        hosts = sorted(
            (h for h in self._hosts.values() if h is not metadata_host),
            key=lambda h: (h.topic, h.partition),
        )
        cleaner, archiver = self._cleaner, self._archiver
        for host in hosts:
            status = host.status(cleaner.cached_low_watermark(host))
            start = self._log_start_offset(host)
            fact = cleaner.archive_fact(host)
            archive = None
            if fact is not None:
                known = archiver.state(host).archived_end if archiver is not None else None
                archive = ArchiveFigures(-1 if known is None else known, fact.lag_bytes, fact.error)
            yield PartitionFigures(
                status, start, archive, host.compaction_ratio, host.config.min_insync_replicas
            )


def disk_usage(directory: Path) -> dict[str, int]:
    """The data directory's disk, as status and the console show it."""
    try:
        disk = shutil.disk_usage(directory)
    except OSError:
        return {}
    return {"disk_free_bytes": disk.free, "disk_total_bytes": disk.total}
