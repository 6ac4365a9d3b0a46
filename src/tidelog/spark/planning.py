"""Driver-side planning of the Spark source: which partitions, which offsets, and how the
offset ranges are cut into Spark input partitions. Offsets are exclusive ends everywhere, as in
Spark's Kafka source: a range [start, end) reads offsets start .. end-1."""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from tidelog.client.sync_client import Client
from tidelog.errors import InvalidConfig, UnknownTopicOrPartition
from tidelog.spark.connection import with_retries
from tidelog.spark.options import (
    EARLIEST,
    LATEST,
    SourceOptions,
    TopicPartition,
    parse_offsets_json,
)
from tidelog.tls import TlsFiles

Offsets = dict[TopicPartition, int]


@dataclass(frozen=True)
class ArchiveLocation:
    url: str
    prefix: str  # the partition's objects and manifest under url
    endpoint: str  # an S3-compatible store's URL ("": the environment's)
    archived_end: int  # what the archive held when planned: below it, read from the store


def archive_locations(
    client: Client, opts: SourceOptions, topics: set[str]
) -> dict[TopicPartition, ArchiveLocation]:
    """The archived partitions among topics, as their leaders' status says (asked only for
    topics with remote.storage.enable)."""
    from tidelog.cluster_status import partition_rows

    if not opts.archive_direct or opts.isolation_level == "read_committed":
        # (the node's archive reads drop aborted transactions; executors reading the store
        # themselves would have to as well: they read through the node instead)
        return {}
    archived = [
        t for t in sorted(topics) if client.topic(t).configs.get("remote.storage.enable") == "true"
    ]
    if not archived:
        return {}
    out: dict[TopicPartition, ArchiveLocation] = {}
    nodes = client.status(archived)
    for topic in archived:
        for row in partition_rows(nodes, topic):
            archive = row.archive
            if archive and archive.get("prefix") and int(archive["archived_end_offset"]) > 0:
                out[(row.topic, row.partition)] = ArchiveLocation(
                    str(archive["url"]),
                    str(archive["prefix"]),
                    opts.archive_endpoint,
                    int(archive["archived_end_offset"]),
                )
    return out


@dataclass(frozen=True)
class OffsetRange:
    """What one Spark task reads; everything read() needs travels in it (it is pickled)."""

    bootstrap: str
    topic: str
    partition: int
    start: int
    end: int
    fail_on_data_loss: bool
    include_headers: bool
    fetch_max_bytes: int
    skip_invalid: bool = False  # skipInvalidBatches
    columns: tuple[str, ...] = ()  # what the query's schema asks for; () = the default schema
    tls: TlsFiles | None = None
    token: str | None = dataclasses.field(default=None, repr=False)
    # Where the executor reads the range's archived part itself (planning found the partition
    # archived): None reads everything through the nodes.
    archive: ArchiveLocation | None = None
    isolation_level: str = "read_uncommitted"  # read_committed: aborted transactions left out

    @property
    def size(self) -> int:
        return self.end - self.start


def topic_partitions(client: Client, opts: SourceOptions) -> list[TopicPartition]:
    if opts.assign:
        return sorted(set(opts.assign))
    if opts.subscribe_pattern:
        pattern = re.compile(opts.subscribe_pattern)
        topics = [
            t for t in with_retries("list topics", client.list_topics) if pattern.fullmatch(t.name)
        ]
        return sorted((t.name, p) for t in topics for p in range(t.partitions))
    out: list[TopicPartition] = []
    for name in opts.subscribe:
        try:
            info = with_retries(f"describe {name}", lambda n=name: client.topic(n, refresh=True))  # type: ignore[misc]
        except UnknownTopicOrPartition:
            raise UnknownTopicOrPartition(
                f"the source subscribes to topic {name!r}, which does not exist", topic=name
            ) from None
        out.extend((name, p) for p in range(info.partitions))
    return sorted(out)


def list_offsets(
    client: Client,
    tps: list[TopicPartition],
    spec: str,
    ts: int = -1,
    isolation_level: str = "read_uncommitted",
) -> Offsets:
    return {
        tp: with_retries(
            f"list {spec} offset of {tp[0]}/{tp[1]}",
            lambda tp=tp: client.list_offsets(  # type: ignore[misc]
                tp[0], tp[1], spec, ts, isolation_level=isolation_level
            ),
        )
        for tp in tps
    }


def high_watermarks(
    client: Client, tps: list[TopicPartition], isolation_level: str = "read_uncommitted"
) -> Offsets:
    """The committed end of every partition: a query never reads past it (read_committed:
    the last stable offset, which no open transaction's record is below)."""
    return list_offsets(client, tps, "latest", isolation_level=isolation_level)


