"""The tidelog sink: exactly once through idempotent producers.

Every Spark task writes its rows itself, as an idempotent producer whose id is derived from the
query id (stable across restarts) and the task's partition, and whose (epoch, sequence) is
derived from the micro-batch id and the chunk's position. The log keeps each producer's highest
(epoch, sequence) on every replica and drops anything not above it, so a retried task, a replayed
micro-batch (Spark replays the last one after a driver crash, even after the sink's commit) and a
produce retried after a lost acknowledgement all land once.

Two things make that sound: a task's rows are put in a canonical order (so a replay cuts the same
chunks), and the log appends each producer's chunks in sequence order with no gap (a chunk whose
predecessor has not landed is refused with OutOfOrderSequence and sent again once it has), so the
log always holds a prefix of a task's chunks and a replay skips exactly that prefix. Several
chunks per partition are in flight at once (`maxInFlight`, 5 by default, as Kafka's producer)."""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
import zlib
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from tidelog.client.sync_client import Client
from tidelog.errors import InvalidConfig
from tidelog.record.batch import (
    COMPILED_CODEC,
    SEQUENCE_MAX,
    ProducerRecord,
    batch_from_section,
    build_batch,
)
from tidelog.spark.connection import client_of
from tidelog.spark.options import SinkOptions
from tidelog.storage.faults import crash_point

log = logging.getLogger(__name__)

EPOCH_BITS = 15  # a producer epoch is an int16: the batch id's low bits; the rest picks the id


def producer_id(*parts: object) -> int:
    """A stable, non-negative 63-bit id: the same query and task always get the same one."""
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & ((1 << 63) - 1)


def task_producer(kind: str, run: str, task: int, batch_id: int) -> tuple[int, int]:
    """(producer id, epoch) of one task of one micro-batch: the same on every attempt and replay
    of it. Each micro-batch is a new epoch of the task's producer (its chunks sequenced from 0,
    Kafka-style: a chunk's base sequence is the number of records before it); every 32,768
    micro-batches the task moves on to a new producer id."""
    if batch_id < 0:
        raise InvalidConfig(f"micro-batch id {batch_id} is negative")
    generation = batch_id >> EPOCH_BITS
    parts: tuple[object, ...] = (
        (kind, run, task) if generation == 0 else (kind, run, task, generation)
    )
    return producer_id(*parts), batch_id & ((1 << EPOCH_BITS) - 1)


@dataclass
class SinkCommit(WriterCommitMessage):
    records: int = 0
    duplicates: int = 0  # records the log already had (a retried task or a replayed batch)
    partitions: list[str] = field(default_factory=list)


def _binary(table: pa.Table, name: str) -> pa.ChunkedArray | None:
    if name not in table.column_names:
        return None
    column = table.column(name)
    if pa.types.is_binary(column.type):
        return column
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return pc.cast(column, pa.binary())
    if pa.types.is_large_binary(column.type):
        return pc.cast(column, pa.binary())
    raise InvalidConfig(
        f"sink column {name!r} must be binary or string, not {column.type}", key=name
    )


def _headers(table: pa.Table) -> list[tuple[tuple[str, bytes | None], ...]] | None:
    if "headers" not in table.column_names:
        return None
    out: list[tuple[tuple[str, bytes | None], ...]] = []
    for value in table.column("headers").to_pylist():
        out.append(tuple((h["key"], h["value"]) for h in value or ()))
    return out


