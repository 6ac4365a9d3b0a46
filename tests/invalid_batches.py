"""Batches with a valid CRC and invalid content, one per rule of record/validation.py: what a
buggy, old or hostile producer can send. Shared by the validation unit tests and the real-cluster
test that sends every one of them to stream, compacted and table topics."""

from __future__ import annotations

import gzip
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from tidelog.errors import (
    CorruptRecord,
    InvalidRecord,
    RecordTooLarge,
    TidelogError,
    UnsupportedCompression,
)
from tidelog.record.batch import (
    CRC_START,
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    ProducerRecord,
    build_batch,
    crc32c,
)
from tidelog.record.varint import encode_varint

# Header field offsets (RecordBatch v2).
ATTRIBUTES_AT = 21
LAST_OFFSET_DELTA_AT = 23
MAX_TIMESTAMP_AT = 35
PRODUCER_ID_AT = 43
BASE_SEQUENCE_AT = 53
RECORDS_COUNT_AT = 57


def now_ms() -> int:
    return int(time.time() * 1000)


def fix_crc(batch: bytearray) -> bytes:
    struct.pack_into(">I", batch, 17, crc32c(memoryview(batch)[CRC_START:]))
    return bytes(batch)


def with_body(batch: bytes, body: bytes) -> bytes:
    """The batch with its record section replaced (length and CRC made right)."""
    out = bytearray(batch[:HEADER_SIZE]) + body
    struct.pack_into(">i", out, 8, len(out) - LOG_OVERHEAD)
    return fix_crc(out)


def set_field(batch: bytes, at: int, fmt: str, value: int) -> bytes:
    out = bytearray(batch)
    struct.pack_into(fmt, out, at, value)
    return fix_crc(out)


def varint(value: int) -> bytes:
    out = bytearray()
    encode_varint(value, out)
    return bytes(out)


def raw_record(
    offset_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[bytes, bytes | None]] | None = None,
    ts_delta: int = 0,
) -> bytes:
    body = bytearray(b"\x00") + varint(ts_delta) + varint(offset_delta)
    body += varint(-1) if key is None else varint(len(key)) + key
    body += varint(-1) if value is None else varint(len(value)) + value
    body += varint(len(headers or []))
    for hkey, hval in headers or []:
        body += varint(len(hkey)) + hkey
        body += varint(-1) if hval is None else varint(len(hval)) + hval
    return varint(len(body)) + bytes(body)


def fields(key: bytes, value: bytes, headers: int = 0) -> bytes:
    """A record's fields up to its header count (offset delta 0, timestamp delta 0)."""
    return (
        b"\x00"
        + varint(0)
        + varint(0)
        + varint(len(key))
        + key
        + varint(len(value))
        + value
        + varint(headers)
    )


def framed(body: bytes) -> bytes:
    return varint(len(body)) + body


def good(n: int = 3, key: bytes | None = b"k", ts: int | None = None) -> bytes:
    stamp = now_ms() if ts is None else ts
    return build_batch([ProducerRecord(key, b"v%d" % i, (), stamp) for i in range(n)])


@dataclass(frozen=True)
class Invalid:
    name: str
    make: Callable[[], bytes]
    error: type[TidelogError]
    rule: str
    only_keyed: bool = False  # invalid only where keys are required (compacted, table)


def _bomb() -> bytes:
    """A gzip batch whose one record inflates past 4 x max.message.bytes (8 MiB by default)."""
    big = b"\x00" * (40 * 1024 * 1024)
    record = raw_record(0, b"k", big)
    base = good(1)
    out = bytearray(base[:HEADER_SIZE]) + gzip.compress(record, compresslevel=9)
    struct.pack_into(">i", out, 8, len(out) - LOG_OVERHEAD)
    struct.pack_into(">h", out, ATTRIBUTES_AT, 1)
    return fix_crc(out)


def _attributes(bits: int) -> Callable[[], bytes]:
    return lambda: set_field(good(), ATTRIBUTES_AT, ">h", bits)


