"""The asyncio client: finds leaders through metadata and retries NotLeader and leader
changes for the caller.

Producing is idempotent by default (as Kafka's producer is since 3.0): the client is one
producer, with a random 63-bit producer id, and stamps each batch it sends to a partition with
the next sequence numbers, one partition's batches one after another. A retried batch the log
already holds is answered as the original was (`ProduceResult.duplicate`), so retries after a
lost answer or a leader change never duplicate records. When retries run out after an attempt
whose fate is unknown (sent, then no answer; or appended by a leader that then lost its
leadership), produce raises OutcomeUnknown, never a plain error that would read as "not
written". With `idempotent=False`, such an attempt is not retried at all.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import logging
import random
import time
import zlib
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from tidelog.acls import Acl
from tidelog.client.coalescing import Coalescer
from tidelog.client.connection import NodeConnection
from tidelog.client.results import ProduceResult as ProduceResult
from tidelog.cluster_status import node_status
from tidelog.config import parse_address
from tidelog.errors import (
    CorruptRecord,
    DuplicateSequence,
    InvalidRequest,
    NetworkError,
    NotLeader,
    OffsetOutOfRange,
    OutcomeUnknown,
    OutOfOrderSequence,
    TidelogError,
    Timeout,
    UnknownNode,
    UnknownTopicOrPartition,
)
from tidelog.invariant import InvariantBroken
from tidelog.principals import new_token
from tidelog.protocol import api
from tidelog.protocol.api import ApiKey
from tidelog.protocol.framing import Frame
from tidelog.record.batch import (
    NO_PRODUCER_ID,
    SEQUENCE_MAX,
    BatchHeader,
    ProducerRecord,
    Record,
    build_batch,
    decode_records,
    iter_headers,
    read_header,
    restamp_producer,
)
from tidelog.record.columns import (
    OFFSET_MAX,
    BatchItem,
    RecordColumns,
    batch_items,
    decode_columns,
)
from tidelog.scram import credentials
from tidelog.tls import TlsFiles

log = logging.getLogger(__name__)

ACKS = {"0": api.ACKS_NONE, "1": api.ACKS_LEADER, "all": api.ACKS_ALL, "-1": api.ACKS_ALL}
PRODUCER_EPOCH_MAX = 0x7FFF
# Concurrent sends to one partition that go together as one batch, at most (below the default
# max.message.bytes of 8 MiB; one send larger than this still goes, alone).
COALESCE_BYTES_MAX = 512 * 1024
CONSUME_FETCH_BYTES = 1024 * 1024  # per fetch of consume(): Kafka's max.partition.fetch.bytes


def is_indeterminate(exc: TidelogError) -> bool:
    """Did this failed attempt perhaps take effect? (Sent, then the answer was lost or timed
    out; or the node appended it and then could not confirm it.)"""
    return bool(exc.details.get("appended")) or (
        isinstance(exc, NetworkError | Timeout) and bool(exc.details.get("sent"))
    )


def parse_acks(acks: int | str) -> int:
    if isinstance(acks, int) and acks in (0, 1, -1):
        return acks
    value = ACKS.get(str(acks).lower())
    if value is None:
        raise InvalidRequest(f"acks must be 0, 1 or all, got {acks!r}")
    return value


@dataclass(frozen=True)
class TopicInfo:
    name: str
    kind: str
    partitions: int
    replication_factor: int
    assignments: list[list[int]]
    configs: dict[str, str]
    leaders: list[int]
    # partition -> nodes a move is leaving (they keep a copy until the move is done)
    reassigning: dict[int, list[int]] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeInfo:
    node_id: int
    host: str
    port: int
    peer_port: int  # 0: learnt from its client listener
    draining: bool  # being removed: its replicas move off
    metadata_role: str  # in the metadata log: "voter", "learner" (catching up) or ""


@dataclass(frozen=True)
class ClusterInfo:
    cluster_id: str
    metadata_leader: int
    nodes: list[NodeInfo]
    metadata_voters: list[int]
    metadata_learners: list[int]
    metadata_base_voters: list[int]  # the metadata log's membership at its log start
    removed_nodes: list[int]

    def node(self, node_id: int) -> NodeInfo | None:
        return next((n for n in self.nodes if n.node_id == node_id), None)


@dataclass(frozen=True)
class FetchResult:
    """One fetch's answer. `raw` holds the batches as they came; `records` (decoded on first
    use) and `columns()` read them, dropping records below `from_offset` and control batches
    unless include_control was asked for."""

    partition: int
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    next_offset: int
    node_id: int
    raw: bytes = b""
    from_offset: int = 0
    include_control: bool = False
    skip_invalid: bool = False
    where: str = ""
    # (position, header) of each batch in raw, CRC-checked once when the answer arrived
    batches: tuple[tuple[int, BatchHeader], ...] | None = None

    @cached_property
    def records(self) -> list[Record]:
        records, _ = decode_fetched(
            self.raw,
            self.from_offset,
            self.include_control,
            self.skip_invalid,
            self.where,
            batches=self.batches,
        )
        if records:
            self._check_below_hw(records[-1].offset)
        return records

    def columns(
        self, end_offset: int | None = None, include_headers: bool = False
    ) -> RecordColumns:
        """The records at from_offset <= offset < end_offset as column buffers (the Spark
        source's path: no Python object per record)."""
        stop = OFFSET_MAX if end_offset is None else end_offset
        items = list(
            batch_items(
                self.raw,
                self.from_offset,
                stop,
                include_control=self.include_control,
                batches=self.batches,
            )
        )
        try:
            columns = decode_columns([item for _, item in items], include_headers)
        except CorruptRecord:
            # Find the batch that cannot be read, name it, and skip it if asked to.
            good = [
                item
                for header, item in items
                if _readable(header, item, include_headers, self.skip_invalid, self.where)
            ]
            columns = decode_columns(good, include_headers)
        last = columns.last_offset()
        if last is not None:
            self._check_below_hw(last)
        return columns

    def _check_below_hw(self, offset: int) -> None:
        if offset >= self.high_watermark:
            raise CorruptRecord(
                f"node {self.node_id} returned offset {offset} at or above its HW "
                f"{self.high_watermark}"
            )


@dataclass
class _Metadata:
    nodes: dict[int, tuple[str, int]] = field(default_factory=dict)
    topics: dict[str, TopicInfo] = field(default_factory=dict)
    leaders: dict[tuple[str, int], int] = field(default_factory=dict)
    metadata_leader: int = -1


class AsyncClient:
    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        request_timeout_ms: int = 30_000,
        retries: int = 40,
        retry_backoff_ms: int = 50,
        retry_backoff_max_ms: int = 250,
        admin_timeout_ms: int = 60_000,
        idempotent: bool = True,
        tls: TlsFiles | None = None,
        token: str | None = None,
    ) -> None:
        items = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
        # TLS to every node: verifies their certificates against tls.ca, presents tls.cert.
        self.tls = tls
        self._tls_context = None if tls is None else tls.client_context()
        # NAME:SECRET (`tidelog principals add`): every connection proves it before use.
        self.token = token
        self.bootstrap = [parse_address(b) for b in items if b.strip()]
        if not self.bootstrap:
            raise InvalidRequest("no bootstrap address given")
        if token and tls is None and any(not _is_loopback(h) for h, _ in self.bootstrap):
            log.warning(
                "a token is sent to %s over plain TCP, readable by anyone on the path: "
                "connect with TLS (tls=TlsFiles.of(ca))",
                ",".join(f"{h}:{p}" for h, p in self.bootstrap),
            )
        self.request_timeout_s = request_timeout_ms / 1000
        if retries < 0:
            raise InvalidRequest(f"retries must be >= 0, got {retries}")
        self.retries = max(1, retries)  # attempts per request: 0 still makes the one attempt
        self.retry_backoff_s = retry_backoff_ms / 1000
        self.retry_backoff_max_s = retry_backoff_max_ms / 1000
        # How long an admin request goes on retrying retriable errors (no metadata leader yet,
        # a node still starting, a leader change): Kafka's default.api.timeout.ms.
        self.admin_timeout_s = admin_timeout_ms / 1000
        # Called with each retriable error an admin request waits out and the seconds waited
        # so far (the CLI shows them on a terminal).
        self.on_admin_retry: Callable[[TidelogError, float], None] | None = None
        self._conns: dict[tuple[str, int], NodeConnection] = {}
        self._connecting: dict[tuple[str, int], asyncio.Future[NodeConnection]] = {}
        self._meta = _Metadata()
        self._rng = random.Random()
        self.idempotent = idempotent
        self.producer_id = -1  # drawn at the first idempotent produce
        self._sequences: dict[tuple[str, int], tuple[int, int]] = {}  # -> (epoch, next)
        self._partition_locks: dict[tuple[str, int], asyncio.Lock] = {}
        self._coalescers: dict[tuple[str, int, int, int], Coalescer] = {}

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()

    # -- plumbing -------------------------------------------------------------------------------

    async def _connection(self, address: tuple[str, int]) -> NodeConnection:
        conn = self._conns.get(address)
        if conn is not None and not conn.closed:
            return conn
        pending = self._connecting.get(address)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[NodeConnection] = asyncio.get_running_loop().create_future()
        self._connecting[address] = future
        try:
            conn = await NodeConnection.open(
                address,
                min(self.request_timeout_s, 10.0),
                self._tls_context,
                self.tls is not None and self.tls.cert is not None,
            )
            if self.token:
                await self._authenticate(conn, self.token)
            self._conns[address] = conn
            future.set_result(conn)
            return conn
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # mark retrieved
            raise
        finally:
            self._connecting.pop(address, None)

    async def _authenticate(self, conn: NodeConnection, token: str) -> None:
        try:
            frame = await conn.request(
                ApiKey.AUTHENTICATE,
                api.encode(api.AuthenticateRequest(token)),
                timeout_s=self.request_timeout_s,
            )
            if frame is None:
                raise InvariantBroken("frame is not None")
            error = api.error_of(frame.header)
            if error is not None:
                raise error
        except BaseException:
            conn.close()
            raise

    async def call(
        self,
        address: tuple[str, int],
        key: ApiKey,
        request: Any,
        payload: bytes | bytearray = b"",
        timeout_s: float | None = None,
        expect_response: bool = True,
    ) -> tuple[dict[str, Any], bytes]:
        """One request to one node; a TidelogError if the node answered with an error."""
        conn = await self._connection(address)
        frame: Frame | None = await conn.request(
            key,
            api.encode(request),
            payload,
            timeout_s if timeout_s is not None else self.request_timeout_s,
            expect_response,
        )
        if frame is None:
            return {}, b""
        error = api.error_of(frame.header)
        if error is not None:
            raise error
        return frame.header, frame.payload

    def _backoff(self, attempt: int) -> float:
        base: float = min(self.retry_backoff_max_s, self.retry_backoff_s * (2 ** min(attempt, 10)))
        return base * (0.5 + self._rng.random() / 2)

    def _addresses(self) -> list[tuple[str, int]]:
        known = list(self._meta.nodes.values())
        return known + [a for a in self.bootstrap if a not in known]

    async def _any_node(self, key: ApiKey, request: Any) -> tuple[dict[str, Any], bytes]:
        last: TidelogError | None = None
        for attempt in range(self.retries):
            addresses = self._addresses()
            address = addresses[attempt % len(addresses)]
            try:
                return await self.call(address, key, request)
            except (NetworkError, Timeout, NotLeader) as exc:  # NotLeader: a node starting
                last = exc
                if attempt + 1 >= len(addresses):
                    await asyncio.sleep(self._backoff(attempt))
        if last is None:
            raise InvariantBroken("last is not None")
        raise last

    # -- metadata -------------------------------------------------------------------------------

    async def refresh_metadata(
        self, topics: list[str] | None = None, at_metadata_leader: bool = False
    ) -> None:
        """at_metadata_leader: read what was just changed (any other node may not have
        applied it yet)."""
        request = api.MetadataRequest(topics, leader_only=at_metadata_leader)
        if at_metadata_leader:
            header = await self._to_metadata_leader(ApiKey.METADATA, request)
        else:
            header, _ = await self._any_node(ApiKey.METADATA, request)
        resp = api.decode(api.MetadataResponse, header)
        self._meta.nodes = {int(n["node_id"]): (str(n["host"]), int(n["port"])) for n in resp.nodes}
        self._meta.metadata_leader = resp.metadata_leader
        if topics is None:  # every topic there is: one deleted since is gone from the cache
            self._meta.topics.clear()
        for t in resp.topics:
            if "error" in t:
                self._meta.topics.pop(str(t["name"]), None)
                continue
            leaders = [int(leader) for leader in t.get("leaders", [])]
            info = TopicInfo(
                name=str(t["name"]),
                kind=str(t.get("kind", "stream")),
                partitions=int(t["partitions"]),
                replication_factor=int(t["replication_factor"]),
                assignments=[[int(r) for r in a] for a in t["assignments"]],
                configs={str(k): str(v) for k, v in dict(t.get("configs", {})).items()},
                leaders=leaders,
                reassigning={
                    int(p): [int(r) for r in a] for p, a in dict(t.get("reassigning", {})).items()
                },
            )
            self._meta.topics[info.name] = info
            for p, leader in enumerate(leaders):
                if leader >= 0:
                    self._meta.leaders[(info.name, p)] = leader

    async def topic(self, name: str, refresh: bool = False) -> TopicInfo:
        if refresh or name not in self._meta.topics:
            await self.refresh_metadata([name])
        info = self._meta.topics.get(name)
        if info is None:
            raise UnknownTopicOrPartition(f"unknown topic {name!r}", topic=name)
        return info

    async def list_topics(self) -> list[TopicInfo]:
        await self.refresh_metadata(None)
        return sorted(self._meta.topics.values(), key=lambda t: t.name)

    async def nodes(self) -> dict[int, tuple[str, int]]:
        if not self._meta.nodes:
            await self.refresh_metadata([])
        return dict(self._meta.nodes)

    def _node_address(self, node_id: int) -> tuple[str, int] | None:
        return self._meta.nodes.get(node_id)

    async def _partition_target(self, topic: str, partition: int, attempt: int) -> tuple[str, int]:
        info = await self.topic(topic)
        if not 0 <= partition < info.partitions:
            raise UnknownTopicOrPartition(
                f"topic {topic!r} has {info.partitions} partitions; no partition {partition}",
                topic=topic,
                partition=partition,
            )
        leader = self._meta.leaders.get((topic, partition), -1)
        replicas = info.assignments[partition]
        node = leader if leader >= 0 else replicas[attempt % len(replicas)]
        address = self._node_address(node)
        if address is None:
            await self.refresh_metadata([topic])
            address = self._node_address(node) or self.bootstrap[0]
        return address

    async def _to_leader(
        self,
        topic: str,
        partition: int,
        key: ApiKey,
        request: Any,
        payload: bytes | bytearray = b"",
        timeout_s: float | None = None,
        expect_response: bool = True,
        note: Callable[[TidelogError], None] | None = None,
        retry_indeterminate: bool = True,
    ) -> tuple[dict[str, Any], bytes]:
        """Send to the partition's leader, following leader changes. note() sees every failed
        attempt; with retry_indeterminate=False an attempt that may have taken effect is not
        retried (OutcomeUnknown)."""
        last: TidelogError | None = None
        for attempt in range(self.retries):
            try:
                try:
                    address = await self._partition_target(topic, partition, attempt)
                    return await self.call(
                        address, key, request, payload, timeout_s, expect_response
                    )
                except TidelogError as exc:
                    if note is not None:
                        note(exc)
                    if not retry_indeterminate and is_indeterminate(exc):
                        raise OutcomeUnknown(
                            f"{topic}/{partition}: the request may or may not have been applied "
                            f"({exc}); it was not retried, as that could apply it twice",
                            topic=topic,
                            partition=partition,
                            cause=exc.name,
                        ) from exc
                    raise
            except NotLeader as exc:
                last = exc
                hint = exc.leader_hint
                if (
                    hint is not None
                    and hint >= 0
                    and self._node_address(hint) is not None
                    and self._meta.leaders.get((topic, partition)) != hint
                ):
                    self._meta.leaders[(topic, partition)] = hint
                    continue  # go straight to the hinted leader
                self._meta.leaders.pop((topic, partition), None)
            except (NetworkError, UnknownTopicOrPartition) as exc:
                last = exc
                self._meta.leaders.pop((topic, partition), None)
                if isinstance(exc, UnknownTopicOrPartition) and attempt >= 5:
                    raise
                with contextlib.suppress(TidelogError):
                    await self.refresh_metadata([topic])
            except Timeout as exc:
                last = exc
                self._meta.leaders.pop((topic, partition), None)
            except TidelogError as exc:
                if not exc.retriable:
                    raise
                last = exc
            await asyncio.sleep(self._backoff(attempt))
        if last is None:
            raise InvariantBroken("last is not None")
        raise last

    # -- admin ----------------------------------------------------------------------------------

    async def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int = -1,
        configs: dict[str, str] | None = None,
        kind: str = "stream",
        wait_for_leaders: bool = True,
    ) -> TopicInfo:
        request = api.CreateTopicRequest(
            name, partitions, replication_factor, dict(configs or {}), kind
        )
        await self._to_metadata_leader(ApiKey.CREATE_TOPIC, request)
        await self.refresh_metadata([name], at_metadata_leader=True)
        info = await self.topic(name)
        if wait_for_leaders:
            await self.wait_for_leaders(name)
        return info

    async def delete_topic(self, name: str, force: bool = False) -> api.DeleteTopicResponse:
        """Delete a topic: every replica deletes its data, and its cursors are deleted. A topic
        held by a backup cursor needs force."""
        header = await self._to_metadata_leader(
            ApiKey.DELETE_TOPIC, api.DeleteTopicRequest(name, force)
        )
        self._meta.topics.pop(name, None)
        return api.decode(api.DeleteTopicResponse, header)

    async def alter_topic(
        self,
        name: str,
        configs: dict[str, str] | None = None,
        delete_configs: list[str] | None = None,
    ) -> api.AlterTopicResponse:
        """Set (configs) or reset to the default (delete_configs) a topic's configs, live on
        every replica; returns the topic's overrides after the change."""
        request = api.AlterTopicRequest(name, dict(configs or {}), list(delete_configs or []))
        header = await self._to_metadata_leader(ApiKey.ALTER_TOPIC, request)
        return api.decode(api.AlterTopicResponse, header)

    async def add_partitions(
        self, name: str, partitions: int, wait_for_leaders: bool = True
    ) -> TopicInfo:
        """Grow a stream topic to `partitions` partitions (never fewer)."""
        request = api.CreatePartitionsRequest(name, partitions)
        await self._to_metadata_leader(ApiKey.CREATE_PARTITIONS, request)
        info = await self.topic(name, refresh=True)
        if wait_for_leaders:
            await self.wait_for_leaders(name)
        return info

    async def reassign_partition(
        self,
        topic: str,
        partition: int,
        replicas: list[int],
        throttle_bytes: int = 0,
        wait: bool = False,
        timeout_s: float = 300.0,
    ) -> api.ReassignPartitionResponse:
        """Move a partition onto `replicas` (Kafka's kafka-reassign-partitions): new replicas
        catch up (at throttle_bytes/s, 0: unthrottled) as learners, then the voters change one
        at a time, then the nodes left delete their copy. wait: return once the move is done."""
        request = api.ReassignPartitionRequest(topic, partition, list(replicas), throttle_bytes)
        header = await self._to_metadata_leader(ApiKey.ALTER_PARTITION_REASSIGNMENTS, request)
        response = api.decode(api.ReassignPartitionResponse, header)
        if wait:
            await self.wait_for_reassignment(topic, partition, timeout_s)
        return response

    async def wait_for_reassignment(
        self, topic: str, partition: int, timeout_s: float = 300.0
    ) -> TopicInfo:
        """Until the partition's move (if any) is done, as the metadata leader says: another
        node may not have applied the move yet, and would call it done before it began."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            await self.refresh_metadata([topic], at_metadata_leader=True)
            info = await self.topic(topic)
            if partition not in info.reassigning:
                return info
            if loop.time() > deadline:
                raise Timeout(
                    f"{topic}/{partition} still moving off nodes {info.reassigning[partition]} "
                    f"after {timeout_s}s"
                )
            await asyncio.sleep(0.2)

    # -- the cluster's nodes ----------------------------------------------------------------------

    async def describe_cluster(self, leader_only: bool = False) -> ClusterInfo:
        """The cluster's nodes and its metadata log's voters, as any node (or with leader_only,
        the metadata leader) knows them."""
        request = api.DescribeClusterRequest(leader_only)
        if leader_only:
            header = await self._to_metadata_leader(ApiKey.DESCRIBE_CLUSTER, request)
        else:
            header, _ = await self._any_node(ApiKey.DESCRIBE_CLUSTER, request)
        resp = api.decode(api.DescribeClusterResponse, header)
        return ClusterInfo(
            resp.cluster_id,
            resp.metadata_leader,
            [
                NodeInfo(
                    int(n["node_id"]),
                    str(n["host"]),
                    int(n["port"]),
                    int(n.get("peer_port", 0)),
                    bool(n.get("draining", False)),
                    str(n.get("metadata_role", "")),
                )
                for n in resp.nodes
            ],
            list(resp.metadata_voters),
            list(resp.metadata_learners),
            list(resp.metadata_base_voters),
            list(resp.removed_nodes),
        )

    async def add_node(
        self,
        node_id: int,
        host: str,
        port: int,
        peer_port: int = 0,
        wait: bool = False,
        timeout_s: float = 120.0,
    ) -> NodeInfo:
        """Register a node (then start it with `tidelog serve --join`): it catches up on the
        metadata log as a learner, then becomes a voter. wait: return once it is one."""
        request = api.AddNodeRequest(node_id, host, port, peer_port)
        await self._to_metadata_leader(ApiKey.ADD_NODE, request)
        return await self.wait_for_node(node_id, "voter" if wait else "", timeout_s)

    async def remove_node(
        self, node_id: int, throttle_bytes: int = 0, wait: bool = False, timeout_s: float = 3600.0
    ) -> int:
        """Remove a node: every replica it holds moves to another node (at throttle_bytes/s,
        0: unthrottled), then it leaves the metadata log's voters and the cluster. Returns how
        many partitions move. wait: return once it is gone."""
        request = api.RemoveNodeRequest(node_id, throttle_bytes)
        header = await self._to_metadata_leader(ApiKey.REMOVE_NODE, request)
        moves = int(api.decode(api.NodeChangeResponse, header).moves)
        if wait:
            await self.wait_for_node(node_id, "removed", timeout_s)
        return moves

    async def wait_for_node(self, node_id: int, state: str, timeout_s: float = 120.0) -> NodeInfo:
        """Until the metadata leader says the node is a "voter" of the metadata log, or is
        "removed" from the cluster ("": it is registered). Returns its entry (the last one,
        once removed)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        last: NodeInfo | None = None
        while True:
            info = await self.describe_cluster(leader_only=True)
            node = info.node(node_id)
            last = node or last
            if node is None and node_id in info.removed_nodes:
                if state == "removed":
                    return last or NodeInfo(node_id, "", 0, 0, True, "")
                raise UnknownNode(f"node {node_id} was removed from the cluster", node_id=node_id)
            if node is not None and state in ("", node.metadata_role):
                return node
            if loop.time() > deadline:
                now = "gone" if node is None else node.metadata_role or "not a member"
                raise Timeout(f"node {node_id} is {now}, not {state}, after {timeout_s}s")
            await asyncio.sleep(0.2)

    async def _to_metadata_leader(self, key: ApiKey, request: Any) -> dict[str, Any]:
        """Admin writes go through the metadata log's leader; follow its hints. Retriable
        errors are retried until admin_timeout_ms has passed (at least `retries` times), as
        Kafka's admin client does until default.api.timeout.ms: right after a cluster starts,
        its first election is still running."""
        started = time.monotonic()
        attempt = 0
        while True:
            address = self._metadata_leader_address(attempt)
            try:
                header, _ = await self.call(address, key, request)
                return header
            except TidelogError as exc:
                # The metadata leader's word that a topic does not exist is final (a partition
                # request retries it: a follower may not have applied its creation yet).
                passes = exc.retriable and not isinstance(exc, UnknownTopicOrPartition)
                if not (passes or isinstance(exc, NotLeader | NetworkError | Timeout)):
                    raise
                waited = time.monotonic() - started
                if attempt + 1 >= self.retries and waited >= self.admin_timeout_s:
                    raise
                if self.on_admin_retry is not None:
                    self.on_admin_retry(exc, waited)
                hint = exc.leader_hint if isinstance(exc, NotLeader) else None
                if hint is not None and hint >= 0:
                    self._meta.metadata_leader = hint
                    if hint not in self._meta.nodes:  # a node we have not heard of
                        with contextlib.suppress(TidelogError):
                            await self.refresh_metadata([])
                else:
                    self._meta.metadata_leader = -1
                    await asyncio.sleep(self._backoff(attempt))
            attempt += 1

    # -- cursors and deletion -------------------------------------------------------------------

    async def create_cursor(
        self,
        name: str,
        topic: str,
        start: int | str | dict[int, int] = "earliest",
        backup: bool = False,
        if_not_exists: bool = False,
    ) -> dict[str, Any]:
        """A durable position per partition that holds the log (earliest, latest, an offset for
        every partition, or a {partition: offset} map)."""
        info = await self.topic(topic)
        if isinstance(start, dict):
            positions = {str(p): int(o) for p, o in start.items()}
        else:
            positions = {
                str(p): await self._resolve_start(topic, p, start) for p in range(info.partitions)
            }
        request = api.CursorRequest(
            "create", name, topic, positions, backup=backup, if_not_exists=if_not_exists
        )
        header = await self._to_metadata_leader(ApiKey.CURSOR, request)
        return dict(api.decode(api.CursorResponse, header).cursors[0])

    async def commit_cursor(self, name: str, positions: dict[int, int]) -> dict[str, Any]:
        """Move a cursor (CursorInvalidated if it was invalidated)."""
        request = api.CursorRequest(
            "commit", name, positions={str(p): o for p, o in positions.items()}
        )
        header = await self._to_metadata_leader(ApiKey.CURSOR, request)
        return dict(api.decode(api.CursorResponse, header).cursors[0])

    async def delete_cursor(self, name: str) -> None:
        await self._to_metadata_leader(ApiKey.CURSOR, api.CursorRequest("delete", name))

    async def add_principal(self, name: str) -> str:
        """A new principal (or a new token for an existing one: the old token stops working).
        Returns its token, NAME:SECRET; only the secret's Argon2id hash leaves this process,
        and the token is shown this once."""
        token, encoded = new_token(name)
        scram = credentials(token.partition(":")[2])  # for Kafka clients' SASL/SCRAM
        request = api.PrincipalsRequest("add", name, encoded, scram)
        await self._to_metadata_leader(ApiKey.PRINCIPALS, request)
        return token

    async def principals(self) -> list[dict[str, Any]]:
        """Every principal: name and created_ms (never a hash). Asked of the metadata leader, so
        that what this client changed is in the answer (read-your-writes)."""
        header = await self._to_metadata_leader(ApiKey.PRINCIPALS, api.PrincipalsRequest("list"))
        return list(api.decode(api.PrincipalsResponse, header).principals)

    async def remove_principal(self, name: str) -> int:
        """Remove a principal: its token stops working, its sessions end, and its ACLs go
        with it (a new principal of that name starts with none). Returns how many ACLs went."""
        header = await self._to_metadata_leader(
            ApiKey.PRINCIPALS, api.PrincipalsRequest("remove", name)
        )
        return api.decode(api.PrincipalsResponse, header).acls_removed

    async def add_acl(
        self,
        principal: str,
        permission: str,
        topic: str | None = None,
        *,
        prefix: str | None = None,
        cluster: bool = False,
        group: str | None = None,
        group_prefix: str | None = None,
    ) -> dict[str, Any]:
        """Grant principal a permission (read, write, admin) on a topic, on every topic whose
        name starts with prefix, on a Kafka consumer group (read: use it; admin: delete it) or
        every group whose name starts with group_prefix, or admin on the cluster. Adding one
        twice keeps one."""
        acl = Acl.of(principal, permission, topic, prefix, cluster, group, group_prefix)
        return await self._change_acl("add", acl)

    async def acls(self, principal: str | None = None) -> list[dict[str, Any]]:
        """Every ACL (or one principal's): principal, permission, resource (topic|group|cluster),
        name, pattern (literal|prefix)."""
        request = api.AclsRequest("list", principal=principal or "")
        header = await self._to_metadata_leader(ApiKey.ACLS, request)  # read-your-writes
        return list(api.decode(api.AclsResponse, header).acls)

    async def remove_acl(
        self,
        principal: str,
        permission: str,
        topic: str | None = None,
        *,
        prefix: str | None = None,
        cluster: bool = False,
        group: str | None = None,
        group_prefix: str | None = None,
    ) -> None:
        acl = Acl.of(principal, permission, topic, prefix, cluster, group, group_prefix)
        await self._change_acl("remove", acl)

    async def _change_acl(self, op: str, acl: Acl) -> dict[str, Any]:
        header = await self._to_metadata_leader(ApiKey.ACLS, api.AclsRequest(op, acl.to_wire()))
        return dict(api.decode(api.AclsResponse, header).acls[0])

    async def archive(self) -> api.ArchiveResponse:
        """The archive as the cluster's metadata log records it: the store's identity
        (archive_id) and per partition what it holds and what it lost."""
        header = await self._to_metadata_leader(ApiKey.ARCHIVE, api.ArchiveRequest("describe"))
        return api.decode(api.ArchiveResponse, header)

    async def accept_archive_loss(self) -> api.ArchiveResponse:
        """An operator's word that the archive's store holds what it holds now: every range it
        lost is recorded (and refused to readers by name), and uploads go on."""
        request = api.ArchiveRequest("accept_loss")
        header = await self._to_metadata_leader(ApiKey.ARCHIVE, request)
        return api.decode(api.ArchiveResponse, header)

    async def set_quota(self, principal: str, limits: dict[str, float]) -> dict[str, Any]:
        """Limit a principal (or "*", every principal without limits of its own) per node:
        producer_byte_rate, consumer_byte_rate (bytes/s), admin_request_rate (requests/s).
        Over it, the principal is slowed (throttle_time_ms), not refused."""
        request = api.QuotasRequest("set", principal, dict(limits))
        header = await self._to_metadata_leader(ApiKey.QUOTAS, request)
        return dict(api.decode(api.QuotasResponse, header).quotas[0])

    async def quotas(self) -> list[dict[str, Any]]:
        """Every quota: principal, limits (from the metadata leader: read-your-writes)."""
        header = await self._to_metadata_leader(ApiKey.QUOTAS, api.QuotasRequest("list"))
        return list(api.decode(api.QuotasResponse, header).quotas)

    async def remove_quota(self, principal: str) -> None:
        await self._to_metadata_leader(ApiKey.QUOTAS, api.QuotasRequest("remove", principal))

    async def cursors(self, name: str | None = None) -> list[dict[str, Any]]:
        op = "describe" if name else "list"
        header, _ = await self._any_node(ApiKey.CURSOR, api.CursorRequest(op, name or ""))
        return list(api.decode(api.CursorResponse, header).cursors)

    async def delete_records(
        self, topic: str, partition: int, before_offset: int, force: bool = False
    ) -> int:
        """Move the log start to before_offset (-1: the HW); returns the new log start."""
        request = api.DeleteRecordsRequest(topic, partition, before_offset, force)
        header, _ = await self._to_leader(topic, partition, ApiKey.DELETE_RECORDS, request)
        return api.decode(api.DeleteRecordsResponse, header).log_start_offset

    async def elect_leaders(
        self,
        node_id: int,
        topic: str,
        partition: int,
        unclean: bool = False,
        campaign: bool = True,
    ) -> api.ElectLeadersResponse:
        """Ask one node's replica of topic/partition to admit every voter's present directory
        (unclean) and/or to stand for election now."""
        address = (await self.nodes()).get(node_id)
        if address is None:  # a node added since we last asked?
            await self.refresh_metadata([])
            address = self._meta.nodes.get(node_id)
        if address is None:
            raise UnknownNode(f"no node {node_id} in this cluster", node_id=node_id)
        request = api.ElectLeadersRequest(topic, partition, unclean, campaign)
        header, _ = await self.call(address, ApiKey.ELECT_LEADERS, request, timeout_s=10.0)
        return api.decode(api.ElectLeadersResponse, header)

    async def elect_preferred_leader(
        self, topic: str, partition: int, node_id: int, timeout_s: float = 20.0
    ) -> None:
        """Until node_id leads the partition: it asks a live leader to hand over (which happens
        once it holds everything the leader holds), or campaigns (Kafka's preferred leader
        election)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            resp = await self.elect_leaders(node_id, topic, partition)
            if resp.role == "leader":
                return
            if loop.time() > deadline:
                raise Timeout(
                    f"node {node_id} does not lead {topic}/{partition} after {timeout_s}s "
                    f"(leader {resp.leader})"
                )
            await asyncio.sleep(0.2)

    # -- tables -------------------------------------------------------------------------------

    async def table_get(self, topic: str, key: bytes) -> bytes | None:
        """The committed value of key in a table topic (None: absent)."""
        info = await self.topic(topic)
        partition = zlib.crc32(key) % info.partitions
        request = api.TableRequest("get", topic, partition, base64.b64encode(key).decode())
        header, _ = await self._to_leader(topic, partition, ApiKey.TABLE, request)
        resp = api.decode(api.TableResponse, header)
        return base64.b64decode(resp.entries[0][1]) if resp.found else None

    async def table_scan(
        self, topic: str, partitions: list[int] | None = None
    ) -> list[tuple[bytes, bytes]]:
        """Every committed key and value of a table topic (or of some of its partitions)."""
        info = await self.topic(topic)
        out: list[tuple[bytes, bytes]] = []
        for partition in range(info.partitions) if partitions is None else partitions:
            after = ""
            while True:
                request = api.TableRequest("scan", topic, partition, after=after, limit=5000)
                header, _ = await self._to_leader(topic, partition, ApiKey.TABLE, request)
                entries = api.decode(api.TableResponse, header).entries
                out.extend((base64.b64decode(k), base64.b64decode(v)) for k, v in entries)
                if len(entries) < 5000:
                    break
                after = entries[-1][0]
        return sorted(out)

    def _metadata_leader_address(self, attempt: int) -> tuple[str, int]:
        leader = self._meta.metadata_leader
        if leader >= 0 and leader in self._meta.nodes:
            return self._meta.nodes[leader]
        addresses = self._addresses()
        return addresses[attempt % len(addresses)]

    async def wait_for_leaders(self, topic: str, timeout_s: float = 30.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            info = await self.topic(topic, refresh=True)
            missing = [p for p in range(info.partitions) if (topic, p) not in self._meta.leaders]
            if not missing:
                return
            for p in list(missing):
                with contextlib.suppress(TidelogError):
                    await self.list_offsets(topic, p, "latest")
                    missing.remove(p)  # a leader answered (one the metadata node may not know)
            if not missing:
                return
            if loop.time() > deadline:
                raise Timeout(f"no leader for {topic} partitions {missing} after {timeout_s}s")
            if any((topic, p) not in self._meta.leaders for p in missing):
                await asyncio.sleep(0.05)

    async def status(self, topics: list[str] | None = None) -> list[dict[str, Any]]:
        """Every node's view of its replicas (unreachable nodes are reported as such)."""
        nodes = await self.nodes()
        results: list[dict[str, Any]] = []

        async def one(node_id: int, address: tuple[str, int]) -> dict[str, Any]:
            async def page(request: api.StatusRequest) -> dict[str, Any]:
                header, _ = await self.call(address, ApiKey.STATUS, request, timeout_s=5.0)
                return header

            try:
                return await node_status(page, topics)
            except TidelogError as exc:
                return {
                    "node_id": node_id,
                    "error": exc.to_wire(),
                    "partitions": [],
                    "metadata": {},
                }

        for result in await asyncio.gather(*(one(n, a) for n, a in sorted(nodes.items()))):
            results.append(result)
        return results

    # -- data -----------------------------------------------------------------------------------

    async def partition_for(self, topic: str, key: bytes | None) -> int:
        info = await self.topic(topic)
        if key is None:
            return self._rng.randrange(info.partitions)
        return zlib.crc32(key) % info.partitions

    async def produce_batch(
        self,
        topic: str,
        partition: int,
        batch: bytes,
        acks: int | str = "all",
        timeout_ms: int = 30_000,
        producer_id: int = -1,
    ) -> ProduceResult | None:
        """Send one or more encoded batches; returns the assigned offsets (None for acks=0).
        Batches without a producer id are stamped as this client's (idempotent) unless
        idempotence is off or acks=0; batches with one (the Spark sink's) go as they are."""
        acks_value = parse_acks(acks)
        owned = read_header(batch).producer_id != NO_PRODUCER_ID
        if owned or not self.idempotent or acks_value == api.ACKS_NONE:
            return await self._produce(
                topic, partition, batch, acks_value, timeout_ms, producer_id, retry=owned
            )
        count = sum(h.last_offset_delta + 1 for _, h in iter_headers(batch, verify=False))

        def stamped(pid: int, epoch: int, sequence: int) -> bytes | bytearray:
            return restamp_producer(batch, pid, epoch, sequence)[0]

        return await self._produce_idempotent(
            topic, partition, count, stamped, acks_value, timeout_ms
        )

    async def produce_records(
        self,
        topic: str,
        partition: int,
        records: Sequence[ProducerRecord],
        acks: int | str = "all",
        timeout_ms: int = 30_000,
    ) -> ProduceResult | None:
        """Encode records into one batch (as this client's idempotent producer, unless
        idempotence is off or acks=0) and send it. Concurrent calls for one partition that
        arrive while a batch is in flight go together as the next one (the result names each
        call's own offsets)."""
        acks_value = parse_acks(acks)
        if not self.idempotent or acks_value == api.ACKS_NONE:
            batch = build_batch(records)
            return await self._produce(
                topic, partition, batch, acks_value, timeout_ms, -1, retry=False
            )

        key = (topic, partition, acks_value, timeout_ms)
        coalescer = self._coalescers.get(key)
        if coalescer is None:

            async def send(batch: list[ProducerRecord]) -> ProduceResult | None:
                def built(pid: int, epoch: int, sequence: int) -> bytes:
                    return build_batch(
                        batch, producer_id=pid, producer_epoch=epoch, base_sequence=sequence
                    )

                return await self._produce_idempotent(
                    topic, partition, len(batch), built, acks_value, timeout_ms
                )

            coalescer = self._coalescers[key] = Coalescer(send, COALESCE_BYTES_MAX)
        return await coalescer.submit(records)

    async def _produce_idempotent(
        self,
        topic: str,
        partition: int,
        count: int,
        encode: Callable[[int, int, int], bytes | bytearray],
        acks_value: int,
        timeout_ms: int,
    ) -> ProduceResult | None:
        """One batch at a time per partition, so that sequences land in order; encode() makes
        the batch as (producer id, epoch, base sequence)."""
        tp = (topic, partition)
        lock = self._partition_locks.setdefault(tp, asyncio.Lock())
        async with lock:
            pid, epoch, sequence = self._take_sequences(tp, count)
            batch = encode(pid, epoch, sequence)
            try:
                return await self._produce(
                    topic, partition, batch, acks_value, timeout_ms, pid, retry=True
                )
            except BaseException:
                # The batch may or may not be in the log, and the next one must not leave a gap
                # after it (the log refuses gaps within an epoch): go on in a new epoch.
                self._next_epoch(tp)
                raise

    def _next_epoch(self, tp: tuple[str, int]) -> None:
        epoch, _ = self._sequences.get(tp, (0, 0))
        self._sequences[tp] = (epoch + 1, 0)

    def _take_sequences(self, tp: tuple[str, int], count: int) -> tuple[int, int, int]:
        """(producer id, epoch, base sequence) for the next count records to tp; taken whatever
        happens next, since a sequence that may be in the log must never be reused."""
        if self.producer_id < 0:
            self.producer_id = random.SystemRandom().getrandbits(63)
        epoch, sequence = self._sequences.get(tp, (0, 0))
        if sequence + count > SEQUENCE_MAX:  # sequences do not wrap: the next epoch starts at 0
            epoch, sequence = epoch + 1, 0
        if epoch > PRODUCER_EPOCH_MAX:
            self.producer_id = random.SystemRandom().getrandbits(63)
            self._sequences.clear()
            epoch, sequence = 0, 0
        self._sequences[tp] = (epoch, sequence + count)
        return self.producer_id, epoch, sequence

    async def _produce(
        self,
        topic: str,
        partition: int,
        batch: bytes | bytearray,
        acks_value: int,
        timeout_ms: int,
        producer_id: int,
        retry: bool,
    ) -> ProduceResult | None:
        request = api.ProduceRequest(topic, partition, acks_value, timeout_ms, producer_id)
        unknown: list[TidelogError] = []

        def note(exc: TidelogError) -> None:
            if is_indeterminate(exc):
                unknown.append(exc)

        try:
            header, _ = await self._to_leader(
                topic,
                partition,
                ApiKey.PRODUCE,
                request,
                batch,
                timeout_s=timeout_ms / 1000 + 5,
                expect_response=acks_value != api.ACKS_NONE,
                note=note,
                retry_indeterminate=retry,
            )
        except DuplicateSequence as exc:
            # Our own earlier attempt (or a replay) is already in the log: that is success.
            return ProduceResult(
                partition,
                int(exc.details.get("base_offset", -1)),
                int(exc.details.get("last_offset", -1)),
                -1,
                duplicate=True,
            )
        except (OutcomeUnknown, OutOfOrderSequence):
            # OutOfOrderSequence is definite even after a lost attempt: the log expects an
            # earlier sequence next, so this batch is not in it.
            raise
        except TidelogError as exc:
            if unknown:
                raise OutcomeUnknown(
                    f"{topic}/{partition}: the write may or may not be in the log: an attempt "
                    f"was lost in flight ({unknown[-1]}), and the last one failed ({exc})",
                    topic=topic,
                    partition=partition,
                    cause=exc.name,
                ) from exc
            raise
        if acks_value == api.ACKS_NONE:
            return None
        resp = api.decode(api.ProduceResponse, header)
        return ProduceResult(
            partition, resp.base_offset, resp.last_offset, resp.high_watermark, resp.duplicate
        )

    async def produce_pipelined(
        self,
        batches: dict[tuple[str, int], list[bytes]],
        acks: int | str = "all",
        in_flight: int = 5,
        timeout_ms: int = 30_000,
    ) -> dict[tuple[str, int], list[ProduceResult | None]]:
        """Each partition's batches of one idempotent producer (producer id and sequences
        already in them, consecutive: the Spark sink's chunks) in order, up to in_flight of them
        sent before the first is acknowledged, all partitions at once. The log refuses a batch
        whose predecessor has not landed (OutOfOrderSequence): it is sent again once the
        predecessor is in, so whatever happens the log holds a prefix of each partition's
        batches. The first failure (in batch order) is raised once every batch has settled."""
        if in_flight < 1:
            raise InvalidRequest(f"in_flight must be at least 1, got {in_flight}")
        acks_value = parse_acks(acks)

        async def one(topic: str, partition: int, items: list[bytes]) -> list[ProduceResult | None]:
            loop = asyncio.get_running_loop()
            landed: list[asyncio.Future[bool]] = [loop.create_future() for _ in items]
            window = asyncio.Semaphore(in_flight)

            async def send(i: int) -> ProduceResult | None:
                batch = items[i]
                pid = read_header(batch).producer_id
                try:
                    async with window:
                        while True:
                            after_predecessor = i == 0 or landed[i - 1].done()
                            try:
                                result = await self._produce(
                                    topic, partition, batch, acks_value, timeout_ms, pid, True
                                )
                                break
                            except OutOfOrderSequence:
                                # Sent ahead of a predecessor still being retried: wait for it
                                # and send again (a gap behind a landed predecessor is real).
                                if after_predecessor or not await landed[i - 1]:
                                    raise
                    landed[i].set_result(True)
                    return result
                except BaseException:
                    landed[i].set_result(False)
                    raise

            outcomes = await asyncio.gather(
                *(send(i) for i in range(len(items))), return_exceptions=True
            )
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    raise outcome
            return outcomes  # type: ignore[return-value]

        keys = list(batches)
        results = await asyncio.gather(*(one(t, p, batches[(t, p)]) for t, p in keys))
        return dict(zip(keys, results, strict=True))

    async def produce(
        self,
        topic: str,
        records: Sequence[ProducerRecord | bytes],
        partition: int | None = None,
        acks: int | str = "all",
        timeout_ms: int = 30_000,
    ) -> ProduceResult | None:
        recs = [r if isinstance(r, ProducerRecord) else ProducerRecord(None, r) for r in records]
        if partition is None:
            partition = await self.partition_for(topic, recs[0].key)
        return await self.produce_records(topic, partition, recs, acks, timeout_ms)

    async def fetch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int = 1024 * 1024,
        max_wait_ms: int = 0,
        min_bytes: int = 1,
        replica_read: bool = False,
        node_id: int | None = None,
        include_control: bool = False,
        cursor: str = "",
        skip_invalid: bool = False,
    ) -> FetchResult:
        """Records at offsets >= offset below the HW of the replica that answers. A batch that
        cannot be read (one written before batches were validated; `tidelog status` lists
        them) raises CorruptRecord, or with skip_invalid is passed over with a warning."""
        request = api.FetchRequest(
            topic, partition, offset, max_bytes, max_wait_ms, min_bytes, replica_read, cursor
        )
        timeout = max_wait_ms / 1000 + self.request_timeout_s
        if node_id is not None:
            address = self._node_address(node_id) or (await self.nodes())[node_id]
            header, payload = await self.call(address, ApiKey.FETCH, request, timeout_s=timeout)
        else:
            header, payload = await self._to_leader(
                topic, partition, ApiKey.FETCH, request, timeout_s=timeout
            )
        resp = api.decode(api.FetchResponse, header)
        # Headers and CRCs are checked here, once; records are decoded when first asked for.
        batches = tuple(iter_headers(payload))
        next_offset = max([offset, *(batch.next_offset for _, batch in batches)])
        return FetchResult(
            partition,
            resp.high_watermark,
            resp.log_start_offset,
            resp.log_end_offset,
            next_offset,
            resp.node_id,
            payload,
            offset,
            include_control,
            skip_invalid,
            f"{topic}/{partition}",
            batches,
        )

    async def list_offsets(
        self, topic: str, partition: int, spec: str = "latest", timestamp_ms: int = -1
    ) -> int:
        """earliest = log start, latest = HW, timestamp = first offset with ts >= timestamp_ms."""
        request = api.ListOffsetsRequest(topic, partition, spec, timestamp_ms)
        header, _ = await self._to_leader(topic, partition, ApiKey.LIST_OFFSETS, request)
        return api.decode(api.ListOffsetsResponse, header).offset

    async def consume(
        self,
        topic: str,
        partition: int,
        start: int | str = "earliest",
        *,
        reset: str = "earliest",
        follow: bool = False,
        max_records: int | None = None,
        max_wait_ms: int = 500,
        replica_read: bool = False,
        prefer_node: int | None = None,
        cursor: str = "",
        skip_invalid: bool = False,
        max_bytes: int = CONSUME_FETCH_BYTES,
    ) -> AsyncGenerator[Record, None]:
        """Records in offset order from start up to the HW as it is now (or on and on with
        follow); out-of-range offsets follow the reset policy (earliest, latest or none). The
        next fetch is on its way while the caller reads one fetch's records."""
        batches = self.consume_batches(
            topic,
            partition,
            start,
            reset=reset,
            follow=follow,
            max_records=max_records,
            max_wait_ms=max_wait_ms,
            replica_read=replica_read,
            prefer_node=prefer_node,
            cursor=cursor,
            skip_invalid=skip_invalid,
            max_bytes=max_bytes,
        )
        async with contextlib.aclosing(batches):  # stopped early: the fetch ahead ends now
            async for records in batches:
                for rec in records:
                    yield rec

    async def consume_batches(
        self,
        topic: str,
        partition: int,
        start: int | str = "earliest",
        *,
        reset: str = "earliest",
        follow: bool = False,
        max_records: int | None = None,
        max_wait_ms: int = 500,
        replica_read: bool = False,
        prefer_node: int | None = None,
        cursor: str = "",
        skip_invalid: bool = False,
        max_bytes: int = CONSUME_FETCH_BYTES,
    ) -> AsyncGenerator[list[Record], None]:
        """consume(), a fetch's worth of records at a time (at most max_bytes per fetch, as
        Kafka's max.partition.fetch.bytes; one batch larger than that still comes whole). With
        replica_read, prefer_node (a follower, say) answers while it is reachable; it serves
        only below its own HW."""
        if reset not in ("earliest", "latest", "none"):
            raise InvalidRequest(f"reset must be earliest, latest or none, got {reset!r}")
        offset = await self._resolve_start(topic, partition, start)
        # Without follow, stop at the end as it is now; a busy partition would never end.
        end = None if follow else await self.list_offsets(topic, partition, "latest")
        if end is not None and offset > end:
            # Past the HW: the node would say so to a fetch, and so do we without one.
            error = OffsetOutOfRange(
                f"offset {offset} is past the high-water mark {end} of {topic}/{partition}",
                log_start=await self.list_offsets(topic, partition, "earliest"),
                high_watermark=end,
            )
            if reset == "none":
                raise error
            offset = error.log_start if reset == "earliest" else end
            log.warning("%s; continuing at the %s offset %d", error.message, reset, offset)
        budget = max_records

        async def fetch_from(at: int, node: int | None) -> FetchResult:
            return await self.fetch(
                topic,
                partition,
                at,
                max_bytes=max_bytes,
                max_wait_ms=max_wait_ms if follow else 0,
                replica_read=replica_read,
                node_id=node,
                cursor=cursor,
                skip_invalid=skip_invalid,
            )

        async def fetch_at(at: int) -> FetchResult:
            node = prefer_node if replica_read else None
            try:
                return await fetch_from(at, node)
            except (NetworkError, NotLeader, UnknownTopicOrPartition):
                if node is None:
                    raise
                return await fetch_from(at, None)  # the preferred replica is gone: the leader

        # The next fetch is sent before this one's records are handed over, as Kafka's consumer
        # pipelines fetches: the node and the network work while the caller does.
        ahead: tuple[int, asyncio.Task[FetchResult]] | None = None
        try:
            while (budget is None or budget > 0) and (end is None or offset < end):
                pending, ahead = ahead, None
                try:
                    if pending is not None and pending[0] == offset:
                        result = await pending[1]
                    else:
                        _forget(pending)
                        result = await fetch_at(offset)
                except OffsetOutOfRange as exc:
                    if reset == "none":
                        raise
                    new_offset = exc.log_start if reset == "earliest" else exc.high_watermark
                    skipped = (
                        f"skipping offsets {offset}..{new_offset - 1}, which retention or "
                        "delete-records removed"
                        if new_offset > offset
                        else f"offset {offset} is past the end"
                    )
                    log.warning(
                        "%s/%d: offset %d is out of range (log start %d, HW %d): %s; "
                        "continuing at the %s offset %d",
                        topic,
                        partition,
                        offset,
                        exc.log_start,
                        exc.high_watermark,
                        skipped,
                        reset,
                        new_offset,
                    )
                    offset = new_offset
                    continue
                at = max(offset, result.next_offset)
                carried = sum(h.records_count for _, h in result.batches or ())
                if (
                    at > offset
                    and (end is None or at < end)
                    and (budget is None or budget > carried)
                ):
                    ahead = (at, asyncio.create_task(fetch_at(at)))
                    await asyncio.sleep(0)  # let it send its request before we decode
                records = result.records
                if end is not None:
                    records = [r for r in records if r.offset < end]
                if budget is not None:
                    records = records[:budget]
                    budget -= len(records)
                offset = at
                if records:
                    yield records
        finally:
            if ahead is not None:  # stopped early: the fetch sent ahead ends here, not later
                ahead[1].cancel()
                await asyncio.wait([ahead[1]])
                _forget(ahead)

    async def _resolve_start(self, topic: str, partition: int, start: int | str) -> int:
        if isinstance(start, int):
            return start
        if start in ("earliest", "latest"):
            return await self.list_offsets(topic, partition, start)
        if start.lstrip("-").isdigit():
            return int(start)
        raise InvalidRequest(f"start must be earliest, latest or an offset, not {start!r}")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _forget(pending: tuple[int, asyncio.Task[FetchResult]] | None) -> None:
    """Drop a read-ahead fetch nobody will wait for, and whatever error it ends with."""
    if pending is not None:
        pending[1].cancel()
        pending[1].add_done_callback(lambda t: t.cancelled() or t.exception())


