"""Kafka's RecordBatch v2 (magic 2), byte for byte: the unit on disk and on the wire.

    offset  size  field
    0       8     base_offset              stamped by the leader, not covered by the CRC
    8       4     batch_length             bytes after this field
    12      4     partition_leader_epoch   stamped by the leader, not covered by the CRC
    16      1     magic = 2
    17      4     crc (CRC-32C of bytes 21..end)
    21      2     attributes               bits 0-2 compression, 3 timestamp type, 4 transactional, 5 control
    23      4     last_offset_delta
    27      8     base_timestamp
    35      8     max_timestamp
    43      8     producer_id
    51      2     producer_epoch
    53      4     base_sequence
    57      4     records_count
    61      ...   records (varint-framed; see decode_records)

Everything here works on whole batches; only encode/decode touch records one by one, and only
the producer and the consumer call those.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

import crc32c as _crc32c

from tidelog.errors import CorruptRecord, RecordTooLarge
from tidelog.invariant import invariant
from tidelog.record import compression as codecs
from tidelog.record.varint import decode_varint, encode_varint

try:  # the compiled codec (optional: the *_py functions here are the same in pure Python)
    from tidelog.record import _codec
except ImportError:  # pragma: no cover - only where the extension could not be built
    _codec = None  # type: ignore[assignment]
COMPILED_CODEC = _codec  # the one place that says whether it was built

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
LOG_OVERHEAD = 12  # base_offset + batch_length: the bytes batch_length does not count
MAGIC = 2
CRC_START = 21
_EPOCH_AT = 12
_BASE_OFFSET_LENGTH = struct.Struct(">qi")
_STAMP = struct.Struct(">q")
_EPOCH = struct.Struct(">i")
_CRC = struct.Struct(">I")

NO_PARTITION_LEADER_EPOCH = -1
NO_PRODUCER_ID = -1
NO_SEQUENCE = -1

COMPRESSION_NONE = codecs.NONE
COMPRESSION_GZIP = codecs.GZIP
COMPRESSION_SNAPPY = codecs.SNAPPY
COMPRESSION_LZ4 = codecs.LZ4
COMPRESSION_ZSTD = codecs.ZSTD
COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20

# The most a reader inflates one batch to (validation bounds each topic's far lower).
READ_INFLATE_LIMIT = 1 << 30
# A batch must at least hold its header; anything beyond this is a configured limit (max.message.bytes).
BATCH_BYTES_MIN = HEADER_SIZE


def crc32c(data: bytes | bytearray | memoryview) -> int:
    return int(_crc32c.crc32c(data))


class BatchHeader(NamedTuple):
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size_bytes(self) -> int:
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_BIT)

    @property
    def is_transactional(self) -> bool:
        """Written inside a transaction (data or its marker): read_committed readers look for
        the transaction's outcome before they hand it out."""
        return bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def timestamp_type(self) -> int:
        return 1 if self.attributes & TIMESTAMP_TYPE_BIT else 0

    @property
    def last_sequence(self) -> int:
        if self.base_sequence < 0:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) & SEQUENCE_MAX


class Record(NamedTuple):
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


class ProducerRecord(NamedTuple):
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    timestamp: int | None = None


