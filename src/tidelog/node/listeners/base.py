"""What every inbound connection shares, and what one may cost.

A `FrameConnection` turns bytes into frames (protocol.framing, sans-IO) and hands them to its
subclass; a `Listener` accepts connections and holds them to the node's limits:

- a frame may be at most `frame_bytes_max`, checked from its 4-byte size before more of it is
  buffered;
- frames over SMALL_FRAME_BYTES reserve their declared size from one node-wide `ReceiveBudget`
  (`queued.max.request.bytes`, as Kafka's memory pool) before their body is read; while the
  budget is spent, such connections are not read (back-pressure, not an error), while small
  requests still are;
- a frame begun must arrive whole within `request.receive.timeout.ms` (slow clients and
  slow-loris connections are closed), and a connection idle for `connections.max.idle.ms` is
  closed;
- at most `max.connections` in all and `max.connections.per.ip` from one address; at the limit
  a new connection takes the place of one that has done nothing for a while (stalled or idle),
  or is closed at once;
- client connections leave `fd.reserve` descriptors free, so that segment files, fsyncs and
  peers keep working when clients exhaust the process's descriptors;
- all of it from a connection's first byte: a TLS connection is admitted before its handshake
  (which the connection then starts itself), and a handshake not done within
  `request.receive.timeout.ms` is closed.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import resource
import ssl
import time
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tidelog.errors import InvalidRequest
from tidelog.invariant import invariant
from tidelog.node.config import NodeConfig
from tidelog.node.failstop import FailStop
from tidelog.node.metrics import Counters
from tidelog.node.quotas import Quotas
from tidelog.node.transport import FrameWriter, Payload, tune_socket
from tidelog.protocol.framing import Frame, FrameDecoder, Kind
from tidelog.tls import HANDSHAKE_TIMEOUT_S

log = logging.getLogger(__name__)
# Pauses that also hold frames already received (not only the socket): too many requests in
# flight, and a token being checked (what follows it is served as the principal it proves).
HOLDING_PAUSES = frozenset({"inflight", "authenticating", "throttled"})

SMALL_FRAME_BYTES = 64 * 1024  # frames this small are read without a reservation
EVICT_AFTER_S = 1.0  # a connection that did nothing for this long may make room for a new one
DROP_GRACE_S = 1.0  # what is buffered for a dropped connection may leave for this long
SWEEP_INTERVAL_S = 0.5
WRITE_BUFFER_HIGH_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class ConnectionLimits:
    frame_bytes_max: int
    queued_max_request_bytes: int
    max_inflight_requests: int
    max_connections: int
    max_connections_per_ip: int
    idle_timeout_s: float
    request_receive_timeout_s: float
    fd_reserve: int

    @staticmethod
    def of(config: NodeConfig) -> ConnectionLimits:
        return ConnectionLimits(
            config.frame_bytes_max,
            config.queued_max_request_bytes,
            config.max_inflight_requests,
            config.max_connections,
            config.max_connections_per_ip,
            config.idle_timeout_ms / 1000,
            config.request_receive_timeout_ms / 1000,
            config.fd_reserve,
        )


class ReceiveBudget:
    """Bytes of large frames being received on one listener. A connection reserves its frame's
    declared size (capped at the whole budget, so that any frame the listener accepts can be
    granted) before reading its body; waiters are served in arrival order."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.used_bytes = 0
        self.peak_bytes = 0
        self.waits = 0
        self._waiting: collections.deque[tuple[FrameConnection, int]] = collections.deque()

    def reserve(self, conn: FrameConnection, size: int) -> int:
        """The bytes reserved now (0: conn is queued, and its granted() is called later)."""
        size = min(size, self.limit_bytes)
        if not self._waiting and self.used_bytes + size <= self.limit_bytes:
            self._take(size)
            return size
        self.waits += 1
        self._waiting.append((conn, size))
        return 0

    def _take(self, size: int) -> None:
        self.used_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.used_bytes)

    def release(self, size: int) -> None:
        self.used_bytes -= size
        invariant(self.used_bytes >= 0, "self.used_bytes >= 0")
        self._serve()

    def forget(self, conn: FrameConnection) -> None:
        self._waiting = collections.deque((c, n) for c, n in self._waiting if c is not conn)
        self._serve()  # the one that left may have been the head

    def _serve(self) -> None:
        while self._waiting:
            conn, want = self._waiting[0]
            if not conn.open:
                self._waiting.popleft()
                continue
            if self.used_bytes + want > self.limit_bytes:
                break
            self._waiting.popleft()
            self._take(want)
            conn.granted(want)