class _Rows:
    """A task's rows as Arrow columns. Python values are made only where a rule reads them:
    keys (partitioning and key order), values only for rows without a key or for a key group
    larger than a chunk, headers only when there is a headers column."""

    def __init__(self, table: pa.Table) -> None:
        values = _binary(table, "value")
        if values is None:
            raise InvalidConfig("the tidelog sink needs a 'value' column", key="value")
        keys = _binary(table, "key")
        self.n = table.num_rows
        self.values = _flat(values)
        self.keys = _flat(keys) if keys is not None else None
        self.key_list: list[bytes | None] = (
            self.keys.to_pylist() if self.keys is not None else [None] * self.n
        )
        self.headers = _headers(table)
        self._value_list: list[bytes | None] | None = None

    def value(self, i: int) -> bytes | None:
        if self._value_list is None:
            self._value_list = self.values.to_pylist()
        return self._value_list[i]

    def order(self, i: int) -> tuple[bytes, str]:
        return self.value(i) or b"", repr(self.headers[i] if self.headers is not None else ())

    def encode(self, rows: list[int], pid: int, epoch: int, sequence: int) -> bytes:
        """The rows as one batch of this producer; from the Arrow buffers in C when there are
        no headers (the same bytes build_batch makes of the same records)."""
        if self.headers is not None or COMPILED_CODEC is None:
            records = [
                ProducerRecord(
                    self.key_list[i],
                    self.value(i),
                    self.headers[i] if self.headers is not None else (),
                )
                for i in rows
            ]
            return build_batch(
                records, producer_id=pid, producer_epoch=epoch, base_sequence=sequence
            )
        key_offsets: Any = None
        key_data: Any = None
        key_validity: Any = None
        if self.keys is not None:
            key_validity, key_offsets, key_data = self.keys.buffers()
        validity, offsets, data = self.values.buffers()
        section = COMPILED_CODEC.encode_rows(
            array("q", rows).tobytes(),
            key_offsets,
            key_data if key_data is not None else b"",
            key_validity,
            offsets,
            data if data is not None else b"",
            validity,
        )
        now = int(time.time() * 1000)
        return batch_from_section(
            section,
            len(rows),
            now,
            now,
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=sequence,
        )


def _flat(column: pa.ChunkedArray) -> pa.Array:
    """One chunk starting at offset 0 (what the C encoder indexes)."""
    array_ = column.combine_chunks()
    if array_.offset:
        array_ = pa.concat_arrays([pa.array([], array_.type), array_])
    return array_


def write_rows(
    client: Client, opts: SinkOptions, table: pa.Table, pid: int, epoch: int
) -> SinkCommit:
    """Write one task's rows (exactly once for this producer id and epoch)."""
    if table.num_rows == 0:
        return SinkCommit()
    rows = _Rows(table)
    n = rows.n
    topics: list[str | None] = (
        table.column("topic").to_pylist() if "topic" in table.column_names else [None] * n
    )
    fixed: list[int | None] = (
        table.column("partition").to_pylist() if "partition" in table.column_names else [None] * n
    )
    groups: dict[tuple[str, int], list[int]] = {}
    partition_counts: dict[str, int] = {}
    key_list = rows.key_list
    for i in range(n):
        topic = topics[i] or opts.topic
        if not topic:
            raise InvalidConfig(
                "a row has no topic: give the sink option 'topic' or a 'topic' column", key="topic"
            )
        count = partition_counts.get(topic)
        if count is None:
            count = partition_counts[topic] = client.topic(topic).partitions
        partition = fixed[i]
        if partition is None:
            # The same rule as the client and table topics: crc32 of the key (of the value
            # when there is no key, so that a replay picks the same partition).
            key = key_list[i]
            partition = zlib.crc32(key if key is not None else rows.value(i) or b"") % count
        elif not 0 <= partition < count:
            raise InvalidConfig(
                f"partition {partition} out of range for {topic!r} ({count})", key="partition"
            )
        groups.setdefault((topic, partition), []).append(i)
    encoded: dict[tuple[str, int], list[bytes]] = {}
    sizes: dict[tuple[str, int], list[int]] = {}
    for target, indices in sorted(groups.items()):
        sequence = 0
        for chunk in chunk_rows(indices, opts.chunk_records, key_list.__getitem__, rows.order):
            if sequence + len(chunk) > SEQUENCE_MAX:
                raise InvalidConfig(
                    f"a task wrote more than {SEQUENCE_MAX} rows to {target[0]}/{target[1]} in one "
                    "micro-batch; use more tasks (repartition)"
                )
            encoded.setdefault(target, []).append(rows.encode(chunk, pid, epoch, sequence))
            sizes.setdefault(target, []).append(len(chunk))
            sequence += len(chunk)
    result = SinkCommit()
    produced_all = client.produce_pipelined(encoded, acks="all", in_flight=opts.max_in_flight)
    for target, produced in produced_all.items():
        for count, answer in zip(sizes[target], produced, strict=True):
            result.records += count
            if answer is not None and answer.duplicate:
                result.duplicates += count
        result.partitions.append(f"{target[0]}/{target[1]}")
    return result


