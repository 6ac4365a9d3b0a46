"""What a producer's batches must be before a leader appends them (Kafka's LogValidator).

A CRC proves only that bytes were not damaged on the way; it says nothing of whether the writer
wrote a batch every reader can read. A batch that passes `validate_produced` is one the decoder
(`batch.decode_records`), the compactor, table topics and the Spark source read without error:
its header agrees with its records, every record parses exactly to the batch end, the codec is one
tidelog reads and the batch inflates within a bound, and it carries nothing only the log may set
(the control bit, LogAppendTime; the transactional bit only with a producer id).

Each refusal is a named error that says which rule failed (`details["rule"]`):

    CorruptRecord           the bytes do not parse (CRC, lengths, varints, trailing bytes)
    InvalidRecord           they parse but break a rule (counts, offset deltas, bits, keys, time)
    UnsupportedCompression  a codec tidelog does not read, or one that does not exist
    RecordTooLarge          the batch, or what it inflates to, is over the topic's limit

The per-record scan runs in C (`_scan.c`) when the extension is built, else in the pure-Python
`_scan_records_py` below; both implement the same rules and the tests hold them to each other.
No Python object is built per record either way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from tidelog.errors import (
    CorruptRecord,
    InvalidRecord,
    InvalidRequest,
    RecordTooLarge,
    TidelogError,
    UnsupportedCompression,
)
from tidelog.record.batch import (
    COMPRESSION_MASK,
    COMPRESSION_NONE,
    CONTROL_BIT,
    HEADER_SIZE,
    NO_PRODUCER_ID,
    TIMESTAMP_TYPE_BIT,
    TRANSACTIONAL_BIT,
    BatchHeader,
    validate,
)
from tidelog.record.compression import CODEC_NAMES, decompress

# A batch may inflate to at most this many times max.message.bytes: beyond it, it is a
# compression bomb (RecordTooLarge), refused before more than that is in memory.
DECOMPRESSION_RATIO_MAX = 4
KNOWN_ATTRIBUTE_BITS = COMPRESSION_MASK | TIMESTAMP_TYPE_BIT | TRANSACTIONAL_BIT | CONTROL_BIT
SUPPORTED_CODECS = frozenset(CODEC_NAMES)

# Scan result codes (shared with _scan.c).
SCAN_OK = 0
SCAN_VARINT = 1
SCAN_RECORD_LENGTH = 2
SCAN_OFFSET_DELTA = 3
SCAN_KEY_LENGTH = 4
SCAN_VALUE_LENGTH = 5
SCAN_HEADER_COUNT = 6
SCAN_HEADER_KEY = 7
SCAN_HEADER_KEY_UTF8 = 8
SCAN_HEADER_VALUE = 9
SCAN_RECORD_END = 10
SCAN_TRAILING = 11
SCAN_TIMESTAMP = 12
SCAN_KEY_REQUIRED = 13

# code -> (error class, rule name, what it means)
_SCAN_ERRORS: dict[int, tuple[type[TidelogError], str, str]] = {
    SCAN_VARINT: (CorruptRecord, "varint", "a varint is cut short or longer than its type"),
    SCAN_RECORD_LENGTH: (CorruptRecord, "record_length", "its length runs past the batch"),
    SCAN_OFFSET_DELTA: (
        InvalidRecord,
        "offset_delta",
        "its offset delta does not follow the one before, or passes last_offset_delta",
    ),
    SCAN_KEY_LENGTH: (CorruptRecord, "key_length", "its key length runs past the record"),
    SCAN_VALUE_LENGTH: (CorruptRecord, "value_length", "its value length runs past the record"),
    SCAN_HEADER_COUNT: (CorruptRecord, "header_count", "its header count is impossible"),
    SCAN_HEADER_KEY: (CorruptRecord, "header_key", "a header key is null or runs past it"),
    SCAN_HEADER_KEY_UTF8: (CorruptRecord, "header_key_utf8", "a header key is not UTF-8"),
    SCAN_HEADER_VALUE: (CorruptRecord, "header_value", "a header value runs past the record"),
    SCAN_RECORD_END: (CorruptRecord, "record_end", "its fields do not end where its length says"),
    SCAN_TRAILING: (CorruptRecord, "trailing_bytes", "bytes follow the last record"),
    SCAN_TIMESTAMP: (InvalidRecord, "timestamp", "its timestamp overflows 64 bits"),
    SCAN_KEY_REQUIRED: (InvalidRecord, "key_required", "it has no key, and this topic needs keys"),
}

ScanResult = tuple[int, int, int, int]  # (code, record index, min timestamp, max timestamp)
Scanner = Callable[[bytes | bytearray | memoryview, int, int, bool, int], ScanResult]


class ValidatedBatches(NamedTuple):
    """A producer's payload that passed validate_produced, with the headers it found: the log
    appends it without parsing (or CRC-checking) it a second time."""

    data: bytes | bytearray | memoryview
    headers: list[tuple[int, BatchHeader]]


@dataclass(frozen=True)
class BatchRules:
    """A topic's rules for what producers may append (from its TopicConfig)."""

    max_batch_bytes: int
    require_keys: bool = False  # compacted and table topics: a record without a key is lost
    timestamp_before_max_ms: int = -1  # -1: no bound
    timestamp_after_max_ms: int = -1

    @property
    def max_inflated_bytes(self) -> int:
        return self.max_batch_bytes * DECOMPRESSION_RATIO_MAX


