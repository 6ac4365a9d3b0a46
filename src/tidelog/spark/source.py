"""The Spark data source "tidelog": batch and streaming readers (this module) and writers
(sink.py), registered with `spark.dataSource.register(TidelogDataSource)`.

Readers only ever plan ranges that end at a high-water mark, so a query never sees data that
could vanish; with the option isolationLevel=read_committed they end at the last stable offset
(LSO) instead, and records of aborted transactions are left out, so a query (and the cursor it
commits) never sees or passes an undecided transaction. With the option `cursor`, the query's progress is a durable tidelog cursor: it
holds retention for everything the query has not finished, and `tidelog cursors list` shows the
query's lag. Spark's checkpoint stays the source of truth for progress; the cursor trails it by
one micro-batch because Spark calls commit(end) only when it plans the next batch."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from tidelog.errors import CursorInvalidated, InvalidConfig, TidelogError, UnknownCursor
from tidelog.spark.arrow import (
    HEADERS_DDL,
    SOURCE_DDL,
    SOURCE_FIELDS,
    TABLE_DDL,
    TABLE_FIELDS,
    projection,
    table_batch,
)
from tidelog.spark.connection import client_of, with_retries
from tidelog.spark.options import SinkOptions, SourceOptions, offsets_from_json, offsets_to_json
from tidelog.spark.planning import (
    Offsets,
    archive_locations,
    high_watermarks,
    plan_tasks,
    rate_limit,
    resolve_offsets,
    topic_partitions,
)
from tidelog.spark.reading import read_ranges

log = logging.getLogger(__name__)


def declared_columns(schema: StructType, fields: dict[str, Any]) -> tuple[str, ...]:
    return projection(
        [(f.name, f.dataType.simpleString(), f.nullable) for f in schema.fields], fields
    )


def cursor_names(name: str, topics: list[str]) -> dict[str, str]:
    """A tidelog cursor covers one topic: a query over several gets NAME.TOPIC for each."""
    if len(topics) == 1:
        return {topics[0]: name}
    return {t: f"{name}.{t}" for t in topics}


class TidelogDataSource(DataSource):
    """spark.read/readStream/write/writeStream .format("tidelog")."""

    @classmethod
    def name(cls) -> str:
        return "tidelog"

    def schema(self) -> str:
        if self.options.get("table"):
            return TABLE_DDL
        include = str(self.options.get("includeHeaders", "false")).lower() == "true"
        return SOURCE_DDL + (HEADERS_DDL if include else "")

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = SourceOptions.parse(self.options, streaming=False)
        if opts.table:
            return TableReader(opts, declared_columns(schema, TABLE_FIELDS))
        return BatchReader(opts, declared_columns(schema, SOURCE_FIELDS))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(
            SourceOptions.parse(self.options, streaming=True),
            declared_columns(schema, SOURCE_FIELDS),
        )

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from tidelog.spark.sink import BatchWriter

        if overwrite:
            raise InvalidConfig("a log is append-only: use mode('append')", key="mode")
        return BatchWriter(SinkOptions.parse(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from tidelog.spark.sink import StreamWriter

        return StreamWriter(SinkOptions.parse(self.options), schema)


class BatchReader(DataSourceReader):
    """startingOffsets (default earliest) to endingOffsets (default latest = the HW now)."""

    def __init__(self, opts: SourceOptions, columns: tuple[str, ...]) -> None:
        self.opts = opts
        self.columns = columns

    def partitions(self) -> list[InputPartition]:
        client = client_of(self.opts)
        tps = topic_partitions(client, self.opts)
        level = self.opts.isolation_level
        start = resolve_offsets(
            client,
            tps,
            self.opts.starting_offsets,
            "startingOffsets",
            self.opts.starting_timestamp,
            level,
        )
        end = resolve_offsets(client, tps, self.opts.ending_offsets, "endingOffsets", None, level)
        hw = high_watermarks(client, tps, level)
        name = "LSO" if level == "read_committed" else "HW"
        above = [
            f"{t}/{p}: {end[(t, p)]} > {name} {hw[(t, p)]}"
            for t, p in tps
            if end[(t, p)] > hw[(t, p)]
        ]
        if above:
            raise InvalidConfig(
                "endingOffsets asks for records that are not committed yet ("
                + "; ".join(above)
                + ")",
                key="endingOffsets",
            )
        start = {tp: min(start[tp], end[tp]) for tp in tps}
        archives = archive_locations(client, self.opts, {t for t, _ in tps})
        tasks = plan_tasks(self.opts, start, end, self.columns, archives)
        return [InputPartition(t) for t in tasks]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from read_ranges(partition.value)


class TableReader(DataSourceReader):
    """A table topic's committed state: one task per partition, answered by its leader."""

    def __init__(self, opts: SourceOptions, columns: tuple[str, ...]) -> None:
        self.opts = opts
        self.columns = columns

    def partitions(self) -> list[InputPartition]:
        client = client_of(self.opts)
        info = with_retries("describe table", lambda: client.topic(self.opts.table, refresh=True))
        if info.kind != "table":
            raise InvalidConfig(
                f"topic {self.opts.table!r} is a {info.kind} topic, not a table", key="table"
            )
        return [InputPartition(p) for p in range(info.partitions)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        client = client_of(self.opts)
        p = int(partition.value)
        entries = client.table_scan(self.opts.table, [p], self.opts.consistency)
        if entries:
            yield table_batch(entries, self.opts.table, p, self.columns)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches end at each partition's HW (capped by maxOffsetsPerTrigger and, under
    Trigger.AvailableNow, by the HW when the run began). Holds no client: it is pickled."""

    def __init__(self, opts: SourceOptions, columns: tuple[str, ...]) -> None:
        self.opts = opts
        self.columns = columns
        self._initial: dict[str, Any] | None = None
        self._available_now: Offsets | None = None

    # -- driver side (one long-lived runner process per query run) ----------------------------

    def initialOffset(self) -> dict[str, Any]:
        # Spark asks twice on a fresh query; "latest" must answer the same both times.
        if self._initial is None:
            self._initial = offsets_to_json(self._starting_offsets())
        return self._initial

    def _starting_offsets(self) -> Offsets:
        client = client_of(self.opts)
        tps = topic_partitions(client, self.opts)
        if not self.opts.cursor:
            return resolve_offsets(
                client,
                tps,
                self.opts.starting_offsets,
                "startingOffsets",
                self.opts.starting_timestamp,
                self.opts.isolation_level,
            )
        start: Offsets = {}
        topics = sorted({t for t, _ in tps})
        for topic, name in cursor_names(self.opts.cursor, topics).items():
            mine = [tp for tp in tps if tp[0] == topic]
            existing = self._live_cursor(name)
            if existing is not None and not self.opts.starting_explicit:
                positions = {int(p): int(o) for p, o in existing["positions"].items()}
                start.update({tp: positions.get(tp[1], 0) for tp in mine})
                log.info("cursor %s: resuming at %s", name, positions)
                continue
            wanted = resolve_offsets(
                client,
                mine,
                self.opts.starting_offsets,
                "startingOffsets",
                self.opts.starting_timestamp,
                self.opts.isolation_level,
            )
            start.update(wanted)
            if existing is not None:
                self._commit_cursor(name, {p: o for (_, p), o in wanted.items()})
                continue
            with_retries(
                f"create cursor {name}",
                lambda name=name, topic=topic, wanted=wanted: client.create_cursor(  # type: ignore[misc]
                    name,
                    topic,
                    {p: o for (_, p), o in wanted.items()},
                    backup=self.opts.cursor_backup,
                    if_not_exists=True,
                ),
            )
        return start

    def _live_cursor(self, name: str) -> dict[str, Any] | None:
        client = client_of(self.opts)
        try:
            found = with_retries(f"describe cursor {name}", lambda: client.cursors(name))
        except UnknownCursor:
            return None
        cursor = found[0] if found else None
        if cursor is not None and cursor.get("invalidated"):
            log.warning(
                "cursor %s was invalidated (%s): recreating it; what it held may be gone",
                name,
                cursor["invalidated"],
            )
            with_retries(f"delete cursor {name}", lambda: client.delete_cursor(name))
            return None
        return cursor

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        client = client_of(self.opts)
        self._available_now = high_watermarks(
            client, topic_partitions(client, self.opts), self.opts.isolation_level
        )

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = offsets_from_json(start)
        try:
            latest = self._latest(begin)
        except TidelogError as exc:
            # An exception here ends the query at once; "no new data" lets the next trigger retry.
            log.warning("latestOffset: %s; trying again at the next trigger", exc)
            return start
        if isinstance(limit, ReadMaxRows):
            latest = rate_limit(begin, latest, limit.max_rows)
        return offsets_to_json(latest)

    def _latest(self, begin: Offsets) -> Offsets:
        client = client_of(self.opts)
        tps = topic_partitions(client, self.opts)
        # read_committed: the LSO, so a micro-batch (and the cursor it commits) never passes it
        hw = high_watermarks(client, tps, self.opts.isolation_level)
        if self._available_now is not None:
            hw = {tp: min(o, self._available_now.get(tp, o)) for tp, o in hw.items()}
        # A new leader may briefly report a lower HW; a batch never ends before it starts. A
        # partition that appeared after the query started is read from offset 0.
        return {tp: max(o, begin.get(tp, 0)) for tp, o in hw.items()}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        begin = offsets_from_json(start)
        finish = offsets_from_json(end)
        begin = {tp: begin.get(tp, 0) for tp in finish}
        archives = archive_locations(client_of(self.opts), self.opts, {t for t, _ in finish})
        tasks = plan_tasks(self.opts, begin, finish, self.columns, archives)
        return [InputPartition(t) for t in tasks]

    def commit(self, end: dict[str, Any]) -> None:
        if not self.opts.cursor:
            return
        done = offsets_from_json(end)
        topics = sorted({t for t, _ in done})
        for topic, name in cursor_names(self.opts.cursor, topics).items():
            self._commit_cursor(name, {p: o for (t, p), o in done.items() if t == topic})

    def _commit_cursor(self, name: str, positions: dict[int, int]) -> None:
        client = client_of(self.opts)
        try:
            with_retries(
                f"commit cursor {name}",
                # read_committed: the node checks that no position passes the LSO
                lambda: client.commit_cursor(name, positions, self.opts.isolation_level),
            )
        except CursorInvalidated as exc:
            log.error(
                "cursor %s no longer holds the log (%s); reads below the log start will follow "
                "failOnDataLoss",
                name,
                exc,
            )
        except TidelogError as exc:
            # The cursor is a hold and a lag gauge, not the query's progress (Spark's checkpoint
            # is): failing the query over it would be worse than a late commit.
            log.error("could not commit cursor %s: %s", name, exc)

    # -- executor side -------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from read_ranges(partition.value)
