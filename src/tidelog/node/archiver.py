"""The node's side of the archive (tidelog/archive): uploads, the archive's hold on the local
low-water mark, reads below the local log start, and the archive's own cleaner.

For each partition of a topic with remote.storage.enable that this node hosts:
- its leader copies every closed segment lying wholly below the HW into the store, in objects of
  at most OBJECT_BYTES cut at batch boundaries, each read back and checked before the manifest
  names it (archive/manifest.py); one upload at a time node-wide, in a worker thread;
- every replica keeps the manifest it last read (the leader its own, others refreshed every
  MANIFEST_REFRESH_S) so that any replica can serve a fetch below its local log start;
- the archived end is a hold on the LWM (replication/low_watermark.py): the local cleaner never
  deletes what is not archived, unless archive.lag.policy=release says so, loudly;
- the leader deletes archived objects below what retention.ms / retention.bytes keep of the
  whole log (the archive included) and below every live cursor, manifest first.

A store that fails is retried with backoff (1 s doubling to 30 s); the error is kept and shown
as the hold's reason until an upload succeeds.

What the store holds is recorded where the store cannot lose it, the metadata log: the archive's
identity (cluster.json's archive_id) and each partition's extent, reported by its leader after
each manifest it writes. A store that comes back without them (a bucket re-created, a directory
replaced, a manifest deleted, an old backup) is ArchiveLost: the leaders once started a new
manifest at the local log start and the earliest offset jumped silently. Now uploads stop, the
local cleaner keeps what is not archived, status and /metrics name the error, a read of the lost
range is refused by name, until an operator runs `tidelog archive accept-loss`, which records the
lost ranges (as gaps) and lets uploads go on.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from tidelog.archive.manifest import (
    CLUSTER_KEY,
    ArchivedSegment,
    Gap,
    Manifest,
    ManifestPart,
    check_object,
    cluster_marker,
    describe_object,
    holds_until,
    manifest_key,
    part_bytes,
    part_key,
    partition_prefix,
)
from tidelog.archive.reader import committed_aborted, read_chunk
from tidelog.archive.store import ArchiveStore, VersionConflict, open_store
from tidelog.errors import (
    ArchiveClusterMismatch,
    ArchiveCorrupt,
    ArchiveError,
    ArchiveLagExceeded,
    ArchiveLost,
    StorageError,
    TidelogError,
    UnsupportedFormatVersion,
)
from tidelog.features import ARCHIVE_REPORTS_LEVEL, MAX_LEVEL
from tidelog.invariant import InvariantBroken
from tidelog.logs import event
from tidelog.node.metadata_log import MetadataLog
from tidelog.node.metrics import Counters
from tidelog.protocol.api import ApiKey
from tidelog.replication.low_watermark import ArchiveFact, human_bytes
from tidelog.replication.metadata_commands import (
    ArchiveClaimed,
    ArchiveExtent,
    ArchiveLoss,
    ArchiveLossAccepted,
    MetadataCommand,
    decode_command,
)

if TYPE_CHECKING:
    from tidelog.node.partition import PartitionHost

log = logging.getLogger(__name__)

ARCHIVE_TICK_S = 0.2
MANIFEST_REFRESH_S = 2.0
OBJECT_BYTES = 64 * 1024 * 1024
UPLOAD_TURN_S = 2.0  # one partition's uploads in a row, at most, before the next's
BACKOFF_MIN_S = 1.0
BACKOFF_MAX_S = 30.0
READ_AHEAD_MAX = 8  # ranges read ahead for readers of the archive, node-wide
READ_AHEAD_S = 5.0  # how long one waits for its reader
CLUSTER_RECHECK_S = 10.0  # cluster.json read again: a store emptied while we run is noticed
LOST_RECHECK_S = 2.0  # a partition whose store lost its archive is looked at again this often
REPORT_EVERY_S = 1.0
PARTS_CACHED = 256  # manifest parts (about 40 KB each) kept in memory, node-wide
ORPHAN_SWEEP_S = 600.0  # a leader looks for orphaned objects this often (and when it starts)
ORPHAN_AGE_S = 3600.0  # an object no manifest names, or a temporary file, this old is deleted  # a partition's extent reported to the metadata log at most this often


def wall_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class ArchiveState:
    """What this node knows of one partition's archive."""

    manifest: Manifest | None = None
    version: str | None = None  # the manifest's version as last read or written (CAS)
    loaded_at: float = -1e9
    error: ArchiveError | None = None
    retry_at: float = 0.0
    backoff_s: float = BACKOFF_MIN_S
    uploaded_objects: int = 0
    uploaded_bytes: int = 0
    # Bumped whenever what the hold says changes (manifest, error): cached LWMs key on it.
    changes: int = 0
    released_logged: float = -1e9
    reported_at: float = -1e9
    swept_at: float = -1e9

    @property
    def archived_end(self) -> int | None:
        if self.manifest is None:
            return None
        return self.manifest.end_offset if self.manifest.segments else None

    def failed(self, error: ArchiveError) -> None:
        if self.error is None or self.error.message != error.message:
            self.changes += 1
        self.error = error
        if isinstance(error, ArchiveLost):
            # Not the store failing: looked at again soon (one read), as an operator may
            # have accepted the loss meanwhile.
            self.retry_at = time.monotonic() + LOST_RECHECK_S
            return
        self.retry_at = time.monotonic() + self.backoff_s
        self.backoff_s = min(BACKOFF_MAX_S, self.backoff_s * 2)

    def succeeded(self) -> None:
        if self.error is not None:
            self.changes += 1
        self.error = None
        self.backoff_s = BACKOFF_MIN_S
        self.retry_at = 0.0


