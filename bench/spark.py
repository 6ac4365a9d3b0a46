"""The Spark source and sink, measured against Spark itself in the same run.

    .venv/bin/python bench/spark.py [--records 200000] [--latency-seconds 30] [--random-values]
        [--compression none|gzip|snappy|lz4|zstd]

1. Source: N committed 1 KiB records (100 keys) in a 3-partition topic on a 3-node cluster;
   Spark reads them through the tidelog source (2 tasks: maxPartitions=2) and aggregates by key
   (count, sum of value lengths), with the default schema and with the two columns the query
   uses declared (PySpark prunes no columns for Python sources; Parquet reads only those two);
   then the same rows, written once as Parquet, get the same aggregation. Best of 3.
   --compression: the source topic's batches are compressed by the producer with that codec
   (Parquet's files are snappy-compressed, its default), decompressed by the source's reader.
2. Sink: the same N rows from Parquet written with df.write.format("tidelog") (acks=all,
   idempotent, 5 chunks in flight per partition; best of 3, each into a new topic), against the
   plain client producing the same rows in batches of 1,000 from one process (acks=all).
3. Micro-batch latency: a streaming query copies topic `lat_in` to `lat_out` through the
   tidelog sink (default trigger: as fast as possible); a record is produced every 100 ms with
   acks=all (so the HW has passed it when the ack arrives), and a reader long-polls `lat_out`:
   latency = ack of the input record -> the output record readable (committed) in the sink.
"""

from __future__ import annotations

import argparse
import os
import shutil
import threading
import time
from typing import Any

from common import median, percentile, print_table, scratch_dir
from tidelog.cli.cluster import LocalCluster
from tidelog.client.sync_client import Client
from tidelog.record import ProducerRecord, build_batch
from tidelog.record.compression import CODEC_NAMES
from tidelog.spark.session import local_spark

KEYS = 100


