"""Records to Arrow record batches whose schema matches the declared Spark schema exactly
(nullable fields, timestamp('us', tz='UTC'), binary not large_binary), as PySpark requires."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tidelog.record.batch import Record
from tidelog.record.columns import BinaryColumn, RecordColumns

SOURCE_DDL = (
    "key binary, value binary, topic string, partition int, offset bigint, "
    "timestamp timestamp, timestampType int"
)
HEADERS_DDL = ", headers array<struct<key:string,value:binary>>"
TABLE_DDL = "key binary, value binary, topic string, partition int"

HEADER_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))


def source_schema(include_headers: bool) -> pa.Schema:
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(pa.field("headers", HEADER_TYPE))
    return pa.schema(fields)


TABLE_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
    ]
)


def records_to_batch(
    records: Sequence[Record], topic: str, partition: int, include_headers: bool
) -> pa.RecordBatch:
    n = len(records)
    columns: list[Any] = [
        pa.array([r.key for r in records], pa.binary()),
        pa.array([r.value for r in records], pa.binary()),
        pa.array([topic] * n, pa.string()),
        pa.array([partition] * n, pa.int32()),
        pa.array([r.offset for r in records], pa.int64()),
        pa.array([r.timestamp * 1000 for r in records], pa.timestamp("us", tz="UTC")),
        pa.array([0] * n, pa.int32()),
    ]
    if include_headers:
        columns.append(
            pa.array([[{"key": k, "value": v} for k, v in r.headers] for r in records], HEADER_TYPE)
        )
    return pa.RecordBatch.from_arrays(columns, schema=source_schema(include_headers))


def _binary(column: BinaryColumn, rows: int, kind: pa.DataType) -> pa.Array:
    validity = None if column.validity is None else pa.py_buffer(column.validity)
    return pa.Array.from_buffers(
        kind,
        rows,
        [validity, pa.py_buffer(column.offsets), pa.py_buffer(column.data)],
        null_count=column.nulls,
    )


def columns_to_batch(
    columns: RecordColumns, topic: str, partition: int, include_headers: bool
) -> pa.RecordBatch:
    """The same rows as records_to_batch, from decoded column buffers without a copy (Arrow
    wraps the buffers; only the timestamp column is scaled to microseconds)."""
    n = columns.rows
    millis = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(columns.timestamps)])
    arrays: list[Any] = [
        _binary(columns.keys, n, pa.binary()),
        _binary(columns.values, n, pa.binary()),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(columns.offsets)]),
        pc.multiply_checked(millis, 1000).cast(pa.timestamp("us", tz="UTC")),
        pa.repeat(pa.scalar(0, pa.int32()), n),
    ]
    if include_headers:
        assert columns.headers is not None
        h = columns.headers
        entries = int(memoryview(h.list_offsets).cast("i")[-1])
        struct = pa.StructArray.from_arrays(
            [_binary(h.keys, entries, pa.string()), _binary(h.values, entries, pa.binary())],
            fields=list(HEADER_TYPE.value_type),
        )
        arrays.append(
            pa.Array.from_buffers(
                HEADER_TYPE, n, [None, pa.py_buffer(h.list_offsets)], children=[struct]
            )
        )
    return pa.RecordBatch.from_arrays(arrays, schema=source_schema(include_headers))


def table_batch(
    entries: Sequence[tuple[bytes, bytes]], topic: str, partition: int
) -> pa.RecordBatch:
    n = len(entries)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([k for k, _ in entries], pa.binary()),
            pa.array([v for _, v in entries], pa.binary()),
            pa.array([topic] * n, pa.string()),
            pa.array([partition] * n, pa.int32()),
        ],
        schema=TABLE_SCHEMA,
    )