def read_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Unpack a header without checking it; callers that did not write the bytes use validate()."""
    if len(buf) - pos < HEADER_SIZE:
        raise CorruptRecord(f"batch header needs {HEADER_SIZE} bytes, {len(buf) - pos} left")
    return BatchHeader._make(HEADER.unpack_from(buf, pos))


def peek_size(buf: bytes | bytearray | memoryview, pos: int = 0) -> int | None:
    """Size of the batch starting at pos, or None if fewer than 12 bytes are there."""
    if len(buf) - pos < LOG_OVERHEAD:
        return None
    _, length = _BASE_OFFSET_LENGTH.unpack_from(buf, pos)
    return int(length) + LOG_OVERHEAD


def validate(
    buf: bytes | bytearray | memoryview, pos: int = 0, *, max_batch_bytes: int | None = None
) -> BatchHeader:
    """Check one batch's layout and CRC; every byte that reaches a log passes through here."""
    header = read_header(buf, pos)
    if header.magic != MAGIC:
        raise CorruptRecord(f"unsupported magic {header.magic}; only RecordBatch v2 (magic 2)")
    size = header.size_bytes
    if size < HEADER_SIZE:
        raise CorruptRecord(f"batch_length {header.batch_length} is shorter than a header")
    if max_batch_bytes is not None and size > max_batch_bytes:
        raise RecordTooLarge(f"batch of {size} bytes exceeds the limit of {max_batch_bytes}")
    if len(buf) - pos < size:
        raise CorruptRecord(f"batch of {size} bytes is cut short at {len(buf) - pos}")
    if header.last_offset_delta < 0 or header.records_count < 0:
        raise CorruptRecord("negative record count or offset delta")
    if header.records_count > header.last_offset_delta + 1:
        # Fewer records than offsets is normal after compaction (offsets never change).
        raise CorruptRecord(
            f"records_count {header.records_count} exceeds last_offset_delta "
            f"{header.last_offset_delta} + 1"
        )
    actual = crc32c(memoryview(buf)[pos + CRC_START : pos + size])
    if actual != header.crc:
        raise CorruptRecord(f"CRC-32C mismatch: stored {header.crc:#010x}, computed {actual:#010x}")
    return header


