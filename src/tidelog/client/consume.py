"""Reading a partition: one fetch, the offsets of its ends, and consuming it in offset order
with the next fetch in flight while the caller reads the last one.

`FetchOptions` and `ConsumeOptions` are the keywords of AsyncClient.fetch and .consume (and of
the blocking Client's), built once by the public method that takes them."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from tidelog.client.fetched import FetchResult
from tidelog.client.routing import Router
from tidelog.errors import (
    FencedLeaderEpoch,
    InvalidRequest,
    NetworkError,
    NotLeader,
    OffsetOutOfRange,
    TidelogError,
    UnknownCursor,
    UnknownTopicOrPartition,
    UnsupportedApi,
)
from tidelog.protocol import api
from tidelog.protocol.api import ApiKey
from tidelog.record.batch import BatchHeader, Record, iter_headers
from tidelog.record.read_committed import aborted_positions

# The client logs under one name, the one it had before it was split into modules (log filters
# and the text format show it).
log = logging.getLogger("tidelog.client.async_client")

CONSUME_FETCH_BYTES = 1024 * 1024  # per fetch of consume(): Kafka's max.partition.fetch.bytes
RESETS = ("earliest", "latest", "none")
# How often a fetch naming a cursor that its node does not know yet (but the metadata leader
# does) is tried before UnknownCursor is raised.
CURSOR_LAG_TRIES = 6


@dataclass(frozen=True)
class FetchOptions:
    """How one fetch reads (AsyncClient.fetch's keywords, with their defaults)."""

    max_bytes: int = 1024 * 1024
    max_wait_ms: int = 0
    min_bytes: int = 1
    replica_read: bool = False
    node_id: int | None = None
    include_control: bool = False
    cursor: str = ""
    skip_invalid: bool = False
    consistent: bool = False  # the leader confirms it still leads first (ReadIndex)
    leader_epoch: int = -1  # KIP-320: the leader epoch this client knows (-1: none)
    # read_committed: below the LSO, without aborted transactions' batches (or any marker)
    isolation_level: str = api.READ_UNCOMMITTED


@dataclass(frozen=True)
class ConsumeOptions:
    """How a consume reads (AsyncClient.consume's keywords, with their defaults)."""

    reset: str = "earliest"
    follow: bool = False
    max_records: int | None = None
    max_wait_ms: int = 500
    replica_read: bool = False
    prefer_node: int | None = None
    cursor: str = ""
    skip_invalid: bool = False
    max_bytes: int = CONSUME_FETCH_BYTES
    consistent: bool = False  # the end (the HW when it began) is confirmed by a majority
    # read_committed: stop at the LSO (the end is the LSO when it began), drop what aborted
    # transactions wrote
    isolation_level: str = api.READ_UNCOMMITTED

    def fetch_options(self, node_id: int | None, leader_epoch: int = -1) -> FetchOptions:
        """Each of its fetches (only a consume that follows waits for records to come)."""
        return FetchOptions(
            leader_epoch=leader_epoch,
            max_bytes=self.max_bytes,
            max_wait_ms=self.max_wait_ms if self.follow else 0,
            replica_read=self.replica_read,
            node_id=node_id,
            cursor=self.cursor,
            skip_invalid=self.skip_invalid,
            isolation_level=self.isolation_level,
        )


@dataclass
class _Span:
    """Where a consume is: the next offset, where it stops (the HW when it began, None when it
    follows) and how many records it may still hand over (None: no limit)."""

    offset: int
    end: int | None
    budget: int | None

    def more(self) -> bool:
        return (self.budget is None or self.budget > 0) and (
            self.end is None or self.offset < self.end
        )

    def wants_after(self, at: int, carried: int) -> bool:
        """Is a fetch at `at` wanted once a fetch carrying `carried` records is read?"""
        return (
            at > self.offset
            and (self.end is None or at < self.end)
            and (self.budget is None or self.budget > carried)
        )

    def take(self, records: list[Record], at: int) -> Fetched:
        """The records it hands over, counted against its budget, and the position after
        them: `at` (where the fetch ended), unless the budget or the end cut the fetch short."""
        if self.end is not None:
            records = [r for r in records if r.offset < self.end]
            at = min(at, self.end)
        if self.budget is not None:
            if len(records) > self.budget:
                records = records[: self.budget]
                at = records[-1].offset + 1 if records else self.offset
            self.budget -= len(records)
        return Fetched(records, at)


class Fetched(list[Record]):
    """One fetch's records and the position after them, past every batch a reader skips
    (transaction markers, aborted transactions under read_committed) as well as the records:
    a Kafka consumer's position, which a cursor commit should take (the last record's offset +
    1 would leave a lag of the trailing markers for good)."""

    def __init__(self, records: list[Record], next_offset: int) -> None:
        super().__init__(records)
        self.next_offset = next_offset


# A fetch sent ahead, and the offset it reads from.
_Ahead = tuple[int, asyncio.Task[FetchResult]]


class Reader:
    def __init__(self, router: Router) -> None:
        self._router = router

    async def fetch(
        self, topic: str, partition: int, offset: int, options: FetchOptions
    ) -> FetchResult:
        request = api.FetchRequest(
            topic,
            partition,
            offset,
            options.max_bytes,
            options.max_wait_ms,
            options.min_bytes,
            options.replica_read,
            options.cursor,
            options.leader_epoch,
            options.consistent,
            options.isolation_level,
        )
        timeout = options.max_wait_ms / 1000 + self._router.settings.request_timeout_s
        attempt = 0
        while True:
            try:
                header, payload = await self._fetch_once(request, options, timeout)
                break
            except UnknownCursor:
                # The node asked (a partition's leader) may not have applied the cursor's
                # creation yet: the metadata leader's word decides (a few tries).
                attempt += 1
                if attempt >= CURSOR_LAG_TRIES or not await self._cursor_exists(options.cursor):
                    raise
                await asyncio.sleep(self._router.backoff(attempt))
        resp = api.decode(api.FetchResponse, header)
        # Headers and CRCs are checked here, once; records are decoded when first asked for.
        batches = tuple(iter_headers(payload))
        next_offset = max([offset, *(batch.next_offset for _, batch in batches)])
        if options.isolation_level == api.READ_COMMITTED:
            batches = committed_only(payload, batches, resp, f"{topic}/{partition}")
        return FetchResult(
            partition,
            resp.high_watermark,
            resp.log_start_offset,
            resp.log_end_offset,
            next_offset,
            resp.node_id,
            payload,
            offset,
            options.include_control,
            options.skip_invalid,
            f"{topic}/{partition}",
            batches,
            resp.leader_epoch,
            resp.last_stable_offset,
        )

    async def _fetch_once(
        self, request: api.FetchRequest, options: FetchOptions, timeout: float
    ) -> tuple[dict[str, Any], bytes]:
        if options.node_id is None:
            return await self._at_leader(request.topic, request.partition, request, timeout)
        router = self._router
        node_id = options.node_id
        address = router.node_address(node_id) or (await router.nodes())[node_id]
        return await router.call(address, ApiKey.FETCH, request, timeout_s=timeout)

    async def _cursor_exists(self, name: str) -> bool:
        """Does the metadata leader know the cursor? (False when it cannot be asked.)"""
        request = api.CursorRequest("describe", name)
        try:
            await self._router.metadata_leader_once(ApiKey.CURSOR, request)
        except TidelogError:
            return False
        return True

    async def _at_leader(
        self, topic: str, partition: int, request: api.FetchRequest, timeout: float
    ) -> tuple[dict[str, Any], bytes]:
        """A fetch at the leader. FencedLeaderEpoch: the leader knows a newer epoch than the one
        we named, so ours was stale and the leader is newer still: read there, naming none."""
        try:
            return await self._router.to_leader(
                topic, partition, ApiKey.FETCH, request, timeout_s=timeout
            )
        except FencedLeaderEpoch:
            request = dataclasses.replace(request, leader_epoch=-1)
            return await self._router.to_leader(
                topic, partition, ApiKey.FETCH, request, timeout_s=timeout
            )

    async def list_offsets(
        self,
        topic: str,
        partition: int,
        spec: str = "latest",
        timestamp_ms: int = -1,
        consistent: bool = False,
        isolation_level: str = api.READ_UNCOMMITTED,
    ) -> int:
        """The offset spec names; read_committed: "latest" is the LSO."""
        request = api.ListOffsetsRequest(
            topic,
            partition,
            spec,
            timestamp_ms,
            consistent=consistent,
            isolation_level=isolation_level,
        )
        header, _ = await self._router.to_leader(topic, partition, ApiKey.LIST_OFFSETS, request)
        resp = api.decode(api.ListOffsetsResponse, header)
        if isolation_level == api.READ_COMMITTED and resp.last_stable_offset < 0:
            raise UnsupportedApi(
                f"the leader of {topic}/{partition} predates transactions: it cannot list "
                "offsets read_committed",
                api=int(ApiKey.LIST_OFFSETS),
            )
        return resp.offset

    async def resolve_start(
        self,
        topic: str,
        partition: int,
        start: int | str,
        consistent: bool = False,
        isolation_level: str = api.READ_UNCOMMITTED,
    ) -> int:
        if isinstance(start, int):
            return start
        if start in ("earliest", "latest"):
            return await self.list_offsets(
                topic, partition, start, consistent=consistent, isolation_level=isolation_level
            )
        if start.lstrip("-").isdigit():
            return int(start)
        raise InvalidRequest(f"start must be earliest, latest or an offset, not {start!r}")

    async def consume_batches(
        self, topic: str, partition: int, start: int | str, options: ConsumeOptions
    ) -> AsyncGenerator[Fetched, None]:
        if options.reset not in RESETS:
            raise InvalidRequest(f"reset must be earliest, latest or none, got {options.reset!r}")
        if options.isolation_level not in api.ISOLATION_LEVELS:
            raise InvalidRequest(
                f"isolation_level must be {' or '.join(api.ISOLATION_LEVELS)}, "
                f"got {options.isolation_level!r}"
            )
        span = await self._opening_span(topic, partition, start, options)

        # The leader epoch we last read at (KIP-320): named in the next fetch, so a deposed
        # leader we reach later refuses (UnknownLeaderEpoch) rather than serve an older log.
        known_epoch = [-1]

        async def fetch_at(at: int) -> FetchResult:
            result = await self._fetch_preferred(topic, partition, at, options, known_epoch[0])
            if not options.replica_read:
                known_epoch[0] = max(known_epoch[0], result.leader_epoch)
            return result

        # The next fetch is sent before this one's records are handed over, as Kafka's consumer
        # pipelines fetches: the node and the network work while the caller does.
        ahead: _Ahead | None = None
        try:
            while span.more():
                pending, ahead = ahead, None
                try:
                    if pending is not None and pending[0] == span.offset:
                        result = await pending[1]
                    else:
                        _forget(pending)
                        result = await fetch_at(span.offset)
                except OffsetOutOfRange as exc:
                    span.offset = _reset_offset(topic, partition, span.offset, exc, options.reset)
                    continue
                at = max(span.offset, result.next_offset)
                if span.wants_after(at, sum(h.records_count for _, h in result.batches or ())):
                    ahead = (at, asyncio.create_task(fetch_at(at)))
                    await asyncio.sleep(0)  # let it send its request before we decode
                records = span.take(result.records, at)
                moved = records.next_offset > span.offset
                span.offset = at
                if records or moved:  # past markers only: the position still moves on
                    yield records
        finally:
            if ahead is not None:  # stopped early: the fetch sent ahead ends here, not later
                ahead[1].cancel()
                await asyncio.wait([ahead[1]])
                _forget(ahead)

    async def _opening_span(
        self, topic: str, partition: int, start: int | str, options: ConsumeOptions
    ) -> _Span:
        level = options.isolation_level
        offset = await self.resolve_start(topic, partition, start, options.consistent, level)
        # Without follow, stop at the end as it is now; a busy partition would never end.
        end = (
            None
            if options.follow
            else await self.list_offsets(
                topic, partition, "latest", consistent=options.consistent, isolation_level=level
            )
        )
        if end is not None and offset > end and level == api.READ_COMMITTED:
            # Past the LSO but not the HW (a position a read_uncommitted reader committed, or
            # one read from a leader whose HW ran ahead): a Kafka consumer waits there for the
            # open transaction; a consume that stops at the end has nothing to read yet.
            hw = await self.list_offsets(topic, partition, "latest", consistent=options.consistent)
            if offset <= hw:
                log.info(
                    "%s/%d: offset %d is past the last stable offset %d (an open transaction "
                    "holds it): nothing to read yet",
                    topic,
                    partition,
                    offset,
                    end,
                )
                end = offset
        if end is not None and offset > end:
            # Past the HW: the node would say so to a fetch, and so do we without one.
            error = OffsetOutOfRange(
                f"offset {offset} is past the high-water mark {end} of {topic}/{partition}",
                log_start=await self.list_offsets(topic, partition, "earliest"),
                high_watermark=end,
            )
            if options.reset == "none":
                raise error
            offset = error.log_start if options.reset == "earliest" else end
            log.warning("%s; continuing at the %s offset %d", error.message, options.reset, offset)
        return _Span(offset, end, options.max_records)

    async def _fetch_preferred(
        self, topic: str, partition: int, at: int, options: ConsumeOptions, epoch: int = -1
    ) -> FetchResult:
        """From the preferred replica while it answers (with replica_read), else the leader
        (naming the leader epoch last read at: a follower's own epoch may lag, so not there)."""
        node = options.prefer_node if options.replica_read else None
        epoch = -1 if options.replica_read else epoch
        try:
            return await self.fetch(topic, partition, at, options.fetch_options(node, epoch))
        except (NetworkError, NotLeader, UnknownTopicOrPartition):
            if node is None:
                raise
            return await self.fetch(topic, partition, at, options.fetch_options(None, epoch))


def _reset_offset(
    topic: str, partition: int, offset: int, exc: OffsetOutOfRange, reset: str
) -> int:
    """Where a consume goes on after its offset fell out of range (raised with reset=none)."""
    if reset == "none":
        raise exc
    new_offset = exc.log_start if reset == "earliest" else exc.high_watermark
    skipped = (
        f"skipping offsets {offset}..{new_offset - 1}, which retention or delete-records removed"
        if new_offset > offset
        else f"offset {offset} is past the end"
    )
    log.warning(
        "%s/%d: offset %d is out of range (log start %d, HW %d): %s; continuing at the %s offset %d",
        topic,
        partition,
        offset,
        exc.log_start,
        exc.high_watermark,
        skipped,
        reset,
        new_offset,
    )
    return new_offset


def committed_only(
    payload: bytes,
    batches: tuple[tuple[int, BatchHeader], ...],
    resp: api.FetchResponse,
    where: str,
) -> tuple[tuple[int, BatchHeader], ...]:
    """A read_committed answer's batches without those of its aborted transactions. A node
    from before transactions ignored the isolation level (its answer has no LSO): refused,
    rather than hand over what may be aborted."""
    if resp.last_stable_offset < 0:
        raise UnsupportedApi(
            f"node {resp.node_id} predates transactions: it cannot read {where} read_committed",
            api=int(ApiKey.FETCH),
        )
    aborted = [(int(t[0]), int(t[1])) for t in resp.aborted_transactions if len(t) == 2]
    if not aborted:
        return batches
    dropped = aborted_positions(payload, batches, aborted)
    return tuple((pos, h) for pos, h in batches if pos not in dropped)


def _forget(pending: _Ahead | None) -> None:
    """Drop a read-ahead fetch nobody will wait for, and whatever error it ends with."""
    if pending is not None:
        pending[1].cancel()
        pending[1].add_done_callback(lambda t: t.cancelled() or t.exception())