class Archiver:
    def __init__(
        self,
        metadata: MetadataLog,
        hosts: dict[str, PartitionHost],
        counters: Counters,
        cluster_id: Callable[[], str],
        url: str,
        endpoint: str = "",
        finalized_level: Callable[[], int] = lambda: MAX_LEVEL,
    ) -> None:
        self.metadata = metadata
        # The cluster's feature level: below ARCHIVE_REPORTS_LEVEL the archive works as in
        # 0.1.0, with no reports (so no loss of the store is detected: docs/formats.md).
        self.finalized_level = finalized_level
        self.hosts = hosts  # the node's replica groups (shared)
        self.counters = counters
        self.cluster_id = cluster_id  # the node's, once its data directory is read
        self.url = url
        self.store: ArchiveStore = open_store(url, endpoint)
        self.states: dict[str, ArchiveState] = {}
        self._cluster_checked_at = -1e9
        self.archive_id = ""  # the store's identity, as cluster.json says
        self.cluster_error: ArchiveError | None = None
        # Manifest parts never change: kept by key (the oldest go first past PARTS_CACHED).
        self._parts: dict[str, bytes] = {}
        self._parts_lock = threading.Lock()
        # (group, offset, max_bytes) -> (object, its read in a worker thread)
        self._ahead: dict[
            tuple[str, int, int], tuple[ArchivedSegment, asyncio.Task[tuple[bytes, int]]]
        ] = {}

    # -- what others ask ------------------------------------------------------------------------

    def state(self, host: PartitionHost) -> ArchiveState:
        state = self.states.get(host.group)
        if state is None:
            state = self.states[host.group] = ArchiveState()
        return state

    def facts_key(self, host: PartitionHost) -> tuple[int, ...]:
        """What changes when the archive's hold on host does (cached LWMs compare it)."""
        state = self.state(host)
        manifest = state.manifest
        return (
            state.changes,
            -2 if manifest is None else manifest.end_offset,
            -2 if manifest is None else manifest.start_offset,
            0 if self.cluster_error is None else 1 + len(self.cluster_error.message),
        )

    def fact(self, host: PartitionHost) -> ArchiveFact | None:
        """The archive's hold on host's local LWM (None: the topic is not archived)."""
        if not host.config.remote_storage_enable:
            return None
        state = self.state(host)
        slog = host.log
        end = state.archived_end
        error = state.error or self.cluster_error
        behind_from, lag = self._lag(host, state)
        behind = sum(
            1
            for seg, nxt in zip(slog.segments, slog.segments[1:], strict=False)
            if nxt.base_offset > behind_from
        )
        detail = f"{behind} segment{'s' if behind != 1 else ''} behind, {human_bytes(lag)}"
        if state.manifest is None:
            detail = "manifest not read yet"
        if error is not None:
            detail += f"; {error.name}: {error.message}"
        config = host.config
        live, why_not = True, ""
        if config.archive_lag_policy == "release" and 0 <= config.archive_max_lag_bytes < lag:
            live = False
            why_not = (
                f"{human_bytes(lag)} not archived > archive.max.lag.bytes "
                f"{human_bytes(config.archive_max_lag_bytes)} (archive.lag.policy=release)"
            )
            if host.replica.is_leader and time.monotonic() - state.released_logged > 10:
                state.released_logged = time.monotonic()
                event(
                    log,
                    logging.WARNING,
                    "archive_hold_released",
                    f"{host.group}: the archive {self.url} is {human_bytes(lag)} behind, past "
                    "archive.max.lag.bytes: the local cleaner goes on without it and what it "
                    "deletes will be missing from the archive",
                    topic=host.topic,
                    partition=host.partition,
                    lag_bytes=lag,
                    error=error.name if error is not None else "",
                )
        start = state.manifest.start_offset if state.manifest and state.manifest.segments else -1
        return ArchiveFact(
            name=self.url,
            archived_end=slog.log_start_offset if end is None else end,
            start_offset=start,
            detail=detail,
            live=live,
            why_not=why_not,
            lag_bytes=lag,
            segments_behind=behind,
            error=error.name if error is not None else "",
        )

    @staticmethod
    def _lag(host: PartitionHost, state: ArchiveState) -> tuple[int, int]:
        """(the first offset not archived, the bytes from it to the log end) on this disk."""
        slog = host.log
        end = state.archived_end
        behind_from = slog.log_start_offset if end is None else max(end, slog.log_start_offset)
        lag = slog.bytes_from(behind_from) if behind_from < slog.log_end_offset else 0
        return behind_from, lag

    def log_start_offset(self, host: PartitionHost) -> int:
        """The whole log's first offset: the archive's when it reaches the local log start."""
        local = host.log.log_start_offset
        state = self.states.get(host.group)
        if state is None or state.manifest is None:
            # Not read yet (a node just started): what the metadata log records it holds, so
            # that `earliest` does not jump to the local log start for a moment.
            extent = self.recorded_extent(host)
            if (
                extent is None
                or host.config.archive_lag_policy == "release"  # (a gap may lie before local)
                or (state is not None and isinstance(state.error, ArchiveLost))
            ):
                return local
            # (Its recorded end may lag the manifest's: the hold kept everything from there
            # to the local log start until it was archived.)
            start = int(extent["start_offset"])
            return start if 0 <= start < local else local
        manifest = state.manifest
        if not manifest.segments:
            return local
        if manifest.end_offset >= local and manifest.start_offset < local:
            return manifest.start_offset
        return local

    def check_produce(self, host: PartitionHost) -> None:
        config = host.config
        if (
            not config.remote_storage_enable
            or config.archive_max_lag_bytes < 0
            or config.archive_lag_policy != "refuse"
        ):
            return
        # Per produce: only the lag (one index lookup), not the hold's whole description.
        state = self.state(host)
        _, lag = self._lag(host, state)
        if lag > config.archive_max_lag_bytes:
            error = state.error or self.cluster_error
            raise ArchiveLagExceeded(
                f"{host.group}: {lag} bytes wait for the archive {self.url}, "
                f"archive.max.lag.bytes is {config.archive_max_lag_bytes}"
                + (f" ({error.name})" if error is not None else ""),
                lag_bytes=lag,
                limit_bytes=config.archive_max_lag_bytes,
            )

    async def read(self, host: PartitionHost, offset: int, max_bytes: int) -> bytes | None:
        """Whole batches from offset (below the local log start) out of the archive; None if the
        archive does not hold offset."""
        found = await self._read(host, offset, max_bytes)
        return found[1] if found is not None else None

    async def read_committed(
        self, host: PartitionHost, offset: int, max_bytes: int
    ) -> tuple[bytes, list[list[int]]] | None:
        """read, for a read_committed reader: the batches and [producer id, first offset] of
        each aborted transaction with a batch among them, as the object's manifest entry names
        them (every archived object is below the LSO: decided). An entry from before the
        archive kept them is served only if it holds no transactional batch (InvalidRequest)."""
        found = await self._read(host, offset, max_bytes)
        if found is None:
            return None
        seg, data, next_offset = found
        return data, committed_aborted(seg, data, offset, next_offset)

    async def _read(
        self, host: PartitionHost, offset: int, max_bytes: int
    ) -> tuple[ArchivedSegment, bytes, int] | None:
        """(the object read, its whole batches from offset, the offset after them)."""
        state = self.state(host)
        manifest = state.manifest
        if manifest is None or manifest.end_offset <= offset:
            # A follower's copy of the manifest may be older than the log start the leader
            # moved past it: read it again rather than tell a reader the offset is gone.
            await self._load(host, state)
            manifest = state.manifest
        if manifest is None or not manifest.segments:
            return None
        if not manifest.start_offset <= offset < manifest.end_offset:
            return None
        seg = manifest.segment_for(offset)
        if seg is None:
            return None
        ahead = self._ahead.pop((host.group, offset, max_bytes), None)
        try:
            if ahead is not None and ahead[0].key == seg.key:
                data, next_offset = await ahead[1]
            else:
                data, next_offset = await asyncio.to_thread(
                    read_chunk, self.store, seg, offset, max_bytes
                )
        except ArchiveError:
            # The manifest held may be what is wrong (repaired or replaced since): the next
            # read reads it again, rather than answer this error until a restart.
            if state.manifest is manifest:
                state.manifest = None
            raise
        self.counters.inc("tidelog_archive_reads_total")
        self.counters.inc("tidelog_archive_read_bytes_total", len(data))
        self._read_ahead(host, manifest, next_offset, max_bytes)
        return seg, data, next_offset

    def _read_ahead(
        self, host: PartitionHost, manifest: Manifest, offset: int, max_bytes: int
    ) -> None:
        """A reader of the archive reads on: the next range is read while it handles this one.
        At most READ_AHEAD_MAX ranges are held node-wide (bounded memory); one nobody asks for
        within READ_AHEAD_S goes."""
        if offset >= manifest.end_offset or len(self._ahead) >= READ_AHEAD_MAX:
            return
        seg = manifest.segment_for(offset)
        if seg is None:
            return
        key = (host.group, offset, max_bytes)
        task = asyncio.get_running_loop().create_task(
            asyncio.to_thread(read_chunk, self.store, seg, offset, max_bytes)
        )
        self._ahead[key] = (seg, task)

        def forget() -> None:
            found = self._ahead.get(key)
            if found is not None and found[1] is task:
                del self._ahead[key]

        task.add_done_callback(
            lambda _: asyncio.get_running_loop().call_later(READ_AHEAD_S, forget)
        )
        # A read-ahead nobody used may fail (the store went away): its error is not anyone's.
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    def status(self, host: PartitionHost) -> dict[str, object] | None:
        fact = self.fact(host)
        if fact is None:
            return None
        state = self.state(host)
        manifest = state.manifest
        error = state.error or self.cluster_error
        return {
            "url": self.url,
            "prefix": partition_prefix(host.topic, host.topic_id, host.partition),
            "start_offset": fact.start_offset,
            "archived_end_offset": state.archived_end if state.archived_end is not None else -1,
            "objects": len(manifest.segments) if manifest else 0,
            "bytes": manifest.size_bytes if manifest else 0,
            "lag_bytes": fact.lag_bytes,
            "segments_behind": fact.segments_behind,
            "error": fact.error,
            "error_message": error.message if error is not None else "",
            "uploaded_objects": state.uploaded_objects,
            "uploaded_bytes": state.uploaded_bytes,
        }

    # -- the loop -------------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            await asyncio.sleep(ARCHIVE_TICK_S)
            if not await self._check_cluster():
                continue
            for host in list(self.hosts.values()):
                if host.closed or not host.config.remote_storage_enable:
                    continue
                state = self.state(host)
                if time.monotonic() < state.retry_at:
                    continue
                try:
                    await self._step(host, state)
                    self._report_extent(host, state)
                except ArchiveLost as exc:
                    if state.error is None or state.error.message != exc.message:
                        self._log_lost(exc, host)
                    state.failed(exc)
                except ArchiveError as exc:
                    if state.error is None or state.error.message != exc.message:
                        log.warning("%s: archive %s: %s", host.group, self.url, exc)
                    state.failed(exc)
                except (TidelogError, OSError) as exc:
                    error = ArchiveError(f"{type(exc).__name__}: {exc}", url=self.url)
                    log.warning("%s: archiving failed: %s", host.group, error)
                    state.failed(error)

    async def _check_cluster(self) -> bool:
        """cluster.json names the cluster that owns the prefix (another cluster's is refused)
        and the store's identity, which must be the one the metadata log recorded: read again
        every CLUSTER_RECHECK_S."""
        if (
            self.cluster_error is None
            and time.monotonic() - self._cluster_checked_at < CLUSTER_RECHECK_S
        ):
            return True
        cluster_id = self.cluster_id()
        recorded = self.metadata.state.archive_id
        try:
            self.archive_id = await asyncio.to_thread(
                claim_archive, self.store, cluster_id, recorded
            )
            if recorded and self.archive_id != recorded:
                raise ArchiveLost(
                    f"{self.url} is not the store the cluster archived to: its archive id is "
                    f"{self.archive_id}, the metadata log records {recorded} (a bucket or "
                    "directory replaced?). Uploads stop until `tidelog archive accept-loss`",
                    url=self.url,
                    archive_id=self.archive_id,
                    recorded_archive_id=recorded,
                )
        except ArchiveLost as exc:
            if self.cluster_error is None or self.cluster_error.message != exc.message:
                self._log_lost(exc, None)
            self.cluster_error = exc
            for state in self.states.values():
                state.manifest = None  # read again once an operator decided
            await asyncio.sleep(BACKOFF_MIN_S)
            return False
        except ArchiveClusterMismatch as exc:
            if self.cluster_error is None:
                log.error("archive %s refused: %s", self.url, exc)
            self.cluster_error = exc
            return False
        except ArchiveError as exc:
            if self.cluster_error is None or self.cluster_error.message != exc.message:
                log.warning("archive %s: %s", self.url, exc)
            self.cluster_error = exc
            await asyncio.sleep(BACKOFF_MIN_S)
            return False
        if not recorded:
            self._report(ArchiveClaimed(self.archive_id), "claimed")
        self.cluster_error = None
        self._cluster_checked_at = time.monotonic()
        return True

    def _log_lost(self, exc: ArchiveLost, host: PartitionHost | None) -> None:
        event(
            log,
            logging.ERROR,
            "archive_lost",
            exc.message,
            topic=host.topic if host is not None else "",
            partition=host.partition if host is not None else -1,
            start_offset=int(exc.details.get("lost_start", -1)),
            end_offset=int(exc.details.get("lost_end", -1)),
        )

    def recorded_extent(self, host: PartitionHost) -> dict[str, Any] | None:
        """What the metadata log records of host's archive (None: nothing, or another
        incarnation of its topic's)."""
        extent = self.metadata.state.archive_extents.get(host.group)
        if extent is None or extent.get("topic_id") != host.topic_id:
            return None
        return extent

    def check_holds(self, host: PartitionHost, manifest: Manifest | None) -> None:
        """ArchiveLost if the store's manifest (None: none) holds less than the metadata log
        recorded: its end before the recorded end."""
        extent = self.recorded_extent(host)
        if extent is None:
            return
        start, end = int(extent["start_offset"]), int(extent["end_offset"])
        if end <= start or start < 0:
            return
        held = holds_until(manifest)
        if held >= end:
            return
        lost_start = max(start, held)
        raise ArchiveLost(
            f"{host.group}: the store {self.url} lost offsets [{lost_start}, {end}) the "
            f"metadata log records it held ([{start}, {end}); "
            + ("no manifest" if manifest is None else f"the manifest ends at {held}")
            + "). Uploads stop and the local log keeps what is not archived until "
            "`tidelog archive accept-loss` records the loss",
            url=self.url,
            topic=host.topic,
            partition=host.partition,
            lost_start=lost_start,
            lost_end=end,
            log_start=host.log.log_start_offset,
            high_watermark=host.log.high_watermark,
        )

    def lost_range(self, host: PartitionHost, offset: int) -> tuple[int, int] | None:
        """The lost range holding offset: one an operator accepted (recorded), or one the
        partition's store lost now."""
        extent = self.recorded_extent(host)
        ranges = [(int(a), int(b)) for a, b in extent.get("lost", [])] if extent else []
        error = self.state(host).error or self.cluster_error
        if isinstance(error, ArchiveLost):
            if "lost_start" in error.details:
                ranges.append((int(error.details["lost_start"]), int(error.details["lost_end"])))
            elif extent is not None:
                ranges.append((int(extent["start_offset"]), int(extent["end_offset"])))
        for start, end in ranges:
            if start <= offset < end:
                return start, end
        return None

    def _report_extent(self, host: PartitionHost, state: ArchiveState) -> None:
        """A leader tells the metadata log what its manifest holds, when it differs from what
        is recorded (at most every REPORT_EVERY_S; lost reports are sent again)."""
        manifest = state.manifest
        if manifest is None or not host.replica.is_leader or not self.archive_id:
            return
        start = manifest.start_offset
        end = holds_until(manifest)
        if end < 0:
            return  # nothing archived yet
        extent = self.recorded_extent(host)
        if extent is not None and (extent["start_offset"], extent["end_offset"]) == (start, end):
            return
        now = time.monotonic()
        if now - state.reported_at < REPORT_EVERY_S:
            return
        state.reported_at = now
        command = ArchiveExtent(
            host.topic, host.topic_id, host.partition, self.archive_id, start, end
        )
        self._report(command, f"{host.group} archived [{start}, {end})")

    def _report(self, command: MetadataCommand, what: str) -> None:
        if self.finalized_level() < ARCHIVE_REPORTS_LEVEL:
            return  # a 0.1.0 metadata leader would refuse the message (features.py)
        self.metadata.report(f"archive {what}", ApiKey.ARCHIVE_REPORT, command)

    def on_report_message(self, header: dict[str, object], sender: int) -> None:
        """A partition leader (an authenticated peer) reports its archive; recorded if we lead
        the metadata log (the command's own checks drop a stale one)."""
        kind = header.get("type")
        if kind not in ("archive_extent", "archive_claimed"):
            return
        if not self.metadata.is_leader:
            return
        command = {k: header[k] for k in REPORT_FIELDS if k in header}
        types = {"name": str, "archive_id": str}
        for field in REPORT_FIELDS[1:]:
            wanted = types.get(field, int)
            value = command.get(field, "" if wanted is str else 0)
            # (Every node applies what is proposed: a malformed report must not reach them.)
            if type(value) is not wanted:
                log.warning("node %d sent a malformed archive report: %s", sender, header)
                return
            command[field] = value
        key = f"archive report {kind} {header.get('name', '')}/{header.get('partition', '')}"
        self.metadata.propose_in_background(key, decode_command(command))

    async def accept_loss(self) -> tuple[str, list[dict[str, object]]]:
        """The store's present contents are the truth from now on (the metadata leader, for
        an operator): every recorded extent is compared with its manifest, what the store
        lost is recorded, and the store's identity is recorded (a new cluster.json if none)."""
        cluster_id = self.cluster_id()
        archive_id = await asyncio.to_thread(claim_archive, self.store, cluster_id, "")
        lost: list[ArchiveLoss] = []
        for key, extent in sorted(self.metadata.state.archive_extents.items()):
            topic, _, partition_text = key.rpartition("/")
            meta = self.metadata.state.topics.get(topic)
            if meta is None or meta.topic_id != extent["topic_id"]:
                continue
            partition = int(partition_text)
            manifest_at = manifest_key(topic, meta.topic_id, partition)
            manifest, _ = await asyncio.to_thread(self._read_manifest, manifest_at)
            start, end = int(extent["start_offset"]), int(extent["end_offset"])
            held = holds_until(manifest)
            if held >= end or end <= start:
                continue
            lost.append(
                ArchiveLoss(
                    name=topic,
                    partition=partition,
                    topic_id=meta.topic_id,
                    start_offset=max(start, held),
                    end_offset=end,
                    now_start=manifest.start_offset if manifest is not None else -1,
                    now_end=held,
                )
            )
        await self.metadata.propose(ArchiveLossAccepted(archive_id, lost), 30.0)
        for loss in lost:
            log.warning(
                "%s/%s: the archive's loss of [%s, %s) accepted by an operator: uploads go on",
                loss.name,
                loss.partition,
                loss.start_offset,
                loss.end_offset,
            )
        self._cluster_checked_at = -1e9
        for state in self.states.values():
            state.retry_at = 0.0
            state.backoff_s = BACKOFF_MIN_S
        return archive_id, [loss.to_wire() for loss in lost]

    async def _step(self, host: PartitionHost, state: ArchiveState) -> None:
        leader = host.replica.is_leader
        stale = time.monotonic() - state.loaded_at > MANIFEST_REFRESH_S
        if state.manifest is None or (stale and not leader):
            await self._load(host, state)
        if not leader:
            state.succeeded()  # (a manifest repaired since: its error goes, no restart needed)
            return
        # Everything ready goes now (each object in a worker thread; the loop is free
        # meanwhile), within a time budget so that other partitions get their turn.
        budget_ends = time.monotonic() + UPLOAD_TURN_S
        while await self._upload_next(host, state):
            state.succeeded()
            if time.monotonic() > budget_ends:
                return
        await self._clean(host, state)
        await self._sweep_orphans(host, state)
        state.succeeded()

    async def _sweep_orphans(self, host: PartitionHost, state: ArchiveState) -> None:
        """Objects no manifest names (an upload killed before its manifest named it, a lost
        race) and unfinished writes (.tmp) stayed forever. An hour old, they are no upload in
        flight: the leader deletes them."""
        if time.monotonic() - state.swept_at < ORPHAN_SWEEP_S or state.manifest is None:
            return
        state.swept_at = time.monotonic()
        prefix = partition_prefix(host.topic, host.topic_id, host.partition)
        named = {seg.key for seg in state.manifest.segments}
        named.update(part.key for part in state.manifest.parts)
        aged = await asyncio.to_thread(self.store.list_aged, prefix + "/")
        orphans = [
            key
            for key, age in aged
            if age > ORPHAN_AGE_S and key not in named and not key.endswith("/manifest.json")
        ]
        for key in orphans:
            await asyncio.to_thread(self.store.delete, key)
        if orphans:
            self.counters.inc("tidelog_archive_orphans_deleted_total", len(orphans))
            log.info("%s: %d orphaned archive objects deleted", host.group, len(orphans))

    async def _load(self, host: PartitionHost, state: ArchiveState) -> None:
        key = manifest_key(host.topic, host.topic_id, host.partition)
        manifest, version = await asyncio.to_thread(self._read_manifest, key)
        if manifest is None:
            self.check_holds(host, None)
            state.manifest = self._new_manifest(host)
            state.version = None
        else:
            self._check_owner(manifest)
            self.check_holds(host, manifest)
            state.manifest, state.version = manifest, version
        state.loaded_at = time.monotonic()

    def _read_manifest(self, key: str) -> tuple[Manifest | None, str | None]:
        """A manifest and its version, its parts included (in a worker thread)."""
        versioned = self.store.get_versioned(key)
        if versioned is None:
            return None, None
        return Manifest.from_bytes(versioned.data, key, self._read_part), versioned.version

    def _read_part(self, key: str) -> bytes:
        """A manifest part, from memory if read before (worker threads share the cache)."""
        with self._parts_lock:
            data = self._parts.get(key)
        if data is None:
            data = self.store.get(key)
            with self._parts_lock:
                self._parts[key] = data
                while len(self._parts) > PARTS_CACHED:
                    del self._parts[next(iter(self._parts))]
        return data

    def _new_manifest(self, host: PartitionHost) -> Manifest:
        meta = self.metadata.state.topics.get(host.topic)
        extent = self.recorded_extent(host)
        lost = extent.get("lost", []) if extent is not None else []
        return Manifest(
            cluster_id=self.cluster_id(),
            topic=host.topic,
            topic_id=host.topic_id,
            partition=host.partition,
            configs=host.config.overrides(),
            partitions=len(meta.assignments) if meta is not None else 1,
            gaps=tuple(Gap(int(a), int(b), LOST_REASON) for a, b in lost),
        )

    def _check_owner(self, manifest: Manifest) -> None:
        if manifest.cluster_id != self.cluster_id():
            raise ArchiveClusterMismatch(
                f"{self.url}: {manifest.topic}/{manifest.partition} belongs to cluster "
                f"{manifest.cluster_id}, this is {self.cluster_id()}",
                url=self.url,
            )

    def _next_range(
        self, host: PartitionHost, state: ArchiveState
    ) -> tuple[str, int, int, int] | None:
        """(segment file, start position, end position, first offset) of the next object: the
        rest of the closed segment the archive ends in, wholly below the LSO (so every
        transaction with a batch in it is decided, and its entry can name the aborted ones, as
        Kafka's tiered storage copies only below the LSO); None if none."""
        slog = host.log
        manifest = state.manifest
        if manifest is None:
            raise InvariantBroken("manifest is not None")
        next_offset = manifest.end_offset if manifest.segments else slog.log_start_offset
        next_offset = max(next_offset, slog.log_start_offset)
        segments = slog.segments
        stable = host.replica.last_stable_offset()  # (at most the HW)
        for seg, nxt in itertools.pairwise(segments):
            if nxt.base_offset <= next_offset:
                continue
            if nxt.base_offset > stable:
                return None  # not wholly committed and decided yet
            start = seg.position_of(next_offset)
            if start >= seg.size_bytes:
                return None
            end = seg.batch_boundary_at_or_before(start + OBJECT_BYTES, start)
            if end <= start:  # one batch larger than an object: it goes alone
                found = seg.find(next_offset)
                end = start + (found[1].size_bytes if found else 0)
            return str(seg.log_path), start, end, next_offset
        return None

    async def _upload_next(self, host: PartitionHost, state: ArchiveState) -> bool:
        found = self._next_range(host, state)
        if found is None:
            return False
        path, start, end, first_offset = found
        manifest = state.manifest
        if manifest is None:
            raise InvariantBroken("manifest is not None")
        epoch = host.replica.epoch
        node_id = self.metadata.node_id
        prefix = partition_prefix(host.topic, host.topic_id, host.partition)

        def upload() -> ArchivedSegment:
            data = _read_file_range(path, start, end)
            probe = describe_object(data, "")
            if probe.base_offset != first_offset:
                raise ArchiveError(
                    f"{path} at {start}: batch starts at {probe.base_offset}, the archive "
                    f"ends at {first_offset}",
                    url=self.url,
                )
            key = (
                f"{prefix}/{probe.base_offset:020d}-{probe.end_offset:020d}-e{epoch}-"
                f"{uuid.uuid4().hex[:8]}.log"
            )
            seg = replace(probe, key=key, uploaded_by=node_id, uploaded_ms=wall_ms())
            self.store.put(key, data)
            check_object(seg, self.store.get(key))  # counts only once it reads back whole
            return seg

        seg = await asyncio.to_thread(upload)
        if not host.replica.is_leader or host.replica.epoch != epoch:
            await asyncio.to_thread(self.store.delete, seg.key)
            return False
        seg = with_aborted_transactions(host, seg)
        if seg.base_offset > manifest.end_offset >= 0:
            event(
                log,
                logging.WARNING,
                "archive_gap",
                f"{host.group}: offsets [{manifest.end_offset}, {seg.base_offset}) were deleted "
                "locally before they were archived: the archive records the gap",
                topic=host.topic,
                partition=host.partition,
                start_offset=manifest.end_offset,
                end_offset=seg.base_offset,
            )
        new = manifest.appended(seg, epoch)
        sealed = new.to_seal()
        part: ManifestPart | None = None
        if sealed:  # the oldest entries go into a part first: the manifest stays small
            base, end = sealed[0].base_offset, sealed[-1].end_offset
            part = ManifestPart(
                part_key(prefix, base, end, uuid.uuid4().hex[:8]), base, end, len(sealed)
            )
            data = part_bytes(sealed)
            await asyncio.to_thread(self.store.put, part.key, data)
            with self._parts_lock:
                self._parts[part.key] = data
            new = new.sealed(part)
        key = manifest_key(host.topic, host.topic_id, host.partition)
        try:
            version = await asyncio.to_thread(self.store.put_if, key, new.to_bytes(), state.version)
        except VersionConflict:
            # Someone else (a leader before us, still finishing) wrote it: read it again, and
            # let the objects we wrote go (they are in no manifest).
            await asyncio.to_thread(self.store.delete, seg.key)
            if part is not None:
                await asyncio.to_thread(self.store.delete, part.key)
            state.manifest = None
            return False
        state.manifest, state.version = new, version
        state.loaded_at = time.monotonic()
        state.uploaded_objects += 1
        state.uploaded_bytes += seg.size
        self.counters.inc("tidelog_archive_uploaded_bytes_total", seg.size)
        self.counters.inc("tidelog_archive_uploaded_objects_total")
        host.low_watermark_cache = None
        return True

    async def _clean(self, host: PartitionHost, state: ArchiveState) -> None:
        """Objects the whole log's retention no longer keeps, below the local log start and
        every live cursor, leave the archive: the manifest first, then the objects."""
        manifest = state.manifest
        if manifest is None or not manifest.segments:
            return
        keep_from = self._archive_keep_from(host, manifest)
        new, gone = manifest.without_below(keep_from)
        if not gone:
            return
        key = manifest_key(host.topic, host.topic_id, host.partition)
        try:
            version = await asyncio.to_thread(self.store.put_if, key, new.to_bytes(), state.version)
        except VersionConflict:
            state.manifest = None
            return
        state.manifest, state.version = new, version
        for seg in gone:
            await asyncio.to_thread(self.store.delete, seg.key)
        for part in manifest.parts_without(new):
            await asyncio.to_thread(self.store.delete, part.key)
            with self._parts_lock:
                self._parts.pop(part.key, None)
        self.counters.inc("tidelog_archive_deleted_objects_total", len(gone))
        log.info(
            "%s: archive start %d -> %d (%d objects deleted)",
            host.group,
            manifest.start_offset,
            new.start_offset,
            len(gone),
        )

    def _archive_keep_from(self, host: PartitionHost, manifest: Manifest) -> int:
        config = host.config
        slog = host.log
        keep = manifest.start_offset
        now = wall_ms()
        candidates = [s for s in manifest.segments if s.end_offset <= slog.log_start_offset]
        if config.retention_ms >= 0:
            for seg in candidates:
                if now - seg.max_timestamp > config.retention_ms:
                    keep = max(keep, seg.end_offset)
                else:
                    break
        if config.retention_bytes >= 0:
            local = slog.size_bytes
            total = local + sum(
                s.size for s in manifest.segments if s.end_offset <= slog.log_start_offset
            )
            for seg in candidates:
                if total <= config.retention_bytes:
                    break
                total -= seg.size
                keep = max(keep, seg.end_offset)
        for cursor in self.metadata.state.cursors.values():
            if cursor.topic == host.topic and cursor.live and config.cursors_hold:
                position = cursor.positions.get(host.partition)
                if position is not None:
                    keep = min(keep, max(position, manifest.start_offset))
        return keep


