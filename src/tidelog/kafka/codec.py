"""The Kafka wire protocol, sans IO: size-prefixed frames in, typed requests out, typed
responses back to bytes.

Message classes come from `kio`, which generates one dataclass per message version from Kafka's
own JSON schemas; nothing here hand-codes a message layout. Handlers build responses as plain
mappings holding the fields of every version they serve, and `build` fits a mapping to the
version the client asked for: fields that version lacks are dropped, fields it needs and the
mapping lacks get their empty value, integers become kio's enums and durations.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import io
import struct
import types
import typing
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i32Timedelta, i64Timedelta

from tidelog.errors import InvalidRequest, UnsupportedApi
from tidelog.kafka.bounds import check_request
from tidelog.protocol.framing import FrameDecoder

# api key -> (lowest, highest) version served. Upper bounds stop before versions whose meaning
# tidelog does not implement: Fetch 17 carries KIP-853's replica directory ids; OffsetCommit 9+
# and OffsetFetch 10+ use KIP-848's group protocol or topic ids; ListOffsets 7+ asks for the
# max-timestamp spec; Produce 10+ wants leader endpoints on errors. Clients negotiate down to
# these, as with any Kafka broker. Fetch 13-16 name topics by the ids Metadata gives.
SUPPORTED_VERSIONS: dict[int, tuple[int, int]] = {
    0: (3, 9),  # Produce
    1: (4, 16),  # Fetch (13+: topics by id)
    2: (1, 6),  # ListOffsets
    3: (0, 12),  # Metadata
    8: (2, 8),  # OffsetCommit
    9: (1, 9),  # OffsetFetch (8+: several groups at once)
    10: (0, 4),  # FindCoordinator
    11: (0, 9),  # JoinGroup
    12: (0, 4),  # Heartbeat
    13: (0, 5),  # LeaveGroup
    14: (0, 5),  # SyncGroup
    15: (0, 5),  # DescribeGroups
    16: (0, 4),  # ListGroups
    17: (1, 1),  # SaslHandshake (v0's unframed tokens are not served)
    18: (0, 3),  # ApiVersions
    19: (2, 7),  # CreateTopics
    20: (1, 6),  # DeleteTopics
    21: (0, 2),  # DeleteRecords
    22: (0, 4),  # InitProducerId
    23: (2, 4),  # OffsetForLeaderEpoch (KIP-320: consumers validate positions after a new leader)
    # Transactions (kafka/transactions.py). AddPartitionsToTxn v4+ is KIP-890's batched,
    # broker-to-broker form (tidelog's partition leaders verify against the metadata log
    # instead); EndTxn, AddOffsetsToTxn and TxnOffsetCommit v5 are KIP-890 part 2, an epoch
    # bump per transaction that needs Produce 12.
    24: (0, 3),  # AddPartitionsToTxn
    25: (0, 4),  # AddOffsetsToTxn
    26: (0, 4),  # EndTxn
    # WriteTxnMarkers, as KIP-664's abort sends it (node/ops/producers.py: only what agrees
    # with the coordinator). v0 is the form before flexible versions, which Kafka 4 dropped
    # (KIP-896) and kio's schemas no longer have: every admin client with KIP-664 speaks v1.
    # v2 carries KIP-890's transaction version 2.
    27: (1, 1),
    28: (0, 4),  # TxnOffsetCommit (3+: KIP-447's group metadata)
    32: (1, 4),  # DescribeConfigs
    33: (0, 2),  # AlterConfigs (kafkajs has only this one)
    36: (0, 2),  # SaslAuthenticate
    37: (0, 3),  # CreatePartitions
    42: (0, 2),  # DeleteGroups
    44: (0, 1),  # IncrementalAlterConfigs
    60: (0, 1),  # DescribeCluster
    61: (0, 0),  # DescribeProducers (KIP-664)
    65: (0, 0),  # DescribeTransactions (KIP-664)
    66: (0, 1),  # ListTransactions (2 filters by a pattern of ids: not served)
}
API_VERSIONS = 18
_HEAD = struct.Struct(">hhi")  # api key, api version, correlation id
_SIZE = struct.Struct(">i")


class UnsupportedVersion(UnsupportedApi):
    """A request for an api key or version this listener does not serve. ApiVersions is
    answered (with Kafka's UNSUPPORTED_VERSION and what is served, so the client can pick);
    anything else closes the connection, as a Kafka broker does."""

    def __init__(self, message: str, api_key: int, api_version: int, correlation_id: int) -> None:
        super().__init__(message, api=api_key, version=api_version)
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


@dataclass(frozen=True, slots=True)
class KafkaRequest:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str
    body: Any  # the kio request dataclass of this api and version


class KafkaFrameDecoder(FrameDecoder):
    """Feed bytes with receive_data(); take frames (the bytes after each 4-byte size) with
    next_frame() until it returns None. The size is checked before the frame is buffered.
    (tidelog's frame decoder, whose chunk buffer it reuses, with Kafka's simpler frame.)"""

    def pending_frame_size(self) -> int | None:
        if self._available < 4:
            return None
        return 4 + self._size()

    def _size(self) -> int:
        (size,) = _SIZE.unpack(self._peek(4))
        if size < _HEAD.size or size > self.frame_bytes_max:
            self.closed = True
            raise InvalidRequest(f"Kafka frame size {size} outside [8, {self.frame_bytes_max}]")
        return int(size)

    def next_frame(self) -> bytes | None:  # type: ignore[override]
        if self._available < 4:
            return None
        size = self._size()
        if self._available < 4 + size:
            return None
        self._take(4)
        return self._take_bytes(size)


def _schema(kind: str, api_key: int, version: int) -> Any:
    cache = _REQUESTS if kind == "request" else _RESPONSES
    found = cache.get((api_key, version))
    if found is None:
        load = load_request_schema if kind == "request" else load_response_schema
        schema = load(api_key, version)
        found = cache[(api_key, version)] = (
            schema,
            entity_reader(schema.__header_schema__) if kind == "request" else None,
            entity_reader(schema) if kind == "request" else entity_writer(schema),
            entity_writer(schema.__header_schema__) if kind == "response" else None,
        )
    return found


_REQUESTS: dict[tuple[int, int], Any] = {}
_RESPONSES: dict[tuple[int, int], Any] = {}


def parse_request(frame: bytes) -> KafkaRequest:
    """A whole request frame (after its size) as a typed request; UnsupportedVersion for an api
    or version not served, InvalidRequest for bytes that do not parse as it."""
    if len(frame) < _HEAD.size:
        raise InvalidRequest(
            f"a Kafka request needs {_HEAD.size} bytes, the frame has {len(frame)}"
        )
    api_key, api_version, correlation_id = _HEAD.unpack_from(frame, 0)
    served = SUPPORTED_VERSIONS.get(api_key)
    if served is None or not served[0] <= api_version <= served[1]:
        raise UnsupportedVersion(
            f"api {api_key} version {api_version} is not served"
            + (f" (versions {served[0]}..{served[1]} are)" if served else ""),
            api_key,
            api_version,
            correlation_id,
        )
    schema, read_header, read_body, _ = _schema("request", api_key, api_version)
    view = memoryview(frame)
    check_request(schema, view)  # kio's native readers trust declared lengths: bounds.py
    try:
        header, used = read_header(view, 0)
        body, _ = read_body(view[used:], 0)
    except Exception as exc:  # kio raises what its readers meet: all of it is bad input
        raise InvalidRequest(
            f"api {api_key} v{api_version}: the request does not parse: {type(exc).__name__}: {exc}"
        ) from None
    # Bytes after the request are ignored, as Kafka's brokers do: librdkafka 2.16 sends
    # three after some Metadata v12 requests, and Kafka answers them.
    return KafkaRequest(api_key, api_version, correlation_id, header.client_id or "", body)


def encode_response(
    api_key: int, api_version: int, correlation_id: int, values: Mapping[str, Any]
) -> bytes:
    """A response frame (size included) from a mapping of its fields."""
    schema, _, write_body, write_header = _schema("response", api_key, api_version)
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    write_header(out, schema.__header_schema__(correlation_id=correlation_id))
    write_body(out, build(schema, values))
    data = out.getbuffer()
    _SIZE.pack_into(data, 0, len(data) - 4)
    return bytes(data)


def error_answer(api_key: int, api_version: int, correlation_id: int, code: int) -> bytes | None:
    """A response carrying only a top-level error code, for the APIs whose responses have one
    (JoinGroup, SyncGroup, InitProducerId, ...); None for those that report errors per topic or
    partition."""
    schema = _schema("response", api_key, api_version)[0]
    if "error_code" not in {f.name for f in dataclasses.fields(schema)}:
        return None
    return encode_response(api_key, api_version, correlation_id, {"error_code": code})


def unsupported_api_versions(correlation_id: int) -> bytes:
    """ApiVersions v0 with UNSUPPORTED_VERSION and what is served: Kafka's answer to an
    ApiVersions version it does not know, so that newer clients can retry with an older one."""
    return encode_response(
        API_VERSIONS, 0, correlation_id, {"error_code": 35, "api_keys": api_version_list()}
    )


def api_version_list() -> list[dict[str, int]]:
    return [
        {"api_key": k, "min_version": lo, "max_version": hi}
        for k, (lo, hi) in sorted(SUPPORTED_VERSIONS.items())
    ]


# -- fitting plain mappings to kio's dataclasses ------------------------------------------------

Converter = Callable[[Any], Any]
_PLANS: dict[type[Any], list[tuple[str, Converter, Callable[[], Any] | None]]] = {}


def build(cls: type[Any], values: Mapping[str, Any]) -> Any:
    plan = _PLANS.get(cls)
    if plan is None:
        plan = _PLANS[cls] = _plan(cls)
    kwargs: dict[str, Any] = {}
    for name, convert, empty in plan:
        if name in values:
            kwargs[name] = convert(values[name])
        elif empty is not None:
            kwargs[name] = empty()
    return cls(**kwargs)


def _plan(cls: type[Any]) -> list[tuple[str, Converter, Callable[[], Any] | None]]:
    plan = []
    for f in dataclasses.fields(cls):
        has_default = (
            f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        )
        convert, empty = _converter(f.type)
        plan.append((f.name, convert, None if has_default else empty))
    return plan


def _identity(value: Any) -> Any:
    return value


def _converter(hint: Any) -> tuple[Converter, Callable[[], Any]]:
    """How a plain value becomes one of this type, and the empty value of the type."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        inner, _ = _converter(options[0])
        return (lambda v: None if v is None else inner(v)), lambda: None
    if origin is tuple:
        item = typing.get_args(hint)[0]
        inner, _ = _converter(item)
        return (lambda v: tuple(inner(x) for x in v)), tuple
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        cls = hint
        return (lambda v: build(cls, v) if isinstance(v, Mapping) else v), lambda: build(cls, {})
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        enum_cls = hint
        return (lambda v: v if isinstance(v, enum_cls) else enum_cls(v)), lambda: enum_cls(0)
    if hint in (i32Timedelta, i64Timedelta):
        return (
            lambda v: v if isinstance(v, datetime.timedelta) else datetime.timedelta(milliseconds=v)
        ), datetime.timedelta
    if hint is uuid.UUID or (isinstance(hint, type) and issubclass(hint, uuid.UUID)):
        return _identity, lambda: uuid.UUID(int=0)
    if isinstance(hint, type) and issubclass(hint, bool):
        return _identity, lambda: False
    if isinstance(hint, type) and issubclass(hint, bytes):
        return _identity, bytes
    if isinstance(hint, type) and issubclass(hint, str):
        return _identity, str
    if isinstance(hint, type) and issubclass(hint, int | float):
        return _identity, lambda: 0
    return _identity, lambda: None


def millis(value: Any) -> int:
    """A kio duration (or an int) as milliseconds."""
    if isinstance(value, datetime.timedelta):
        return int(value / datetime.timedelta(milliseconds=1))
    return int(value)
