"""Wire framing, sans-IO (h11's shape): bytes in, frames out; frames in, bytes out.

    offset size field
    0      4    frame_size     bytes after this field
    4      1    kind           0 request, 1 response, 2 one-way message
    5      2    api            ApiKey
    7      4    correlation_id
    11     4    header_size
    15     ...  header         UTF-8 JSON object (the typed fields of the message)
    ...    ...  payload        raw bytes: record batches exactly as stored, never re-encoded

The payload is last so a node can send it straight from a segment file (sendfile) after writing
the 15-byte prefix and the header. Limits are constructor arguments; a frame over the limit or a
header that is not a JSON object is the peer's fault (RemoteProtocolError) and the connection
is closed.
"""

from __future__ import annotations

import collections
import enum
import json
import struct
from dataclasses import dataclass
from typing import Any

from tidelog.errors import InvalidRequest

PREFIX = struct.Struct(">IBHII")
PREFIX_SIZE = PREFIX.size  # 15
_AFTER_SIZE = PREFIX_SIZE - 4
FRAME_BYTES_MAX_DEFAULT = 64 * 1024 * 1024
HEADER_BYTES_MAX_DEFAULT = 1024 * 1024


class Kind(enum.IntEnum):
    REQUEST = 0
    RESPONSE = 1
    MESSAGE = 2


class RemoteProtocolError(InvalidRequest):
    """The peer broke the framing; the only safe answer is to close the connection."""


class LocalProtocolError(InvalidRequest):
    """We were asked to send something the protocol cannot carry."""


@dataclass(frozen=True, slots=True)
class Frame:
    kind: Kind
    api: int
    correlation_id: int
    header: dict[str, Any]
    payload: bytes = b""


def encode_prefix(
    kind: Kind, api: int, correlation_id: int, header: dict[str, Any], payload_size: int
) -> bytes:
    """Prefix + header; the caller sends payload_size bytes of payload right after."""
    body = json.dumps(header, separators=(",", ":")).encode()
    frame_size = _AFTER_SIZE + len(body) + payload_size
    if frame_size > 0xFFFFFFFF or not 0 <= correlation_id <= 0xFFFFFFFF:
        raise LocalProtocolError("frame too large or correlation id out of range")
    return PREFIX.pack(frame_size, kind, api, correlation_id, len(body)) + body


def encode_frame(frame: Frame) -> bytes:
    return (
        encode_prefix(frame.kind, frame.api, frame.correlation_id, frame.header, len(frame.payload))
        + frame.payload
    )


class FrameDecoder:
    """Feed bytes with receive_data(); take frames with next_frame() until it returns None.

    Received chunks are kept as they came and a frame is cut out of them once it is whole, so
    its payload is copied once (not once per chunk, as a growing buffer would).
    """

    def __init__(
        self,
        frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT,
        header_bytes_max: int = HEADER_BYTES_MAX_DEFAULT,
    ) -> None:
        self.frame_bytes_max = frame_bytes_max
        self.header_bytes_max = header_bytes_max
        self._chunks: collections.deque[bytes] = collections.deque()
        self._head = 0  # bytes of the first chunk already consumed
        self._available = 0
        self.closed = False

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        if self.closed:
            raise LocalProtocolError("decoder closed after a protocol error")
        if data:
            self._chunks.append(bytes(data))
            self._available += len(data)

    @property
    def pending_bytes(self) -> int:
        return self._available

    def pending_frame_size(self) -> int | None:
        """The whole size (prefix included) the frame being received declares, once its
        4-byte size is in (checked against the limit before anything more is buffered)."""
        if self._available < 4:
            return None
        frame_size = int.from_bytes(self._peek(4), "big")
        self._check_size(frame_size)
        return 4 + frame_size

    def next_frame(self) -> Frame | None:
        try:
            return self._next_frame()
        except RemoteProtocolError:
            self.closed = True
            raise

    def _peek(self, n: int) -> bytes:
        first = self._chunks[0]
        if len(first) - self._head >= n:
            return first[self._head : self._head + n]
        out = bytearray()
        for i, chunk in enumerate(self._chunks):
            out += chunk[self._head :] if i == 0 else chunk
            if len(out) >= n:
                break
        return bytes(out[:n])

    def _take(self, n: int) -> memoryview:
        first = self._chunks[0]
        if len(first) - self._head >= n:
            view = memoryview(first)[self._head : self._head + n]
            self._head += n
            if self._head == len(first):
                self._chunks.popleft()
                self._head = 0
        else:
            out = bytearray()
            while len(out) < n:
                chunk = self._chunks.popleft()
                piece = chunk[self._head :] if self._head else chunk
                self._head = 0
                need = n - len(out)
                if len(piece) > need:
                    out += piece[:need]
                    self._chunks.appendleft(chunk)
                    self._head = len(chunk) - (len(piece) - need)
                else:
                    out += piece
            view = memoryview(bytes(out))
        self._available -= n
        return view

    def _take_bytes(self, n: int) -> bytes:
        """The next n bytes as one bytes object, copied once (not at all when a chunk is
        exactly them): a large payload arrives in many chunks."""
        if n == 0:
            return b""
        first = self._chunks[0]
        if self._head == 0 and len(first) == n:
            self._chunks.popleft()
            self._available -= n
            return first
        pieces: list[bytes | memoryview] = []
        need = n
        while need:
            chunk = self._chunks[0]
            left = len(chunk) - self._head
            if left <= need:
                pieces.append(memoryview(chunk)[self._head :] if self._head else chunk)
                self._chunks.popleft()
                self._head = 0
                need -= left
            else:
                pieces.append(memoryview(chunk)[self._head : self._head + need])
                self._head += need
                need = 0
        self._available -= n
        return b"".join(pieces)

    def _next_frame(self) -> Frame | None:
        if self._available < PREFIX_SIZE:
            if self._available >= 4:
                self._check_size(int.from_bytes(self._peek(4), "big"))
            return None
        frame_size, kind, api, correlation_id, header_size = PREFIX.unpack(self._peek(PREFIX_SIZE))
        self._check_size(frame_size)
        if kind not in (0, 1, 2):
            raise RemoteProtocolError(f"unknown frame kind {kind}")
        if header_size > frame_size - _AFTER_SIZE or header_size > self.header_bytes_max:
            raise RemoteProtocolError(f"header size {header_size} does not fit frame {frame_size}")
        total = 4 + frame_size
        if self._available < total:
            return None
        raw_header = self._take(PREFIX_SIZE + header_size)[PREFIX_SIZE:]
        payload = self._take_bytes(total - PREFIX_SIZE - header_size)
        try:
            header = json.loads(bytes(raw_header)) if header_size else {}
        except (UnicodeDecodeError, ValueError) as exc:
            raise RemoteProtocolError(f"frame header is not JSON: {exc}") from exc
        except RecursionError:
            # Python's parser recurses per nesting level: a deep header is an attack, not JSON.
            raise RemoteProtocolError("frame header is nested too deeply") from None
        if not isinstance(header, dict):
            raise RemoteProtocolError("frame header is not a JSON object")
        return Frame(Kind(kind), api, correlation_id, header, payload)

    def _check_size(self, frame_size: int) -> None:
        if frame_size < _AFTER_SIZE or frame_size > self.frame_bytes_max:
            raise RemoteProtocolError(
                f"frame size {frame_size} outside [{_AFTER_SIZE}, {self.frame_bytes_max}]"
            )
