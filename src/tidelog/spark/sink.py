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
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

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
from tidelog.record.batch import SEQUENCE_MAX, ProducerRecord, build_batch
from tidelog.spark.connection import client_for
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


def write_rows(
    client: Client, opts: SinkOptions, table: pa.Table, pid: int, epoch: int
) -> SinkCommit:
    """Write one task's rows (exactly once for this producer id and epoch)."""
    if table.num_rows == 0:
        return SinkCommit()
    values = _binary(table, "value")
    if values is None:
        raise InvalidConfig("the tidelog sink needs a 'value' column", key="value")
    keys = _binary(table, "key")
    n = table.num_rows
    key_list: list[bytes | None] = keys.to_pylist() if keys is not None else [None] * n
    value_list: list[bytes | None] = values.to_pylist()
    header_list = _headers(table)
    topics: list[str | None] = (
        table.column("topic").to_pylist() if "topic" in table.column_names else [None] * n
    )
    fixed: list[int | None] = (
        table.column("partition").to_pylist() if "partition" in table.column_names else [None] * n
    )
    groups: dict[tuple[str, int], list[ProducerRecord]] = {}
    partition_counts: dict[str, int] = {}
    for i in range(n):
        topic = topics[i] or opts.topic
        if not topic:
            raise InvalidConfig(
                "a row has no topic: give the sink option 'topic' or a 'topic' column", key="topic"
            )
        count = partition_counts.get(topic)
        if count is None:
            count = partition_counts[topic] = client.topic(topic).partitions
        key, value = key_list[i], value_list[i]
        partition = fixed[i]
        if partition is None:
            # The same rule as the client and table topics: crc32 of the key (of the value
            # when there is no key, so that a replay picks the same partition).
            partition = zlib.crc32(key if key is not None else value or b"") % count
        elif not 0 <= partition < count:
            raise InvalidConfig(
                f"partition {partition} out of range for {topic!r} ({count})", key="partition"
            )
        headers = header_list[i] if header_list is not None else ()
        groups.setdefault((topic, partition), []).append(ProducerRecord(key, value, headers))
    encoded: dict[tuple[str, int], list[bytes]] = {}
    sizes: dict[tuple[str, int], list[int]] = {}
    for target, records in sorted(groups.items()):
        sequence = 0
        for rows in replayable_chunks(records, opts.chunk_records):
            if sequence + len(rows) > SEQUENCE_MAX:
                raise InvalidConfig(
                    f"a task wrote more than {SEQUENCE_MAX} rows to {target[0]}/{target[1]} in one "
                    "micro-batch; use more tasks (repartition)"
                )
            encoded.setdefault(target, []).append(
                build_batch(rows, producer_id=pid, producer_epoch=epoch, base_sequence=sequence)
            )
            sizes.setdefault(target, []).append(len(rows))
            sequence += len(rows)
    result = SinkCommit()
    produced_all = client.produce_pipelined(encoded, acks="all", in_flight=opts.max_in_flight)
    for target, produced in produced_all.items():
        for count, answer in zip(sizes[target], produced, strict=True):
            result.records += count
            if answer is not None and answer.duplicate:
                result.duplicates += count
        result.partitions.append(f"{target[0]}/{target[1]}")
    return result


def _by_key(records: list[ProducerRecord]) -> list[list[ProducerRecord]]:
    """Rows grouped by key, groups in key order, rows of a key in the order they came (so the
    last update of a key stays last, as users of Kafka's sink expect). Rows without a key have
    no order to keep: they are sorted by value."""
    groups: dict[bytes | None, list[ProducerRecord]] = {}
    for record in records:
        groups.setdefault(record.key, []).append(record)
    out = [groups[k] for k in sorted(k for k in groups if k is not None)]
    if None in groups:
        out.append(sorted(groups[None], key=lambda r: (r.value or b"", repr(r.headers))))
    return out


def replayable_chunks(records: list[ProducerRecord], size: int) -> list[list[ProducerRecord]]:
    """Cut a task's rows for one partition into chunks that a replay cuts the same way even if
    Spark hands it the rows in another order: a chunk holds whole key groups (which rows a chunk
    holds then depends only on the keys), and a key group too large for one chunk is put in
    value order before it is cut."""
    chunks: list[list[ProducerRecord]] = []
    current: list[ProducerRecord] = []
    for group in _by_key(records):
        if len(group) > size:
            if current:
                chunks.append(current)
                current = []
            ordered = sorted(group, key=lambda r: (r.value or b"", repr(r.headers)))
            chunks.extend(ordered[i : i + size] for i in range(0, len(ordered), size))
            continue
        if current and len(current) + len(group) > size:
            chunks.append(current)
            current = []
        current.extend(group)
    if current:
        chunks.append(current)
    return chunks


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
        return write_rows(client_for(self.opts.bootstrap), self.opts, table, pid, epoch)

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
        return write_rows(client_for(self.opts.bootstrap), self.opts, table, pid, epoch)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        return None

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning("write job %s aborted; records written by finished tasks stay", self.job)
