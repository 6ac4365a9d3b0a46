"""The Kafka port: a thin asyncio layer between sockets and the broker's handlers.

Connections are held to the same limits as tidelog's own client listener (node/listeners/
base.py: frame size checked before buffering, the node-wide receive budget, in-flight requests,
connection counts, slow and idle clients). Requests on one connection may be answered
concurrently, but their answers leave in the order the requests came, as Kafka requires.
A request this listener cannot parse, or for an api or version it does not serve, closes the
connection (Kafka's behaviour); ApiVersions of an unknown version is answered with
UNSUPPORTED_VERSION and the versions served, so the client can retry with one of them.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import re
import time
from typing import Any

from tidelog.errors import AuthenticationFailed, InvalidRequest, NotAuthorized, TidelogError
from tidelog.invariant import InvariantBroken
from tidelog.kafka.broker import KafkaBroker
from tidelog.kafka.codec import (
    API_VERSIONS,
    KafkaFrameDecoder,
    KafkaRequest,
    UnsupportedVersion,
    encode_response,
    error_answer,
    parse_request,
    unsupported_api_versions,
)
from tidelog.kafka.errors import kafka_code
from tidelog.kafka.sasl import (
    ILLEGAL_SASL_STATE,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
    SaslSession,
    failed_answer,
)
from tidelog.node.access import Listener as Origin
from tidelog.node.access import Principal
from tidelog.node.config import is_loopback
from tidelog.node.listeners.base import ConnectionLimits, FrameConnection, Listener
from tidelog.node.transport import tune_socket

log = logging.getLogger(__name__)

FAILED_AUTHENTICATION_DELAY_S = 0.1


class _Slot:
    __slots__ = ("data", "ready", "task")

    def __init__(self) -> None:
        self.ready = False
        self.data = b""
        self.task: asyncio.Task[None] | None = None


class KafkaConnection(FrameConnection):
    def __init__(self, listener: Listener, broker: KafkaBroker) -> None:
        super().__init__(listener)
        self.decoder = KafkaFrameDecoder(self.frame_bytes_max)
        self.broker = broker
        self.principal = Principal.anonymous("", Origin.KAFKA)
        self._slots: collections.deque[_Slot] = collections.deque()

    def on_ready(self, transport: asyncio.Transport) -> None:
        self.principal = Principal.of_connection(
            self.address, Origin.KAFKA, transport.get_extra_info("peercert")
        )
        tls = transport.get_extra_info("sslcontext") is not None
        self.sasl = SaslSession(self.broker, tls or is_loopback(self.host), self.principal)

    def tune(self, transport: asyncio.Transport) -> None:
        tune_socket(transport, receive_buffer=False)

    @property
    def busy(self) -> bool:
        return bool(self._slots)

    def on_frame(self, frame: Any) -> None:
        if not isinstance(frame, bytes):
            raise InvariantBroken("isinstance(frame, bytes)")
        try:
            request = parse_request(frame)
        except UnsupportedVersion as exc:
            self.listener.counters.inc("tidelog_kafka_unsupported_requests_total")
            if exc.api_key == API_VERSIONS:
                slot = _Slot()
                self._slots.append(slot)
                self._answer(slot, unsupported_api_versions(exc.correlation_id))
                return
            raise InvalidRequest(str(exc)) from None
        self.listener.counters.inc("tidelog_kafka_requests_total", api=str(request.api_key))
        slot = _Slot()
        self._slots.append(slot)
        if len(self._slots) >= self.listener.limits.max_inflight_requests:
            self.pause("inflight")
        if self.sasl.mid_exchange != (request.api_key == SASL_AUTHENTICATE):
            # Between SaslHandshake and the end of SaslAuthenticate nothing else is served (it
            # ran as who the connection was before), and SaslAuthenticate comes only after a
            # handshake: Kafka answers ILLEGAL_SASL_STATE and closes.
            self._illegal_sasl_state(slot, request)
            return
        if request.api_key in (SASL_HANDSHAKE, SASL_AUTHENTICATE):
            # Nothing more is read until it is decided: what follows is served as the
            # principal it proves, never as who the connection was before.
            self.pause("authenticating")
            slot.task = asyncio.get_running_loop().create_task(self._sasl(slot, request))
            return
        slot.task = asyncio.get_running_loop().create_task(self._serve(slot, request, len(frame)))

    def _illegal_sasl_state(self, slot: _Slot, request: KafkaRequest) -> None:
        log.info(
            "kafka: api %d from %s out of SASL's order: ILLEGAL_SASL_STATE",
            request.api_key,
            self.address,
        )
        self.pause("authenticating")  # read nothing more: the connection ends
        answer = error_answer(
            request.api_key, request.api_version, request.correlation_id, ILLEGAL_SASL_STATE
        )
        self._answer(slot, answer)  # (None, where the response has no error code: closed)
        asyncio.get_running_loop().call_later(FAILED_AUTHENTICATION_DELAY_S, self.close)

    async def _sasl(self, slot: _Slot, request: KafkaRequest) -> None:
        failed = False
        try:
            if request.api_key == SASL_HANDSHAKE:
                values = self.sasl.handshake(str(request.body.mechanism))
            else:
                values, proved = await self.sasl.authenticate(bytes(request.body.auth_bytes))
                if proved is not None:
                    self.principal = Principal.of_token(proved, self.principal)
        except TidelogError as exc:
            log.info("kafka: SASL from %s refused: %s", self.address, exc)
            values, failed = failed_answer(exc), True
        data = encode_response(request.api_key, request.api_version, request.correlation_id, values)
        self._answer(slot, data)
        if failed:
            # Closed a moment after the answer that says why, still reading nothing: Kafka's
            # connection.failed.authentication.delay.ms (clients read the answer first, and
            # guessing is slowed).
            asyncio.get_running_loop().call_later(FAILED_AUTHENTICATION_DELAY_S, self.close)
        else:
            self.resume("authenticating")

    async def _serve(self, slot: _Slot, request: KafkaRequest, size: int) -> None:
        started = time.monotonic()
        try:
            values = await self.broker.handle(self.principal, request)
        except asyncio.CancelledError:
            raise
        except TidelogError as exc:
            # Handlers turn per-partition errors into codes; one that escapes is about the
            # whole request. Refused permission is answered where the response has a place
            # for it (GROUP_/CLUSTER_AUTHORIZATION_FAILED); otherwise the connection ends.
            log.warning("kafka request %s from %s refused: %s", request.api_key, self.address, exc)
            answer = None
            if isinstance(exc, NotAuthorized | AuthenticationFailed):
                answer = error_answer(
                    request.api_key, request.api_version, request.correlation_id, kafka_code(exc)
                )
            if answer is None:
                self.drop("refused")
            else:
                self._answer(slot, answer)
            return
        except Exception as exc:
            self.broker.core.fail_stop.check(exc, f"kafka api {request.api_key}")
            log.exception("kafka request %s failed", request.api_key)
            self.drop("error")
            return
        if values is None:  # acks=0: no answer, and so no place in the queue
            self._answer(slot, None)
            return
        held = self.hold_for_quota(self.broker.core.quotas, self.principal.name)
        if held:
            values = {**values, "throttle_time": held}  # kio names throttle_time_ms so
        data = encode_response(request.api_key, request.api_version, request.correlation_id, values)
        self.broker.core.request_metrics("kafka", request_name(request)).answered(
            time.monotonic() - started, size, len(data)
        )
        self._answer(slot, data)

    def _answer(self, slot: _Slot, data: bytes | None) -> None:
        slot.ready, slot.task = True, None
        slot.data = data or b""
        slots = self._slots
        while slots and slots[0].ready:
            done = slots.popleft()
            if done.data and self.open and self.transport is not None:
                self.transport.write(done.data)
        if len(slots) < self.listener.limits.max_inflight_requests:
            self.resume("inflight")

    def on_closed(self) -> None:
        for slot in self._slots:
            if slot.task is not None:
                slot.task.cancel()
        self._slots.clear()


def kafka_listener(broker: KafkaBroker, limits: ConnectionLimits) -> Listener:
    return Listener(
        "kafka",
        limits,
        broker.core.counters,
        lambda listener: KafkaConnection(listener, broker),
        zero_copy=False,
        fail_stop=broker.core.fail_stop,
    )


def request_name(request: KafkaRequest) -> str:
    return _snake_name(type(request.body).__name__)


@functools.cache
def _snake_name(class_name: str) -> str:
    """ProduceRequest → produce, ListOffsetsRequest → list_offsets: Kafka's API names, written
    as tidelog's own requests are in the metrics."""
    name = class_name.removesuffix("Request")
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
