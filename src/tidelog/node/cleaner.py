"""The background cleaner of a node: every retention.check.interval.ms per partition it gathers
the facts the low-water mark is decided from (replication/low_watermark.py decides; the partition
driver moves the leader's log start up to it, durably, before any file is touched), deletes
whole segments below the log start, and records the invalidation of cursors past their caps
through the metadata log (they stop holding at once).
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import logging
import time
from typing import Any

from tidelog.errors import TidelogError, Timeout
from tidelog.logs import event
from tidelog.node.archiver import Archiver
from tidelog.node.metadata_log import MetadataLog
from tidelog.node.partition import PartitionHost
from tidelog.node.status import CachedLowWatermark
from tidelog.node.turns import Turns
from tidelog.protocol.api import ApiKey
from tidelog.replication.low_watermark import (
    ArchiveFact,
    CursorFact,
    LowWatermark,
    LowWatermarkFacts,
    transaction_facts,
)
from tidelog.replication.metadata_commands import InvalidateCursor

log = logging.getLogger(__name__)

# A cached LWM whose facts have not changed is reused for this long (cached_low_watermark).
LWM_MAX_AGE_S = 1.0

CLEANER_TICK_S = 0.1
# An invalidation asked of the metadata leader by a peer message is asked again this often
# (a message may be lost) until it is applied here, for at most INVALIDATE_WAIT_S.
INVALIDATE_RESEND_S = 0.2
INVALIDATE_WAIT_S = 30.0


def wall_ms() -> int:
    return int(time.time() * 1000)


class Cleaner:
    def __init__(
        self, metadata: MetadataLog, hosts: dict[str, PartitionHost], archiver: Archiver | None
    ) -> None:
        self.metadata = metadata
        self.hosts = hosts  # the node's replica groups (shared): a removed one is not cleaned
        self.archiver = archiver
        self._due: list[tuple[float, int, PartitionHost]] = []  # (due time, seq, replica)
        self._seq = 0
        self._invalidating: set[str] = set()
        self._requested: set[str] = set()
        self._to_scrub: collections.deque[PartitionHost] = collections.deque()
        self._scrubbing: PartitionHost | None = None
        self.passes = 0

    def scrub_later(self, host: PartitionHost) -> None:
        """Check, in the background, what host's log held when it opened (storage/scrub.py)."""
        self._to_scrub.append(host)

    def _scrub(self) -> None:
        """One scrub step at a time, node-wide: it reads whole segments."""
        if self._scrubbing is not None and self._scrubbing.scrubbing:
            return
        while self._to_scrub:
            host = self._to_scrub[0]
            if host.scrub_pending:
                self._scrubbing = host
                host.scrub_step()
                return
            if not host.scrubbing:
                self._to_scrub.popleft()
            else:
                return

    def watch(self, host: PartitionHost) -> None:
        """A replica opened on this node: a first pass soon, then every
        retention.check.interval.ms (a heap of due times: no pass visits the others)."""
        self._seq += 1
        heapq.heappush(self._due, (time.monotonic(), self._seq, host))

    async def run(self) -> None:
        while True:
            await asyncio.sleep(CLEANER_TICK_S)
            self._scrub()
            now = time.monotonic()
            turns = Turns()
            while self._due and self._due[0][0] <= now:
                _, _, host = heapq.heappop(self._due)
                if host.closed or self.hosts.get(host.group) is not host:
                    continue  # removed: no more passes
                self._seq += 1
                interval = host.config.retention_check_interval_ms / 1000
                heapq.heappush(self._due, (now + interval, self._seq, host))
                try:
                    self.clean(host)
                except TidelogError as exc:
                    log.error("%s: cleaning failed: %s", host.group, exc)
                await turns.take()

    def request(self, host: PartitionHost) -> None:
        """A pass for this partition soon (a segment rolled): retention.bytes holds between
        passes too, not only every retention.check.interval.ms."""
        if host.group in self._requested:
            return
        self._requested.add(host.group)

        def run() -> None:
            self._requested.discard(host.group)
            if not host.closed:
                try:
                    self.clean(host)
                except TidelogError as exc:
                    log.error("%s: cleaning failed: %s", host.group, exc)

        asyncio.get_running_loop().call_soon(run)

    def facts(self, host: PartitionHost) -> LowWatermarkFacts:
        """What the low-water mark is decided from, as this node knows it now."""
        slog = host.log
        cursors = tuple(
            CursorFact(
                c.name,
                c.positions[host.partition],
                c.committed_ms,
                slog.bytes_from(c.positions[host.partition]),
                c.backup,
                c.invalidated,
            )
            for c in self.metadata.state.cursors.values()
            if c.topic == host.topic and host.partition in c.positions
        )
        now = wall_ms()
        return LowWatermarkFacts(
            slog.log_start_offset,
            slog.high_watermark,
            slog.segments,
            host.config,
            now,
            cursors=cursors,
            snapshot_offset=host.snapshot_offset(),
            state_machine=host.state_machine is not None,
            archive=self.archive_fact(host),
            transactions=transaction_facts(slog.transactions, slog.high_watermark, now),
        )

    def archive_fact(self, host: PartitionHost) -> ArchiveFact | None:
        """The archive's hold on host's LWM; a topic archived on a node with no --archive
        holds everything (nothing unarchived is deleted)."""
        if not host.config.remote_storage_enable:
            return None
        if self.archiver is None:
            start = host.log.log_start_offset
            return ArchiveFact(
                name="(none)",
                archived_end=start,
                start_offset=-1,
                detail=f"remote.storage.enable, but node {self.metadata.node_id} has no --archive",
                error="ArchiveError",
            )
        return self.archiver.fact(host)

    def low_watermark(self, host: PartitionHost) -> LowWatermark:
        """Decided now, from the facts as they are."""
        lwm = host.driver.low_watermark(self.facts(host))
        self._remember(host, lwm)
        return lwm

    def cached_low_watermark(self, host: PartitionHost) -> LowWatermark:
        """The last LWM decided for host if nothing it was decided from has changed since and it
        is younger than LWM_MAX_AGE_S; else decided now. Status and /metrics read this, so a
        node with many idle partitions answers them without deciding every LWM each time."""
        cached = host.low_watermark_cache
        if (
            cached is not None
            and cached.key == self._facts_key(host)
            and time.monotonic() - cached.decided_at < LWM_MAX_AGE_S
        ):
            return cached.value
        return self.low_watermark(host)

    def _facts_key(self, host: PartitionHost) -> tuple[int, ...]:
        """What changes when an LWM's facts do (but time): the log's bounds, the replicas'
        leadership, the metadata (cursors, configs), the archive's hold."""
        slog, replica = host.log, host.replica
        archiver = self.archiver
        archive = archiver.facts_key(host) if archiver is not None else ()
        return (
            slog.log_start_offset,
            slog.high_watermark,
            slog.log_end_offset,
            slog.segment_count,
            replica.epoch,
            replica.leader_id,
            self.metadata.state.applied_offset,
            *archive,
        )

    def _remember(self, host: PartitionHost, lwm: LowWatermark) -> None:
        host.low_watermark_cache = CachedLowWatermark(self._facts_key(host), time.monotonic(), lwm)

    def clean(self, host: PartitionHost) -> None:
        """One pass over one partition."""
        self.passes += 1
        before = host.log.log_start_offset
        lwm = host.driver.clean(lambda: self.facts(host))
        if lwm is not None and host.log.log_start_offset == before:
            self._remember(host, lwm)  # (a moved log start changes its figures: decided anew)
        if lwm is not None and host.log.log_start_offset > before:
            after = host.log.log_start_offset
            event(
                log,
                logging.INFO,
                "log_start_moved",
                f"{host.group}: log start {before} -> {after} "
                f"(low-water mark set by {lwm.hold.describe()})",
                topic=host.topic,
                partition=host.partition,
                previous_log_start_offset=before,
                log_start_offset=after,
                set_by=lwm.hold.describe(),
            )
        self.delete_below_log_start(host)
        host.log.expire_producers()
        host.log.purge_retired()
        host.log.maybe_roll_by_time()
        host.after_cleaning()

    def delete_below_log_start(self, host: PartitionHost) -> None:
        """Whole segments below the log start go (the host logs and counts them)."""
        host.log.delete_segments_below_log_start()

    # -- cursor invalidation --------------------------------------------------------------------

    def on_cursor_past_cap(self, host: PartitionHost, name: str, reason: str) -> None:
        self.invalidate(name, reason, host.group)

    def invalidate(self, name: str, reason: str, group: str) -> None:
        """Say it loudly, then record it in the metadata log (once)."""
        if name in self._invalidating:
            return
        self._invalidating.add(name)
        event(
            log,
            logging.WARNING,
            "cursor_invalidated",
            f"cursor {name} no longer holds {group}: {reason}; invalidating it",
            cursor=name,
            group=group,
            reason=reason,
        )
        metadata = self.metadata
        if metadata.is_leader:
            metadata.background.start(self._propose_invalidation(name, reason))
        else:
            self._ask_leader_to_invalidate(name, reason)
            self._invalidating.discard(name)  # retried on the next pass until it is committed

    def _ask_leader_to_invalidate(self, name: str, reason: str) -> None:
        """A peer message to the metadata leader, which proposes it (on_invalidate_message);
        dropped while no leader is known: the caller asks again."""
        leader = self.metadata.leader_id
        if leader >= 0:
            header: dict[str, Any] = {"op": "invalidate", "name": name, "reason": reason}
            self.metadata.send_to_peer(leader, ApiKey.CURSOR, header, None)

    async def invalidate_now(self, name: str, reason: str) -> None:
        """Invalidate before going on (delete-records --force, before it moves the log start):
        proposed here when this node leads the metadata log, else asked of its leader until this
        node has applied it (a partition's leader need not lead the metadata log: it answered
        NotLeader with the metadata leader as hint, which its client took for the partition's
        leader, and the request never got through)."""
        metadata = self.metadata
        loop = asyncio.get_running_loop()
        deadline = loop.time() + INVALIDATE_WAIT_S
        while (cursor := metadata.state.cursors.get(name)) is not None and cursor.live:
            if metadata.is_leader:  # (or it became the leader meanwhile)
                command = InvalidateCursor(name, reason, wall_ms())
                await metadata.propose(command, max(deadline - loop.time(), 0.1))
                return
            if loop.time() > deadline:
                raise Timeout(f"cursor {name!r} not invalidated after {INVALIDATE_WAIT_S:.0f}s")
            self._ask_leader_to_invalidate(name, reason)
            await asyncio.sleep(INVALIDATE_RESEND_S)

    async def _propose_invalidation(self, name: str, reason: str) -> None:
        try:
            await self.metadata.propose(InvalidateCursor(name, reason, wall_ms()), 30.0)
        except TidelogError as exc:
            log.error("could not invalidate cursor %s: %s", name, exc)
        finally:
            self._invalidating.discard(name)

    def on_invalidate_message(self, header: dict[str, Any], sender: int) -> None:
        """A partition leader elsewhere (an authenticated peer) asks the metadata leader (us)
        to invalidate a cursor."""
        name, reason = str(header.get("name", "")), str(header.get("reason", ""))
        cursor = self.metadata.state.cursors.get(name)
        if cursor is None or not cursor.live or not self.metadata.is_leader:
            return
        self.invalidate(name, reason, f"(reported by node {sender})")