LOST_REASON = "lost from the store (accepted by an operator)"
REPORT_FIELDS = (
    "type",
    "name",
    "topic_id",
    "partition",
    "archive_id",
    "start_offset",
    "end_offset",
)


def with_aborted_transactions(host: PartitionHost, seg: ArchivedSegment) -> ArchivedSegment:
    """The entry naming the aborted transactions with a batch in its object, as the log's
    transaction state has them. Called on the loop that feeds that state; the object is still
    on the local disk (nothing unarchived is deleted), so the state still knows its range, and
    it lies below the LSO, so every transaction in it is decided."""
    aborted = host.log.aborted_transactions(seg.base_offset, seg.end_offset)
    return replace(
        seg,
        aborted_transactions=tuple(
            (t.producer_id, t.first_offset, t.marker_offset) for t in aborted
        ),
    )


def claim_archive(store: ArchiveStore, cluster_id: str, recorded_archive_id: str = "") -> str:
    """Make the archive this cluster's, or refuse one that is another's; the store's identity
    (a random archive_id, written once). A missing cluster.json is written anew only while the
    metadata log records no identity (recorded_archive_id ""): otherwise the store lost it."""
    import json

    versioned = store.get_versioned(CLUSTER_KEY)
    if versioned is None:
        if recorded_archive_id:
            raise ArchiveLost(
                f"{store.url}: {CLUSTER_KEY} is gone, though the metadata log records archive "
                f"{recorded_archive_id} there: the store lost what it held (a bucket re-created, "
                "a directory replaced?). Uploads stop until `tidelog archive accept-loss`",
                url=store.url,
                recorded_archive_id=recorded_archive_id,
            )
        body = {"format": 1, "cluster_id": cluster_id, "archive_id": uuid.uuid4().hex}
        try:
            store.put_if(CLUSTER_KEY, json.dumps(body).encode(), None)
        except VersionConflict:
            pass
        versioned = store.get_versioned(CLUSTER_KEY)
        if versioned is None:
            raise ArchiveError(f"{store.url}: {CLUSTER_KEY} vanished", url=store.url)
    try:
        claimed = cluster_marker(versioned.data)
        owner = str(claimed["cluster_id"])
    except UnsupportedFormatVersion as exc:
        # A newer tidelog's archive: never written over (uploads wait, the error names it).
        raise ArchiveError(f"{store.url}: {exc.message}", url=store.url) from None
    except (ArchiveCorrupt, KeyError, TypeError):
        raise ArchiveClusterMismatch(
            f"{store.url}: {CLUSTER_KEY} is not a tidelog archive's", url=store.url
        ) from None
    if owner != cluster_id:
        raise ArchiveClusterMismatch(
            f"{store.url} is the archive of cluster {owner}; this is cluster {cluster_id}",
            url=store.url,
            archive_cluster_id=owner,
        )
    archive_id = str(claimed.get("archive_id", ""))
    if not archive_id:  # written before archives had an identity: given one now, once
        claimed["archive_id"] = uuid.uuid4().hex
        try:
            store.put_if(CLUSTER_KEY, json.dumps(claimed).encode(), versioned.version)
        except VersionConflict:
            pass  # another node gave it one first
        return claim_archive(store, cluster_id, recorded_archive_id)
    return archive_id


def _read_file_range(path: str, start: int, end: int) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise StorageError(f"{path} is gone (deleted since it was chosen)") from None
    try:
        data = os.pread(fd, end - start, start)
    finally:
        os.close(fd)
    if len(data) != end - start:
        raise StorageError(f"{path}: {len(data)} bytes at {start}, expected {end - start}")
    return data
