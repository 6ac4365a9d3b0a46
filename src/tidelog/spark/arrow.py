"""Records to Arrow record batches whose schema matches the declared Spark schema exactly
(nullable fields, timestamp('us', tz='UTC'), binary not large_binary), as PySpark requires."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tidelog.errors import InvalidConfig
from tidelog.invariant import InvariantBroken
from tidelog.record.batch import Record
from tidelog.record.columns import BinaryColumn, RecordColumns

SOURCE_DDL = (
    "key binary, value binary, topic string, partition int, offset bigint, "
    "timestamp timestamp, timestampType int"
)
HEADERS_DDL = ", headers array<struct<key:string,value:binary>>"
TABLE_DDL = "key binary, value binary, topic string, partition int"

HEADER_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))


# Every column the source can return, in the default schema's order, with its Spark type.
SOURCE_FIELDS: dict[str, tuple[pa.DataType, str]] = {
    "key": (pa.binary(), "binary"),
    "value": (pa.binary(), "binary"),
    "topic": (pa.string(), "string"),
    "partition": (pa.int32(), "int"),
    "offset": (pa.int64(), "bigint"),
    "timestamp": (pa.timestamp("us", tz="UTC"), "timestamp"),
    "timestampType": (pa.int32(), "int"),
    "headers": (HEADER_TYPE, "array<struct<key:string,value:binary>>"),
}
TABLE_FIELDS = {name: SOURCE_FIELDS[name] for name in ("key", "value", "topic", "partition")}


def default_columns(include_headers: bool) -> tuple[str, ...]:
    names = tuple(SOURCE_FIELDS)
    return names if include_headers else names[:-1]


@functools.lru_cache(maxsize=64)
def arrow_schema(columns: tuple[str, ...]) -> pa.Schema:
    return pa.schema([pa.field(name, SOURCE_FIELDS[name][0]) for name in columns])


def source_schema(include_headers: bool) -> pa.Schema:
    return arrow_schema(default_columns(include_headers))


def projection(
    declared: Sequence[tuple[str, str, bool]], fields: dict[str, tuple[pa.DataType, str]]
) -> tuple[str, ...]:
    """The columns a user-declared schema asks for: `spark.read.format("tidelog").schema("key
    binary, value binary")` reads only those (PySpark gives Python sources no column pruning,
    and every column a source returns costs Spark a conversion per row). Each declared field is
    (name, Spark type as simpleString, nullable) and must be one of the source's columns with
    its type (names as the default schema spells them)."""
    out: list[str] = []
    for column, kind, nullable in declared:
        if column not in fields:
            raise InvalidConfig(
                f"the declared schema has a column {column!r}, which the tidelog source does not "
                f"have (it has {', '.join(fields)})",
                key="schema",
            )
        if kind != fields[column][1]:
            raise InvalidConfig(
                f"the declared schema gives column {column!r} type {kind}; the tidelog source's "
                f"{column} is {fields[column][1]}",
                key="schema",
            )
        if not nullable:
            raise InvalidConfig(
                f"the declared schema makes column {column!r} NOT NULL; the tidelog source's "
                "columns are nullable",
                key="schema",
            )
        if column in out:
            raise InvalidConfig(f"the declared schema names {column!r} twice", key="schema")
        out.append(column)
    if not out:
        raise InvalidConfig("the declared schema has no columns", key="schema")
    return tuple(out)


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
    columns: RecordColumns,
    topic: str,
    partition: int,
    include_headers: bool,
    select: tuple[str, ...] = (),
) -> pa.RecordBatch:
    """The same rows as records_to_batch, from decoded column buffers without a copy (Arrow
    wraps the buffers; only the timestamp column is scaled to microseconds). With select, only
    those columns, in that order."""
    n = columns.rows
    select = select or default_columns(include_headers)

    def timestamps() -> pa.Array:
        millis = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(columns.timestamps)])
        return pc.multiply_checked(millis, 1000).cast(pa.timestamp("us", tz="UTC"))

    def headers() -> pa.Array:
        if columns.headers is None:
            raise InvariantBroken("headers were not decoded")
        h = columns.headers
        entries = int(memoryview(h.list_offsets).cast("i")[-1])
        struct = pa.StructArray.from_arrays(
            [_binary(h.keys, entries, pa.string()), _binary(h.values, entries, pa.binary())],
            fields=list(HEADER_TYPE.value_type),
        )
        return pa.Array.from_buffers(
            HEADER_TYPE, n, [None, pa.py_buffer(h.list_offsets)], children=[struct]
        )

    build: dict[str, Callable[[], pa.Array]] = {
        "key": lambda: _binary(columns.keys, n, pa.binary()),
        "value": lambda: _binary(columns.values, n, pa.binary()),
        "topic": lambda: pa.repeat(pa.scalar(topic, pa.string()), n),
        "partition": lambda: pa.repeat(pa.scalar(partition, pa.int32()), n),
        "offset": lambda: pa.Array.from_buffers(
            pa.int64(), n, [None, pa.py_buffer(columns.offsets)]
        ),
        "timestamp": timestamps,
        "timestampType": lambda: pa.repeat(pa.scalar(0, pa.int32()), n),
        "headers": headers,
    }
    return pa.RecordBatch.from_arrays([build[c]() for c in select], schema=arrow_schema(select))


def table_batch(
    entries: Sequence[tuple[bytes, bytes]], topic: str, partition: int, select: tuple[str, ...] = ()
) -> pa.RecordBatch:
    n = len(entries)
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array([k for k, _ in entries], pa.binary()),
            pa.array([v for _, v in entries], pa.binary()),
            pa.array([topic] * n, pa.string()),
            pa.array([partition] * n, pa.int32()),
        ],
        schema=TABLE_SCHEMA,
    )
    return batch.select(list(select)) if select else batch
