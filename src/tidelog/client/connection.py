"""One client connection to one node: requests out, responses matched by correlation id."""

from __future__ import annotations

import asyncio
import itertools
import socket
import ssl
import typing
from typing import Any

from tidelog.errors import AuthenticationFailed, NetworkError, Timeout
from tidelog.protocol.framing import Frame, FrameDecoder, Kind, encode_prefix
from tidelog.tls import HANDSHAKE_TIMEOUT_S, handshake_error, handshake_reset_hint

CLIENT_FRAME_BYTES_MAX = 256 * 1024 * 1024


class NodeConnection(asyncio.Protocol):
    def __init__(self, address: tuple[str, int], tls: bool = False) -> None:
        self.address = address
        self.tls = tls
        self.answered = False  # any frame came back (else a plain client at a TLS port?)
        self.decoder = FrameDecoder(CLIENT_FRAME_BYTES_MAX)
        self.transport: asyncio.Transport | None = None
        self._pending: dict[int, asyncio.Future[Frame]] = {}
        self._ids = itertools.count(1)
        self.closed = False
        self._can_write = asyncio.Event()
        self._can_write.set()

    @classmethod
    async def open(
        cls,
        address: tuple[str, int],
        timeout_s: float,
        tls: ssl.SSLContext | None = None,
        with_certificate: bool = False,
    ) -> NodeConnection:
        """with_certificate: the TLS context presents a client certificate (a connection the
        node ends within the handshake may then be one it does not accept)."""
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: cls(address, tls is not None),
                    *address,
                    ssl=tls,
                    server_hostname=address[0] if tls is not None else None,
                    ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S if tls is not None else None,
                ),
                timeout_s,
            )
        except (OSError, TimeoutError) as exc:
            failed = None
            if tls is not None:
                failed = handshake_error(exc, f"{address[0]}:{address[1]}")
            if failed is not None:
                raise failed from None
            hint = handshake_reset_hint(exc, tls is not None)
            if hint and with_certificate:
                # Its alert lost in the reset: a certificate the node does not accept, or a
                # node turning connections away -- named as the first, both said.
                raise AuthenticationFailed(
                    f"{address[0]}:{address[1]} ended the TLS handshake: it does not accept "
                    "this client's certificate (signed by a CA the node does not trust?), or "
                    "it was turning connections away (max.connections, its descriptors)",
                    address=f"{address[0]}:{address[1]}",
                ) from None
            raise NetworkError(f"cannot connect to {address[0]}:{address[1]}: {exc}{hint}") from exc
        return conn

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = typing.cast(asyncio.Transport, transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        try:
            self.decoder.receive_data(data)
            while True:
                frame = self.decoder.next_frame()
                if frame is None:
                    break
                self.answered = True
                future = self._pending.pop(frame.correlation_id, None)
                if future is not None and not future.done():
                    future.set_result(frame)
        except Exception as exc:  # a broken stream poisons every request on it
            self._fail_all(
                NetworkError(f"bad response stream from {self.address}: {exc}", sent=True)
            )
            self.close()

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        # Under TLS 1.3 a node that refuses our certificate (or its absence) says so with an
        # alert after the handshake: that is an answer, not a lost connection.
        refused = None
        if exc is not None and not self.answered:  # later TLS errors are a broken connection
            refused = handshake_error(exc, f"{self.address[0]}:{self.address[1]}")
        lost = f"connection to {self.address[0]}:{self.address[1]} lost"
        if not self.tls and not self.answered and self._pending:
            lost += " before any answer (a node with TLS closes plain connections: give the CA)"
        # Every request still waiting was sent: whether the node acted on it is unknown.
        self._fail_all(refused or NetworkError(lost, sent=True))

    def _fail_all(self, error: Exception) -> None:
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    async def request(
        self,
        api: int,
        header: dict[str, Any],
        payload: bytes | bytearray = b"",
        timeout_s: float = 30.0,
        expect_response: bool = True,
    ) -> Frame | None:
        if self.closed or self.transport is None:
            raise NetworkError(f"connection to {self.address} is closed")
        await self._can_write.wait()
        correlation_id = next(self._ids) & 0xFFFFFFFF
        future: asyncio.Future[Frame] | None = None
        if expect_response:
            future = asyncio.get_running_loop().create_future()
            self._pending[correlation_id] = future
        prefix = encode_prefix(Kind.REQUEST, api, correlation_id, header, len(payload))
        if len(payload) < 65536:
            self.transport.write(prefix + payload)
        else:  # not copied into one buffer first: a fresh megabyte costs page faults
            self.transport.writelines([prefix, payload])
        if future is None:
            return None
        try:
            return await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            self._pending.pop(correlation_id, None)
            raise Timeout(
                f"no answer from {self.address[0]}:{self.address[1]} in {timeout_s}s", sent=True
            ) from None
