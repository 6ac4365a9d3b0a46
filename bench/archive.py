"""The archive, measured against what it keeps up with and what it stands in for, in one run.

    .venv/bin/python bench/archive.py [--seconds 10] [--records 200000] [--s3]

1. Upload vs produce: a one-node cluster with a file:// archive (--s3: moto's S3 server as well,
   through the same obstore code as real S3); 8 producers write 1 KiB records in batches of 100
   (acks=1, fsync) for --seconds into an archived topic (segment.bytes 8 MiB, local.retention
   .bytes 32 MiB) and, before it, into a topic without an archive. Upload rate = bytes archived
   from the first produce until the archive holds every closed segment, over that time; the ratio
   is upload MB/s / produce MB/s (>= 1: the archive keeps up), and archived produce / plain
   produce says what archiving costs the producers.
2. Tiered read vs local read: --records committed 1 KiB records, read from offset 0 with the
   client's pipelined consumer (fetch + CRC + decode) once from the archive (local copies
   deleted) and once from a topic that still holds them locally.
3. Spark over the archive vs Parquet: the same rows, groupBy(key) through the tidelog source (the
   executors read the archive straight from the store; 2 tasks) and from Parquet. Best of 3.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import make_batch, print_table, run_producers, scratch_dir
from tidelog.cli.cluster import LocalCluster, free_ports
from tidelog.client.sync_client import Client
from tidelog.cluster_status import merge_status
from tidelog.record import ProducerRecord, build_batch

MiB = 1024 * 1024
ARCHIVED = {
    "remote.storage.enable": "true",
    "segment.bytes": str(8 * MiB),
    "local.retention.bytes": str(32 * MiB),
    "retention.check.interval.ms": "200",
    "file.delete.delay.ms": "0",
}
PLAIN = {"segment.bytes": str(8 * MiB)}


def row(client: Client, topic: str) -> dict[str, Any]:
    return dict(merge_status(client.status([topic]), topic)[0])


def topics(client: Client, configs: dict[str, dict[str, str]]) -> None:
    """One-partition topics with these configs, led."""
    for name, topic_configs in configs.items():
        client.create_topic(name, replication_factor=1, configs=topic_configs)
    for name in configs:
        client.wait_for_leaders(name)


def fill(client: Client, topic: str, records: int) -> None:
    for lo in range(0, records, 1000):
        batch = build_batch(
            [
                ProducerRecord(b"key-%03d" % ((lo + i) % 100), b"x" * 1000 + b"%08d" % (lo + i))
                for i in range(1000)
            ]
        )
        client.produce_batch(topic, 0, batch, acks="all")


def produce_for(bootstrap: str, topic: str, seconds: float) -> tuple[float, float]:
    """(records/s, MB/s) of 8 producers, batches of 100 x 1 KiB, acks=1."""
    batch = make_batch(100)
    sent, elapsed, _ = asyncio.run(run_producers(bootstrap, topic, batch, 8, seconds, "1"))
    rate = sent * 100 / elapsed
    return rate, sent * len(batch) / elapsed / 1e6


def upload_vs_produce(
    url: str, serve_args: list[str], env: dict[str, str], seconds: float, label: str
) -> list[list[object]]:
    work = scratch_dir("archive-" + "".join(c for c in label if c.isalnum()))
    with (
        LocalCluster(
            work / "c",
            nodes=1,
            serve_args=["--archive", url, *serve_args],
            env=env,
            log_level="WARNING",
        ) as cluster,
        Client(cluster.bootstrap) as client,
    ):
        topics(client, {"plain": PLAIN, "arch": ARCHIVED})
        plain_rate, plain_mb = produce_for(cluster.bootstrap, "plain", seconds)
        t0 = time.perf_counter()
        rate, mb = produce_for(cluster.bootstrap, "arch", seconds)
        produced_s = time.perf_counter() - t0
        while True:
            r = row(client, "arch")
            a = r.get("archive", {})
            # drained: every closed segment archived (the active one never is)
            if a.get("segments_behind", 1) == 0 and a.get("archived_end_offset", -1) > 0:
                break
            if time.perf_counter() - t0 > seconds * 20:
                raise RuntimeError(f"the archive did not catch up: {a}")
            time.sleep(0.1)
        drained_s = time.perf_counter() - t0
        uploaded = int(a["uploaded_bytes"])
        upload_mb = uploaded / drained_s / 1e6
        largest = max(
            int(n["partitions"][0]["size_bytes"])
            for n in client.status(["arch"])
            if n.get("partitions")
        )
        return [
            [label, "produce, no archive", f"{plain_rate:,.0f}", f"{plain_mb:.1f}", "", ""],
            [
                label,
                "produce, archived topic",
                f"{rate:,.0f}",
                f"{mb:.1f}",
                f"{rate / plain_rate:.2f} of no archive",
                "",
            ],
            [
                label,
                "upload (until drained)",
                "",
                f"{upload_mb:.1f}",
                f"{upload_mb / mb:.2f} of produce",
                f"drained {drained_s - produced_s:.1f} s after; disk {largest / MiB:.0f} MiB",
            ],
        ]


def read_rate(client: Client, topic: str, records: int) -> float:
    t0 = time.perf_counter()
    n = 0
    for _ in client.consume(topic, 0, 0):
        n += 1
        if n >= records:
            break
    return n / (time.perf_counter() - t0)


def tiered_and_spark(records: int) -> list[list[object]]:
    work = scratch_dir("archive-read")
    archive = work / "archive"
    archive.mkdir()
    url = f"file://{archive}"
    configs = {**ARCHIVED, "local.retention.bytes": str(16 * MiB)}
    rows: list[list[object]] = []
    with (
        LocalCluster(
            work / "c", nodes=1, serve_args=["--archive", url], log_level="WARNING"
        ) as cluster,
        Client(cluster.bootstrap) as client,
    ):
        topics(client, {"arch": configs, "local": PLAIN})
        fill(client, "local", records)
        fill(client, "arch", records + 30_000)  # the tail stays local
        deadline = time.monotonic() + 120
        while row(client, "arch")["local_log_start_offset"] < records:
            if time.monotonic() > deadline:
                raise RuntimeError(f"local log start stuck: {row(client, 'arch')}")
            time.sleep(0.2)
        local = max(read_rate(client, "local", records) for _ in range(3))
        tiered = max(read_rate(client, "arch", records) for _ in range(3))
        rows.append(
            ["consume from offset 0", f"{tiered:,.0f}", f"{local:,.0f}", f"{tiered / local:.2f}"]
        )

        from tidelog.spark.session import local_spark

        spark = local_spark("bench-archive", master="local[2]", local_dir=work / "spark")
        try:
            from pyspark.sql import functions as F

            def query(df: Any) -> None:
                df.groupBy("key").agg(F.count("*"), F.sum(F.length("value"))).collect()

            source = (
                spark.read.format("tidelog")
                .option("bootstrap", cluster.bootstrap)
                .option("subscribe", "arch")
                .option("maxPartitions", "2")
                .option("minPartitions", "2")
                .option("endingOffsets", json.dumps({"arch": {"0": records}}))
                .schema("key binary, value binary")
                .load()
            )
            parquet_dir = work / "rows.parquet"
            source.write.parquet(str(parquet_dir))
            parquet = spark.read.parquet(str(parquet_dir))

            def best(df: Any) -> float:
                times = []
                for _ in range(3):
                    t0 = time.perf_counter()
                    query(df)
                    times.append(time.perf_counter() - t0)
                return min(times)

            t_source = best(source)
            t_parquet = best(parquet)
            rows.append(
                [
                    "Spark groupBy, archived rows",
                    f"{records / t_source:,.0f}",
                    f"{records / t_parquet:,.0f} (Parquet)",
                    f"{t_parquet / t_source:.2f}",
                ]
            )
        finally:
            spark.stop()
    shutil.rmtree(work, ignore_errors=True)
    return rows


def moto_server() -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    import boto3

    (port,) = free_ports(1)
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    env = {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_REGION": "us-east-1",
    }
    for _ in range(100):
        try:
            boto3.client(
                "s3",
                endpoint_url=endpoint,
                region_name="us-east-1",
                aws_access_key_id="bench",
                aws_secret_access_key="bench",
            ).create_bucket(Bucket="bench")
            break
        except Exception:
            time.sleep(0.1)
    return proc, {**env, "endpoint": endpoint}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--s3", action="store_true", help="also against moto's S3 server")
    args = parser.parse_args()

    work = scratch_dir("archive-file")
    (work / "a").mkdir(parents=True, exist_ok=True)
    table = upload_vs_produce(f"file://{work / 'a'}", [], {}, args.seconds, "file://")
    if args.s3:
        proc, s3 = moto_server()
        try:
            endpoint = s3.pop("endpoint")
            table += upload_vs_produce(
                "s3://bench/p",
                ["--archive-endpoint", endpoint],
                {**os.environ, **s3},
                args.seconds,
                "s3 (moto)",
            )
        finally:
            proc.kill()
    print_table(["store", "what", "records/s", "MB/s", "ratio", "notes"], table)
    print()
    print_table(
        ["read", "archive rec/s", "local rec/s", "archive/local"], tiered_and_spark(args.records)
    )


if __name__ == "__main__":
    main()
