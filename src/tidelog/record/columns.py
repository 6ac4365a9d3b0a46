"""Record batches decoded into columns: the offsets, timestamps, keys, values and headers of
every record as Arrow-layout buffers (the Spark source's rows), with no Python object per
record when the compiled decoder (`_codec.c`) is built.

The pure-Python reference here (`decode_columns_py`, on top of `batch.decode_records_py`) is
what the compiled path is held to by property tests; it is also what runs where the extension
could not be built. Buffers are native-endian (little-endian on every machine tidelog runs on),
as Arrow expects:

    offsets, timestamps   int64 per row (timestamps in ms since the epoch)
    keys, values          BinaryColumn: int32 offsets (rows + 1), data, validity bitmap or None
    headers               HeaderColumns (a list<struct<key string, value binary>>) or None
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from tidelog.errors import CorruptRecord
from tidelog.record.batch import (
    COMPILED_CODEC,
    BatchHeader,
    decode_records_py,
    iter_headers,
    records_view,
)

OFFSET_MIN = -(1 << 63)
OFFSET_MAX = (1 << 63) - 1
# A column's data is addressed by int32 offsets (Arrow's binary type): items are decoded in
# groups whose payloads stay below this.
GROUP_BYTES_MAX = 1 << 30

# (record section, records_count, base_offset, base_timestamp, last_offset_delta, min_offset,
# end_offset): one batch's records at min_offset <= offset < end_offset.
BatchItem = tuple[bytes | memoryview, int, int, int, int, int, int]


class BinaryColumn(NamedTuple):
    offsets: bytes
    data: bytes
    validity: bytes | None  # None when no row is null
    nulls: int


class HeaderColumns(NamedTuple):
    list_offsets: bytes  # int32 per row + 1, into keys/values
    keys: BinaryColumn  # header keys (UTF-8, never null)
    values: BinaryColumn


class RecordColumns(NamedTuple):
    rows: int
    offsets: bytes
    timestamps: bytes
    keys: BinaryColumn
    values: BinaryColumn
    headers: HeaderColumns | None

    def last_offset(self) -> int | None:
        return array("q", self.offsets[-8:])[0] if self.rows else None


COMPILED = COMPILED_CODEC


def batch_items(
    payload: bytes | bytearray | memoryview,
    min_offset: int = OFFSET_MIN,
    end_offset: int = OFFSET_MAX,
    *,
    include_control: bool = False,
    verify: bool = True,
    batches: Sequence[tuple[int, BatchHeader]] | None = None,
) -> Iterator[tuple[BatchHeader, BatchItem]]:
    """One item per batch of a buffer of whole batches (CRC-checked unless verify=False, or
    given as `batches`, already checked) that may hold records in [min_offset, end_offset),
    its record section decompressed."""
    for pos, header in iter_headers(payload, verify=verify) if batches is None else batches:
        if header.is_control and not include_control:
            continue
        if header.last_offset < min_offset or header.base_offset >= end_offset:
            continue
        data = records_view(memoryview(payload)[pos:], header)
        yield (
            header,
            (
                data,
                header.records_count,
                header.base_offset,
                header.base_timestamp,
                header.last_offset_delta,
                min_offset,
                end_offset,
            ),
        )


def decode_columns(items: Sequence[BatchItem], include_headers: bool) -> RecordColumns:
    """The records of items as columns; a batch that cannot be decoded raises CorruptRecord."""
    if COMPILED is None:
        return decode_columns_py(items, include_headers)
    groups = _groups(items)
    if len(groups) != 1:
        return concat([decode_columns(g, include_headers) for g in groups], include_headers)
    try:
        raw = COMPILED.decode_columns(items, include_headers)
    except ValueError as exc:
        raise CorruptRecord(str(exc)) from None
    rows, offsets, timestamps, keys, values, headers = raw
    return RecordColumns(
        rows,
        offsets,
        timestamps,
        BinaryColumn(*keys),
        BinaryColumn(*values),
        None if headers is None else _headers(headers),
    )


def _headers(
    raw: tuple[
        bytes, tuple[bytes, bytes, bytes | None, int], tuple[bytes, bytes, bytes | None, int]
    ],
) -> HeaderColumns:
    list_offsets, keys, values = raw
    return HeaderColumns(list_offsets, BinaryColumn(*keys), BinaryColumn(*values))


def _groups(items: Sequence[BatchItem]) -> list[Sequence[BatchItem]]:
    groups: list[Sequence[BatchItem]] = []
    start, size = 0, 0
    for i, item in enumerate(items):
        if size and size + len(item[0]) > GROUP_BYTES_MAX:
            groups.append(items[start:i])
            start, size = i, 0
        size += len(item[0])
    groups.append(items[start:])
    return groups


class _BinaryBuilder:
    def __init__(self) -> None:
        self.offsets = array("i", [0])
        self.data = bytearray()
        self.valid: list[bool] = []

    def put(self, value: bytes | None) -> None:
        if value is not None:
            self.data += value
        self.valid.append(value is not None)
        self.offsets.append(len(self.data))

    def finish(self) -> BinaryColumn:
        nulls = self.valid.count(False)
        validity = None
        if nulls:
            bitmap = bytearray((len(self.valid) + 7) // 8)
            for i, ok in enumerate(self.valid):
                if ok:
                    bitmap[i >> 3] |= 1 << (i & 7)
            validity = bytes(bitmap)
        return BinaryColumn(self.offsets.tobytes(), bytes(self.data), validity, nulls)


class _ColumnsBuilder:
    """Rows appended one by one into the layout RecordColumns describes (the reference path)."""

    def __init__(self, include_headers: bool) -> None:
        self.include_headers = include_headers
        self.offsets, self.timestamps = array("q"), array("q")
        self.keys, self.values = _BinaryBuilder(), _BinaryBuilder()
        self.list_offsets = array("i", [0])
        self.header_keys, self.header_values = _BinaryBuilder(), _BinaryBuilder()

    def put(
        self,
        offset: int,
        timestamp: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[bytes, bytes | None]],
    ) -> None:
        self.offsets.append(offset)
        self.timestamps.append(timestamp)
        self.keys.put(key)
        self.values.put(value)
        if self.include_headers:
            for hkey, hval in headers:
                self.header_keys.put(hkey)
                self.header_values.put(hval)
            self.list_offsets.append(len(self.header_keys.valid))

    def finish(self) -> RecordColumns:
        headers = None
        if self.include_headers:
            headers = HeaderColumns(
                self.list_offsets.tobytes(), self.header_keys.finish(), self.header_values.finish()
            )
        return RecordColumns(
            len(self.offsets),
            self.offsets.tobytes(),
            self.timestamps.tobytes(),
            self.keys.finish(),
            self.values.finish(),
            headers,
        )


def decode_columns_py(items: Sequence[BatchItem], include_headers: bool) -> RecordColumns:
    """The reference: decode_records_py per batch, then one row per record in range."""
    out = _ColumnsBuilder(include_headers)
    for data, count, base_offset, base_ts, last_delta, lo, hi in items:
        for rec in decode_records_py(bytes(data), count, base_offset, base_ts, last_delta):
            if lo <= rec.offset < hi:
                headers = [(k.encode(), v) for k, v in rec.headers]
                out.put(rec.offset, rec.timestamp, rec.key, rec.value, headers)
    return out.finish()


def concat(parts: Sequence[RecordColumns], include_headers: bool) -> RecordColumns:
    """Columns of several decodes as one (rare: only past GROUP_BYTES_MAX of payload)."""
    out = _ColumnsBuilder(include_headers)
    for part in parts:
        offsets = array("q", part.offsets)
        timestamps = array("q", part.timestamps)
        keys = binary_values(part.keys, part.rows)
        values = binary_values(part.values, part.rows)
        header_rows: list[list[tuple[bytes, bytes | None]]] = [[] for _ in range(part.rows)]
        if include_headers and part.headers is not None:
            bounds = array("i", part.headers.list_offsets)
            hkeys = binary_values(part.headers.keys, bounds[-1])
            hvalues = binary_values(part.headers.values, bounds[-1])
            header_rows = [
                [(hkeys[j] or b"", hvalues[j]) for j in range(bounds[i], bounds[i + 1])]
                for i in range(part.rows)
            ]
        for i in range(part.rows):
            out.put(offsets[i], timestamps[i], keys[i], values[i], header_rows[i])
    return out.finish()


def binary_values(column: BinaryColumn, rows: int) -> list[bytes | None]:
    """A binary column back as Python values (for tests and the rare concat)."""
    bounds = array("i", column.offsets)
    out: list[bytes | None] = []
    for i in range(rows):
        if column.validity is not None and not column.validity[i >> 3] & (1 << (i & 7)):
            out.append(None)
        else:
            out.append(column.data[bounds[i] : bounds[i + 1]])
    return out
