"""A Spark driver for test_spark_cluster: copies topic IN to topic OUT through the tidelog
sink (Trigger.AvailableNow, 400 records per micro-batch) on the Spark named by its first
argument (spark://... a standalone cluster, sc://... a Spark Connect server), restarting from
its checkpoint. Prints "done" when the copy has finished."""

from __future__ import annotations

import os
import sys

from tidelog.spark.session import spark_session


def main() -> None:
    master, bootstrap, checkpoint, source, sink = sys.argv[1:6]
    os.environ.setdefault("TIDELOG_CRASH_GROUP", str(os.getpgrp()))
    spark = spark_session("tidelog-copy", master)
    query = (
        spark.readStream.format("tidelog")
        .option("bootstrap", bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "400")
        .load()
        .select("key", "value")
        .writeStream.format("tidelog")
        .option("bootstrap", bootstrap)
        .option("topic", sink)
        .option("chunkRecords", "50")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    print(f"done after batch {query.lastProgress['batchId']}", flush=True)


if __name__ == "__main__":
    main()
