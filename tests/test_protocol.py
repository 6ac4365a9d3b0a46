"""Framing and typed messages, fed whole and one byte at a time, and fuzzed."""

from __future__ import annotations

import dataclasses
import itertools
import json
import struct
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.errors import InvalidRequest, NotLeader, OffsetOutOfRange, from_wire
from tidelog.protocol import api
from tidelog.protocol.framing import (
    FRAME_BYTES_MAX_DEFAULT,
    PREFIX,
    Frame,
    FrameDecoder,
    FrameReader,
    Kind,
    RemoteProtocolError,
    encode_frame,
)
from tidelog.protocol.replication_codec import decode_message, encode_message
from tidelog.replication.messages import (
    BeginEpoch,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    VoteRequest,
    VoteResponse,
)
from tidelog.storage.segment import BytesSlice

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)
frames = st.builds(
    Frame,
    kind=st.sampled_from(list(Kind)),
    api=st.integers(0, 65535),
    correlation_id=st.integers(0, 2**32 - 1),
    header=st.dictionaries(st.text(max_size=10), json_values, max_size=5),
    payload=st.binary(max_size=300),
)


def decode_all(decoder: FrameDecoder, chunks: list[bytes]) -> list[Frame]:
    out = []
    for chunk in chunks:
        decoder.receive_data(chunk)
        while (frame := decoder.next_frame()) is not None:
            out.append(frame)
    return out


def read_all(reader: FrameReader, chunks: list[bytes]) -> list[Frame]:
    """As a BufferedProtocol's transport feeds it: each chunk into the buffers the reader
    hands out, as much as each takes, frames taken after every read."""
    out = []
    for chunk in chunks:
        view = memoryview(chunk)
        while view:
            buffer = reader.get_buffer(-1)
            assert len(buffer) > 0
            n = min(len(buffer), len(view))
            buffer[:n] = view[:n]
            view = view[n:]
            reader.buffer_updated(n)
            while (frame := reader.next_frame()) is not None:
                out.append(frame)
    return out


Decode = Callable[[list[bytes], int], list[Frame]]
DECODERS: dict[str, Decode] = {
    "FrameDecoder": lambda chunks, limit: decode_all(FrameDecoder(limit), chunks),
    "FrameReader": lambda chunks, limit: read_all(FrameReader(limit), chunks),
}


@pytest.mark.parametrize("decoder", DECODERS)
@given(items=st.lists(frames, min_size=1, max_size=5))
def test_frames_whole_and_one_byte_at_a_time(decoder: str, items: list[Frame]) -> None:
    decode = DECODERS[decoder]
    blob = b"".join(encode_frame(f) for f in items)
    assert decode([blob], FRAME_BYTES_MAX_DEFAULT) == items
    assert decode([blob[i : i + 1] for i in range(len(blob))], FRAME_BYTES_MAX_DEFAULT) == items


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.sampled_from([0, 10, 65_535, 65_536, 300_000, 1_200_000]), max_size=6),
    cuts=st.lists(st.integers(1, 400_000), min_size=1, max_size=30),
    header_bytes=st.sampled_from([2, 300_000]),
)
def test_the_reader_takes_large_payloads_and_headers_in_any_pieces(
    sizes: list[int], cuts: list[int], header_bytes: int
) -> None:
    """Payloads large enough to get a buffer of their own, headers larger than the read
    buffer, frames of both kinds in one read: the reader gives the frames that were sent."""
    items = [
        Frame(Kind.RESPONSE, 1, i, {"h": "x" * (header_bytes - 8)}, bytes([i % 251]) * size)
        for i, size in enumerate(sizes)
    ]
    blob = b"".join(encode_frame(f) for f in items)
    chunks, at = [], 0
    for i in itertools.count():
        if at >= len(blob):
            break
        chunks.append(blob[at : at + cuts[i % len(cuts)]])
        at += cuts[i % len(cuts)]
    assert read_all(FrameReader(), chunks) == items


@pytest.mark.parametrize("decoder", DECODERS)
def test_limits_close_the_connection(decoder: str) -> None:
    decode = DECODERS[decoder]
    with pytest.raises(RemoteProtocolError):
        decode([struct.pack(">I", 5000)], 1000)
    with pytest.raises(RemoteProtocolError):
        decode([PREFIX.pack(20, 0, 1, 1, 500) + b"x" * 9], FRAME_BYTES_MAX_DEFAULT)
    with pytest.raises(RemoteProtocolError, match="object"):
        decode([PREFIX.pack(11 + 4, 0, 1, 1, 4) + b"[1] "], FRAME_BYTES_MAX_DEFAULT)
    with pytest.raises(RemoteProtocolError, match="kind"):
        decode([PREFIX.pack(11 + 2, 7, 1, 1, 2) + b"{}"], FRAME_BYTES_MAX_DEFAULT)
    for closed in (FrameDecoder(frame_bytes_max=1000), FrameReader(frame_bytes_max=1000)):
        with pytest.raises(RemoteProtocolError):
            if isinstance(closed, FrameDecoder):
                decode_all(closed, [struct.pack(">I", 5000)])
            else:
                read_all(closed, [struct.pack(">I", 5000)])
        assert closed.closed


