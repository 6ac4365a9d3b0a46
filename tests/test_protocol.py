"""Framing and typed messages, fed whole and one byte at a time, and fuzzed."""

from __future__ import annotations

import dataclasses
import json
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.errors import InvalidRequest, NotLeader, OffsetOutOfRange, from_wire
from tidelog.protocol import api
from tidelog.protocol.api import ApiKey
from tidelog.protocol.framing import (
    PREFIX,
    Frame,
    FrameDecoder,
    Kind,
    RemoteProtocolError,
    encode_frame,
)
from tidelog.protocol.peer_batch import PeerMessage, decode_peer_batch, encode_peer_batch
from tidelog.protocol.replication_codec import decode_message, encode_message
from tidelog.record.slices import BytesSlice
from tidelog.replication.messages import (
    BeginEpoch,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    VoteRequest,
    VoteResponse,
)

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


@given(st.lists(frames, min_size=1, max_size=5))
def test_frames_whole_and_one_byte_at_a_time(items: list[Frame]) -> None:
    blob = b"".join(encode_frame(f) for f in items)
    assert decode_all(FrameDecoder(), [blob]) == items
    assert decode_all(FrameDecoder(), [blob[i : i + 1] for i in range(len(blob))]) == items


def test_limits_close_the_connection() -> None:
    decoder = FrameDecoder(frame_bytes_max=1000)
    decoder.receive_data(struct.pack(">I", 5000))
    with pytest.raises(RemoteProtocolError):
        decoder.next_frame()
    assert decoder.closed
    decoder = FrameDecoder()
    decoder.receive_data(PREFIX.pack(20, 0, 1, 1, 500) + b"x" * 9)
    with pytest.raises(RemoteProtocolError):
        decoder.next_frame()
    decoder = FrameDecoder()
    decoder.receive_data(PREFIX.pack(11 + 4, 0, 1, 1, 4) + b"[1] ")
    with pytest.raises(RemoteProtocolError, match="object"):
        decoder.next_frame()
    decoder = FrameDecoder()
    decoder.receive_data(PREFIX.pack(11 + 2, 7, 1, 1, 2) + b"{}")
    with pytest.raises(RemoteProtocolError, match="kind"):
        decoder.next_frame()


@settings(max_examples=3000)
@given(st.binary(max_size=200))
def test_fuzz_frame_decoder(blob: bytes) -> None:
    decoder = FrameDecoder(frame_bytes_max=4096)
    try:
        decode_all(decoder, [blob])
    except RemoteProtocolError:
        pass


@settings(max_examples=1000)
@given(
    st.sampled_from(sorted(api.REQUEST_TYPES.items())),
    st.dictionaries(st.text(max_size=12), json_values, max_size=6),
)
@pytest.mark.slow
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


peer_message_st = st.tuples(
    st.integers(min_value=0, max_value=ApiKey.PEER_BATCH - 1),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    st.binary(max_size=64),
)


@given(st.lists(peer_message_st, min_size=1, max_size=8))
def test_a_peer_batch_decodes_to_the_messages_it_holds(messages: list[PeerMessage]) -> None:
    header, payload = encode_peer_batch(messages)
    assert decode_peer_batch(json.loads(json.dumps(header)), payload) == messages


@given(st.lists(st.lists(st.integers(-5, 200) | st.none() | st.text(max_size=3), max_size=4)))
def test_a_malformed_peer_batch_is_refused_by_name(index: list[Any]) -> None:
    """Sizes past the payload, a batch inside a batch, a payload longer than its messages, and
    entries of the wrong shape: InvalidRequest, nothing else."""
    for payload in (b"", b"x" * 64):
        try:
            decode_peer_batch({"messages": index}, payload)
        except InvalidRequest:
            pass
    with pytest.raises(InvalidRequest, match="batch entry"):
        decode_peer_batch({"messages": [[ApiKey.PEER_BATCH, {}, 0]]}, b"")
    with pytest.raises(InvalidRequest, match="longer"):
        decode_peer_batch({"messages": [[101, {}, 1]]}, b"ab")