def _refuse(
    cls: type[TidelogError], rule: str, message: str, batch: int, **details: object
) -> TidelogError:
    return cls(f"batch {batch}: {message}", rule=rule, batch=batch, **details)


def validate_produced(
    buf: bytes | bytearray | memoryview, rules: BatchRules, now_ms: int
) -> ValidatedBatches:
    """The payload with (position, header) of every batch in it, or the first rule it breaks.
    Nothing of a payload that fails is appended: the caller appends only after this returns."""
    out: list[tuple[int, BatchHeader]] = []
    pos = 0
    end = len(buf)
    if end == 0:
        raise InvalidRequest("produce request carries no record batch", rule="empty", batch=0)
    while pos < end:
        index = len(out)
        try:
            header = validate(buf, pos, max_batch_bytes=rules.max_batch_bytes)
        except TidelogError as exc:
            raise type(exc)(f"batch {index}: {exc.message}", rule="layout", batch=index) from None
        check_header(header, index, rules)
        check_records(buf, pos, header, index, rules, now_ms)
        out.append((pos, header))
        pos += header.size_bytes
    return ValidatedBatches(buf, out)


def check_header(header: BatchHeader, batch: int, rules: BatchRules) -> None:
    """The rules a header alone answers."""
    attributes = header.attributes
    if attributes & ~KNOWN_ATTRIBUTE_BITS & 0xFFFF:
        raise _refuse(
            InvalidRecord, "attributes", f"unknown attribute bits {attributes:#06x}", batch
        )
    codec = attributes & COMPRESSION_MASK
    if codec not in SUPPORTED_CODECS:
        why = f"compression codec {codec} does not exist (none, gzip, snappy, lz4, zstd do)"
        raise _refuse(UnsupportedCompression, "compression", why, batch, codec=codec)
    if attributes & CONTROL_BIT:
        raise _refuse(InvalidRecord, "control", "control batches are written by the log", batch)
    if attributes & TRANSACTIONAL_BIT and header.producer_id < 0:
        # A transactional batch is a transactional producer's: whether its transaction holds
        # the partition is the partition leader's check (node/ops/data.py), not the codec's.
        raise _refuse(
            InvalidRecord, "transactional", "a transactional batch needs a producer id", batch
        )
    if attributes & TIMESTAMP_TYPE_BIT:
        raise _refuse(
            InvalidRecord,
            "timestamp_type",
            "LogAppendTime is set by the log, not by a producer",
            batch,
        )
    if header.records_count < 1:
        raise _refuse(InvalidRecord, "records_count", "a batch holds at least one record", batch)
    if header.records_count != header.last_offset_delta + 1:
        raise _refuse(
            InvalidRecord,
            "records_count",
            f"records_count {header.records_count} is not last_offset_delta "
            f"{header.last_offset_delta} + 1",
            batch,
        )
    if header.producer_id < NO_PRODUCER_ID:
        raise _refuse(InvalidRecord, "producer", f"producer id {header.producer_id}", batch)
    # A sequence without a producer id is ignored, not refused: Kafka takes such batches
    # (aiokafka's producer sends sequence 0 when it is not idempotent), and the log keeps
    # producer state only for ids >= 0.
    if header.producer_id >= 0 and (header.producer_epoch < 0 or header.base_sequence < 0):
        raise _refuse(
            InvalidRecord, "producer", "an idempotent batch needs an epoch and sequence >= 0", batch
        )


