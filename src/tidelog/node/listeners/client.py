"""tidelog's own client protocol: frames in, typed requests to the core, answers out.

Every request gets exactly one answer (acks=0 produce excepted, as in Kafka), and a connection's
answers go out in the order its requests came, whatever order they finish in: a slot is taken
per request and answers are written from the head of the queue. At most
`max.inflight.requests.per.connection` requests wait at once (answered or not), and at most
HELD_BYTES_MAX of answers wait behind an unanswered one; past either the connection is not
read until answers drain. Replication and cursor-invalidation messages are a peer's, never a client's: a
client connection that sends one is closed.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import time
from collections.abc import Awaitable
from typing import Any

from tidelog.errors import InvalidRequest, TidelogError
from tidelog.node.access import Listener as Origin
from tidelog.node.access import Principal
from tidelog.node.core import NodeCore
from tidelog.node.listeners.base import FrameConnection, Listener
from tidelog.node.transport import tune_socket
from tidelog.protocol import api
from tidelog.protocol.api import ApiKey
from tidelog.protocol.framing import Frame, Kind

log = logging.getLogger(__name__)

HELD_BYTES_MAX = 4 * 1024 * 1024  # answers ready but queued behind one that is not


class _Slot:
    __slots__ = (
        "api",
        "bytes_in",
        "correlation_id",
        "header",
        "held_bytes",
        "payload",
        "ready",
        "started",
        "task",
    )

    def __init__(self, frame: Frame) -> None:
        self.started = time.monotonic()
        self.bytes_in = len(frame.payload)
        self.api = frame.api
        self.correlation_id = frame.correlation_id
        self.ready = False
        self.header: dict[str, Any] = {}
        self.payload: Any = None
        self.held_bytes = 0
        self.task: asyncio.Task[None] | None = None


class ClientConnection(FrameConnection):
    def __init__(self, listener: Listener, core: NodeCore) -> None:
        super().__init__(listener)
        self.core = core
        self.principal = Principal.anonymous("")
        self._slots: collections.deque[_Slot] = collections.deque()
        self._held_bytes = 0

    def on_ready(self, transport: asyncio.Transport) -> None:
        self.principal = Principal.of_connection(
            self.address,
            Origin.CLIENT,
            transport.get_extra_info("peercert"),
            self.core.config.tls_client_auth == "required",
        )

    def tune(self, transport: asyncio.Transport) -> None:
        tune_socket(transport, receive_buffer=False)

    @property
    def busy(self) -> bool:
        return bool(self._slots)

    @property
    def waiting_on_node(self) -> bool:
        return super().waiting_on_node or self.paused_since("held") is not None

    def on_frame(self, frame: Frame) -> None:
        if frame.kind == Kind.MESSAGE:
            what = "a peer's message" if frame.api in api.PEER_ONLY_MESSAGES else "a message"
            self.core.counters.inc("tidelog_client_peer_messages_refused_total")
            raise InvalidRequest(f"client connections may not send {what} (api {frame.api})")
        if frame.kind != Kind.REQUEST:
            raise InvalidRequest("a node accepts only requests on its client listener")
        slot = _Slot(frame)
        self._slots.append(slot)
        if len(self._slots) >= self.listener.limits.max_inflight_requests:
            self.pause("inflight")
        if frame.api == ApiKey.AUTHENTICATE:
            # Nothing more is read until the token is decided: a request sent after it is
            # served as the principal it proves, never as who the connection was before.
            self.pause("authenticating")
        try:
            request = api.decode(self.core.request_type(frame.api), frame.header)
            result = self.core.handle(self.principal, request, frame.payload)
        except TidelogError as exc:
            self._answer(slot, api.encode_error(exc))
            if frame.api == ApiKey.AUTHENTICATE:
                self.close()  # a connection whose token failed ends here
            return
        except Exception as exc:  # a bug must not take the connection's other requests with it
            if self._failed_stop(exc, frame.api):
                return
            log.exception("request %s failed", frame.api)
            self._answer(slot, api.encode_error(TidelogError(f"internal error: {exc}")))
            return
        if result is None:  # acks=0: no answer, and so no place in the queue
            self._slots.remove(slot)
            return
        if isinstance(result, Awaitable):
            slot.task = asyncio.get_running_loop().create_task(self._finish(slot, result))
            return
        self._answer(slot, *self._throttled(_encoded(result)))

    async def _finish(self, slot: _Slot, pending: Awaitable[Any]) -> None:
        try:
            result = await pending
        except TidelogError as exc:
            self._answer(slot, api.encode_error(exc))
            if slot.api == ApiKey.AUTHENTICATE:
                self.close()  # a connection whose token failed ends here
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if self._failed_stop(exc, slot.api):
                return
            log.exception("request %s failed", slot.api)
            self._answer(slot, api.encode_error(TidelogError(f"internal error: {exc}")))
            if slot.api == ApiKey.AUTHENTICATE:
                self.close()
        else:
            if isinstance(result, api.AuthenticateResponse):
                # The token held: this connection is that principal from now on.
                self.principal = Principal.of_token(result.principal, self.principal)
                self.resume("authenticating")
            self._answer(slot, *self._throttled(_encoded(result)))

    def _throttled(self, answer: tuple[dict[str, Any], Any]) -> tuple[dict[str, Any], Any]:
        """The answer, with how long a principal over its quota is held (and the hold)."""
        held = self.hold_for_quota(self.core.quotas, self.principal.name)
        if held:
            answer[0]["throttle_time_ms"] = held
        return answer

    def _answer(self, slot: _Slot, header: dict[str, Any], payload: Any = None) -> None:
        slot.header, slot.payload, slot.ready = header, payload, True
        self.core.request_metrics("client", slot.api).answered(
            time.monotonic() - slot.started, slot.bytes_in, _payload_size(payload)
        )
        slot.task = None
        slots = self._slots
        while slots and slots[0].ready:
            done = slots.popleft()
            self._held_bytes -= done.held_bytes
            self.send(Kind.RESPONSE, done.api, done.correlation_id, done.header, done.payload)
        if slots and slot.ready and slot is not slots[0] and slot in slots:
            # Ready, but behind one that is not: it waits here, in memory, and counts.
            slot.held_bytes = _size(header, payload)
            self._held_bytes += slot.held_bytes
            if self._held_bytes > HELD_BYTES_MAX:
                self.pause("held")
        if self._held_bytes <= HELD_BYTES_MAX:
            self.resume("held")
        if len(slots) < self.listener.limits.max_inflight_requests:
            self.resume("inflight")

    def _failed_stop(self, exc: Exception, api_key: int) -> bool:
        """An invariant failed: the node stops, and this request gets no answer (its client
        sees the connection close, as it would if the node had crashed)."""
        self.core.fail_stop.check(exc, f"request api {api_key}")
        return self.core.fail_stop.failed is not None

    def on_closed(self) -> None:
        for slot in self._slots:
            if slot.task is not None:
                slot.task.cancel()  # a long-poll for nobody
        self._slots.clear()


def _size(header: dict[str, Any], payload: Any) -> int:
    return len(json.dumps(header, separators=(",", ":"))) + _payload_size(payload)


def _payload_size(payload: Any) -> int:
    if payload is None:
        return 0
    return len(payload) if isinstance(payload, bytes | bytearray) else int(payload.size)


def _encoded(result: Any) -> tuple[dict[str, Any], Any]:
    if isinstance(result, tuple):
        response, payload = result
        return api.encode(response), payload
    return api.encode(result), None


def client_listener(core: NodeCore, listener_limits: Any, zero_copy: bool) -> Listener:
    return Listener(
        "client",
        listener_limits,
        core.counters,
        lambda listener: ClientConnection(listener, core),
        zero_copy,
        fail_stop=core.fail_stop,
    )
