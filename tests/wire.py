"""Speaking tidelog's wire protocol by hand, as a hostile or buggy client (or a peer) would:
blocking sockets, whole frames, no client library in the way; and the Kafka protocol the same
way (kafka_ask, kafka_call), one request at a time to a node's Kafka listener."""

from __future__ import annotations

import dataclasses
import socket
import ssl
import struct
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from helpers import poll
from tidelog.kafka.codec import SUPPORTED_VERSIONS, build
from tidelog.protocol import api
from tidelog.protocol.api import ApiKey
from tidelog.protocol.framing import Frame, FrameDecoder, Kind, encode_prefix
from tidelog.protocol.peer_handshake import DialerHandshake, PeerHelloResponse
from tidelog.protocol.replication_codec import encode_message
from tidelog.replication.messages import Message


class Wire:
    def __init__(self, address: tuple[str, int], timeout_s: float = 10.0) -> None:
        self.sock = socket.create_connection(address, timeout=timeout_s)
        self.decoder = FrameDecoder(256 * 1024 * 1024)
        self.next_id = 1

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(
        self, kind: Kind, key: int, header: dict[str, Any], payload: bytes = b"", cid: int = -1
    ) -> int:
        if cid < 0:
            cid, self.next_id = self.next_id, self.next_id + 1
        self.sock.sendall(encode_prefix(kind, key, cid, header, len(payload)) + payload)
        return cid

    def request(self, key: int, request: Any, payload: bytes = b"") -> Frame:
        self.send(Kind.REQUEST, key, api.encode(request), payload)
        frame = self.frame()
        assert frame is not None, "the node closed the connection"
        return frame

    def frame(self) -> Frame | None:
        """The next frame, or None once the node closed the connection."""
        while True:
            frame = self.decoder.next_frame()
            if frame is not None:
                return frame
            try:
                data = self.sock.recv(1 << 20)
            except (ConnectionResetError, TimeoutError):
                return None
            if not data:
                return None
            self.decoder.receive_data(data)

    def closed_by_node(self, within_s: float = 5.0) -> bool:
        """True if the node closes the connection (reading until EOF) within the time."""
        self.sock.settimeout(0.2)

        def closed() -> bool:
            try:
                data = self.sock.recv(1 << 16)
            except TimeoutError:
                return False
            except (ConnectionResetError, BrokenPipeError):
                return True
            return not data

        return bool(poll(closed, within_s, every_s=0))

    def close(self) -> None:
        self.sock.close()


def peer_session(address: tuple[str, int], secret: bytes, as_node: int, to_node: int) -> Wire:
    """An authenticated peer-channel connection, as node as_node (it must know the secret)."""
    wire = Wire(address)
    dialer = DialerHandshake(secret, as_node, to_node)
    hello = wire.request(ApiKey.PEER_HELLO, dialer.hello())
    error = api.error_of(hello.header)
    if error is not None:
        raise error
    auth = wire.request(
        ApiKey.PEER_AUTH, dialer.answer(api.decode(PeerHelloResponse, hello.header))
    )
    error = api.error_of(auth.header)
    if error is not None:
        raise error
    return wire


def replication_frame(
    group: str, message: Message, records: bytes = b""
) -> tuple[dict[str, Any], bytes]:
    header, _ = encode_message(group, message)
    if records:
        header["records_first_offset"] = 0
    return header, records


# -- the Kafka protocol --------------------------------------------------------------------------


def kafka_ask(sock: socket.socket, api_key: int, values: dict[str, Any]) -> dict[str, Any] | None:
    """One Kafka request at the highest version tidelog serves, on a connected socket (plain or
    TLS); its answer as a dict, or None when the node closed the connection."""
    version = SUPPORTED_VERSIONS[api_key][1]
    schema = load_request_schema(api_key, version)
    head = schema.__header_schema__(
        request_api_key=api_key, request_api_version=version, correlation_id=7, client_id="t"
    )
    out = bytearray()

    class Sink:
        def write(self, data: bytes) -> None:
            out.extend(data)

    entity_writer(schema.__header_schema__)(Sink(), head)
    entity_writer(schema)(Sink(), build(schema, values))
    data = b""
    try:
        sock.sendall(struct.pack(">i", len(out)) + out)
        while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
            chunk = sock.recv(65536)
            if not chunk:
                return None
            data += chunk
    except (ConnectionError, ssl.SSLError):
        return None
    response = load_response_schema(api_key, version)
    view = memoryview(data)[4:]
    _, used = entity_reader(response.__header_schema__)(view, 0)
    body, _ = entity_reader(response)(view[used:], 0)
    answer: dict[str, Any] = dataclasses.asdict(body)
    return answer


def kafka_call(
    address: tuple[str, int], api_key: int, values: dict[str, Any], timeout_s: float = 10.0
) -> dict[str, Any]:
    """One Kafka request on a connection of its own (no TLS) to the listener at address."""
    with socket.create_connection(address, timeout=timeout_s) as sock:
        answer = kafka_ask(sock, api_key, values)
    assert answer is not None, f"{address} closed the connection"
    return answer