def check_records(
    buf: bytes | bytearray | memoryview,
    pos: int,
    header: BatchHeader,
    batch: int,
    rules: BatchRules,
    now_ms: int,
) -> None:
    """Every record parses to the batch end, and their timestamps agree with the header and the
    topic's window."""
    min_ts, max_ts = check_readable(
        buf, pos, header, batch, rules.max_inflated_bytes, rules.require_keys
    )
    if max_ts != header.max_timestamp:
        raise _refuse(
            InvalidRecord,
            "max_timestamp",
            f"max_timestamp {header.max_timestamp} is not the records' newest ({max_ts})",
            batch,
        )
    if min_ts < 0:
        raise _refuse(InvalidRecord, "timestamp", f"negative timestamp {min_ts}", batch)
    before, after = rules.timestamp_before_max_ms, rules.timestamp_after_max_ms
    if before >= 0 and min_ts < now_ms - before:
        raise _refuse(
            InvalidRecord,
            "timestamp",
            f"timestamp {min_ts} is more than message.timestamp.before.max.ms={before} "
            f"before the log's clock ({now_ms})",
            batch,
        )
    if after >= 0 and max_ts > now_ms + after:
        raise _refuse(
            InvalidRecord,
            "timestamp",
            f"timestamp {max_ts} is more than message.timestamp.after.max.ms={after} "
            f"after the log's clock ({now_ms})",
            batch,
        )


def check_readable(
    buf: bytes | bytearray | memoryview,
    pos: int,
    header: BatchHeader,
    batch: int,
    inflate_limit: int,
    require_keys: bool = False,
) -> tuple[int, int]:
    """What every reader needs of a batch already in a log (whoever wrote it): a codec tidelog
    reads, records that parse exactly to its end, offsets rising within it (compaction leaves
    gaps). Returns the records' (oldest, newest) timestamps."""
    codec = header.compression
    if codec not in SUPPORTED_CODECS:
        raise _refuse(
            UnsupportedCompression,
            "compression",
            f"compression codec {codec} does not exist",
            batch,
            codec=codec,
        )
    records = inflate(buf, pos, header, batch, inflate_limit)
    code, index, min_ts, max_ts = scan_records(
        records, header.records_count, header.base_timestamp, require_keys, header.last_offset_delta
    )
    if code != SCAN_OK:
        cls, rule, why = _SCAN_ERRORS.get(code, (CorruptRecord, "scan", f"scan code {code}"))
        where = f"after record {index - 1}" if code == SCAN_TRAILING else f"record {index}"
        raise _refuse(cls, rule, f"{where}: {why}", batch, record=index)
    return min_ts, max_ts


def inflate(
    buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader, batch: int, limit: int
) -> bytes | memoryview:
    """The record section, decompressed; never more than limit bytes are produced."""
    raw = memoryview(buf)[pos + HEADER_SIZE : pos + header.size_bytes]
    if header.compression == COMPRESSION_NONE:
        return raw
    try:
        return decompress(header.compression, raw, limit)
    except RecordTooLarge:
        raise _refuse(
            RecordTooLarge,
            "inflated_size",
            f"the batch inflates past {limit} bytes ({DECOMPRESSION_RATIO_MAX} x max.message.bytes)",
            batch,
        ) from None
    except CorruptRecord as exc:
        raise _refuse(CorruptRecord, "compression", exc.message, batch) from None


class _MalformedVarint(Exception):
    """A varint cut short by its field's end, or wider than its type: the scan stops there with
    SCAN_VARINT (raised, so that the reads on the common path need no check)."""


def _varint(
    data: bytes | bytearray | memoryview, p: int, end: int, max_bytes: int
) -> tuple[int, int]:
    """Zig-zag varint of at most max_bytes (5: int32, 10: int64) at p: (value, next p)."""
    raw = 0
    top = 0x0F if max_bytes == 5 else 0x01  # what the last byte may hold: 32 or 64 bits
    for i in range(max_bytes):
        if p >= end:
            raise _MalformedVarint
        b = data[p]
        p += 1
        if i == max_bytes - 1 and b > top:
            raise _MalformedVarint
        raw |= (b & 0x7F) << (7 * i)
        if b < 0x80:
            return (raw >> 1) ^ -(raw & 1), p
    raise _MalformedVarint