def fill(
    client: Client, topic: str, records: int, random_values: bool = False, compression: int = 0
) -> float:
    payload = b"x" * 1000
    started = time.perf_counter()
    for lo in range(0, records, 1000):
        p = (lo // 1000) % 3
        batch = build_batch(
            [
                ProducerRecord(
                    b"key-%03d" % ((lo + i) % KEYS),
                    (os.urandom(1000) if random_values else payload) + b"%08d" % (lo + i),
                )
                for i in range(1000)
            ],
            compression=compression,
        )
        client.produce_batch(topic, p, batch, acks="all")
    return records / (time.perf_counter() - started)


def aggregate(df: Any) -> list[Any]:
    from pyspark.sql import functions as F

    return (
        df.groupBy("key")
        .agg(F.count("*").alias("n"), F.sum(F.length("value")).alias("b"))
        .collect()
    )


def best_of(runs: int, action: Any) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        action()
        times.append(time.perf_counter() - t0)
    return min(times)


def latency(
    spark: Any, cluster: LocalCluster, client: Client, work: Any, seconds: float
) -> list[float]:
    client.create_topic("lat_in", partitions=1, replication_factor=3)
    client.create_topic("lat_out", partitions=1, replication_factor=3)
    q = (
        spark.readStream.format("tidelog")
        .option("bootstrap", cluster.bootstrap)
        .option("subscribe", "lat_in")
        .option("startingOffsets", "earliest")
        .load()
        .select("key", "value")
        .writeStream.format("tidelog")
        .option("bootstrap", cluster.bootstrap)
        .option("topic", "lat_out")
        .option("checkpointLocation", str(work / "lat-ck"))
        .start()
    )
    acked: dict[bytes, float] = {}
    seen: dict[bytes, float] = {}
    done = threading.Event()

    def watch() -> None:
        with Client(cluster.bootstrap) as reader:
            offset = 0
            while not done.is_set():
                result = reader.fetch("lat_out", 0, offset, max_wait_ms=50)
                now = time.perf_counter()
                for rec in result.records:
                    seen.setdefault(rec.value or b"", now)
                offset = result.next_offset

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    time.sleep(8)  # the first micro-batch pays for starting Python workers
    deadline = time.perf_counter() + seconds
    i = 0
    while time.perf_counter() < deadline:
        value = b"probe-%d" % i
        client.produce("lat_in", [ProducerRecord(None, value)], partition=0, acks="all")
        acked[value] = time.perf_counter()
        i += 1
        time.sleep(0.1)
    time.sleep(5)
    done.set()
    q.stop()
    return [seen[v] - t for v, t in acked.items() if v in seen]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--latency-seconds", type=float, default=30.0)
    parser.add_argument(
        "--random-values",
        action="store_true",
        help="incompressible values (Parquet cannot shrink them) instead of repeated bytes",
    )
    parser.add_argument(
        "--compression",
        choices=sorted(CODEC_NAMES.values()),
        default="none",
        help="the producer's codec for the source topic's batches (Parquet compresses with "
        "snappy by default; a Kafka user with compressible values sets one too)",
    )
    args = parser.parse_args()
    codec = {name: code for code, name in CODEC_NAMES.items()}[args.compression]
    work = scratch_dir("spark-")
    n = args.records
    try:
        with (
            LocalCluster(work / "cluster", 3, log_level="WARNING") as cluster,
            Client(cluster.bootstrap) as client,
        ):
            client.create_topic("src", partitions=3, replication_factor=3)
            client.create_topic("dst_client", partitions=3, replication_factor=3)
            fill_rate = fill(client, "src", n, args.random_values, codec)
            spark = local_spark("tidelog-bench")
            # local[2]: two tasks (maxPartitions), as Spark packs Parquet files into two splits.
            source = (
                spark.read.format("tidelog")
                .option("bootstrap", cluster.bootstrap)
                .option("subscribe", "src")
                .option("maxPartitions", "2")
                .load()
            )
            rows = aggregate(source)
            assert sum(r["n"] for r in rows) == n, "the source did not read every record"
            source_s = best_of(3, lambda: aggregate(source))
            # The columns the query uses, declared: what Parquet's column pruning reads.
            declared = (
                spark.read.format("tidelog")
                .schema("key binary, value binary")
                .option("bootstrap", cluster.bootstrap)
                .option("subscribe", "src")
                .option("maxPartitions", "2")
                .load()
            )
            declared_s = best_of(3, lambda: aggregate(declared))
            source.select("key", "value").write.parquet(str(work / "parquet"))
            parquet = spark.read.parquet(str(work / "parquet"))
            parquet_s = best_of(3, lambda: aggregate(parquet))

            sink_times = []
            for run in range(3):  # best of 3, like the source (the first pays for workers)
                topic = f"dst{run}"
                client.create_topic(topic, partitions=3, replication_factor=3)
                t0 = time.perf_counter()
                parquet.write.format("tidelog").option("bootstrap", cluster.bootstrap).option(
                    "topic", topic
                ).mode("append").save()
                sink_times.append(time.perf_counter() - t0)
                written = sum(client.list_offsets(topic, p) for p in range(3))
                assert written == n, f"the sink wrote {written} of {n}"
            sink_s = min(sink_times)
            client_rate = fill(client, "dst_client", n)

            lat = latency(spark, cluster, client, work, args.latency_seconds)
            spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    kind = "random" if args.random_values else "repeated-byte"
    print(
        f"\n{n:,} records of 1 KiB ({kind} values, source batches {args.compression}), "
        "3 partitions, RF 3, local[2]; best of 3\n"
    )
    print_table(
        ["what", "seconds", "records/s", "MB/s", "ratio"],
        [
            [
                "source: tidelog -> groupBy(key)",
                source_s,
                n / source_s,
                n * 1.03 / source_s / 1e3,
                parquet_s / source_s,
            ],
            [
                "source, schema declared as key, value",
                declared_s,
                n / declared_s,
                n * 1.03 / declared_s / 1e3,
                parquet_s / declared_s,
            ],
            [
                "same rows as Parquet -> groupBy(key)",
                parquet_s,
                n / parquet_s,
                n * 1.03 / parquet_s / 1e3,
                1.0,
            ],
            [
                "sink: Parquet -> tidelog (acks=all)",
                sink_s,
                n / sink_s,
                n * 1.03 / sink_s / 1e3,
                n / sink_s / client_rate,
            ],
            [
                "client producer, batches of 1000 (acks=all)",
                n / client_rate,
                client_rate,
                client_rate * 1.03e-3,
                1.0,
            ],
        ],
    )
    print("\nratio: source vs Parquet (records/s), sink vs the client producer\n")
    ms = [x * 1000 for x in lat]
    print_table(
        [
            "micro-batch latency (input acked -> output committed)",
            "samples",
            "p50 ms",
            "p99 ms",
            "max ms",
        ],
        [
            [
                "tidelog -> Spark -> tidelog, default trigger",
                len(ms),
                median(ms),
                percentile(ms, 99),
                max(ms) if ms else 0.0,
            ]
        ],
    )
    print(f"\n(input filled at {fill_rate:,.0f} records/s)")


if __name__ == "__main__":
    main()