def chunk_rows(
    rows: list[int],
    size: int,
    key_of: Callable[[int], bytes | None],
    order_of: Callable[[int], Any],
) -> list[list[int]]:
    """Cut a task's rows for one partition into chunks that a replay cuts the same way even if
    Spark hands it the rows in another order. Rows are grouped by key, groups in key order,
    rows of a key in the order they came (so the last update of a key stays last, as users of
    Kafka's sink expect); rows without a key have no order to keep and are put in value order.
    A chunk holds whole key groups (which rows a chunk holds then depends only on the keys), and
    a key group too large for one chunk is put in value order before it is cut."""
    by_key: dict[bytes | None, list[int]] = {}
    for i in rows:
        by_key.setdefault(key_of(i), []).append(i)
    ordered = [by_key[k] for k in sorted(k for k in by_key if k is not None)]
    if None in by_key:
        ordered.append(sorted(by_key[None], key=order_of))
    chunks: list[list[int]] = []
    current: list[int] = []
    for group in ordered:
        if len(group) > size:
            if current:
                chunks.append(current)
                current = []
            group = sorted(group, key=order_of)
            chunks.extend(group[i : i + size] for i in range(0, len(group), size))
            continue
        if current and len(current) + len(group) > size:
            chunks.append(current)
            current = []
        current.extend(group)
    if current:
        chunks.append(current)
    return chunks


def replayable_chunks(records: list[ProducerRecord], size: int) -> list[list[ProducerRecord]]:
    """chunk_rows over records (the rule the sink applies to its rows, for tests and tools)."""
    chunks = chunk_rows(
        list(range(len(records))),
        size,
        lambda i: records[i].key,
        lambda i: (records[i].value or b"", repr(records[i].headers)),
    )
    return [[records[i] for i in chunk] for chunk in chunks]


def _table(iterator: Iterator[pa.RecordBatch]) -> pa.Table:
    batches = list(iterator)
    return pa.Table.from_batches(batches) if batches else pa.table({})


class StreamWriter(DataSourceStreamArrowWriter):
    """A new instance per micro-batch (pickled to the tasks); commit runs in another process."""

    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        table = _table(iterator)
        context = TaskContext.get()
        query_id = context.getLocalProperty("sql.streaming.queryId") if context else None
        batch = context.getLocalProperty("streaming.sql.batchId") if context else None
        if context is None or query_id is None or batch is None:
            raise InvalidConfig("the streaming sink runs only inside a Spark streaming task")
        pid, epoch = task_producer("stream", query_id, context.partitionId(), int(batch))
        return write_rows(client_of(self.opts), self.opts, table, pid, epoch)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        done = [m for m in messages if isinstance(m, SinkCommit)]
        records = sum(m.records for m in done)
        duplicates = sum(m.duplicates for m in done)
        if duplicates:
            log.warning(
                "batch %d: %d records, %d were already in the log (a replay)",
                batchId,
                records,
                duplicates,
            )
        # For the exactly-once test: die (with the JVM) after the batch is in the log but before
        # Spark records it in its checkpoint, so that Spark replays a batch the sink has written.
        crash_point(f"spark-sink-commit:{batchId}")

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Whatever the batch wrote stays; Spark replays the batch and the replay writes only the
        # rest (the log drops what it already has).
        log.warning("batch %d aborted; it will be replayed when the query restarts", batchId)


class BatchWriter(DataSourceArrowWriter):
    """df.write: made once per write job and pickled to every task, so the job id it draws here
    is the same for every attempt of a task, and a retried task lands once."""

    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        self.opts = opts
        self.job = uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        table = _table(iterator)
        context = TaskContext.get()
        task = context.partitionId() if context else 0
        pid, epoch = task_producer("batch", self.job, task, 0)
        return write_rows(client_of(self.opts), self.opts, table, pid, epoch)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        return None

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning("write job %s aborted; records written by finished tasks stay", self.job)