def _scan_records_py(
    data: bytes | bytearray | memoryview,
    count: int,
    base_ts: int,
    require_keys: bool,
    last_offset_delta: int,
) -> ScanResult:
    """The reference scan (what _scan.c does, check for check, in the same order). Single-byte
    varints, nearly all of them, are read inline: a call per field would triple the cost.
    Headers, which most records have none of, are _scan_headers'."""
    data = bytes(data)
    end = len(data)
    p = 0
    min_ts = max_ts = 0
    previous = -1
    try:
        for i in range(count):
            if p < end and data[p] < 0x80:
                b = data[p]
                n, p = (b >> 1) ^ -(b & 1), p + 1
            else:
                n, p = _varint(data, p, end, 5)
            if n < 1 or n > end - p:
                return SCAN_RECORD_LENGTH, i, min_ts, max_ts
            stop = p + n
            p += 1  # record attributes
            if p < stop and data[p] < 0x80:
                b = data[p]
                delta, p = (b >> 1) ^ -(b & 1), p + 1
            else:
                delta, p = _varint(data, p, stop, 10)
            ts = base_ts + delta
            if not -(1 << 63) <= ts < (1 << 63):
                return SCAN_TIMESTAMP, i, min_ts, max_ts
            if i == 0 or ts < min_ts:
                min_ts = ts
            if i == 0 or ts > max_ts:
                max_ts = ts
            if p < stop and data[p] < 0x80:
                b = data[p]
                n, p = (b >> 1) ^ -(b & 1), p + 1
            else:
                n, p = _varint(data, p, stop, 5)
            if n <= previous or n > last_offset_delta:
                return SCAN_OFFSET_DELTA, i, min_ts, max_ts
            previous = n
            if p < stop and data[p] < 0x80:
                b = data[p]
                n, p = (b >> 1) ^ -(b & 1), p + 1
            else:
                n, p = _varint(data, p, stop, 5)
            if n == -1:
                if require_keys:
                    return SCAN_KEY_REQUIRED, i, min_ts, max_ts
            elif n < 0 or n > stop - p:
                return SCAN_KEY_LENGTH, i, min_ts, max_ts
            else:
                p += n
            n, p = _varint(data, p, stop, 5)
            if n < -1 or n > stop - p:
                return SCAN_VALUE_LENGTH, i, min_ts, max_ts
            if n > 0:
                p += n
            if p < stop and data[p] == 0:
                p += 1  # no headers, as nearly always
            else:
                code, p = _scan_headers(data, p, stop)
                if code != SCAN_OK:
                    return code, i, min_ts, max_ts
            if p != stop:
                return SCAN_RECORD_END, i, min_ts, max_ts
    except _MalformedVarint:
        return SCAN_VARINT, i, min_ts, max_ts
    if p != end:
        return SCAN_TRAILING, count, min_ts, max_ts
    return SCAN_OK, count, min_ts, max_ts


def _scan_headers(data: bytes, p: int, stop: int) -> tuple[int, int]:
    """A record's headers from p (their count, then each key and value) to at most stop:
    (SCAN_OK or the rule broken, where the scan got to)."""
    if p < stop and data[p] < 0x80:
        b = data[p]
        headers, p = (b >> 1) ^ -(b & 1), p + 1
    else:
        headers, p = _varint(data, p, stop, 5)
    if headers < 0 or headers > stop - p:
        return SCAN_HEADER_COUNT, p
    for _ in range(headers):
        n, p = _varint(data, p, stop, 5)
        if n < 0 or n > stop - p:
            return SCAN_HEADER_KEY, p
        try:
            data[p : p + n].decode("utf-8")
        except UnicodeDecodeError:
            return SCAN_HEADER_KEY_UTF8, p
        p += n
        n, p = _varint(data, p, stop, 5)
        if n < -1 or n > stop - p:
            return SCAN_HEADER_VALUE, p
        if n > 0:
            p += n
    return SCAN_OK, p


def _compiled_scanner() -> Scanner | None:
    try:
        from tidelog.record import _scan
    except ImportError:
        return None
    scanner: Scanner = _scan.scan_records
    return scanner


COMPILED_SCANNER = _compiled_scanner()
scan_records: Scanner = COMPILED_SCANNER or _scan_records_py
