"""The peer channel: nodes talk to nodes here, never on the client listener.

Every node listens for peers on a port of its own (`--peer-listen`; by default the client
listener's host and a port the kernel picks, which other nodes learn from the client listener's
ApiVersions answer, or fixed with `ID=HOST:PORT/PEER_PORT` in `--peers`). A connection is bound
to one node id by the handshake of protocol/peer_handshake.py, which proves the dialer holds
the cluster secret (and the listener proves it back); before that nothing but the handshake is
read, in frames of at most HANDSHAKE_FRAME_BYTES, and a handshake that does not finish within
`peer_handshake_timeout_ms` is closed. After it, the connection carries one-way replication
and cursor-invalidation messages, whose sender is the bound node id.

Each node dials each peer once (`PeerLink`) and sends on that link; answers come back on the
peer's own link to us. A link that is down drops what it is given: the replication protocol
retries on its own timers.

One stream per pair of nodes carries every partition they share: what the node has for a peer
in one turn of its event loop (fetches, answers, votes, heartbeats of many groups) leaves as one
`PEER_BATCH` frame, as a Kafka follower fetches all partitions of a leader in one request. A
large answer (a file range worth sendfile) goes in a frame of its own, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import socket
import ssl
import time
import typing
from collections.abc import Callable
from typing import Any

from tidelog.errors import InvalidRequest, TidelogError
from tidelog.invariant import InvariantBroken
from tidelog.node.access import Principal
from tidelog.node.config import BATCH_FRAME_MARGIN_BYTES
from tidelog.node.core import NodeCore
from tidelog.node.listeners.base import ConnectionLimits, FrameConnection, Listener
from tidelog.node.metrics import Counters
from tidelog.node.transport import (
    WRITE_BUFFER_HIGH_BYTES,
    ZERO_COPY_BYTES_MIN,
    FrameWriter,
    Payload,
    tune_socket,
)
from tidelog.protocol import api
from tidelog.protocol.api import ApiKey
from tidelog.protocol.framing import Frame, FrameDecoder, Kind, encode_prefix
from tidelog.protocol.peer_batch import PeerMessage, encode_peer_batch
from tidelog.protocol.peer_handshake import (
    DialerHandshake,
    ListenerHandshake,
    PeerAuth,
    PeerAuthResponse,
    PeerHello,
    PeerHelloResponse,
)
from tidelog.replication.metadata import NodeEntry

log = logging.getLogger(__name__)

HANDSHAKE_FRAME_BYTES = 64 * 1024
PEER_BATCH_BYTES_MAX = 1024 * 1024  # a batch this large leaves at once
PEER_QUEUE_BYTES_MAX = 64 * 1024 * 1024
UNBOUND_PEER_CONNECTIONS_MAX = 32


class PeerConnection(FrameConnection):
    """An inbound connection from another node."""

    def __init__(self, listener: Listener, core: NodeCore, secret: bytes) -> None:
        self.peer_id: int | None = None
        super().__init__(listener)
        self.core = core
        peers = frozenset(core.registry.peer_nodes())
        self.handshake = ListenerHandshake(secret, core.node_id, peers, core.identity.cluster_id)
        self.principal: Principal | None = None

    @property
    def frame_bytes_max(self) -> int:
        return (
            self.listener.limits.frame_bytes_max
            if self.peer_id is not None
            else HANDSHAKE_FRAME_BYTES
        )

    @property
    def busy(self) -> bool:
        return self.peer_id is not None  # a bound peer is never evicted for a stranger

    def tune(self, transport: asyncio.Transport) -> None:
        tune_socket(transport)
        keep_alive(transport)

    def on_frame(self, frame: Frame) -> None:
        if self.principal is not None:
            if frame.kind != Kind.MESSAGE:
                raise InvalidRequest("a bound peer connection carries one-way messages only")
            self.core.on_peer_message(self.principal, frame.api, frame.header, frame.payload)
            return
        if frame.kind != Kind.REQUEST or frame.api not in (ApiKey.PEER_HELLO, ApiKey.PEER_AUTH):
            raise InvalidRequest("a peer connection must complete its handshake first")
        try:
            if frame.api == ApiKey.PEER_HELLO:
                hello = self.handshake.hello(api.decode(PeerHello, frame.header))
                self.send(Kind.RESPONSE, frame.api, frame.correlation_id, api.encode(hello))
                return
            peer_id = self.handshake.auth(api.decode(PeerAuth, frame.header))
        except TidelogError as exc:
            self.core.counters.inc("tidelog_peer_handshakes_failed_total")
            self.send(Kind.RESPONSE, frame.api, frame.correlation_id, api.encode_error(exc))
            raise InvalidRequest(f"peer handshake failed: {exc.message}") from None
        self.peer_id = peer_id
        directory = self.handshake.dialer_directory
        self.principal = Principal.peer(peer_id, self.address, directory)
        self.core.directories.seen(peer_id, directory)
        self.decoder.frame_bytes_max = self.listener.limits.frame_bytes_max
        if not isinstance(self.listener, PeerListener):
            raise InvariantBroken("isinstance(self.listener, PeerListener)")
        self.listener.bound(self)
        self.send(
            Kind.RESPONSE, frame.api, frame.correlation_id, api.encode(PeerAuthResponse(True))
        )
        log.info("peer channel: node %d connected from %s", peer_id, self.address)


class PeerListener(Listener):
    def __init__(
        self, core: NodeCore, limits: ConnectionLimits, secret: bytes, handshake_timeout_s: float
    ) -> None:
        nodes = len(core.config.voters)
        peer_limits = ConnectionLimits(
            limits.frame_bytes_max + BATCH_FRAME_MARGIN_BYTES,
            limits.queued_max_request_bytes + BATCH_FRAME_MARGIN_BYTES,
            limits.max_inflight_requests,
            max_connections=2 * nodes + UNBOUND_PEER_CONNECTIONS_MAX,
            max_connections_per_ip=2 * nodes + UNBOUND_PEER_CONNECTIONS_MAX,
            idle_timeout_s=limits.idle_timeout_s,
            request_receive_timeout_s=limits.request_receive_timeout_s,
            fd_reserve=0,
        )
        super().__init__(
            "peer",
            peer_limits,
            core.counters,
            lambda listener: PeerConnection(listener, core, secret),
            core.config.zero_copy,
            reserve_descriptors=False,
            fail_stop=core.fail_stop,
        )
        self.handshake_timeout_s = handshake_timeout_s
        self.on_bound: Callable[[int], None] = lambda peer_id: None

    def fit(self, nodes: int) -> None:
        """Room for two connections per node (one each way) and some strangers."""
        most = 2 * nodes + UNBOUND_PEER_CONNECTIONS_MAX
        self.limits = dataclasses.replace(
            self.limits, max_connections=most, max_connections_per_ip=most
        )

    def bound(self, conn: PeerConnection) -> None:
        """conn proved it is node conn.peer_id: an older connection from that node is gone
        (its host crashed, or a partition ate the FIN), so it is dropped rather than kept."""
        for other in list(self.connections):
            same = isinstance(other, PeerConnection) and other.peer_id == conn.peer_id
            if same and other is not conn:
                other.drop("replaced")
        if conn.peer_id is None:
            raise InvariantBroken("conn.peer_id is not None")
        self.on_bound(conn.peer_id)

    def expired(self, conn: FrameConnection, now: float) -> str:
        if not isinstance(conn, PeerConnection):
            raise InvariantBroken("isinstance(conn, PeerConnection)")
        if conn.peer_id is None and now - conn.opened_at > self.handshake_timeout_s:
            return "handshake timeout"
        return ""


async def discover_peer_port(
    address: tuple[str, int], timeout_s: float, tls: ssl.SSLContext | None = None
) -> int:
    """Ask a node's client listener where its peer channel listens."""
    request = api.encode(api.ApiVersionsRequest("peer-discovery"))
    answer = await _ask(address, timeout_s, tls, ApiKey.API_VERSIONS, request)
    port = api.decode(api.ApiVersionsResponse, answer).peer_port
    if port <= 0:
        raise InvalidRequest(f"node at {address[0]}:{address[1]} has no peer channel")
    return port


