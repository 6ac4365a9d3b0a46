"""The node's figures in Prometheus's text format (`GET /metrics`): read through the node's
cluster view (node/cluster_view.py) when scraped, never kept twice. Per partition replica: the
offsets that bound its zones (log start, LWM, HW, LEO), its size, leader and epoch; on the
leader, the in-sync set and the hold that sets the LWM; per cursor, how far it trails and how
long it has been idle. Then what the node counted (node/metrics.py), its disk, and the cleaner's
work.

Each partition's figures are its typed status (node/status.py), the one `tidelog status` answers
with; its LWM the cached one (cleaner.cached_low_watermark), so a scrape of many idle partitions
reads each LWM rather than deciding it again.

The families are tables (METADATA_AND_STORAGE, REPLICAS_AND_FILES, PARTITION_METRICS): a name,
its type and help, and what reads its value; their order is the order of the text."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from tidelog.features import FEATURE
from tidelog.invariant import InvariantBroken
from tidelog.node.cluster_view import ArchiveFigures, ClusterView, PartitionFigures
from tidelog.node.turns import Turns
from tidelog.replication.low_watermark import LowWatermark
from tidelog.storage.descriptors import SEGMENT_FILES
from tidelog.version import __version__

# What generate_latest writes: the classic text format.
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
PARTITION = ["topic", "partition"]


def snapshot(view: ClusterView) -> list[Family]:
    """The node's figures now, as plain values (on the event loop, where the core lives)."""
    return list(NodeCollector(view).collect())


async def render(families: list[Family]) -> bytes:
    """The text format, by prometheus_client, one family at a time with the event loop let run
    in between: with thousands of partitions the whole takes long enough that the node's own
    work must not wait for it (and a worker thread would starve behind the loop for the GIL)."""
    chunks = []
    turns = Turns()
    for family in families:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Built([family]))
        chunks.append(generate_latest(registry))
        await turns.take()
    return b"".join(chunks)


class Family:
    """A metric family's values, kept as plain tuples until render() builds prometheus_client's
    objects from them."""

    __slots__ = ("doc", "kind", "labels", "name", "samples")

    def __init__(
        self, kind: str, name: str, doc: str, labels: Sequence[str] = (), value: float | None = None
    ) -> None:
        self.kind, self.name, self.doc, self.labels = kind, name, doc, list(labels)
        self.samples: list[tuple[Sequence[str], Any, float]] = []
        if value is not None:
            self.samples.append(((), value, 0.0))

    def add_metric(self, labels: Sequence[str], value: Any, sum_value: float = 0.0) -> None:
        self.samples.append((labels, value, sum_value))

    def build(self) -> Metric:
        doc, labels = self.doc, self.labels
        if self.kind == "info":
            info = InfoMetricFamily(self.name, doc, labels=labels)
            for values, mapping, _ in self.samples:
                info.add_metric(values, mapping)
            return info
        if self.kind == "histogram":
            histogram = HistogramMetricFamily(self.name, doc, labels=labels)
            for values, buckets, total in self.samples:
                histogram.add_metric(values, buckets, total)
            return histogram
        family: GaugeMetricFamily | CounterMetricFamily
        if self.kind == "counter":
            family = CounterMetricFamily(self.name, doc, labels=labels)
        else:
            family = GaugeMetricFamily(self.name, doc, labels=labels)
        for values, value, _ in self.samples:
            family.add_metric(values, value)
        return family