def resolve_offsets(
    client: Client,
    tps: list[TopicPartition],
    spec: str,
    key: str,
    timestamp: int | None = None,
    isolation_level: str = "read_uncommitted",
) -> Offsets:
    """startingOffsets/endingOffsets (earliest, latest or JSON with -2/-1) or a timestamp."""
    if timestamp is not None:
        return list_offsets(client, tps, "timestamp", timestamp, isolation_level)
    if spec == "earliest":
        return list_offsets(client, tps, "earliest")
    if spec == "latest":
        return high_watermarks(client, tps, isolation_level)
    given = parse_offsets_json(spec, key)
    missing = [f"{t}/{p}" for t, p in tps if (t, p) not in given]
    if missing and key == "startingOffsets":
        # Spark's Kafka source starts partitions missing from the JSON at latest only for new
        # partitions; a named partition set must be complete.
        raise InvalidConfig(f"option {key!r} gives no offset for {', '.join(missing)}", key=key)
    out: Offsets = {}
    earliest: Offsets | None = None
    latest: Offsets | None = None
    for tp in tps:
        value = given.get(tp, LATEST)
        if value == EARLIEST:
            earliest = earliest or list_offsets(client, tps, "earliest")
            value = earliest[tp]
        elif value == LATEST:
            latest = latest or high_watermarks(client, tps, isolation_level)
            value = latest[tp]
        elif value < 0:
            raise InvalidConfig(
                f"option {key!r}: offset {value} for {tp[0]}/{tp[1]} is negative", key=key
            )
        out[tp] = value
    return out


def rate_limit(start: Mapping[TopicPartition, int], latest: Offsets, limit: int) -> Offsets:
    """Spark's Kafka rule for maxOffsetsPerTrigger: share the limit across partitions in
    proportion to what each has available (at least one offset where any is available)."""
    sizes = {tp: max(0, end - start.get(tp, end)) for tp, end in latest.items()}
    total = sum(sizes.values())
    if total <= limit:
        return dict(latest)
    out: Offsets = {}
    for tp, end in latest.items():
        begin = start.get(tp, end)
        share = limit * sizes[tp] / total
        step = math.ceil(share) if share < 1 else math.floor(share)
        out[tp] = min(end, begin + step)
    return out


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """Cut the larger ranges so that there are at least min_partitions tasks (Kafka's
    minPartitions: pieces in proportion to each range's share of the total)."""
    ranges = [r for r in ranges if r.size > 0]
    total = sum(r.size for r in ranges)
    if not min_partitions or min_partitions <= len(ranges) or total == 0:
        return ranges
    # Whole pieces in proportion to size, then the leftover pieces to the largest remainders,
    # so that there are at least min_partitions of them.
    shares = [min_partitions * r.size / total for r in ranges]
    pieces = [max(1, math.floor(s)) for s in shares]
    by_remainder = sorted(
        range(len(ranges)), key=lambda i: shares[i] - math.floor(shares[i]), reverse=True
    )
    for i in by_remainder[: max(0, min_partitions - sum(pieces))]:
        pieces[i] += 1
    out: list[OffsetRange] = []
    for r, count in zip(ranges, pieces, strict=True):
        count = min(count, r.size)
        bounds = [r.start + (r.size * i) // count for i in range(count)] + [r.end]
        for lo, hi in itertools.pairwise(bounds):
            out.append(dataclasses.replace(r, start=lo, end=hi))
    return out


def pack_ranges(
    ranges: list[OffsetRange], max_partitions: int | None
) -> list[tuple[OffsetRange, ...]]:
    """Spark tasks, each a run of ranges read one after another. With maxPartitions below the
    number of ranges, the ranges laid end to end are cut into that many pieces of (nearly) equal
    size, as Spark packs small files into splits: on 2 cores, 3 partitions read as 3 tasks take
    two waves, as 2 tasks one."""
    ranges = [r for r in ranges if r.size > 0]
    if not max_partitions or len(ranges) <= max_partitions:
        return [(r,) for r in ranges]
    total = sum(r.size for r in ranges)
    bounds = [total * i // max_partitions for i in range(1, max_partitions + 1)]
    tasks: list[tuple[OffsetRange, ...]] = []
    current: list[OffsetRange] = []
    done = 0  # records of the ranges before the current piece, laid end to end
    for r in ranges:
        lo = r.start
        while lo < r.end:
            hi = min(r.end, lo + bounds[len(tasks)] - done)
            current.append(dataclasses.replace(r, start=lo, end=hi))
            done += hi - lo
            lo = hi
            if done == bounds[len(tasks)]:
                tasks.append(tuple(current))
                current = []
    return tasks


def plan_tasks(
    opts: SourceOptions,
    start: Offsets,
    end: Offsets,
    columns: tuple[str, ...] = (),
    archives: Mapping[TopicPartition, ArchiveLocation] | None = None,
) -> list[tuple[OffsetRange, ...]]:
    """minPartitions splits large ranges, then maxPartitions packs them into fewer tasks."""
    archives = archives or {}
    ranges = [
        OffsetRange(
            opts.bootstrap,
            tp[0],
            tp[1],
            start.get(tp, end[tp]),
            end[tp],
            opts.fail_on_data_loss,
            "headers" in columns if columns else opts.include_headers,
            opts.fetch_max_bytes,
            opts.skip_invalid_batches,
            columns,
            opts.tls,
            opts.token,
            archives.get(tp) if start.get(tp, end[tp]) < end[tp] else None,
            opts.isolation_level,
        )
        for tp in sorted(end)
    ]
    return pack_ranges(split_ranges(ranges, opts.min_partitions), opts.max_partitions)
