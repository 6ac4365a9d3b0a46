"""The HTTP listener (--http-listen): Prometheus's `/metrics`, the web console at `/`, and the
JSON it draws from.

    GET /metrics       this node's figures in Prometheus's text format (node/exposition.py)
    GET /api/status    this node's own status (what `tidelog status --json` gets from it)
    GET /api/cluster   every node's status merged into one row per partition (the console's
                       source): this node asks the others over tidelog's protocol
    GET /              the console (static files shipped in tidelog/console/)

A layer over the same core as the other listeners: each request is authorized there, as a
describe of the cluster (open to every connection, as `tidelog status` is). Served with the
node's TLS when it has one.
"""

from __future__ import annotations

import asyncio
import collections
import ipaddress
import json
import logging
import socket
import ssl
import time
import typing
from collections.abc import Collection
from importlib import resources
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from tidelog.cluster_status import merge_status, node_status
from tidelog.errors import NotAuthorized, TidelogError
from tidelog.invariant import InvariantBroken
from tidelog.node.access import Listener as Origin
from tidelog.node.access import Principal
from tidelog.node.core import NodeCore
from tidelog.node.exposition import CONTENT_TYPE, render, snapshot
from tidelog.node.listeners.base import DescriptorGauge, let_go, started_now
from tidelog.protocol import api
from tidelog.protocol.api import ApiKey
from tidelog.tls import HANDSHAKE_TIMEOUT_S

log = logging.getLogger(__name__)

CLUSTER_ASK_TIMEOUT_S = 2.0


class _MalformedRequests(logging.Filter):
    """aiohttp logs every malformed request at ERROR with a traceback: anyone could fill the
    node's log (the decoder fuzzer's HTTP corpus did). Such a request is answered 400 and
    closed; it is logged in one line, at INFO."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError):
            record.msg = f"refused a malformed HTTP request ({type(error).__name__}): %s"
            record.args = (str(error.message).splitlines()[0][:200] if error.message else "",)
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


BAD_REQUESTS_LOG = logging.getLogger("tidelog.http")
BAD_REQUESTS_LOG.addFilter(_MalformedRequests())
# Many consoles open at once share one gathering of the cluster's status at most this often.
CLUSTER_VIEW_MAX_AGE_S = 0.25
# The console's own files only, never in a frame (clickjacking), no sniffing of types. Its
# script sets style attributes, which CSP counts as inline styles.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; "
    "style-src 'self' 'unsafe-inline'; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'; form-action 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
CONSOLE_FILES = {
    "index.html": "text/html",
    "console.js": "text/javascript",
    "console.css": "text/css",
}


class HttpGate:
    """The HTTP listener's connections held to the node's limits from their first byte, as the
    other listeners' are: max.connections, max.connections.per.ip and fd.reserve, a TLS
    handshake started only once admitted and closed if not done within
    request.receive.timeout.ms, and a request whose head has not arrived within that time of
    its first byte (or of the connection, for the first) closed too. (aiohttp's server takes
    every connection, with TLS hands it over only after its handshake, and waits for a
    request's head as long as the client trickles it: silent and slow-loris connections
    escaped every limit.)"""

    def __init__(self, core: NodeCore, tls: ssl.SSLContext | None) -> None:
        self.core = core
        self.tls = tls
        self.connections: set[_GatedHttp] = set()
        self.by_handler: dict[asyncio.Protocol, _GatedHttp] = {}  # aiohttp's protocol -> ours
        self.per_host: collections.Counter[str] = collections.Counter()
        self._fds = DescriptorGauge()
        self.refused = 0

    def admit(self, conn: _GatedHttp) -> bool:
        config = self.core.config
        why = ""
        if self.per_host[conn.host] >= config.max_connections_per_ip and not self._evict(conn.host):
            why = f"max.connections.per.ip={config.max_connections_per_ip} from {conn.host}"
        elif len(self.connections) >= config.max_connections and not self._evict(None):
            why = f"max.connections={config.max_connections}"
        elif self._fds.free() <= config.fd_reserve and not self._evict(None):
            why = f"only {self._fds.free()} descriptors left, {config.fd_reserve} are kept"
        if why:
            self.refused += 1
            self.core.counters.inc("tidelog_connections_refused_total", listener="http")
            log.warning("http listener refuses a connection from %s: %s", conn.host, why)
            return False
        self.connections.add(conn)
        self.by_handler[conn.inner] = conn
        self.per_host[conn.host] += 1
        self._fds.opened()
        return True

    def _evict(self, host: str | None) -> bool:
        """Make room by closing the oldest connection (of host) still in its TLS handshake a
        second or more after it came: one that has sent nothing a node could answer."""
        now = time.monotonic()
        silent = [
            c
            for c in self.connections
            if c.handshaking and (host is None or c.host == host) and now - c.opened_at >= 1.0
        ]
        if not silent:
            return False
        victim = min(silent, key=lambda c: c.opened_at)
        log.info("http listener closes %s (still in its TLS handshake) to make room", victim.host)
        victim.abort()
        return True

    def request_arrived(self, handler: object) -> None:
        """aiohttp has a request's head (it reached the middleware): not a slow one."""
        conn = self.by_handler.get(typing.cast(asyncio.Protocol, handler))
        if conn is not None:
            conn.waiting_since = None

    def forget(self, conn: _GatedHttp) -> None:
        self.by_handler.pop(conn.inner, None)
        let_go(self.connections, self.per_host, self._fds, conn, conn.host)

    async def sweep(self) -> None:
        timeout_s = self.core.config.request_receive_timeout_ms / 1000
        while True:
            await asyncio.sleep(0.5)
            now = time.monotonic()
            for conn in list(self.connections):
                why = ""
                if conn.handshaking and now - conn.opened_at > timeout_s:
                    why = "TLS handshake not done"
                elif conn.waiting_since is not None and now - conn.waiting_since > timeout_s:
                    why = "request not received"
                if why:
                    log.info("http listener closes %s: %s", conn.host, why)
                    self.core.counters.inc(
                        "tidelog_connections_closed_total", listener="http", why=why
                    )
                    conn.abort()