def iter_headers(
    buf: bytes | bytearray | memoryview, *, verify: bool = True, max_batch_bytes: int | None = None
) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) for each batch in a buffer of whole batches."""
    pos = 0
    end = len(buf)
    while pos < end:
        header = (
            validate(buf, pos, max_batch_bytes=max_batch_bytes) if verify else read_header(buf, pos)
        )
        if not verify and not HEADER_SIZE <= header.size_bytes <= end - pos:
            # Unverified bytes still may not move the position back or past the end (a
            # negative batch_length looped forever: found by the fuzzer).
            raise CorruptRecord(f"batch_length {header.batch_length} does not fit the buffer")
        yield pos, header
        pos += header.size_bytes


def stamp(buf: bytearray | memoryview, pos: int, base_offset: int, epoch: int) -> None:
    """Write the leader-assigned fields in place; the CRC does not cover them, so it stays valid."""
    _STAMP.pack_into(buf, pos, base_offset)
    _EPOCH.pack_into(buf, pos + _EPOCH_AT, epoch)


_PRODUCER = struct.Struct(">qhi")  # producer id, producer epoch, base sequence
_PRODUCER_AT = 43
SEQUENCE_MAX = 0x7FFFFFFF


def restamp_producer(
    data: bytes | bytearray | memoryview, producer_id: int, epoch: int, first_sequence: int
) -> tuple[bytearray, int]:
    """The batches of data (CRC-checked first) as one idempotent producer's (sequences
    consecutive from first_sequence, one per record, as Kafka's), CRCs recomputed; and the
    next sequence."""
    out = bytearray(data)
    sequence = first_sequence
    for pos, header in iter_headers(out):
        _PRODUCER.pack_into(out, pos + _PRODUCER_AT, producer_id, epoch, sequence)
        end = pos + header.size_bytes
        _CRC.pack_into(out, pos + 17, crc32c(memoryview(out)[pos + CRC_START : end]))
        sequence += header.last_offset_delta + 1
    return out, sequence


def build_batch(
    records: Sequence[ProducerRecord] | Iterable[ProducerRecord],
    *,
    base_offset: int = 0,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = -1,
    base_sequence: int = NO_SEQUENCE,
    compression: int = COMPRESSION_NONE,
    now_ms: int | None = None,
    control: bool = False,
    transactional: bool = False,
) -> bytes:
    """Encode records into one batch (the producer's job; brokers never re-encode)."""
    recs = records if isinstance(records, list | tuple) else list(records)
    if not recs:
        raise ValueError("a batch holds at least one record")
    default_ts = int(time.time() * 1000) if now_ms is None else now_ms
    if COMPILED_CODEC is None:
        body, base_ts, max_ts = encode_records_py(recs, default_ts)
    else:
        body, base_ts, max_ts = COMPILED_CODEC.encode_records(recs, default_ts)
    return batch_from_section(
        body,
        len(recs),
        base_ts,
        max_ts,
        base_offset=base_offset,
        partition_leader_epoch=partition_leader_epoch,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        compression=compression,
        control=control,
        transactional=transactional,
    )


def encode_records_py(records: Sequence[ProducerRecord], default_ts: int) -> tuple[bytes, int, int]:
    """The reference encoder of a record section (what _codec.c is held to): the section,
    the base timestamp and the max timestamp."""
    timestamps = [default_ts if r.timestamp is None else r.timestamp for r in records]
    base_ts = min(timestamps)
    body = b"".join(
        [
            _encode_record(rec, ts - base_ts, delta)
            for delta, (rec, ts) in enumerate(zip(records, timestamps, strict=True))
        ]
    )
    return body, base_ts, max(timestamps)


def batch_from_section(
    body: bytes,
    count: int,
    base_ts: int,
    max_ts: int,
    *,
    base_offset: int = 0,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = -1,
    base_sequence: int = NO_SEQUENCE,
    compression: int = COMPRESSION_NONE,
    control: bool = False,
    transactional: bool = False,
) -> bytes:
    """A batch around an encoded record section of count records (offset deltas 0..count-1)."""
    if compression not in codecs.CODEC_NAMES:
        raise ValueError(f"unsupported compression codec {compression}")
    payload = codecs.compress(compression, body)
    attributes = (
        (compression & COMPRESSION_MASK)
        | (CONTROL_BIT if control else 0)
        | (TRANSACTIONAL_BIT if transactional else 0)
    )
    out = bytearray(HEADER_SIZE)
    out.extend(payload)
    batch_length = len(out) - LOG_OVERHEAD
    HEADER.pack_into(
        out,
        0,
        base_offset,
        batch_length,
        partition_leader_epoch,
        MAGIC,
        0,
        attributes,
        count - 1,
        base_ts,
        max_ts,
        producer_id,
        producer_epoch,
        base_sequence,
        count,
    )
    _CRC.pack_into(out, 17, crc32c(memoryview(out)[CRC_START:]))
    return bytes(out)


def rebuild_batch(
    header: BatchHeader, records: Sequence[Record], *, keep_base_offset: bool = False
) -> bytes:
    """A batch holding a subset of an existing batch's records at their original offsets
    (the compactor's job): same epoch, producer fields and last offset; no compression. The
    base offset moves to the first record kept unless keep_base_offset: a producer's last
    batch keeps it, as its base sequence belongs to the base offset (producer state derives
    the last sequence from both)."""
    invariant(
        records and all(header.base_offset <= r.offset <= header.last_offset for r in records),
        "records and all(header.base_offset <= r.offset <= header.last_offset for r in records)",
    )
    base = header.base_offset if keep_base_offset else records[0].offset
    base_ts = min(r.timestamp for r in records)
    body = bytearray()
    for rec in records:
        body.extend(
            _encode_record(
                ProducerRecord(rec.key, rec.value, rec.headers),
                rec.timestamp - base_ts,
                rec.offset - base,
            )
        )
    attributes = header.attributes & ~COMPRESSION_MASK
    out = bytearray(HEADER_SIZE)
    out.extend(body)
    HEADER.pack_into(
        out,
        0,
        base,
        len(out) - LOG_OVERHEAD,
        header.partition_leader_epoch,
        MAGIC,
        0,
        attributes,
        header.last_offset - base,
        base_ts,
        max(r.timestamp for r in records),
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        len(records),
    )
    _CRC.pack_into(out, 17, crc32c(memoryview(out)[CRC_START:]))
    return bytes(out)


def empty_batch(header: BatchHeader) -> bytes:
    """An existing batch emptied of its records (Kafka's empty batch, which its cleaner keeps
    as a producer's last batch): the same base offset, last offset, leader epoch, timestamps,
    producer id, epoch and base sequence, and the same attributes bar compression (nothing is
    left to compress), so what is derived from headers alone (producer state, transactions,
    the offsets a segment covers) reads it as it read the batch. records_count is 0."""
    out = bytearray(HEADER_SIZE)
    HEADER.pack_into(
        out,
        0,
        header.base_offset,
        HEADER_SIZE - LOG_OVERHEAD,
        header.partition_leader_epoch,
        MAGIC,
        0,
        header.attributes & ~COMPRESSION_MASK,
        header.last_offset_delta,
        header.base_timestamp,
        header.max_timestamp,
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        0,
    )
    _CRC.pack_into(out, 17, crc32c(memoryview(out)[CRC_START:]))
    return bytes(out)


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    encode_varint(value, out)
    return bytes(out)


# The producer's hot path: lengths, deltas and counts are nearly always small, so their varints
# come from a table instead of a bit loop per field.
_SMALL_VARINTS = tuple(_varint_bytes(v) for v in range(-1, 1 << 12))


def _varint(value: int) -> bytes:
    if -1 <= value < (1 << 12) - 1:
        return _SMALL_VARINTS[value + 1]
    return _varint_bytes(value)


def _encode_record(rec: ProducerRecord, ts_delta: int, offset_delta: int) -> bytes:
    key, value, headers = rec.key, rec.value, rec.headers
    parts = [b"\x00", _varint(ts_delta), _varint(offset_delta)]  # \x00: record attributes
    if key is None:
        parts.append(_SMALL_VARINTS[0])
    else:
        parts += (_varint(len(key)), key)
    if value is None:
        parts.append(_SMALL_VARINTS[0])
    else:
        parts += (_varint(len(value)), value)
    parts.append(_varint(len(headers)))
    for hkey, hval in headers:
        raw = hkey.encode()
        parts += (_varint(len(raw)), raw)
        if hval is None:
            parts.append(_SMALL_VARINTS[0])
        else:
            parts += (_varint(len(hval)), hval)
    body = b"".join(parts)
    return _varint(len(body)) + body


def records_payload(batch: bytes | bytearray | memoryview, header: BatchHeader) -> bytes:
    """The record section of a batch, decompressed."""
    raw = memoryview(batch)[HEADER_SIZE : header.size_bytes]
    # Batches in a log were validated (and inflated within its bound) when appended; a reader
    # still refuses one that would inflate past the largest batch a topic may hold, times four.
    return codecs.decompress(header.compression, raw, READ_INFLATE_LIMIT)


def records_view(batch: bytes | bytearray | memoryview, header: BatchHeader) -> bytes | memoryview:
    """records_payload without a copy when the batch is not compressed (for the compiled
    decoders, which read it in place)."""
    if header.compression == COMPRESSION_NONE:
        return memoryview(batch)[HEADER_SIZE : header.size_bytes]
    return records_payload(batch, header)


def decode_records(
    batch: bytes | bytearray | memoryview, pos: int = 0, min_offset: int = -(1 << 63)
) -> list[Record]:
    """Decode the records of the batch at pos at offsets >= min_offset (the consumer's
    per-record work: compiled in _codec.c where built, else decode_records_py)."""
    mv = memoryview(batch)[pos:]
    header = read_header(mv)
    if len(mv) < header.size_bytes:
        raise CorruptRecord("batch cut short")
    if COMPILED_CODEC is None:
        data = records_payload(mv, header)
        records = decode_records_py(
            data,
            header.records_count,
            header.base_offset,
            header.base_timestamp,
            header.last_offset_delta,
        )
        return (
            [r for r in records if r.offset >= min_offset]
            if min_offset > header.base_offset
            else records
        )
    try:
        decoded: list[Record] = COMPILED_CODEC.decode_records(
            records_view(mv, header),
            header.records_count,
            header.base_offset,
            header.base_timestamp,
            header.last_offset_delta,
            min_offset,
            Record,
        )
    except ValueError as exc:
        raise CorruptRecord(str(exc)) from None
    return decoded


def decode_records_py(
    data: bytes, count: int, base_offset: int, base_timestamp: int, last_offset_delta: int
) -> list[Record]:
    """The reference decoder of a record section (what _codec.c is held to)."""
    try:
        out, p = _decode_all(data, count, base_offset, base_timestamp, last_offset_delta)
    except IndexError:
        raise CorruptRecord("record runs past the end of the batch") from None
    if p != len(data):
        raise CorruptRecord(f"{len(data) - p} trailing bytes after the last record")
    return out


def _decode_all(
    data: bytes, count: int, base_offset: int, base_ts: int, last_delta: int
) -> tuple[list[Record], int]:
    # One flat loop with single-byte varints inlined: this is the consumer's hot path, and a
    # function call per field would triple its cost.
    out: list[Record] = []
    append = out.append
    previous = -1
    end = len(data)
    p = 0
    for _ in range(count):
        b = data[p]
        if b < 0x80:
            length = (b >> 1) ^ -(b & 1)
            p += 1
        else:
            length, p = decode_varint(data, p)
        stop = p + length
        if length < 1 or stop > end:
            raise CorruptRecord(f"record length {length} runs past the batch")
        p += 1  # record attributes
        b = data[p]
        if b < 0x80:
            ts_delta = (b >> 1) ^ -(b & 1)
            p += 1
        else:
            ts_delta, p = decode_varint(data, p)
        b = data[p]
        if b < 0x80:
            offset_delta = (b >> 1) ^ -(b & 1)
            p += 1
        else:
            offset_delta, p = decode_varint(data, p)
        if not previous < offset_delta <= last_delta:
            raise CorruptRecord(
                f"offset delta {offset_delta} does not follow {previous} within {last_delta}"
            )
        previous = offset_delta
        key: bytes | None
        value: bytes | None
        b = data[p]
        if b < 0x80:
            n = (b >> 1) ^ -(b & 1)
            p += 1
        else:
            n, p = decode_varint(data, p)
        if n == -1:
            key = None
        elif 0 <= n <= stop - p:
            key = data[p : p + n]
            p += n
        else:
            raise CorruptRecord(f"key length {n} runs past the record")
        b = data[p]
        if b < 0x80:
            n = (b >> 1) ^ -(b & 1)
            p += 1
        else:
            n, p = decode_varint(data, p)
        if n == -1:
            value = None
        elif 0 <= n <= stop - p:
            value = data[p : p + n]
            p += n
        else:
            raise CorruptRecord(f"value length {n} runs past the record")
        headers: tuple[tuple[str, bytes | None], ...] = ()
        if data[p] == 0:
            p += 1
        else:
            headers, p = _decode_headers(data, p, stop)
        if p != stop:
            raise CorruptRecord("record length disagrees with its fields")
        append(Record(base_offset + offset_delta, base_ts + ts_delta, key, value, headers))
    return out, p


def _decode_headers(
    data: bytes, p: int, stop: int
) -> tuple[tuple[tuple[str, bytes | None], ...], int]:
    n_headers, p = decode_varint(data, p)
    if n_headers < 0 or n_headers > stop - p:
        raise CorruptRecord(f"bad header count {n_headers}")
    headers: list[tuple[str, bytes | None]] = []
    for _ in range(n_headers):
        hkey, p = _decode_bytes(data, p, stop)
        if hkey is None:
            raise CorruptRecord("null header key")
        hval, p = _decode_bytes(data, p, stop)
        try:
            headers.append((hkey.decode(), hval))
        except UnicodeDecodeError as exc:
            raise CorruptRecord("header key is not UTF-8") from exc
    return tuple(headers), p


def _decode_bytes(data: bytes, p: int, stop: int) -> tuple[bytes | None, int]:
    length, p = decode_varint(data, p)
    if length == -1:
        return None, p
    if length < 0 or p + length > stop:
        raise CorruptRecord(f"field length {length} runs past the record")
    return data[p : p + length], p + length
