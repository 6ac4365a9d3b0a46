"""Routing: which node a request goes to, and trying again when it went to the wrong one.

One connection per node (opened once, authenticated with the client's token), the metadata
cache (nodes, topics, partition leaders), and the three ways a request finds its node: to a
partition's leader (`to_leader`), to the metadata log's leader (`to_metadata_leader`, every
admin write) or to any node (`any_node`, reads every node can answer). docs/errors.md lists what
each retries."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from tidelog.client.connection import NodeConnection
from tidelog.client.metadata import MetadataCache, TopicInfo
from tidelog.config import parse_address
from tidelog.errors import (
    InvalidRequest,
    NetworkError,
    NotLeader,
    OutcomeUnknown,
    TidelogError,
    Timeout,
    UnknownTopicOrPartition,
)
from tidelog.invariant import InvariantBroken
from tidelog.protocol import api
from tidelog.protocol.api import ApiKey
from tidelog.protocol.framing import Frame
from tidelog.tls import TlsFiles

# The client logs under one name, the one it had before it was split into modules (log filters
# and the text format show it).
log = logging.getLogger("tidelog.client.async_client")

Address = tuple[str, int]


class ClientSettings(Protocol):
    """The client's settings as routing reads them, at each use (AsyncClient's constructor sets
    them, and `on_admin_retry` may be set at any time)."""

    bootstrap: list[Address]
    tls: TlsFiles | None
    token: str | None
    request_timeout_s: float
    retries: int  # attempts per request
    retry_backoff_s: float
    retry_backoff_max_s: float
    admin_timeout_s: float
    on_admin_retry: Callable[[TidelogError, float], None] | None


def bootstrap_addresses(
    bootstrap: str | Sequence[str], tls: TlsFiles | None, token: str | None
) -> list[Address]:
    """The addresses to ask first ("host:port,host:port" or a list of them)."""
    items = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
    addresses = [parse_address(b) for b in items if b.strip()]
    if not addresses:
        raise InvalidRequest("no bootstrap address given")
    if token and tls is None and any(not _is_loopback(h) for h, _ in addresses):
        log.warning(
            "a token is sent to %s over plain TCP, readable by anyone on the path: "
            "connect with TLS (tls=TlsFiles.of(ca))",
            ",".join(f"{h}:{p}" for h, p in addresses),
        )
    return addresses


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_indeterminate(exc: TidelogError) -> bool:
    """Did this failed attempt perhaps take effect? (Sent, then the answer was lost or timed
    out; or the node appended it and then could not confirm it.)"""
    return bool(exc.details.get("appended")) or (
        isinstance(exc, NetworkError | Timeout) and bool(exc.details.get("sent"))
    )


class Router:
    def __init__(self, settings: ClientSettings) -> None:
        self.settings = settings
        tls = settings.tls
        # TLS to every node: verifies their certificates against tls.ca, presents tls.cert.
        self._tls_context = None if tls is None else tls.client_context()
        self._conns: dict[Address, NodeConnection] = {}
        self._connecting: dict[Address, asyncio.Future[NodeConnection]] = {}
        self.metadata = MetadataCache()
        self._rng = random.Random()

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()

    # -- connections ------------------------------------------------------------------------------

    async def _connection(self, address: Address) -> NodeConnection:
        conn = self._conns.get(address)
        if conn is not None and not conn.closed:
            return conn
        pending = self._connecting.get(address)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[NodeConnection] = asyncio.get_running_loop().create_future()
        self._connecting[address] = future
        try:
            tls = self.settings.tls
            conn = await NodeConnection.open(
                address,
                min(self.settings.request_timeout_s, 10.0),
                self._tls_context,
                tls is not None and tls.cert is not None,
            )
            if self.settings.token:
                await self._authenticate(conn, self.settings.token)
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
                timeout_s=self.settings.request_timeout_s,
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
        address: Address,
        key: ApiKey,
        request: Any,
        payload: bytes | bytearray = b"",
        timeout_s: float | None = None,
        expect_response: bool = True,
    ) -> tuple[dict[str, Any], bytes]:
        conn = await self._connection(address)
        frame: Frame | None = await conn.request(
            key,
            api.encode(request),
            payload,
            timeout_s if timeout_s is not None else self.settings.request_timeout_s,
            expect_response,
        )
        if frame is None:
            return {}, b""
        error = api.error_of(frame.header)
        if error is not None:
            raise error
        return frame.header, frame.payload

    def backoff(self, attempt: int) -> float:
        settings = self.settings
        base: float = min(
            settings.retry_backoff_max_s, settings.retry_backoff_s * (2 ** min(attempt, 10))
        )
        return base * (0.5 + self._rng.random() / 2)

    def _addresses(self) -> list[Address]:
        known = list(self.metadata.nodes.values())
        return known + [a for a in self.settings.bootstrap if a not in known]

    # -- the metadata cache -----------------------------------------------------------------------

    async def refresh_metadata(
        self, topics: list[str] | None = None, at_metadata_leader: bool = False
    ) -> None:
        request = api.MetadataRequest(topics, leader_only=at_metadata_leader)
        if at_metadata_leader:
            header = await self.to_metadata_leader(ApiKey.METADATA, request)
        else:
            header, _ = await self.any_node(ApiKey.METADATA, request)
        resp = api.decode(api.MetadataResponse, header)
        self._remember_nodes(resp)
        cache = self.metadata
        if topics is None:  # every topic there is: one deleted since is gone from the cache
            cache.topics.clear()
        entries = list(resp.topics)
        unknown = [t for t in entries if "error" in t]
        asked_leader = at_metadata_leader or resp.node_id == resp.metadata_leader
        if unknown and topics is not None and not asked_leader:
            # A node that has not applied a topic's creation yet calls it unknown, as a Kafka
            # broker answers UNKNOWN_TOPIC_OR_PARTITION just after CreateTopics; the metadata
            # leader has applied it. One try: when it cannot answer, the first word stands.
            entries = [t for t in entries if "error" not in t]
            entries += await self._unknown_at_metadata_leader(unknown)
        for t in entries:
            if "error" in t:
                cache.topics.pop(str(t["name"]), None)
                continue
            info = TopicInfo.of_wire(t)
            cache.topics[info.name] = info
            for p, leader in enumerate(info.leaders):
                if leader >= 0:
                    cache.leaders[(info.name, p)] = leader

    async def _unknown_at_metadata_leader(
        self, unknown: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """The metadata leader's entries for topics another node called unknown (that node's
        entries when the leader cannot be asked)."""
        request = api.MetadataRequest([str(t["name"]) for t in unknown], leader_only=True)
        try:
            header = await self.metadata_leader_once(ApiKey.METADATA, request)
        except TidelogError:
            return unknown
        return list(api.decode(api.MetadataResponse, header).topics)

    async def metadata_leader_once(self, key: ApiKey, request: Any) -> dict[str, Any]:
        """One try at the metadata leader, for a read whose "no such thing" at some node may
        only mean that node has not applied a change yet (its errors are the caller's)."""
        await self._learn_metadata_leader()
        header, _ = await self.call(self._metadata_leader_address(0), key, request)
        return header

    async def _learn_metadata_leader(self) -> None:
        """A client that does not know which node leads the metadata log asks one (a Metadata
        request for no topics), so that its first admin request or read-your-writes read goes
        there and not to a follower that may not have applied the latest change. One try, at
        the first address: the callers' own loops go through the nodes when it fails."""
        if self.metadata.metadata_leader >= 0:
            return
        request = api.MetadataRequest([])
        try:
            header, _ = await self.call(self._addresses()[0], ApiKey.METADATA, request)
        except TidelogError:
            return
        self._remember_nodes(api.decode(api.MetadataResponse, header))

    def _remember_nodes(self, resp: api.MetadataResponse) -> None:
        cache = self.metadata
        cache.nodes = {int(n["node_id"]): (str(n["host"]), int(n["port"])) for n in resp.nodes}
        cache.metadata_leader = resp.metadata_leader

    async def topic(self, name: str, refresh: bool = False) -> TopicInfo:
        if refresh or name not in self.metadata.topics:
            await self.refresh_metadata([name])
        info = self.metadata.topics.get(name)
        if info is None:
            raise UnknownTopicOrPartition(f"unknown topic {name!r}", topic=name)
        return info

    async def list_topics(self) -> list[TopicInfo]:
        await self.refresh_metadata(None)
        return sorted(self.metadata.topics.values(), key=lambda t: t.name)

    async def nodes(self) -> dict[int, Address]:
        if not self.metadata.nodes:
            await self.refresh_metadata([])
        return dict(self.metadata.nodes)

    def node_address(self, node_id: int) -> Address | None:
        return self.metadata.nodes.get(node_id)

    # -- the three routes -------------------------------------------------------------------------

    async def any_node(self, key: ApiKey, request: Any) -> tuple[dict[str, Any], bytes]:
        last: TidelogError | None = None
        for attempt in range(self.settings.retries):
            addresses = self._addresses()
            address = addresses[attempt % len(addresses)]
            try:
                return await self.call(address, key, request)
            except (NetworkError, Timeout, NotLeader) as exc:  # NotLeader: a node starting
                last = exc
                if attempt + 1 >= len(addresses):
                    await asyncio.sleep(self.backoff(attempt))
        if last is None:
            raise InvariantBroken("last is not None")
        raise last

    async def _partition_target(self, topic: str, partition: int, attempt: int) -> Address:
        info = await self.topic(topic)
        if not 0 <= partition < info.partitions:
            raise UnknownTopicOrPartition(
                f"topic {topic!r} has {info.partitions} partitions; no partition {partition}",
                topic=topic,
                partition=partition,
            )
        leader = self.metadata.leaders.get((topic, partition), -1)
        replicas = info.assignments[partition]
        node = leader if leader >= 0 else replicas[attempt % len(replicas)]
        address = self.node_address(node)
        if address is None:
            await self.refresh_metadata([topic])
            address = self.node_address(node) or self.settings.bootstrap[0]
        return address

    async def to_leader(
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
        for attempt in range(self.settings.retries):
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
                    and self.node_address(hint) is not None
                    and self.metadata.leaders.get((topic, partition)) != hint
                ):
                    self.metadata.leaders[(topic, partition)] = hint
                    continue  # go straight to the hinted leader
                self.metadata.leaders.pop((topic, partition), None)
            except (NetworkError, UnknownTopicOrPartition) as exc:
                last = exc
                self.metadata.leaders.pop((topic, partition), None)
                if isinstance(exc, UnknownTopicOrPartition) and attempt >= 5:
                    raise
                with contextlib.suppress(TidelogError):
                    await self.refresh_metadata([topic])
            except Timeout as exc:
                last = exc
                self.metadata.leaders.pop((topic, partition), None)
            except TidelogError as exc:
                if not exc.retriable:
                    raise
                last = exc
            await asyncio.sleep(self.backoff(attempt))
        if last is None:
            raise InvariantBroken("last is not None")
        raise last

    def _metadata_leader_address(self, attempt: int) -> Address:
        leader = self.metadata.metadata_leader
        if leader >= 0 and leader in self.metadata.nodes:
            return self.metadata.nodes[leader]
        addresses = self._addresses()
        return addresses[attempt % len(addresses)]

    async def to_metadata_leader(self, key: ApiKey, request: Any) -> dict[str, Any]:
        """Admin writes go through the metadata log's leader; follow its hints. Retriable
        errors are retried until admin_timeout_ms has passed (at least `retries` times), as
        Kafka's admin client does until default.api.timeout.ms: right after a cluster starts,
        its first election is still running."""
        started = time.monotonic()
        await self._learn_metadata_leader()
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
                if attempt + 1 >= self.settings.retries and waited >= self.settings.admin_timeout_s:
                    raise
                on_admin_retry = self.settings.on_admin_retry
                if on_admin_retry is not None:
                    on_admin_retry(exc, waited)
                hint = exc.leader_hint if isinstance(exc, NotLeader) else None
                if hint is not None and hint >= 0:
                    self.metadata.metadata_leader = hint
                    if hint not in self.metadata.nodes:  # a node we have not heard of
                        with contextlib.suppress(TidelogError):
                            await self.refresh_metadata([])
                else:
                    self.metadata.metadata_leader = -1
                    await asyncio.sleep(self.backoff(attempt))
            attempt += 1
