"""Writing frames to a socket: in order, with large file payloads sent by sendfile.

Listeners (node/listeners/) and the peer channel's outbound links write through a FrameWriter,
so TLS can be swapped in later without touching them: a TLS transport simply reports
`zero_copy = False` and payloads are copied instead of sendfile'd.
"""

from __future__ import annotations

import asyncio
import asyncio.selector_events
import collections
import logging
import os
import socket
from collections.abc import Callable
from typing import Any, Protocol

from tidelog.invariant import InvariantBroken
from tidelog.protocol.api import ApiKey
from tidelog.protocol.framing import Kind, encode_prefix
from tidelog.storage.segment import FileSlice

log = logging.getLogger(__name__)

# How a node reaches another over the peer channel: (node, api key, header, payload).
PeerSender = Callable[[int, ApiKey, dict[str, Any], Any], None]

ZERO_COPY_BYTES_MIN = 64 * 1024  # below this a copy is cheaper than sendfile's bookkeeping
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
                    if not isinstance(payload, FileSlice):
                        raise InvariantBroken("isinstance(payload, FileSlice)")
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
            self._drained.set()  # a drain task waiting for a resume ends instead
            self.transport.close()


SOCKET_BUFFER_BYTES = 4 * 1024 * 1024


def tune_socket(transport: asyncio.BaseTransport, receive_buffer: bool = True) -> None:
    """No Nagle delay, and buffers big enough for a whole replication fetch answer: with the
    default autotuned buffers a multi-megabyte answer trickled out behind delayed ACKs. Client
    connections keep the kernel's autotuned receive buffer: a fixed large one per connection is
    kernel memory no budget of ours bounds."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
    if receive_buffer:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