class _Built(Collector):
    def __init__(self, families: list[Family]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return (f.build() for f in self.families)


class NodeCollector:
    """The node's metric families now, read from its cluster view: the node's own figures,
    each partition replica's, then what it counted."""

    def __init__(self, view: ClusterView) -> None:
        self.view = view

    def collect(self) -> Iterator[Family]:
        yield from self._node()
        yield from self._partitions()
        yield from self._counted()

    # -- the node ------------------------------------------------------------------------------

    def _node(self) -> Iterator[Family]:
        view = self.view
        yield _node_info(view)
        yield from (metric.family(view) for metric in METADATA_AND_STORAGE)
        yield _feature_level(view)
        yield from _disk(view)
        yield _peers_alive(view)
        yield from (metric.family(view) for metric in REPLICAS_AND_FILES)
        yield _cursors_invalidated(view)

    # -- partitions ----------------------------------------------------------------------------

    def _partitions(self) -> Iterator[Family]:
        """PARTITION_METRICS' families, each with a sample per replica it applies to."""
        families = [metric.family() for metric in PARTITION_METRICS]
        single: dict[Scope, list[tuple[Callable[[PartitionFigures], float], Family]]] = {
            scope: [] for scope in Scope
        }
        multi: dict[Scope, list[tuple[Samples, Family]]] = {scope: [] for scope in Scope}
        for metric, family in zip(PARTITION_METRICS, families, strict=True):
            if metric.samples is not None:
                multi[metric.scope].append((metric.samples, family))
            elif metric.value is not None:
                single[metric.scope].append((metric.value, family))
        for figures in self.view.partition_figures():
            st = figures.status
            labels = [st.topic, str(st.partition)]
            for scope in _scopes(figures):
                for value, family in single[scope]:
                    family.add_metric(labels, value(figures))
                for samples, family in multi[scope]:
                    for extra, sample in samples(figures):
                        family.add_metric([*labels, *extra], sample)
        yield from families

    # -- what the node counted -----------------------------------------------------------------

    def _counted(self) -> Iterator[Family]:
        families: dict[str, Family] = {}
        for name, labels, value in self.view.counters():
            keys = [k for k, _ in labels]
            found = families.get(name)
            if found is None:  # every count of one name has the same label names
                found = families[name] = Family("counter", name, _doc(name), keys)
            found.add_metric([v for _, v in labels], value)
        yield from families.values()
        histograms: dict[str, Family] = {}
        for name, labels, buckets, total in self.view.histograms():
            keys = [k for k, _ in labels]
            hfound = histograms.get(name)
            if hfound is None:
                hfound = histograms[name] = Family("histogram", name, _doc(name), keys)
            hfound.add_metric(
                [v for _, v in labels], [(le, float(count)) for le, count in buckets], total
            )
        yield from histograms.values()


# -- the node's figures ----------------------------------------------------------------------


@dataclass(frozen=True)
class NodeMetric:
    """A family of one sample: a figure of the node."""

    name: str
    kind: str  # "gauge" or "counter"
    doc: str
    value: Callable[[ClusterView], float]

    def family(self, view: ClusterView) -> Family:
        return Family(self.kind, self.name, self.doc, value=self.value(view))


METADATA_AND_STORAGE: tuple[NodeMetric, ...] = (
    NodeMetric(
        "tidelog_metadata_leader",
        "gauge",
        "Node that leads the metadata log (-1: none)",
        lambda view: view.metadata_leader,
    ),
    NodeMetric(
        "tidelog_metadata_epoch",
        "gauge",
        "The metadata log's leader epoch",
        lambda view: view.metadata_epoch,
    ),
    NodeMetric(
        "tidelog_metadata_applied_offset",
        "gauge",
        "Metadata log entries this node has applied",
        lambda view: view.applied_offset,
    ),
    NodeMetric("tidelog_topics", "gauge", "Topics in the cluster", lambda view: len(view.topics)),
    NodeMetric(
        "tidelog_storage_bytes",
        "gauge",
        "Bytes of segments this node stores",
        lambda view: view.stored_bytes(),
    ),
    NodeMetric(
        "tidelog_storage_max_bytes",
        "gauge",
        "storage.max.bytes: past it produce is refused with StorageFull (-1: no cap)",
        lambda view: view.config.storage_max_bytes,
    ),
)

REPLICAS_AND_FILES: tuple[NodeMetric, ...] = (
    NodeMetric(
        "tidelog_replicas_quiesced",
        "gauge",
        "Replicas of idle groups that stopped talking (a follower told to wait, a leader "
        "whose followers all were)",
        lambda view: view.quiesced_replicas(),
    ),
    NodeMetric(
        "tidelog_segment_files_open",
        "gauge",
        "Segment files open now (a bounded cache: idle segments' files are closed)",
        lambda view: len(SEGMENT_FILES),
    ),
    NodeMetric(
        "tidelog_segment_files_max",
        "gauge",
        "The most segment files kept open",
        lambda view: SEGMENT_FILES.capacity,
    ),
    NodeMetric(
        "tidelog_segment_files_reopened",
        "counter",
        "Segment files opened again after the cache closed them",
        lambda view: SEGMENT_FILES.opened,
    ),
    NodeMetric(
        "tidelog_segment_files_evicted",
        "counter",
        "Segment files the cache closed to stay within its bound",
        lambda view: SEGMENT_FILES.evicted,
    ),
    NodeMetric(
        "tidelog_cleaner_passes",
        "counter",
        "Cleaner passes over a partition",
        lambda view: view.cleaner_passes,
    ),
)


def _node_info(view: ClusterView) -> Family:
    info = Family("info", "tidelog_node", "This node", ["node_id"])
    info.add_metric(
        [str(view.node_id)],
        {
            "version": __version__,
            "cluster_id": view.cluster_id,
            "directory_id": view.directory_id,
        },
    )
    return info


def _feature_level(view: ClusterView) -> Family:
    level = Family(
        "gauge",
        "tidelog_feature_level",
        "The cluster's finalized level of a feature, as this node applied it",
        ["feature"],
    )
    level.add_metric([FEATURE], view.finalized_level)
    return level


def _disk(view: ClusterView) -> Iterator[Family]:
    """The data directory's disk (nothing if it cannot be read)."""
    disk = view.disk_usage()
    if disk:
        yield _gauge(
            "tidelog_disk_free_bytes",
            "Free bytes on the data directory's disk",
            disk["disk_free_bytes"],
        )
        yield _gauge(
            "tidelog_disk_total_bytes",
            "Size of the data directory's disk",
            disk["disk_total_bytes"],
        )


def _peers_alive(view: ClusterView) -> Family:
    alive = Family(
        "gauge",
        "tidelog_peer_alive",
        "1 while this node hears a peer's liveness heartbeats (or anything else from it)",
        ["peer"],
    )
    for peer, is_alive in view.peers_alive():
        alive.add_metric([str(peer)], 1 if is_alive else 0)
    return alive


def _cursors_invalidated(view: ClusterView) -> Family:
    invalidated = Family(
        "gauge",
        "tidelog_cursor_invalidated",
        "1 for a cursor that no longer holds the log (past a cap, or invalidated by hand)",
        ["cursor", "topic"],
    )
    for name, cursor in sorted(view.cursors.items()):
        invalidated.add_metric([name, cursor.topic], 1 if cursor.invalidated else 0)
    return invalidated


# -- each partition replica's figures --------------------------------------------------------


class Scope(enum.Enum):
    """Which replicas a partition metric has a sample for."""

    REPLICA = enum.auto()  # every replica
    ARCHIVED = enum.auto()  # a replica of an archived topic
    LEADER = enum.auto()  # the leader's
    DECIDED = enum.auto()  # the leader's, once an LWM is decided


# Samples beyond the topic and partition labels: (the other labels' values, the value).
Samples = Callable[[PartitionFigures], Iterable[tuple[Sequence[str], float]]]


@dataclass(frozen=True)
class PartitionMetric:
    """A family with samples per partition replica: one `value` each, or, for a family with
    more labels than the topic and partition, the `samples` of each."""

    name: str
    doc: str
    scope: Scope
    value: Callable[[PartitionFigures], float] | None = None
    labels: tuple[str, ...] = ()
    samples: Samples | None = None
    kind: str = "gauge"

    def __post_init__(self) -> None:
        one = self.value is not None and self.samples is None and not self.labels
        many = self.value is None and self.samples is not None and bool(self.labels)
        if not (one or many):
            raise InvariantBroken(f"{self.name}: a value, or more labels and their samples")

    def family(self) -> Family:
        return Family(self.kind, self.name, self.doc, [*PARTITION, *self.labels])


def _scopes(figures: PartitionFigures) -> list[Scope]:
    scopes = [Scope.REPLICA]
    if figures.archive is not None:
        scopes.append(Scope.ARCHIVED)
    if figures.status.replica.is_leader:
        scopes.append(Scope.LEADER)
        if figures.status.low_watermark is not None:
            scopes.append(Scope.DECIDED)
    return scopes


def _archive(figures: PartitionFigures) -> ArchiveFigures:
    if figures.archive is None:
        raise InvariantBroken(f"{figures.status.topic}: archive figures of a topic not archived")
    return figures.archive


def _decided(figures: PartitionFigures) -> LowWatermark:
    if figures.status.low_watermark is None:
        raise InvariantBroken(f"{figures.status.topic}: the LWM of a replica that decided none")
    return figures.status.low_watermark


def _archive_failing(figures: PartitionFigures) -> Iterator[tuple[Sequence[str], float]]:
    error = _archive(figures).error
    yield (error,), 1 if error else 0


def _replica_lags(figures: PartitionFigures) -> Iterator[tuple[Sequence[str], float]]:
    rs = figures.status.replica
    for rid, view in sorted(rs.replicas.items()):
        if rid != rs.leader:
            yield (str(rid),), view.lag


def _holds(figures: PartitionFigures) -> Iterator[tuple[Sequence[str], float]]:
    decided = _decided(figures)
    for h in decided.holds:
        sets = "1" if h is decided.hold else "0"
        live = "true" if h.live else "false"
        yield (h.kind, h.name, live, sets), h.offset


def _cursors(figures: PartitionFigures) -> list[tuple[str, Mapping[str, int]]]:
    return sorted(_decided(figures).cursor_stats.items())


PARTITION_METRICS: tuple[PartitionMetric, ...] = (
    PartitionMetric(
        "tidelog_partition_log_start_offset",
        "First offset a reader may read (the archive's, for an archived partition)",
        Scope.REPLICA,
        lambda f: f.log_start_offset,
    ),
    PartitionMetric(
        "tidelog_partition_local_log_start_offset",
        "First offset on this replica's disk",
        Scope.REPLICA,
        lambda f: f.status.replica.log_start_offset,
    ),
    PartitionMetric(
        "tidelog_partition_high_watermark",
        "Offsets below it are committed",
        Scope.REPLICA,
        lambda f: f.status.replica.high_watermark,
    ),
    PartitionMetric(
        "tidelog_partition_last_stable_offset",
        "Offsets below it are committed and in no undecided transaction (read_committed reads "
        "below it)",
        Scope.REPLICA,
        lambda f: f.status.replica.last_stable_offset,
    ),
    PartitionMetric(
        "tidelog_partition_log_end_offset",
        "The next offset this replica appends",
        Scope.REPLICA,
        lambda f: f.status.replica.log_end_offset,
    ),
    PartitionMetric(
        "tidelog_partition_durable_end_offset",
        "Offsets below it are fsynced on this replica",
        Scope.REPLICA,
        lambda f: f.status.durable_end_offset,
    ),
    PartitionMetric(
        "tidelog_partition_size_bytes",
        "Bytes of this replica's segments",
        Scope.REPLICA,
        lambda f: f.status.size_bytes,
    ),
    PartitionMetric(
        "tidelog_partition_segments",
        "Segments of this replica",
        Scope.REPLICA,
        lambda f: f.status.segment_count,
    ),
    PartitionMetric(
        "tidelog_partition_leader",
        "Node this replica knows as leader (-1: none)",
        Scope.REPLICA,
        lambda f: f.status.replica.leader,
    ),
    PartitionMetric(
        "tidelog_partition_epoch", "Leader epoch", Scope.REPLICA, lambda f: f.status.replica.epoch
    ),
    PartitionMetric(
        "tidelog_partition_is_leader",
        "1 where this node leads the partition",
        Scope.REPLICA,
        lambda f: 1 if f.status.replica.is_leader else 0,
    ),
    PartitionMetric(
        "tidelog_partition_archive_end_offset",
        "Offsets below it are in the archive (archived partitions; -1: nothing yet)",
        Scope.ARCHIVED,
        lambda f: _archive(f).archived_end,
    ),
    PartitionMetric(
        "tidelog_partition_archive_lag_bytes",
        "Bytes on this replica's disk not yet archived (archived partitions)",
        Scope.ARCHIVED,
        lambda f: _archive(f).lag_bytes,
    ),
    PartitionMetric(
        "tidelog_partition_archive_failing",
        "1 while the archive's last attempt for this partition failed",
        Scope.ARCHIVED,
        labels=("error",),
        samples=_archive_failing,
    ),
    PartitionMetric(
        "tidelog_partition_compactions",
        "Compactions of this replica",
        Scope.REPLICA,
        lambda f: f.status.flushes.compactions,
        kind="counter",
    ),
    PartitionMetric(
        "tidelog_partition_compaction_ratio",
        "Bytes after / bytes before of this replica's last compaction (1: none yet)",
        Scope.REPLICA,
        lambda f: f.compaction_ratio,
    ),
    PartitionMetric(
        "tidelog_partition_replicas",
        "Voters (leader only)",
        Scope.LEADER,
        lambda f: len(f.status.replica.voters),
    ),
    PartitionMetric(
        "tidelog_partition_in_sync_replicas",
        "Replicas in sync (leader only)",
        Scope.LEADER,
        lambda f: sum(1 for v in f.status.replica.replicas.values() if v.in_sync),
    ),
    PartitionMetric(
        "tidelog_partition_under_replicated",
        "1 when fewer replicas are in sync than vote",
        Scope.LEADER,
        lambda f: 1 if f.status.replica.in_sync_voters < len(f.status.replica.voters) else 0,
    ),
    PartitionMetric(
        "tidelog_partition_under_min_isr",
        "1 when fewer replicas are in sync than min.insync.replicas (acks=all is refused)",
        Scope.LEADER,
        lambda f: (
            1
            if f.status.replica.in_sync_voters
            < min(f.min_insync_replicas, len(f.status.replica.voters))
            else 0
        ),
    ),
    PartitionMetric(
        "tidelog_partition_replica_lag_records",
        "How far each replica trails the leader's log end (leader only)",
        Scope.LEADER,
        labels=("replica",),
        samples=_replica_lags,
    ),
    PartitionMetric(
        "tidelog_partition_low_watermark",
        "Nothing below it is needed: the cleaner may delete it (leader only)",
        Scope.DECIDED,
        lambda f: _decided(f).offset,
    ),
    PartitionMetric(
        "tidelog_partition_low_watermark_hold_offset",
        "Each hold on the LWM: the offset it needs kept (set_by=1 for the one that sets it)",
        Scope.DECIDED,
        labels=("kind", "name", "live", "set_by"),
        samples=_holds,
    ),
    PartitionMetric(
        "tidelog_cursor_lag_records",
        "Committed records the cursor has not read",
        Scope.DECIDED,
        labels=("cursor",),
        samples=lambda f: (((name,), stats["lag"]) for name, stats in _cursors(f)),
    ),
    PartitionMetric(
        "tidelog_cursor_lead_records",
        "Records between the log start and the cursor: how far retention is from it",
        Scope.DECIDED,
        labels=("cursor",),
        samples=lambda f: (((name,), stats["lead"]) for name, stats in _cursors(f)),
    ),
    PartitionMetric(
        "tidelog_cursor_lag_bytes",
        "Bytes stored from the cursor to the log end",
        Scope.DECIDED,
        labels=("cursor",),
        samples=lambda f: (((name,), stats["lag_bytes"]) for name, stats in _cursors(f)),
    ),
    PartitionMetric(
        "tidelog_cursor_idle_seconds",
        "Seconds since the cursor last committed",
        Scope.DECIDED,
        labels=("cursor",),
        samples=lambda f: (((name,), stats["idle_ms"] / 1000) for name, stats in _cursors(f)),
    ),
)


DOCS = {
    "tidelog_request_seconds": "Time from a request's arrival to its answer, by listener and request",
    "tidelog_request_bytes_total": "Payload bytes that came in with requests",
    "tidelog_response_bytes_total": "Payload bytes that went out in answers",
    "tidelog_fsync_seconds": "Time of each fsync of a partition's log",
    "tidelog_leader_elections_won_total": "Times a replica on this node became leader",
    "tidelog_segments_deleted_total": "Segments deleted below the log start",
    "tidelog_http_requests_total": "Requests to the HTTP listener, by path",
    "tidelog_tick_round_seconds": "Time of one round of ticks over every replica (yields included)",
    "tidelog_event_loop_lag_seconds": "How late the event loop woke the tick loop: a busy node's delay",
    "tidelog_compaction_bytes_before_total": "Bytes of the segments compaction read",
    "tidelog_compaction_bytes_after_total": "Bytes of those segments after compaction",
    "tidelog_compaction_records_removed_total": "Records compaction removed (superseded keys)",
    "tidelog_compaction_aborted_records_removed_total": (
        "Records of aborted transactions compaction removed (part of records removed)"
    ),
    "tidelog_compaction_markers_removed_total": (
        "Transaction markers compaction removed once nothing of their transaction remained"
    ),
    "tidelog_compaction_empty_batches_kept_total": (
        "Batches compaction emptied of records but kept: a producer's newest, for its sequence"
    ),
    "tidelog_segments_deleted_bytes_total": "Bytes of segments deleted below the log start",
}


def _doc(name: str) -> str:
    return DOCS.get(name, name.removeprefix("tidelog_").replace("_", " "))


def _gauge(name: str, doc: str, value: float) -> Family:
    return Family("gauge", name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> Family:
    return Family("counter", name, doc, value=value)