class _GatedHttp(asyncio.Protocol):
    """One HTTP connection: admitted by its gate, then (TLS) secured, then aiohttp's."""

    def __init__(self, gate: HttpGate, inner: asyncio.Protocol) -> None:
        self.gate = gate
        self.inner = inner
        self.host = ""
        self.opened_at = time.monotonic()
        self.handshaking = False
        self.connected = False  # aiohttp's protocol has the connection
        # Since when a request's head is awaited (the connection's start, then each request's
        # first byte); None while none is: between requests, and once aiohttp has the head.
        self.waiting_since: float | None = None
        self.raw: asyncio.Transport | None = None
        self._handshake: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        raw = typing.cast(asyncio.Transport, transport)
        self.raw = raw
        peer = raw.get_extra_info("peername")
        self.host = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        if not self.gate.admit(self):
            raw.abort()
            return
        tls = self.gate.tls
        if tls is None:
            self._connect(raw)
            return
        self.handshaking = True
        handshake = asyncio.get_running_loop().start_tls(
            raw, self, tls, server_side=True, ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S
        )
        try:
            started = started_now(handshake)  # (see listeners/base.py: uvloop reads at once)
        except (OSError, RuntimeError):
            self.abort()
            return
        self._handshake = asyncio.ensure_future(self._secured(started))

    async def _secured(self, handshake: typing.Awaitable[asyncio.Transport | None]) -> None:
        try:
            secured = await handshake
        except (OSError, ssl.SSLError, TimeoutError, RuntimeError):
            self.abort()
            return
        if secured is None or self not in self.gate.connections:
            if secured is not None:
                secured.abort()
            return
        self.handshaking = False
        self._connect(secured)

    def _connect(self, transport: asyncio.Transport) -> None:
        self.connected = True
        self.waiting_since = time.monotonic()
        self.inner.connection_made(transport)

    def abort(self) -> None:
        self.gate.forget(self)
        if self.raw is not None:
            self.raw.abort()

    def data_received(self, data: bytes) -> None:
        if self.connected:
            if self.waiting_since is None:
                self.waiting_since = time.monotonic()
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.connected else None

    def connection_lost(self, exc: Exception | None) -> None:
        self.gate.forget(self)
        if self.connected:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.connected:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.connected:
            self.inner.resume_writing()