async def ask_cluster_id(
    dialer: DialerHandshake, address: tuple[str, int], timeout_s: float, tls: ssl.SSLContext | None
) -> str:
    """The cluster id of the peer whose peer channel is at address ("" if it is not formatted
    yet), once it proved it holds the cluster secret. Only the hello is sent: the connection is
    never bound."""
    hello = api.encode(dialer.hello())
    answer = await _ask(address, timeout_s, tls, ApiKey.PEER_HELLO, hello)
    return dialer.listener_cluster(api.decode(PeerHelloResponse, answer))


async def _ask(
    address: tuple[str, int],
    timeout_s: float,
    tls: ssl.SSLContext | None,
    key: int,
    request: dict[str, Any],
) -> dict[str, Any]:
    """One request on a connection of its own, and its answer's header."""
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(*address, ssl=tls, server_hostname=address[0] if tls else None),
        timeout_s,
    )
    try:
        writer.write(encode_prefix(Kind.REQUEST, key, 1, request, 0))
        decoder = FrameDecoder(HANDSHAKE_FRAME_BYTES)
        while True:
            frame = decoder.next_frame()
            if frame is not None:
                break
            data = await asyncio.wait_for(reader.read(65536), timeout_s)
            if not data:
                raise ConnectionError("closed before answering")
            decoder.receive_data(data)
        error = api.error_of(frame.header)
        if error is not None:
            raise error
        return frame.header
    finally:
        writer.close()


