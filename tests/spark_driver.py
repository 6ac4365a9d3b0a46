"""A Spark driver for test_spark's kill test, run as its own process (so that it can be
SIGKILLed): two streaming queries over topic IN, one copying its rows to topic OUT through the
tidelog sink, one writing them (with partition and offset) to Parquet. Both restart from their
checkpoints. Prints one line per finished micro-batch."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from tidelog.spark.session import local_spark


def main() -> None:
    bootstrap, work, source, sink = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    os.environ["TIDELOG_CRASH_GROUP"] = str(os.getpgrp())  # a crash point takes us all down
    spark = local_spark("tidelog-test-driver", master="local[2]")
    stream = (
        spark.readStream.format("tidelog")
        .option("bootstrap", bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "1500")
        .load()
    )
    to_log = (
        stream.select("key", "value")
        .writeStream.format("tidelog")
        .option("bootstrap", bootstrap)
        .option("topic", sink)
        .option("checkpointLocation", str(work / "ck-log"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    to_files = (
        stream.select("partition", "offset", "value")
        .writeStream.format("parquet")
        .option("path", str(work / "parquet"))
        .option("checkpointLocation", str(work / "ck-parquet"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    seen: dict[str, int] = {}
    while True:
        for q in (to_log, to_files):
            if not q.isActive:
                print(f"query stopped: {q.exception()}", flush=True)
                sys.exit(3)
            progress = q.lastProgress
            if progress and progress["batchId"] != seen.get(q.id):
                seen[q.id] = progress["batchId"]
                print(
                    f"batch {q.id[:8]} {progress['batchId']} rows {progress['numInputRows']}",
                    flush=True,
                )
        time.sleep(0.2)


if __name__ == "__main__":
    main()