INVALID: list[Invalid] = [
    Invalid(
        "last_offset_delta_disagrees",
        lambda: set_field(good(3), LAST_OFFSET_DELTA_AT, ">i", 5),
        InvalidRecord,
        "records_count",
    ),
    Invalid(
        "records_count_disagrees",
        lambda: set_field(good(3), RECORDS_COUNT_AT, ">i", 2),
        InvalidRecord,
        "records_count",
    ),
    Invalid(
        "offset_deltas_not_0_to_n",
        lambda: with_body(good(2), raw_record(0, b"k", b"a") + raw_record(5, b"k", b"b")),
        InvalidRecord,
        "offset_delta",
    ),
    Invalid("codec_5_does_not_exist", _attributes(5), UnsupportedCompression, "compression"),
    Invalid("codec_6_does_not_exist", _attributes(6), UnsupportedCompression, "compression"),
    Invalid("codec_7_does_not_exist", _attributes(7), UnsupportedCompression, "compression"),
    Invalid("zstd_bit_on_plain_data", _attributes(4), CorruptRecord, "compression"),
    Invalid("lz4_bit_on_plain_data", _attributes(3), CorruptRecord, "compression"),
    Invalid("snappy_bit_on_plain_data", _attributes(2), CorruptRecord, "compression"),
    Invalid("gzip_bit_on_plain_data", _attributes(1), CorruptRecord, "compression"),
    Invalid("control_bit_from_a_client", _attributes(0x20), InvalidRecord, "control"),
    Invalid(
        "transactional_bit_without_a_producer_id", _attributes(0x10), InvalidRecord, "transactional"
    ),
    Invalid("log_append_time_from_a_client", _attributes(0x08), InvalidRecord, "timestamp_type"),
    Invalid(
        "record_length_varint_corrupt",
        lambda: with_body(good(1), b"\xff\xff\xff\xff\xff\xff" + raw_record(0, b"k", b"v")[1:]),
        CorruptRecord,
        "varint",
    ),
    Invalid(
        "record_runs_past_the_batch",
        lambda: with_body(good(1), varint(200) + raw_record(0, b"k", b"v")[1:]),
        CorruptRecord,
        "record_length",
    ),
    Invalid(
        "trailing_bytes_after_the_records",
        lambda: with_body(good(1), raw_record(0, b"k", b"v") + b"\x00\x00"),
        CorruptRecord,
        "trailing_bytes",
    ),
    Invalid(
        "record_length_disagrees_with_fields",
        lambda: with_body(good(1), framed(fields(b"k", b"v") + b"\x00")),
        CorruptRecord,
        "record_end",
    ),
    Invalid(
        "header_key_not_utf8",
        lambda: with_body(good(1), raw_record(0, b"k", b"v", [(b"\xff\xfe", b"x")])),
        CorruptRecord,
        "header_key_utf8",
    ),
    Invalid(
        "null_header_key",
        lambda: with_body(
            good(1), framed(fields(b"k", b"v", headers=1) + varint(-1) + varint(1) + b"x")
        ),
        CorruptRecord,
        "header_key",
    ),
    Invalid("gzip_bomb", _bomb, RecordTooLarge, "inflated_size"),
    Invalid(
        "max_timestamp_disagrees",
        lambda: set_field(good(2), MAX_TIMESTAMP_AT, ">q", now_ms() + 10_000_000),
        InvalidRecord,
        "max_timestamp",
    ),
    Invalid(
        "timestamp_far_in_the_future",
        lambda: good(2, ts=now_ms() + 48 * 3600 * 1000),
        InvalidRecord,
        "timestamp",
    ),
    Invalid(
        "negative_producer_id",
        lambda: set_field(good(1), PRODUCER_ID_AT, ">q", -5),
        InvalidRecord,
        "producer",
    ),
    Invalid(
        "no_key_on_a_keyed_topic", lambda: good(2, key=None), InvalidRecord, "key_required", True
    ),
]

assert HEADER.size == HEADER_SIZE