class PeerLink:
    """Our outbound, authenticated connection to one peer, for one-way messages."""

    RECONNECT_DELAY_MIN_S = 0.05
    RECONNECT_DELAY_MAX_S = 1.0

    def __init__(
        self,
        node_id: int,
        peer_id: int,
        client_address: tuple[str, int],
        peer_port: int | None,
        secret: bytes,
        zero_copy: bool,
        counters: Counters,
        timeout_s: float,
        identity: tuple[str, str] = ("", ""),  # our cluster id and directory id
        tls: ssl.SSLContext | None = None,  # mutual TLS: we dial with our node certificate
        on_lost: Callable[[int], None] = lambda peer: None,
    ) -> None:
        self.on_lost = on_lost  # our link to the peer closed: it may have died
        self.node_id = node_id
        self.identity = identity
        self.tls = tls
        self.peer_id = peer_id
        self.client_address = client_address
        self.fixed_port = peer_port
        self.secret = secret
        self.zero_copy = zero_copy
        self.counters = counters
        self.timeout_s = timeout_s
        self.writer: FrameWriter | None = None
        self._protocol: _Outbound | None = None
        self._connecting = False
        self._delay_s = self.RECONNECT_DELAY_MIN_S
        self._closed = False
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._last_failure_log = 0.0
        self.dropped_messages = 0
        self.sent_messages = 0
        self.sent_frames = 0
        self._outbox: list[PeerMessage] = []
        self._outbox_bytes = 0
        self._flush_scheduled = False

    @property
    def connected(self) -> bool:
        return self.writer is not None and not self.writer.closed

    def send(self, key: int, header: dict[str, Any], payload: Payload | bytes | None) -> None:
        if not self.connected:
            self.dropped_messages += 1
            self._ensure_connecting()
            return
        if self.writer is None:
            raise InvariantBroken("self.writer is not None")
        if self.writer.queued_bytes > PEER_QUEUE_BYTES_MAX:
            self.dropped_messages += 1
            return
        self.sent_messages += 1
        if payload is None:
            data = b""
        elif isinstance(payload, bytes | bytearray):
            data = bytes(payload)
        elif payload.size >= ZERO_COPY_BYTES_MIN:
            self.flush()  # in order, and alone: it may go by sendfile
            self.sent_frames += 1
            self.writer.write(Kind.MESSAGE, key, 0, header, payload)
            return
        else:
            data = payload.read()
        self._outbox.append((key, header, data))
        self._outbox_bytes += len(data)
        if self._outbox_bytes >= PEER_BATCH_BYTES_MAX:
            self.flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Send what this turn of the loop gave us for the peer: one frame."""
        self._flush_scheduled = False
        outbox, self._outbox, self._outbox_bytes = self._outbox, [], 0
        if not outbox or not self.connected:
            return
        if self.writer is None:
            raise InvariantBroken("self.writer is not None")
        self.sent_frames += 1
        if len(outbox) == 1:
            key, header, data = outbox[0]
            self.writer.write(Kind.MESSAGE, key, 0, header, data or None)
            return
        header, payload = encode_peer_batch(outbox)
        self.writer.write(Kind.MESSAGE, ApiKey.PEER_BATCH, 0, header, payload)

    def connect(self) -> None:
        if not self.connected:
            self._ensure_connecting()

    def _ensure_connecting(self) -> None:
        if self._connecting or self._closed:
            return
        self._connecting = True
        self._task = asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        host = self.client_address[0]
        try:
            while not self._closed:
                transport: asyncio.BaseTransport | None = None
                try:
                    port = self.fixed_port or await discover_peer_port(
                        self.client_address, self.timeout_s, self.tls
                    )
                    transport, protocol = await asyncio.wait_for(
                        loop.create_connection(
                            lambda: _Outbound(self),
                            host,
                            port,
                            ssl=self.tls,
                            server_hostname=host if self.tls else None,
                        ),
                        self.timeout_s,
                    )
                    await asyncio.wait_for(protocol.handshake(), self.timeout_s)
                    self._protocol = protocol
                    self.writer = protocol.writer
                    self._delay_s = self.RECONNECT_DELAY_MIN_S
                    log.info(
                        "peer channel: connected to node %d at %s:%d", self.peer_id, host, port
                    )
                    return
                except (OSError, TimeoutError, TidelogError) as exc:
                    if transport is not None:
                        transport.close()
                    self._note_failure(exc)
                    self._wake = asyncio.Event()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), self._delay_s)
                    self._delay_s = min(self._delay_s * 2, self.RECONNECT_DELAY_MAX_S)
        finally:
            self._connecting = False

    def peer_is_up(self) -> None:
        """The peer just proved itself on our listener: it is up, so dial it now rather than
        after the rest of a backoff (a cluster starting one node at a time converges at once)."""
        self._delay_s = self.RECONNECT_DELAY_MIN_S
        if self._wake is not None:
            self._wake.set()

    def _note_failure(self, exc: BaseException) -> None:
        if isinstance(exc, TidelogError) and "handshake" in exc.message:
            self.counters.inc("tidelog_peer_handshakes_failed_total")
            level = logging.ERROR
        else:
            level = logging.DEBUG
        now = time.monotonic()
        if level == logging.ERROR and now - self._last_failure_log < 10:
            level = logging.DEBUG
        if level == logging.ERROR:
            self._last_failure_log = now
        log.log(level, "peer channel: cannot reach node %d: %s", self.peer_id, exc)

    def _detach(self) -> None:
        if self.writer is not None:
            self.writer.closed = True
        self.writer = None
        self._protocol = None
        if not self._closed:
            self.on_lost(self.peer_id)

    def close(self) -> None:
        self._closed = True
        if self.writer is not None:
            self.writer.close()
        if self._protocol is not None and self._protocol.transport is not None:
            self._protocol.transport.close()
        if self._task is not None:
            self._task.cancel()


class _Outbound(asyncio.Protocol):
    """Our side of an outbound peer connection: the handshake, then frames out only."""

    def __init__(self, link: PeerLink) -> None:
        self.link = link
        self.transport: asyncio.Transport | None = None
        self.writer: FrameWriter | None = None
        self.decoder = FrameDecoder(HANDSHAKE_FRAME_BYTES)
        self._answers: asyncio.Queue[Frame | None] = asyncio.Queue()
        self.bound = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = typing.cast(asyncio.Transport, transport)
        tune_socket(self.transport)
        keep_alive(self.transport)
        # As on accepted connections: a replication answer (up to replica.fetch.max.bytes)
        # fits the transport's buffer without pausing the writer behind it.
        self.transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH_BYTES)
        self.writer = FrameWriter(self.transport, self.link.zero_copy)

    async def handshake(self) -> None:
        if self.writer is None:
            raise InvariantBroken("self.writer is not None")
        link = self.link
        dialer = DialerHandshake(link.secret, link.node_id, link.peer_id, *link.identity)
        self.writer.write(Kind.REQUEST, ApiKey.PEER_HELLO, 1, api.encode(dialer.hello()))
        hello = api.decode(PeerHelloResponse, await self._answer())
        self.writer.write(Kind.REQUEST, ApiKey.PEER_AUTH, 2, api.encode(dialer.answer(hello)))
        if not api.decode(PeerAuthResponse, await self._answer()).accepted:
            raise InvalidRequest(f"peer handshake: node {link.peer_id} refused us")
        self.bound = True

    async def _answer(self) -> dict[str, Any]:
        frame = await self._answers.get()
        if frame is None:
            raise ConnectionError("the peer closed the connection during the handshake")
        error = api.error_of(frame.header)
        if error is not None:
            raise error
        return frame.header

    def data_received(self, data: bytes) -> None:
        if self.bound:
            return  # peers answer on their own links
        try:
            self.decoder.receive_data(data)
            while (frame := self.decoder.next_frame()) is not None:
                self._answers.put_nowait(frame)
        except InvalidRequest:
            self._answers.put_nowait(None)
            if self.transport is not None:
                self.transport.close()

    def pause_writing(self) -> None:
        if self.writer is not None:
            self.writer.pause()

    def resume_writing(self) -> None:
        if self.writer is not None:
            self.writer.resume()

    def connection_lost(self, exc: Exception | None) -> None:
        self._answers.put_nowait(None)
        if self.writer is not None:
            self.writer.closed = True
        if self.bound:
            self.link._detach()


def keep_alive(transport: asyncio.BaseTransport) -> None:
    """TCP keepalive on peer sockets: a peer whose host vanished is noticed, not kept."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


