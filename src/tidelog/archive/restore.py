"""`tidelog restore --archive URL --topic T --to-offset N | --to-time ISO8601 --data DIR`:
a topic rebuilt from its archive, up to a point, into a new node's data directory.

The directory is made the ordinary way -- a real node (`tidelog serve`, started by the CLI's
create_topic) starts on it and creates the topic with its archived configs (without remote.storage.enable: the restored node does not
write into the archive it came from) and partition count -- and stops; then each partition's log
is rebuilt from the archived batches, exactly as the leader wrote them (offsets, epochs,
producer ids), from the archive's start up to the point: offsets below N, or records stamped at
or before the time. A batch the point cuts through is rebuilt holding only the records before
it, so the restored log is exactly the original's prefix. A node started on DIR serves it.

A transaction the point cuts through (its batches before the point, its marker after) would
stay open in the copy for good: no coordinator of the new node knows it, and its LSO would
never move. Each is ended with the marker the archive holds for it further on (committed as
the original committed it, in every partition restored); one the archive has not decided
either is aborted. The copy is the prefix plus those markers, and the restore says so.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tidelog.archive.manifest import Manifest
from tidelog.archive.reader import iter_batches
from tidelog.archive.store import ArchiveStore
from tidelog.archive.verify import manifest_keys
from tidelog.config import TopicConfig
from tidelog.errors import ArchiveError, InvalidRequest, RestorePointOutside
from tidelog.invariant import InvariantBroken
from tidelog.record.batch import BatchHeader, Record, decode_records, read_header, rebuild_batch
from tidelog.record.markers import Marker, build_marker, read_marker
from tidelog.storage.checkpoint import read_checkpoint, write_checkpoint
from tidelog.storage.log import SegmentedLog

log = logging.getLogger(__name__)

# Topic settings that belong to the archived cluster, not to the restored copy.
NOT_RESTORED = (
    "remote.storage.enable",
    "local.retention.ms",
    "local.retention.bytes",
    "archive.max.lag.bytes",
    "archive.lag.policy",
    "min.insync.replicas",  # the restored copy is one replica
)


@dataclass(frozen=True)
class RestorePoint:
    to_offset: int | None = None  # restore offsets < to_offset
    to_time_ms: int | None = None  # restore records stamped <= to_time_ms

    @staticmethod
    def parse(to_offset: int | None, to_time: str | None) -> RestorePoint:
        if (to_offset is None) == (to_time is None):
            raise InvalidRequest("restore needs exactly one of --to-offset and --to-time")
        if to_offset is not None:
            if to_offset < 0:
                raise InvalidRequest(f"--to-offset must be >= 0, not {to_offset}")
            return RestorePoint(to_offset=to_offset)
        if to_time is None:
            raise InvariantBroken("to_time is not None")
        try:
            moment = datetime.datetime.fromisoformat(to_time)
        except ValueError:
            raise InvalidRequest(f"--to-time {to_time!r} is not ISO 8601") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=datetime.UTC)
        return RestorePoint(to_time_ms=int(moment.timestamp() * 1000))

    def describe(self) -> str:
        if self.to_offset is not None:
            return f"offsets below {self.to_offset}"
        if self.to_time_ms is None:
            raise InvariantBroken("self.to_time_ms is not None")
        when = datetime.datetime.fromtimestamp(self.to_time_ms / 1000, datetime.UTC)
        return f"records stamped at or before {when.isoformat()}"


@dataclass(frozen=True)
class RestoredPartition:
    partition: int
    start_offset: int
    end_offset: int
    records: int
    note: str = ""


def latest_manifests(store: ArchiveStore, topic: str) -> list[Manifest]:
    """The newest incarnation of topic in the archive, a manifest per partition."""
    found: dict[int, list[Manifest]] = {}
    for key in manifest_keys(store, topic):
        manifest = Manifest.from_bytes(store.get(key), key, store.get)
        if manifest.topic == topic:
            found.setdefault(manifest.topic_id, []).append(manifest)
    if not found:
        raise ArchiveError(f"{store.url} holds no archive of topic {topic!r}", url=store.url)
    return sorted(found[max(found)], key=lambda m: m.partition)


def check_point(manifests: list[Manifest], point: RestorePoint) -> str:
    """RestorePointOutside if the point lies before the archive's first record or past its
    last; else "" (or, past the end within one partition, a note of where it ends)."""
    segments = [m.segments for m in manifests if m.segments]
    if not segments:
        raise RestorePointOutside("the archive holds no record of this topic yet")
    if point.to_offset is not None:
        first, last = (
            min(s[0].base_offset for s in segments),
            max(s[-1].end_offset for s in segments),
        )
        before, after = point.to_offset <= first, point.to_offset > last
        extent = f"offsets [{first}, {last})"
    else:
        if point.to_time_ms is None:
            raise InvariantBroken("point.to_time_ms is not None")
        first = min(s[0].first_timestamp for s in segments)
        last = max(seg.max_timestamp for s in segments for seg in s)
        before, after = point.to_time_ms < first, point.to_time_ms > last
        extent = f"records stamped {_iso(first)} to {_iso(last)}"
    if before:
        raise RestorePointOutside(
            f"{point.describe()}: the archive holds {extent}; the point is before its first "
            "record, so nothing would be restored",
            first=first,
            last=last,
        )
    if after:
        raise RestorePointOutside(
            f"{point.describe()}: the archive holds {extent}; the point is past its last "
            "record, so the copy would end before it",
            first=first,
            last=last,
        )
    return ""


def _iso(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat()


# Makes data_dir a node's directory holding the topic (partitions, configs), as a real node
# would: `tidelog restore` starts one (cli/archive.py).
CreateTopic = Callable[[Path, str, int, dict[str, str]], None]


def restore_topic(
    store: ArchiveStore,
    topic: str,
    point: RestorePoint,
    data_dir: Path,
    create_topic: CreateTopic,
    allow_outside: bool = False,
) -> list[RestoredPartition]:
    if data_dir.exists() and any(data_dir.iterdir()):
        raise InvalidRequest(f"--data {data_dir} is not empty: restore makes a new node's data")
    manifests = latest_manifests(store, topic)
    try:
        check_point(manifests, point)
    except RestorePointOutside as exc:
        if not allow_outside:
            raise
        log.warning("%s (restoring anyway: --allow-outside)", exc.message)
    partitions = max(max(m.partitions for m in manifests), max(m.partition for m in manifests) + 1)
    configs = {k: v for k, v in manifests[0].configs.items() if k not in NOT_RESTORED}
    create_topic(data_dir, topic, partitions, configs)
    config = TopicConfig.from_mapping(configs)
    by_partition = {m.partition: m for m in manifests}
    done = []
    for p in range(partitions):
        manifest = by_partition.get(p)
        done.append(
            _restore_partition(store, manifest, point, data_dir / f"{topic}-{p}", config, p)
        )
    return done


def _restore_partition(
    store: ArchiveStore,
    manifest: Manifest | None,
    point: RestorePoint,
    directory: Path,
    config: TopicConfig,
    partition: int,
) -> RestoredPartition:
    if manifest is None or not manifest.segments:
        return RestoredPartition(partition, 0, 0, 0, "nothing archived")
    slog = SegmentedLog(directory, config)
    note = ""
    records = 0
    max_epoch = 0
    last_ms = 0
    try:
        slog.truncate_fully_and_start_at(manifest.start_offset)
        for header, batch in _batches_to(store, manifest, point):
            if header.base_offset != slog.log_end_offset:
                note = f"stopped at the archive's gap at {slog.log_end_offset}"
                break
            slog.append_as_follower(batch)
            records += header.records_count
            max_epoch = max(max_epoch, header.partition_leader_epoch)
            last_ms = max(last_ms, header.max_timestamp)
        decided = _end_open_transactions(store, manifest, slog, max_epoch, last_ms)
        note = "; ".join(n for n in (note, decided) if n)
        slog.flush()
        slog.set_high_watermark(slog.log_end_offset)
        slog.write_state_checkpoint()
        end = slog.log_end_offset
    finally:
        slog.close()
    # The restored replica's next election must start past every epoch its batches carry.
    state_path = directory / "quorum-state"
    state = read_checkpoint(state_path) or {}
    state["epoch"] = max(int(state.get("epoch", 0)), max_epoch)
    state["voted_for"] = -1
    write_checkpoint(state_path, state)
    return RestoredPartition(partition, manifest.start_offset, end, records, note)


def _end_open_transactions(
    store: ArchiveStore, manifest: Manifest, slog: SegmentedLog, epoch: int, stamp_ms: int
) -> str:
    """End each transaction the point left open as the archive decides it further on (module
    docstring); what was done, for the restore's note ("" when nothing was open)."""
    opened = sorted(slog.transactions.open.values(), key=lambda t: t.first_offset)
    if not opened:
        return ""
    decisions = _decisions_after(
        store, manifest, slog.log_end_offset, {t.producer_id for t in opened}
    )
    counts = {"committed": 0, "aborted": 0, "aborted as undecided in the archive": 0}
    for t in opened:
        found = decisions.get(t.producer_id)
        marker = build_marker(
            t.producer_id,
            found.producer_epoch if found else t.producer_epoch,
            commit=found.commit if found else False,
            coordinator_epoch=found.coordinator_epoch if found else 0,
            now_ms=stamp_ms,  # within the restored span, as a --to-time copy's records are
        )
        slog.append_as_leader(marker, epoch)
        kind = (
            "aborted as undecided in the archive"
            if found is None
            else ("committed" if found.commit else "aborted")
        )
        counts[kind] += 1
    done = ", ".join(f"{n} {kind}" for kind, n in counts.items() if n)
    log.info("transactions the point cut through, ended as the archive decided them: %s", done)
    return f"transactions the point cut through: {done}"


