"""The demo's Spark job: views per page per one-minute event-time window, with a watermark.

Two streaming queries read the `events` topic, each with its own tidelog cursor (so retention
keeps whatever they have not finished):
- `page-counts`: into the `page_counts` table topic (key "page|window start", value the count)
  through the exactly-once tidelog sink;
- `page-counts-parquet`: into Parquet (Spark's file sink, exactly once by its own log).
Both run in append mode: a window's count is written once, when the watermark has passed the
window's end (Python data source sinks take append mode only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

WINDOW = "1 minute"
WATERMARK_DELAY = "1 minute"  # of event time: the demo runs it 4x faster than the clock
EVENT_SCHEMA = "page string, user string, ts bigint"
WATERMARK_PAGE = "__watermark__"
TABLE_CURSOR = "page-counts"
PARQUET_CURSOR = "page-counts-parquet"


def windowed_counts(spark: Any, bootstrap: str, topic: str, cursor: str) -> Any:
    from pyspark.sql import functions as F

    events = (
        spark.readStream.format("tidelog")
        .option("bootstrap", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("cursor", cursor)
        .load()
        .select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e"))
        .select("e.page", F.timestamp_millis("e.ts").alias("event_time"))
        .withWatermark("event_time", WATERMARK_DELAY)
    )
    # No filter for the end-of-stream marker: Spark would push it below the watermark, which
    # must see the marker. Its window is the newest and never closes, so it is never written.
    return events.groupBy(F.window("event_time", WINDOW), "page").count()


def key_column(counts: Any) -> Any:
    from pyspark.sql import functions as F

    return F.concat_ws(
        "|", F.col("page"), F.date_format(F.col("window.start"), "yyyy-MM-dd'T'HH:mm")
    )


def start_queries(
    spark: Any, bootstrap: str, work: Path, topic: str = "events", table: str = "page_counts"
) -> tuple[Any, Any]:
    from pyspark.sql import functions as F

    table_counts = windowed_counts(spark, bootstrap, topic, TABLE_CURSOR)
    to_table = (
        table_counts.select(
            key_column(table_counts).alias("key"), F.col("count").cast("string").alias("value")
        )
        .writeStream.format("tidelog")
        .option("bootstrap", bootstrap)
        .option("topic", table)
        .option("checkpointLocation", str(work / "checkpoints" / "page_counts"))
        .outputMode("append")
        .queryName("page_counts")
        .trigger(processingTime="2 seconds")
        .start()
    )
    file_counts = windowed_counts(spark, bootstrap, topic, PARQUET_CURSOR)
    to_parquet = (
        file_counts.select(
            key_column(file_counts).alias("key"),
            F.col("page"),
            F.col("window.start").alias("window_start"),
            F.col("count"),
        )
        .writeStream.format("parquet")
        .option("path", str(work / "parquet"))
        .option("checkpointLocation", str(work / "checkpoints" / "parquet"))
        .outputMode("append")
        .queryName("page_counts_parquet")
        .trigger(processingTime="2 seconds")
        .start()
    )
    return to_table, to_parquet


def parquet_counts(spark: Any, work: Path) -> dict[str, int]:
    path = work / "parquet"
    if not any(path.glob("*.parquet")):
        return {}
    from pyspark.errors import AnalysisException

    try:
        rows = spark.read.parquet(str(path)).select("key", "count").collect()
    except AnalysisException:  # files written but no batch committed in the sink's log yet
        return {}
    out: dict[str, int] = {}
    for row in rows:
        # A window appears once in append mode; a second row would be a duplicate write.
        out[row["key"]] = out.get(row["key"], 0) + int(row["count"])
    return out