class PeerChannel:
    """Our links to every peer (by node id), and sending on them."""

    def __init__(self, core: NodeCore, secret: bytes) -> None:
        self.core = core
        self.secret = secret
        self.links: dict[int, PeerLink] = {}  # by update(), from the cluster's nodes

    def _link(self, peer_id: int, address: tuple[str, int], peer_port: int | None) -> PeerLink:
        core = self.core
        config = core.config
        return PeerLink(
            config.node_id,
            peer_id,
            address,
            peer_port,
            self.secret,
            config.zero_copy,
            core.counters,
            config.peer_handshake_timeout_ms / 1000,
            (core.identity.cluster_id, core.identity.directory_id),
            config.tls_dialing,
            core.peer_connection_lost,
        )

    def update(self, nodes: dict[int, NodeEntry], removed: set[int]) -> None:
        """Links to the cluster's nodes as the metadata log now has them: new ones dialled now,
        not at their first message (a peer we reach learns that we are up and dials us back at
        once), removed ones closed. (A link to a node the metadata does not list is kept: while a
        restarted node replays an old metadata log, nodes added since are not in it yet.)"""
        for peer_id, entry in nodes.items():
            if peer_id != self.core.node_id and peer_id not in self.links:
                link = self._link(peer_id, entry.address, entry.peer_port or None)
                self.links[peer_id] = link
                link.connect()
                log.info("peer channel: node %d joined, at %s:%d", peer_id, *entry.address)
        for peer_id in [p for p in self.links if p in removed]:
            self.links.pop(peer_id).close()
            log.info("peer channel: node %d left the cluster", peer_id)

    def send(self, to: int, key: int, header: dict[str, Any], payload: Any) -> None:
        link = self.links.get(to)
        if link is not None:
            link.send(key, header, payload)

    def peer_is_up(self, peer_id: int) -> None:
        link = self.links.get(peer_id)
        if link is not None and not link.connected:
            link.peer_is_up()

    def close(self) -> None:
        for link in self.links.values():
            link.close()

    def stats(self) -> dict[str, Any]:
        return {
            str(peer_id): {
                "connected": link.connected,
                "sent_messages": link.sent_messages,
                "sent_frames": link.sent_frames,
                "dropped_messages": link.dropped_messages,
            }
            for peer_id, link in sorted(self.links.items())
        }
