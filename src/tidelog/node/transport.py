"""Sockets: the server side of client and peer connections, and outbound links to peers.

The transport is one small interface (a `FrameSink` the node writes frames into, a handler
that receives frames), so TLS can be swapped in later without touching the node: a TLS
transport simply reports `zero_copy = False` and payloads are copied instead of sendfile'd.
"""

from __future__ import annotations

import asyncio
import asyncio.selector_events
import collections
import logging
import os
import socket
import typing
from collections.abc import Callable
from typing import Any, Protocol

from tidelog.errors import InvalidRequest
from tidelog.protocol.framing import Frame, FrameDecoder, Kind, encode_prefix
from tidelog.storage.segment import FileSlice

log = logging.getLogger(__name__)

ZERO_COPY_BYTES_MIN = 64 * 1024  # below this a copy is cheaper than sendfile's bookkeeping
PEER_QUEUE_BYTES_MAX = 64 * 1024 * 1024
WRITE_BUFFER_HIGH_BYTES = 4 * 1024 * 1024


class Payload(Protocol):
    @property
    def size(self) -> int: ...

    def read(self) -> bytes: ...


class _FdFile:
    """The file-object face asyncio's sendfile wants, over a segment's descriptor."""

    mode = "rb"

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def fileno(self) -> int:
        return self._fd

    def seek(self, position: int, whence: int = 0) -> int:
        return position  # the descriptor is read with positional IO only


class FrameWriter:
    """Writes frames to one transport in order; large file payloads go out with sendfile."""

    def __init__(self, transport: asyncio.Transport, zero_copy: bool) -> None:
        self.transport = transport
        # Only asyncio's own selector loop does sendfile natively; uvloop (and TLS) would fall
        # back to reading the file through a Python file object, so we copy instead.
        native = isinstance(
            asyncio.get_running_loop(), asyncio.selector_events.BaseSelectorEventLoop
        )
        self.zero_copy = zero_copy and native
        sock = transport.get_extra_info("socket")
        # Plain TCP only: a TLS transport must see every byte.
        plain = sock is not None and transport.get_extra_info("sslcontext") is None
        self._raw_fd = sock.fileno() if zero_copy and not native and plain else -1
        self._queue: collections.deque[tuple[bytes, Payload | None]] = collections.deque()
        self._busy = False
        self._paused = False
        self._drained = asyncio.Event()
        self._drained.set()
        self.queued_bytes = 0
        self.closed = False

    def write(
        self,
        kind: Kind,
        api: int,
        correlation_id: int,
        header: dict[str, Any],
        payload: Payload | bytes | None = None,
    ) -> None:
        if self.closed:
            return
        if isinstance(payload, bytes | bytearray):
            size = len(payload)
        else:
            size = payload.size if payload is not None else 0
        prefix = encode_prefix(kind, api, correlation_id, header, size)
        if isinstance(payload, bytes | bytearray):
            self._enqueue(prefix + payload, None)
        else:
            self._enqueue(prefix, payload)

    def _enqueue(self, data: bytes, payload: Payload | None) -> None:
        if not self._busy and not self._paused and not self._wants_sendfile(payload):
            if payload is None:
                self.transport.write(data)
            elif not self._send_file_now(data, payload):
                self.transport.writelines([data, payload.read()])
            return
        self._queue.append((data, payload))
        self.queued_bytes += len(data) + (payload.size if payload is not None else 0)
        if not self._busy:
            self._busy = True
            asyncio.get_running_loop().create_task(self._drain_queue())

    def _send_file_now(self, prefix: bytes, payload: Payload) -> bool:
        """On a loop without native sendfile (uvloop), still send a large file range without
        copying it through Python: when nothing is buffered, hand it to the kernel directly
        and queue only what the socket did not take. False: copy it as usual."""
        if (
            self._raw_fd < 0
            or not isinstance(payload, FileSlice)
            or payload.size < ZERO_COPY_BYTES_MIN
            or self.transport.get_write_buffer_size()
        ):
            return False
        self.transport.write(prefix)
        if self.transport.get_write_buffer_size():
            self.transport.write(payload.read())
            return True
        sent = 0
        try:
            while sent < payload.size:
                n = os.sendfile(
                    self._raw_fd, payload.fd, payload.position + sent, payload.size - sent
                )
                if n == 0:
                    break
                sent += n
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as exc:
            log.debug("sendfile failed: %s", exc)
            self.close()
            return True
        if sent < payload.size:
            self.transport.write(os.pread(payload.fd, payload.size - sent, payload.position + sent))
        return True

    def _wants_sendfile(self, payload: Payload | None) -> bool:
        return (
            self.zero_copy
            and isinstance(payload, FileSlice)
            and payload.size >= ZERO_COPY_BYTES_MIN
        )

    async def _drain_queue(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._queue and not self.closed:
                if self._paused:
                    self._drained.clear()
                    await self._drained.wait()
                    continue
                data, payload = self._queue.popleft()
                self.queued_bytes -= len(data) + (payload.size if payload is not None else 0)
                if payload is not None and self._wants_sendfile(payload):
                    assert isinstance(payload, FileSlice)
                    self.transport.write(data)
                    await loop.sendfile(
                        self.transport,
                        _FdFile(payload.fd),  # type: ignore[arg-type]
                        payload.position,
                        payload.size,
                    )
                else:
                    self.transport.write(data if payload is None else data + payload.read())
        except (ConnectionError, OSError, RuntimeError) as exc:
            log.debug("write failed: %s", exc)
            self.close()
        except Exception:
            log.exception("writing a frame failed; closing the connection")
            self.close()
        finally:
            self._busy = False

    def pause(self) -> None:
        self._paused = True

    def resume(self) -> None:
        self._paused = False
        self._drained.set()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._queue.clear()
            self.queued_bytes = 0
            self.transport.close()


class FrameHandler(Protocol):
    def on_frame(self, conn: Connection, frame: Frame) -> None: ...

    def on_connection_lost(self, conn: Connection) -> None: ...


class Connection(asyncio.Protocol):
    """One accepted connection: frames in to the handler, frames out through its writer."""

    def __init__(self, handler: FrameHandler, frame_bytes_max: int, zero_copy: bool) -> None:
        self.handler = handler
        self.decoder = FrameDecoder(frame_bytes_max)
        self.zero_copy = zero_copy
        self.writer: FrameWriter | None = None
        self.peer_name = ""
        self.open = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = typing.cast(asyncio.Transport, transport)
        tune_socket(transport)
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH_BYTES)
        self.writer = FrameWriter(transport, self.zero_copy)
        self.peer_name = str(transport.get_extra_info("peername"))
        self.open = True

    def data_received(self, data: bytes) -> None:
        try:
            self.decoder.receive_data(data)
            while self.open:
                frame = self.decoder.next_frame()
                if frame is None:
                    break
                self.handler.on_frame(self, frame)
        except InvalidRequest as exc:
            log.warning("closing connection from %s: %s", self.peer_name, exc)
            self.close()

    def pause_writing(self) -> None:
        if self.writer is not None:
            self.writer.pause()
            self.writer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.writer is not None:
            self.writer.resume()
            if self.open:
                self.writer.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        if self.writer is not None:
            self.writer.closed = True
        self.handler.on_connection_lost(self)

    def close(self) -> None:
        self.open = False
        if self.writer is not None:
            self.writer.close()

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