def _decisions_after(
    store: ArchiveStore, manifest: Manifest, start: int, producers: set[int]
) -> dict[int, Marker]:
    """Each producer's first marker at or past start in the archive (its open transaction's
    decision), reading on only until every producer has one. The search stops at a hole in
    the offsets (a recorded gap): a marker past it may end a later transaction of the same
    producer. An object it cannot read leaves the rest undecided (aborted) rather than fail a
    restore that did not need that object before."""
    found: dict[int, Marker] = {}
    expected = start
    try:
        for seg in manifest.segments:
            if seg.end_offset <= start:
                continue
            for header, batch in iter_batches(store, seg, start):
                if header.base_offset < start:  # the batch the point cut
                    expected = max(expected, header.next_offset)
                    continue
                if header.base_offset != expected:
                    return found  # a hole: what follows may be another transaction's
                expected = header.next_offset
                marker = read_marker(batch, header)
                if marker is not None and marker.producer_id in producers:
                    found.setdefault(marker.producer_id, marker)
                    if len(found) == len(producers):
                        return found
    except ArchiveError as exc:
        log.warning("deciding the transactions the point cut: %s; the rest are aborted", exc)
    return found


def _batches_to(
    store: ArchiveStore, manifest: Manifest, point: RestorePoint
) -> Iterator[tuple[BatchHeader, bytes]]:
    """The archived batches up to the point, the last one cut where the point falls in it."""
    end = point.to_offset if point.to_offset is not None else 1 << 63
    until = point.to_time_ms if point.to_time_ms is not None else 1 << 63

    def keep(record: Record) -> bool:
        return record.offset < end and record.timestamp <= until

    for seg in manifest.segments:
        for header, batch in iter_batches(store, seg):
            if header.last_offset < end and header.max_timestamp <= until:
                yield header, batch
                continue
            if header.base_offset < end:
                records = _keep_while(batch, keep)
                if records:
                    yield _cut_records(header, records)
            return


def _keep_while(batch: bytes, keep: Callable[[Record], bool]) -> list[Record]:
    """The batch's records up to the first that keep refuses: a prefix, never a selection."""
    out = []
    for record in decode_records(batch):
        if not keep(record):
            break
        out.append(record)
    return out


def _cut_records(header: BatchHeader, records: list[Record]) -> tuple[BatchHeader, bytes]:
    """The batch holding only records (its first ones), ending at the last of them."""
    cut = header._replace(last_offset_delta=records[-1].offset - header.base_offset)
    data = rebuild_batch(cut, records)
    return read_header(data), data