class FrameConnection(asyncio.Protocol):
    """One accepted connection: bytes in, frames to on_frame(); frames out through its writer."""

    listener: Listener

    def __init__(self, listener: Listener) -> None:
        self.listener = listener
        self.decoder = FrameDecoder(self.frame_bytes_max)
        self.writer: FrameWriter | None = None
        self.transport: asyncio.Transport | None = None
        self.address = ""
        self.host = ""
        self.open = False
        self.opened_at = time.monotonic()
        self.last_active = self.opened_at  # connect, or the last whole frame
        self.frame_started: float | None = None  # when the partial frame now buffered began
        self.reserved = 0
        self._pauses: dict[str, float] = {}  # why reading is paused -> since when
        self._held_until = 0.0  # a quota's throttle: nothing is read before this
        self._hold: asyncio.TimerHandle | None = None
        self.handshaking = False  # admitted, its TLS handshake not done yet
        self._handshake: asyncio.Future[None] | None = None

    # -- what subclasses say ------------------------------------------------------------------

    @property
    def frame_bytes_max(self) -> int:
        return self.listener.limits.frame_bytes_max

    def on_frame(self, frame: Frame) -> None:
        raise NotImplementedError

    @property
    def busy(self) -> bool:
        """Requests are being answered: not idle, never evicted."""
        return False

    def on_closed(self) -> None:
        """The connection is gone (release what it holds)."""

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        raw = typing.cast(asyncio.Transport, transport)
        self.transport = raw
        peer = raw.get_extra_info("peername")
        self.host = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        self.address = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.open = True
        if not self.listener.admit(self):
            self.open = False
            raw.abort()
            return
        tls = self.listener.tls
        if tls is None:
            self._ready(raw)
            return
        # The TLS handshake runs on a connection already counted against the limits and the
        # descriptor reserve: silent handshakes once escaped both (asyncio's TLS server calls
        # connection_made only after the handshake), and 1,000 of them locked clients out.
        self.handshaking = True
        loop = asyncio.get_running_loop()
        handshake = loop.start_tls(
            raw, self, tls, server_side=True, ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S
        )
        try:
            started = started_now(handshake)
        except (OSError, RuntimeError) as exc:  # the socket already gone
            log.info("%s listener: no TLS with %s: %s", self.listener.name, self.address, exc)
            self.open = False
            raw.abort()
            self._release_all()
            return
        self._handshake = asyncio.ensure_future(self._finish_tls(raw, started))

    async def _finish_tls(
        self, raw: asyncio.Transport, handshake: typing.Awaitable[asyncio.Transport | None]
    ) -> None:
        try:
            secured = await handshake
        except (OSError, ssl.SSLError, TimeoutError, RuntimeError) as exc:
            if self.open:
                log.info(
                    "%s listener: TLS handshake with %s failed: %s",
                    self.listener.name,
                    self.address,
                    exc,
                )
                self.listener.counters.inc(
                    "tidelog_connections_closed_total", listener=self.listener.name, why="tls"
                )
                self.open = False
                raw.abort()
                self._release_all()
            return
        if secured is None or not self.open:  # dropped (evicted, timed out) meanwhile
            if secured is not None:
                secured.abort()
            return
        self.handshaking = False
        self._ready(secured)

    def _ready(self, transport: asyncio.Transport) -> None:
        """The connection is established (its TLS handshake done, if any)."""
        self.transport = transport
        self.tune(transport)
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH_BYTES)
        self.writer = FrameWriter(transport, self.listener.zero_copy)
        self.on_ready(transport)

    def on_ready(self, transport: asyncio.Transport) -> None:
        """What a subclass learns once the connection is established (a TLS peer's
        certificate, say)."""

    def tune(self, transport: asyncio.Transport) -> None:
        tune_socket(transport)

    def data_received(self, data: bytes) -> None:
        if not self.open:
            return
        try:
            self.decoder.receive_data(data)
        except InvalidRequest as exc:
            self._protocol_error(exc)
            return
        self._pump()

    def _pump(self) -> None:
        """Hand whole frames to on_frame until there are none, or until the connection may
        not take more (too many requests in flight): what is buffered waits for resume()."""
        try:
            while self.open and not HOLDING_PAUSES.intersection(self._pauses):
                frame = self.decoder.next_frame()
                if frame is None:
                    self._partial_frame()
                    return
                self.last_active = time.monotonic()
                self.frame_started = None
                if self.reserved:
                    size, self.reserved = self.reserved, 0
                    self.listener.budget.release(size)
                self.on_frame(frame)
                if self.decoder.pending_bytes:
                    self.frame_started = self.last_active
        except InvalidRequest as exc:
            self._protocol_error(exc)
        except Exception as exc:  # a bug must cost this connection only, and say so once
            if self.listener.fail_stop is not None:
                self.listener.fail_stop.check(exc, f"{self.listener.name} listener")
            log.exception("%s connection from %s failed", self.listener.name, self.address)
            self.drop("error")

    def _protocol_error(self, exc: InvalidRequest) -> None:
        log.warning("closing %s connection from %s: %s", self.listener.name, self.address, exc)
        self.drop("protocol")

    def _partial_frame(self) -> None:
        if not self.decoder.pending_bytes:
            return
        if self.frame_started is None:
            self.frame_started = time.monotonic()
        size = self.decoder.pending_frame_size()
        if size is None or size <= SMALL_FRAME_BYTES or self.reserved or "budget" in self._pauses:
            return
        self.reserved = self.listener.budget.reserve(self, size)
        if not self.reserved:
            self.pause("budget")

    def granted(self, size: int) -> None:
        """The budget reserved size bytes for our frame: read on."""
        self.reserved = size
        self.frame_started = time.monotonic()  # we stopped reading; the client was not slow
        self.resume("budget")

    def pause_writing(self) -> None:
        if self.writer is not None:
            self.writer.pause()
        self.pause("writes")

    def resume_writing(self) -> None:
        if self.writer is not None:
            self.writer.resume()
        self.resume("writes")

    def pause(self, reason: str) -> None:
        if reason in self._pauses:
            return
        if not self._pauses and self.transport is not None and self.open:
            self.transport.pause_reading()
        self._pauses[reason] = time.monotonic()

    def resume(self, reason: str) -> None:
        if reason not in self._pauses:
            return
        del self._pauses[reason]
        if not self._pauses and self.transport is not None and self.open:
            self.transport.resume_reading()
        if reason in HOLDING_PAUSES and self.decoder.pending_bytes:
            asyncio.get_running_loop().call_soon(self._pump)  # frames that arrived meanwhile

    def hold_for_quota(self, quotas: Quotas, principal: str) -> int:
        """How long principal, over a quota, is held (ms, 0 if not): the answer says so in its
        throttle_time_ms, and nothing more is read from this connection for that long
        (Kafka's KIP-219)."""
        held = quotas.throttle_ms(principal)
        if held:
            self._hold_for(held / 1000)
        return held

    def _hold_for(self, seconds: float) -> None:
        until = time.monotonic() + seconds
        if until <= self._held_until:
            return
        self._held_until = until
        self.pause("throttled")
        if self._hold is not None:
            self._hold.cancel()
        self._hold = asyncio.get_running_loop().call_later(seconds, self.resume, "throttled")

    def paused_since(self, reason: str) -> float | None:
        return self._pauses.get(reason)

    @property
    def waiting_on_node(self) -> bool:
        """Reading is paused for the node's own reasons (the budget, requests in flight), not
        because the client stopped reading its answers: its frame is not slow."""
        return any(r in self._pauses for r in ("budget", "inflight", "throttled"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        if self.writer is not None:
            self.writer.closed = True
        if self._hold is not None:
            self._hold.cancel()
        self._release_all()
        self.on_closed()

    def _release_all(self) -> None:
        """What the connection holds of the listener: its place, its reservation, its wait."""
        if self.reserved:
            size, self.reserved = self.reserved, 0
            self.listener.budget.release(size)
        self.listener.budget.forget(self)
        self.listener.forget(self)

    def close(self) -> None:
        """Close after what is already written has gone (a clean end)."""
        self.open = False
        if self.writer is not None:
            self.writer.close()
        elif self.transport is not None:
            self.transport.close()

    def drop(self, why: str) -> None:
        """The node ends the connection (evicted, timed out, broke the protocol): it gives
        back what it holds now, and its socket goes even if the client never reads what is
        buffered for it (a graceful close would wait on that forever)."""
        if self.transport is None:
            return
        self.listener.counters.inc(
            "tidelog_connections_closed_total", listener=self.listener.name, why=why
        )
        was_open = self.open
        self.close()
        self._release_all()
        if was_open:
            self.on_closed()
        transport = self.transport
        asyncio.get_running_loop().call_later(DROP_GRACE_S, transport.abort)

    def send(
        self,
        kind: Kind,
        api: int,
        correlation_id: int,
        header: dict[str, Any],
        payload: Payload | bytes | None = None,
    ) -> None:
        if self.open and self.writer is not None:
            self.writer.write(kind, api, correlation_id, header, payload)


class Listener:
    """A server socket and the connections it accepted, held to the limits above."""

    def __init__(
        self,
        name: str,
        limits: ConnectionLimits,
        counters: Counters,
        factory: Callable[[Listener], FrameConnection],
        zero_copy: bool,
        reserve_descriptors: bool = True,
        fail_stop: FailStop | None = None,
    ) -> None:
        self.name = name
        self.fail_stop = fail_stop
        self.limits = limits
        self.counters = counters
        self.zero_copy = zero_copy
        self.budget = ReceiveBudget(limits.queued_max_request_bytes)
        self.connections: set[FrameConnection] = set()
        self.per_host: collections.Counter[str] = collections.Counter()
        self._factory = factory
        self._reserve = reserve_descriptors
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self.tls: ssl.SSLContext | None = None
        self._fds = DescriptorGauge()
        self.refused = 0
        self.evicted = 0
        self.peak_connections = 0

    async def start(
        self, host: str, port: int, tls: ssl.SSLContext | None = None
    ) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        self.tls = tls  # each connection starts TLS itself, once admitted (FrameConnection)
        self._server = await loop.create_server(
            lambda: self._factory(self),
            host,
            port,
            reuse_address=True,
            backlog=1024,
        )
        self._sweeper = loop.create_task(self._sweep())
        bound = self._server.sockets[0].getsockname()
        return str(bound[0]), int(bound[1])

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.close()

    # -- admission ------------------------------------------------------------------------------

    def admit(self, conn: FrameConnection) -> bool:
        """Take conn in, making room if a limit is reached; False: it must be closed."""
        limits = self.limits
        why = ""
        same_host = self.per_host[conn.host] >= limits.max_connections_per_ip
        if same_host and not self._evict(lambda c: c.host == conn.host):
            why = f"max.connections.per.ip={limits.max_connections_per_ip} from {conn.host}"
        elif (
            not same_host
            and len(self.connections) >= limits.max_connections
            and not self._evict(lambda c: True)
        ):
            why = f"max.connections={limits.max_connections}"
        if (
            not why
            and self._reserve
            and self._fds.free() <= limits.fd_reserve
            and not self._evict(lambda c: True)
        ):
            why = f"only {self._fds.free()} descriptors left, {limits.fd_reserve} are kept"
        if why:
            self.refused += 1
            self.counters.inc("tidelog_connections_refused_total", listener=self.name)
            log.warning(
                "%s listener refuses a connection from %s: %s", self.name, conn.address, why
            )
            return False
        self.connections.add(conn)
        self.per_host[conn.host] += 1
        self._fds.opened()
        self.peak_connections = max(self.peak_connections, len(self.connections))
        self.counters.inc("tidelog_connections_accepted_total", listener=self.name)
        return True

    def _evict(self, among: Callable[[FrameConnection], bool]) -> bool:
        """Close the connection that has done least for longest (a stalled frame first, then
        the longest idle) to make room; False if every candidate is busy or recent."""
        now = time.monotonic()

        def idle_for(c: FrameConnection) -> float:
            return now - c.last_active

        candidates = [
            c
            for c in self.connections
            if among(c) and not c.busy and c.open and idle_for(c) >= EVICT_AFTER_S
        ]
        if not candidates:
            return False
        victim = max(candidates, key=lambda c: (c.frame_started is not None, idle_for(c)))
        self.evicted += 1
        log.info(
            "%s listener closes %s (did nothing for %.1f s) to make room",
            self.name,
            victim.address,
            idle_for(victim),
        )
        victim.drop("evicted")
        return True

    def forget(self, conn: FrameConnection) -> None:
        self._drop(conn)

    def _drop(self, conn: FrameConnection) -> None:
        let_go(self.connections, self.per_host, self._fds, conn, conn.host)

    # -- timeouts -------------------------------------------------------------------------------

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            self.sweep(time.monotonic())

    def sweep(self, now: float) -> None:
        limits = self.limits
        for conn in list(self.connections):
            why = ""
            started = conn.frame_started
            stalled = conn.paused_since("writes")
            if stalled is not None and now - stalled > limits.request_receive_timeout_s:
                why = "not reading"  # its answers back up: it holds memory and makes no progress
            elif conn.handshaking:
                if now - conn.opened_at > limits.request_receive_timeout_s:
                    why = "TLS handshake not done"
            elif started is not None:
                if not conn.waiting_on_node and now - started > limits.request_receive_timeout_s:
                    why = "slow"
            elif not conn.busy and now - conn.last_active > limits.idle_timeout_s:
                why = "idle"
            why = why or self.expired(conn, now)
            if why:
                log.info("%s listener closes %s: %s", self.name, conn.address, why)
                conn.drop(why)

    def expired(self, conn: FrameConnection, now: float) -> str:
        """A listener's own reason to close a connection now ("" for none)."""
        return ""

    def stats(self) -> dict[str, Any]:
        return {
            "connections": len(self.connections),
            "peak_connections": self.peak_connections,
            "refused": self.refused,
            "evicted": self.evicted,
            "receive_budget_used_bytes": self.budget.used_bytes,
            "receive_budget_peak_bytes": self.budget.peak_bytes,
            "receive_budget_waits": self.budget.waits,
            "descriptors_free": self._fds.free(),
        }


def let_go(
    connections: set[Any],
    per_host: collections.Counter[str],
    fds: DescriptorGauge,
    conn: Any,
    host: str,
) -> None:
    """A listener's books on a connection gone: its place, its address's count, its
    descriptor (once, however often it is called)."""
    if conn in connections:
        connections.discard(conn)
        per_host[host] -= 1
        if per_host[host] <= 0:
            del per_host[host]
        fds.closed()


class DescriptorGauge:
    """Free file descriptors under the soft limit, counted from /proc now and then and kept
    current in between by what the listener opens and closes."""

    RECOUNT_S = 0.2

    def __init__(self) -> None:
        self.limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self._open = 0
        self._counted_at = -1.0

    def free(self) -> int:
        now = time.monotonic()
        if now - self._counted_at > self.RECOUNT_S:
            self._counted_at = now
            self.limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]  # the node may raise it
            try:
                self._open = len(os.listdir("/proc/self/fd"))
            except OSError:
                return self.limit  # no /proc: nothing to measure with
        if self.limit == resource.RLIM_INFINITY:
            return 1 << 30
        return self.limit - self._open

    def opened(self) -> None:
        self._open += 1

    def closed(self) -> None:
        self._open -= 1


T = typing.TypeVar("T")


def started_now(coro: typing.Coroutine[Any, Any, T]) -> typing.Awaitable[T]:
    """coro with its first step taken now, synchronously, the rest awaited as usual. For
    loop.start_tls from connection_made: its first step takes the socket's bytes over for the
    TLS protocol; run a tick later (as a task would), uvloop has begun reading by then (it
    starts after connection_made returns, whatever pause_reading said) and the ClientHello went
    to the frame decoder."""
    try:
        yielded = coro.send(None)
    except StopIteration as done:
        return _already(typing.cast(T, done.value))
    except BaseException:
        coro.close()
        raise
    return _resumed(coro, yielded)


async def _already(value: T) -> T:
    return value


@types.coroutine
def _resumed(coro: typing.Coroutine[Any, Any, T], yielded: Any) -> typing.Generator[Any, Any, T]:
    """The rest of a coroutine whose first step was taken: what it waits on goes up to the
    task, what the task sends or throws goes down to it."""
    while True:
        try:
            sent = yield yielded
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:
            try:
                yielded = coro.throw(exc)
            except StopIteration as done:
                return typing.cast(T, done.value)
        else:
            try:
                yielded = coro.send(sent)
            except StopIteration as done:
                return typing.cast(T, done.value)