def decode_fetched(
    payload: bytes,
    from_offset: int,
    include_control: bool = False,
    skip_invalid: bool = False,
    where: str = "",
    *,
    batches: Sequence[tuple[int, BatchHeader]] | None = None,
) -> tuple[list[Record], int]:
    """Decode fetched batches (CRC-checked here, unless `batches` says where they are, already
    checked); records below from_offset are dropped.
    Returns (records, the offset to fetch next). A batch whose records cannot be decoded raises
    CorruptRecord naming its offsets, or with skip_invalid is skipped with a warning."""
    records: list[Record] = []
    next_offset = from_offset
    for pos, header in iter_headers(payload) if batches is None else batches:
        next_offset = max(next_offset, header.next_offset)
        if header.is_control and not include_control:
            continue
        if header.last_offset < from_offset:
            continue
        try:
            records += decode_records(payload, pos, from_offset)
        except CorruptRecord as exc:
            _unreadable(header, exc, skip_invalid, where)
    return records, next_offset


def _unreadable(header: BatchHeader, exc: CorruptRecord, skip_invalid: bool, where: str) -> None:
    span = f"{where} offsets {header.base_offset}..{header.last_offset}"
    if not skip_invalid:
        raise CorruptRecord(
            f"{span} hold a batch that cannot be read ({exc.message}); read with "
            "skip_invalid (tidelog consume --skip-invalid, Spark option "
            "skipInvalidBatches) to pass over it",
            base_offset=header.base_offset,
            last_offset=header.last_offset,
        ) from None
    log.warning("skipping %s: a batch that cannot be read (%s)", span, exc.message)


def _readable(
    header: BatchHeader, item: BatchItem, include_headers: bool, skip_invalid: bool, where: str
) -> bool:
    try:
        decode_columns([item], include_headers)
    except CorruptRecord as exc:
        _unreadable(header, exc, skip_invalid, where)
        return False
    return True