@pytest.mark.parametrize("decoder", DECODERS)
@settings(max_examples=3000)
@given(blob=st.binary(max_size=200))
def test_fuzz_frame_decoder(decoder: str, blob: bytes) -> None:
    try:
        DECODERS[decoder]([blob], 4096)
    except RemoteProtocolError:
        pass


@settings(max_examples=1000)
@given(
    st.sampled_from(sorted(api.REQUEST_TYPES.items())),
    st.dictionaries(st.text(max_size=12), json_values, max_size=6),
)
def test_fuzz_request_decoding(entry: tuple[api.ApiKey, type], header: dict) -> None:
    _, cls = entry
    try:
        req = api.decode(cls, header)
    except InvalidRequest:
        return
    assert dataclasses.is_dataclass(req)


def test_request_decoding_checks_types() -> None:
    req = api.decode(api.ProduceRequest, {"topic": "t", "partition": 1, "acks": -1})
    assert req == api.ProduceRequest("t", 1, -1)
    with pytest.raises(InvalidRequest, match="partition"):
        api.decode(api.ProduceRequest, {"topic": "t", "partition": "1"})
    with pytest.raises(InvalidRequest, match="partition"):
        api.decode(api.ProduceRequest, {"topic": "t", "partition": True})
    with pytest.raises(InvalidRequest, match="topic"):
        api.decode(api.ProduceRequest, {"partition": 0})
    with pytest.raises(InvalidRequest):
        api.decode(api.CreateTopicRequest, {"name": "t", "configs": {"a": 1}})
    assert api.decode(api.MetadataRequest, {"topics": None}).topics is None
    assert api.decode(api.MetadataRequest, {"topics": ["a"], "extra": 1}).topics == ["a"]


def test_errors_survive_the_wire() -> None:
    err = from_wire(json.loads(json.dumps(NotLeader("no", leader_hint=3).to_wire())))
    assert isinstance(err, NotLeader) and err.leader_hint == 3 and err.retriable
    err2 = from_wire(OffsetOutOfRange("x", log_start=5, high_watermark=9).to_wire())
    assert isinstance(err2, OffsetOutOfRange) and (err2.log_start, err2.high_watermark) == (5, 9)
    assert type(from_wire({"code": 9999, "message": "?"})).__name__ == "TidelogError"


@pytest.mark.parametrize(
    "message",
    [
        VoteRequest(3, 1, 2, 100, True),
        VoteResponse(3, 2, False, False, 1),
        BeginEpoch(4, 2),
        FetchRequest(4, 3, 10, 2, 9, 1024),
        FetchResponse(4, 2, 10, 12, 0, records=BytesSlice(b"batches", 10)),
        FetchResponse(4, 2, 10, 12, 0, diverging_epoch=3, diverging_end_offset=8),
        FetchResponse(4, 2, 10, 12, 11, snapshot_required=True),
        FetchResponse(5, -1, 10, 12, 0, error="FencedEpoch"),
        FetchSnapshotRequest(3, 2, -1, 0, 1024),
        FetchSnapshotResponse(3, 1, 240, 5000, 1024, records=BytesSlice(b"chunk", 1024)),
        FetchSnapshotResponse(3, 1, -1, 0, 0, error="NoSnapshot"),
    ],
)
def test_replication_messages_round_trip(message: object) -> None:
    header, records = encode_message("t/0", message)  # type: ignore[arg-type]
    payload = records.read() if records is not None else b""
    frame = Frame(Kind.MESSAGE, api.ApiKey.REPLICATION, 0, json.loads(json.dumps(header)), payload)
    decoded = decode_all(FrameDecoder(), [encode_frame(frame)])[0]
    group, got = decode_message(decoded.header, decoded.payload)
    assert group == "t/0"
    assert got == message


def test_bad_replication_messages_are_named_errors() -> None:
    with pytest.raises(InvalidRequest):
        decode_message({"group": "t/0", "type": "Nope"}, b"")
    with pytest.raises(InvalidRequest):
        decode_message({"group": "t/0", "type": "FetchRequest", "epoch": "x"}, b"")
