"""The node's figures in Prometheus's text format (`GET /metrics`): read from the core when
scraped, never kept twice. Per partition replica: the offsets that bound its zones (log start,
LWM, HW, LEO), its size, leader and epoch; on the leader, the in-sync set and the hold that sets
the LWM; per cursor, how far it trails and how long it has been idle. Then what the node counted
(node/metrics.py), its disk, and the cleaner's work.

Each partition's figures are its typed status (node/status.py), the one `tidelog status` answers
with; its LWM the cached one (cleaner.cached_low_watermark), so a scrape of many idle partitions
reads each LWM rather than deciding it again."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from tidelog.node.core import disk_usage
from tidelog.node.turns import Turns
from tidelog.storage.descriptors import SEGMENT_FILES
from tidelog.version import __version__

if TYPE_CHECKING:
    from tidelog.node.core import NodeCore
    from tidelog.node.partition import PartitionHost

# What generate_latest writes: the classic text format.
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
PARTITION = ["topic", "partition"]


def snapshot(core: NodeCore) -> list[Family]:
    """The node's figures now, as plain values (on the event loop, where the core lives)."""
    return list(NodeCollector(core).collect())


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
    def __init__(self, core: NodeCore) -> None:
        self.core = core

    def collect(self) -> Iterator[Family]:
        core = self.core
        yield from self._node()
        yield from self._partitions(
            sorted(
                (h for h in core.hosts.values() if h is not core.metadata_host),
                key=lambda h: (h.topic, h.partition),
            )
        )
        yield from self._counted()

    # -- the node ------------------------------------------------------------------------------

    def _node(self) -> Iterator[Family]:
        core = self.core
        info = Family("info", "tidelog_node", "This node", ["node_id"])
        identity = getattr(core, "identity", None)
        info.add_metric(
            [str(core.node_id)],
            {
                "version": __version__,
                "cluster_id": identity.cluster_id if identity is not None else "",
                "directory_id": identity.directory_id if identity is not None else "",
            },
        )
        yield info
        mh = core.metadata_host.replica
        yield _gauge(
            "tidelog_metadata_leader", "Node that leads the metadata log (-1: none)", mh.leader_id
        )
        yield _gauge("tidelog_metadata_epoch", "The metadata log's leader epoch", mh.epoch)
        yield _gauge(
            "tidelog_metadata_applied_offset",
            "Metadata log entries this node has applied",
            core.metadata.applied_offset,
        )
        yield _gauge("tidelog_topics", "Topics in the cluster", len(core.metadata.topics))
        yield _gauge(
            "tidelog_storage_bytes", "Bytes of segments this node stores", core.stored_bytes()
        )
        yield _gauge(
            "tidelog_storage_max_bytes",
            "storage.max.bytes: past it produce is refused with StorageFull (-1: no cap)",
            core.config.storage_max_bytes,
        )
        disk = disk_usage(core.config.data_dir)
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
        alive = Family(
            "gauge",
            "tidelog_peer_alive",
            "1 while this node hears a peer's liveness heartbeats (or anything else from it)",
            ["peer"],
        )
        for peer in sorted(core.registry.peer_nodes()):
            if peer != core.node_id:
                alive.add_metric([str(peer)], 1 if core.liveness.is_alive(peer) else 0)
        yield alive
        yield _gauge(
            "tidelog_replicas_quiesced",
            "Replicas of idle groups that stopped talking (a follower told to wait, a leader "
            "whose followers all were)",
            sum(1 for h in core.hosts.values() if h.replica.quiescent),
        )
        yield _gauge(
            "tidelog_segment_files_open",
            "Segment files open now (a bounded cache: idle segments' files are closed)",
            len(SEGMENT_FILES),
        )
        yield _gauge(
            "tidelog_segment_files_max", "The most segment files kept open", SEGMENT_FILES.capacity
        )
        yield _counter(
            "tidelog_segment_files_reopened",
            "Segment files opened again after the cache closed them",
            SEGMENT_FILES.opened,
        )
        yield _counter(
            "tidelog_segment_files_evicted",
            "Segment files the cache closed to stay within its bound",
            SEGMENT_FILES.evicted,
        )
        cleaner = core.cleaner
        yield _counter("tidelog_cleaner_passes", "Cleaner passes over a partition", cleaner.passes)
        invalidated = Family(
            "gauge",
            "tidelog_cursor_invalidated",
            "1 for a cursor that no longer holds the log (past a cap, or invalidated by hand)",
            ["cursor", "topic"],
        )
        for name, cursor in sorted(core.metadata.cursors.items()):
            invalidated.add_metric([name, cursor.topic], 1 if cursor.invalidated else 0)
        yield invalidated

    # -- partitions ----------------------------------------------------------------------------

    def _partitions(self, hosts: list[PartitionHost]) -> Iterator[Family]:
        def family(name: str, doc: str, extra: tuple[str, ...] = ()) -> Family:
            return Family("gauge", name, doc, [*PARTITION, *extra])

        start = family(
            "tidelog_partition_log_start_offset",
            "First offset a reader may read (the archive's, for an archived partition)",
        )
        local_start = family(
            "tidelog_partition_local_log_start_offset", "First offset on this replica's disk"
        )
        archive_end = family(
            "tidelog_partition_archive_end_offset",
            "Offsets below it are in the archive (archived partitions; -1: nothing yet)",
        )
        archive_lag = family(
            "tidelog_partition_archive_lag_bytes",
            "Bytes on this replica's disk not yet archived (archived partitions)",
        )
        archive_failing = family(
            "tidelog_partition_archive_failing",
            "1 while the archive's last attempt for this partition failed",
            ("error",),
        )
        hw = family("tidelog_partition_high_watermark", "Offsets below it are committed")
        leo = family("tidelog_partition_log_end_offset", "The next offset this replica appends")
        durable = family(
            "tidelog_partition_durable_end_offset", "Offsets below it are fsynced on this replica"
        )
        size = family("tidelog_partition_size_bytes", "Bytes of this replica's segments")
        segments = family("tidelog_partition_segments", "Segments of this replica")
        leader = family("tidelog_partition_leader", "Node this replica knows as leader (-1: none)")
        epoch = family("tidelog_partition_epoch", "Leader epoch")
        leading = family("tidelog_partition_is_leader", "1 where this node leads the partition")
        compactions = Family(
            "counter", "tidelog_partition_compactions", "Compactions of this replica", PARTITION
        )
        ratio = family(
            "tidelog_partition_compaction_ratio",
            "Bytes after / bytes before of this replica's last compaction (1: none yet)",
        )
        replicas = family("tidelog_partition_replicas", "Voters (leader only)")
        in_sync = family("tidelog_partition_in_sync_replicas", "Replicas in sync (leader only)")
        under = family(
            "tidelog_partition_under_replicated", "1 when fewer replicas are in sync than vote"
        )
        under_min = family(
            "tidelog_partition_under_min_isr",
            "1 when fewer replicas are in sync than min.insync.replicas (acks=all is refused)",
        )
        lag = family(
            "tidelog_partition_replica_lag_records",
            "How far each replica trails the leader's log end (leader only)",
            ("replica",),
        )
        lwm = family(
            "tidelog_partition_low_watermark",
            "Nothing below it is needed: the cleaner may delete it (leader only)",
        )
        hold = family(
            "tidelog_partition_low_watermark_hold_offset",
            "Each hold on the LWM: the offset it needs kept (set_by=1 for the one that sets it)",
            ("kind", "name", "live", "set_by"),
        )
        cursor_lag = family(
            "tidelog_cursor_lag_records", "Committed records the cursor has not read", ("cursor",)
        )
        cursor_lead = family(
            "tidelog_cursor_lead_records",
            "Records between the log start and the cursor: how far retention is from it",
            ("cursor",),
        )
        cursor_lag_bytes = family(
            "tidelog_cursor_lag_bytes", "Bytes stored from the cursor to the log end", ("cursor",)
        )
        cursor_idle = family(
            "tidelog_cursor_idle_seconds", "Seconds since the cursor last committed", ("cursor",)
        )
        cleaner = self.core.cleaner
        for host in hosts:
            # The same typed status `tidelog status` answers with; the LWM as cached.
            st = host.status(cleaner.cached_low_watermark(host))
            labels = [st.topic, str(st.partition)]
            rs = st.replica
            start.add_metric(labels, self.core.log_start_offset(host))
            local_start.add_metric(labels, rs.log_start_offset)
            archived = self.core.cleaner.archive_fact(host)
            if archived is not None:
                known = self.core.archiver.state(host).archived_end if self.core.archiver else None
                archive_end.add_metric(labels, -1 if known is None else known)
                archive_lag.add_metric(labels, archived.lag_bytes)
                archive_failing.add_metric([*labels, archived.error], 1 if archived.error else 0)
            hw.add_metric(labels, rs.high_watermark)
            leo.add_metric(labels, rs.log_end_offset)
            durable.add_metric(labels, st.durable_end_offset)
            size.add_metric(labels, st.size_bytes)
            segments.add_metric(labels, st.segment_count)
            leader.add_metric(labels, rs.leader)
            epoch.add_metric(labels, rs.epoch)
            leading.add_metric(labels, 1 if rs.is_leader else 0)
            compactions.add_metric(labels, st.flushes.compactions)
            ratio.add_metric(labels, host.compaction_ratio)
            if not rs.is_leader:
                continue
            voters, synced = len(rs.voters), rs.in_sync_voters
            replicas.add_metric(labels, voters)
            in_sync.add_metric(labels, sum(1 for v in rs.replicas.values() if v.in_sync))
            under.add_metric(labels, 1 if synced < voters else 0)
            needed = min(host.config.min_insync_replicas, voters)
            under_min.add_metric(labels, 1 if synced < needed else 0)
            for rid, view in sorted(rs.replicas.items()):
                if rid != rs.leader:
                    lag.add_metric([*labels, str(rid)], view.lag)
            decided = st.low_watermark
            if decided is None:
                continue
            lwm.add_metric(labels, decided.offset)
            for h in decided.holds:
                sets = "1" if h is decided.hold else "0"
                live = "true" if h.live else "false"
                hold.add_metric([*labels, h.kind, h.name, live, sets], h.offset)
            for name, stats in sorted(decided.cursor_stats.items()):
                cursor_lag.add_metric([*labels, name], stats["lag"])
                cursor_lead.add_metric([*labels, name], stats["lead"])
                cursor_lag_bytes.add_metric([*labels, name], stats["lag_bytes"])
                cursor_idle.add_metric([*labels, name], stats["idle_ms"] / 1000)
        yield from (start, local_start, hw, leo, durable, size, segments, leader, epoch, leading)
        yield from (archive_end, archive_lag, archive_failing)
        yield from (compactions, ratio, replicas, in_sync, under, under_min, lag, lwm, hold)
        yield from (cursor_lag, cursor_lead, cursor_lag_bytes, cursor_idle)

    # -- what the node counted -----------------------------------------------------------------

    def _counted(self) -> Iterator[Family]:
        families: dict[str, Family] = {}
        for name, labels, value in self.core.counters.items():
            keys = [k for k, _ in labels]
            found = families.get(name)
            if found is None:  # every count of one name has the same label names
                found = families[name] = Family("counter", name, _doc(name), keys)
            found.add_metric([v for _, v in labels], value)
        yield from families.values()
        histograms: dict[str, Family] = {}
        for name, labels, histogram in self.core.histograms.items():
            keys = [k for k, _ in labels]
            hfound = histograms.get(name)
            if hfound is None:
                hfound = histograms[name] = Family("histogram", name, _doc(name), keys)
            hfound.add_metric(
                [v for _, v in labels],
                [(le, float(count)) for le, count in histogram.cumulative()],
                histogram.sum,
            )
        yield from histograms.values()


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
    "tidelog_segments_deleted_bytes_total": "Bytes of segments deleted below the log start",
}


def _doc(name: str) -> str:
    return DOCS.get(name, name.removeprefix("tidelog_").replace("_", " "))


def _gauge(name: str, doc: str, value: float) -> Family:
    return Family("gauge", name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> Family:
    return Family("counter", name, doc, value=value)