class PeerLink:
    """An outbound connection to one peer for one-way replication messages.

    Messages sent while the link is down are dropped: the protocol above retries on its own
    timers, and queueing for a dead peer would only hold memory. The link redials with backoff.
    """

    RECONNECT_DELAY_MIN_S = 0.05
    RECONNECT_DELAY_MAX_S = 1.0

    def __init__(
        self,
        peer_id: int,
        address: tuple[str, int],
        zero_copy: bool,
        on_frame: Callable[[Frame], None] | None = None,
    ) -> None:
        self.peer_id = peer_id
        self.address = address
        self.zero_copy = zero_copy
        self.writer: FrameWriter | None = None
        self._connecting = False
        self._delay_s = self.RECONNECT_DELAY_MIN_S
        self._closed = False
        self._task: asyncio.Task[None] | None = None
        self.dropped_messages = 0
        self.sent_messages = 0

    @property
    def connected(self) -> bool:
        return self.writer is not None and not self.writer.closed

    def send(self, api: int, header: dict[str, Any], payload: Payload | bytes | None) -> None:
        if not self.connected:
            self.dropped_messages += 1
            self._ensure_connecting()
            return
        assert self.writer is not None
        if self.writer.queued_bytes > PEER_QUEUE_BYTES_MAX:
            self.dropped_messages += 1
            return
        self.sent_messages += 1
        self.writer.write(Kind.MESSAGE, api, 0, header, payload)

    def _ensure_connecting(self) -> None:
        if self._connecting or self._closed:
            return
        self._connecting = True
        self._task = asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not self._closed:
                try:
                    _transport, _protocol = await loop.create_connection(
                        lambda: _OutboundProtocol(self), *self.address
                    )
                    self._delay_s = self.RECONNECT_DELAY_MIN_S
                    return
                except OSError:
                    await asyncio.sleep(self._delay_s)
                    self._delay_s = min(self._delay_s * 2, self.RECONNECT_DELAY_MAX_S)
        finally:
            self._connecting = False

    def _attach(self, transport: asyncio.Transport) -> None:
        tune_socket(transport)
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH_BYTES)
        self.writer = FrameWriter(transport, self.zero_copy)

    def _detach(self) -> None:
        if self.writer is not None:
            self.writer.closed = True
        self.writer = None

    def close(self) -> None:
        self._closed = True
        if self.writer is not None:
            self.writer.close()
        if self._task is not None:
            self._task.cancel()


class _OutboundProtocol(asyncio.Protocol):
    def __init__(self, link: PeerLink) -> None:
        self.link = link

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = typing.cast(asyncio.Transport, transport)
        self.link._attach(transport)

    def data_received(self, data: bytes) -> None:
        pass  # peers answer on their own links

    def pause_writing(self) -> None:
        if self.link.writer is not None:
            self.link.writer.pause()

    def resume_writing(self) -> None:
        if self.link.writer is not None:
            self.link.writer.resume()

    def connection_lost(self, exc: Exception | None) -> None:
        self.link._detach()


SOCKET_BUFFER_BYTES = 4 * 1024 * 1024


def tune_socket(transport: asyncio.BaseTransport) -> None:
    """No Nagle delay, and buffers big enough for a whole replication fetch answer: with the
    default autotuned buffers a multi-megabyte answer trickled out behind delayed ACKs."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