class HttpListener:
    def __init__(self, core: NodeCore) -> None:
        self.core = core
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self.gate: HttpGate | None = None
        self._view: tuple[float, dict[str, Any]] | None = None
        self._gathering: asyncio.Future[dict[str, Any]] | None = None
        self._own_hosts: set[str] = set()

    async def start(self, host: str, port: int, tls: ssl.SSLContext | None) -> tuple[str, int]:
        self._own_hosts = {host.lower(), socket.gethostname().lower()}
        self._own_hosts.add(self.core.config.advertised[0].lower())
        app = web.Application(middlewares=[self._guarded, self._authorized])
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/api/status", self._status)
        app.router.add_get("/api/cluster", self._cluster)
        app.router.add_get("/", self._index)
        app.router.add_get("/console/{name}", self._console_file)
        self._runner = web.AppRunner(
            app, access_log=None, handle_signals=False, logger=BAD_REQUESTS_LOG
        )
        await self._runner.setup()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.setblocking(False)
        bound = sock.getsockname()
        runner, gate = self._runner, HttpGate(self.core, tls)
        self.gate = gate
        if runner.server is None:
            raise InvariantBroken("runner.server is not None")
        handler = runner.server
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _GatedHttp(gate, handler()), sock=sock, backlog=128
        )
        self._sweeper = loop.create_task(gate.sweep())
        return bound[0], bound[1]

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    def host_allowed(self, host_header: str) -> bool:
        return host_allowed(host_header, self.core.config.http_allowed_hosts, self._own_hosts)

    @web.middleware
    async def _guarded(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if self.gate is not None:
            self.gate.request_arrived(request.protocol)
        if not self.host_allowed(request.headers.get("Host", "")):
            self.core.counters.inc("tidelog_http_refused_hosts_total")
            return web.json_response(
                {
                    "error": {
                        "name": "NotAuthorized",
                        "message": f"Host {request.headers.get('Host', '')!r} is not this "
                        "node's: add it to http.allowed.hosts to be served under that name",
                    }
                },
                status=421,
                headers=SECURITY_HEADERS,
            )
        response: web.StreamResponse = await handler(request)
        response.headers.update(SECURITY_HEADERS)
        return response

    @web.middleware
    async def _authorized(self, request: web.Request, handler: Any) -> web.StreamResponse:
        route = request.match_info.route.resource
        path = route.canonical if route is not None else "other"
        self.core.counters.inc("tidelog_http_requests_total", path=path)
        principal = Principal.anonymous(request.remote or "", Origin.HTTP)
        try:
            self.core.authorize(principal, api.StatusRequest())
        except NotAuthorized as exc:
            return web.json_response({"error": exc.to_wire()}, status=403)
        except TidelogError as exc:  # still starting
            return web.json_response({"error": exc.to_wire()}, status=503)
        try:
            response: web.StreamResponse = await handler(request)
        except TidelogError as exc:
            return web.json_response({"error": exc.to_wire()}, status=503)
        return response

    async def _metrics(self, request: web.Request) -> web.Response:
        body = await render(snapshot(self.core.view))
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def _own_status(self) -> dict[str, Any]:
        async def page(request: api.StatusRequest) -> dict[str, Any]:
            result = self.core.handle(Principal.anonymous("", Origin.HTTP), request, b"")
            if not isinstance(result, api.StatusResponse):
                raise InvariantBroken("isinstance(result, api.StatusResponse)")
            await asyncio.sleep(0)  # a page at a time: the loop serves others in between
            return api.encode(result)

        return await node_status(page, None)

    async def _status(self, request: web.Request) -> web.Response:
        return _json(await self._own_status())

    async def _cluster(self, request: web.Request) -> web.Response:
        now = time.monotonic()
        if self._view is not None and now - self._view[0] < CLUSTER_VIEW_MAX_AGE_S:
            return _json(self._view[1])
        if self._gathering is None:
            # One gathering for every request waiting now; it finishes even if they go away.
            self._gathering = gathering = asyncio.ensure_future(self._gather())
            gathering.add_done_callback(self._gathered)
        return _json(await asyncio.shield(self._gathering))

    def _gathered(self, gathering: asyncio.Future[dict[str, Any]]) -> None:
        if self._gathering is gathering:
            self._gathering = None

    async def _gather(self) -> dict[str, Any]:
        core = self.core
        own = await self._own_status()

        async def ask(node_id: int) -> dict[str, Any]:
            async def page(request: api.StatusRequest) -> dict[str, Any]:
                return await core.asker.ask(node_id, ApiKey.STATUS, request, CLUSTER_ASK_TIMEOUT_S)

            try:
                return await node_status(page, None)
            except (TimeoutError, TidelogError, OSError) as exc:
                error = (
                    exc if isinstance(exc, TidelogError) else TidelogError(str(exc) or "timeout")
                )
                return {
                    "node_id": node_id,
                    "error": error.to_wire(),
                    "partitions": [],
                    "metadata": {},
                }

        others = [n for n in sorted(core.view.nodes()) if n != core.node_id]
        nodes = [own, *await asyncio.gather(*(ask(n) for n in others))]
        nodes.sort(key=lambda n: int(n["node_id"]))
        view = {
            "node_id": core.node_id,
            "generated_ms": int(time.time() * 1000),
            "nodes": [_node_summary(n) for n in nodes],
            "partitions": merge_status(nodes, None),
        }
        self._view = (time.monotonic(), view)
        return view

    async def _index(self, request: web.Request) -> web.Response:
        return _console_file("index.html")

    async def _console_file(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in CONSOLE_FILES:
            raise web.HTTPNotFound()
        return _console_file(name)


def _console_file(name: str) -> web.Response:
    body = resources.files("tidelog.console").joinpath(name).read_bytes()
    return web.Response(
        body=body,
        content_type=CONSOLE_FILES[name],
        headers={"Cache-Control": "no-cache"},
    )


def _node_summary(node: dict[str, Any]) -> dict[str, Any]:
    """What the console shows of a node besides its replicas: who leads the metadata log, its
    storage and disk, or why it did not answer."""
    meta = node.get("metadata", {})
    info = node.get("node", {})
    summary: dict[str, Any] = {"node_id": int(node["node_id"])}
    if "error" in node:
        summary["error"] = node["error"]
        return summary
    summary.update(
        metadata_leader=meta.get("leader"),
        storage_bytes=meta.get("storage_bytes", 0),
        storage_max_bytes=meta.get("storage_max_bytes", 0),
        disk_free_bytes=info.get("disk_free_bytes"),
        disk_total_bytes=info.get("disk_total_bytes"),
    )
    return summary


def _json(value: Any) -> web.Response:
    return web.Response(
        text=json.dumps(value, default=_jsonable, separators=(",", ":")),
        content_type="application/json",
        headers={"Cache-Control": "no-cache"},
    )


def _jsonable(value: Any) -> Any:
    if isinstance(value, set | frozenset):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def host_allowed(host_header: str, allowed: Collection[str], own_hosts: Collection[str]) -> bool:
    """The DNS-rebinding guard: a page from another site whose name was made to resolve to
    this node (a loopback console included) sends that name as Host. IP literals, localhost,
    this node's own names and http.allowed.hosts are answered."""
    if "*" in allowed:
        return True
    host = host_header.strip().lower()
    if host.startswith("["):  # [::1]:8080
        host = host[1 : host.find("]")] if "]" in host else host
    elif host.count(":") == 1:
        host = host.rsplit(":", 1)[0]
    if not host:
        return False
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    host = host.rstrip(".")
    return host in ("localhost", *own_hosts, *allowed)
