"""`tidelog demo`: the main job, end to end on this machine.

A local 3-node cluster of real processes; an `events` topic (3 partitions, replication factor
3, short retention so the low-water mark visibly moves) and a `page_counts` table topic; a
clickstream produced at a steady rate; a Spark Structured Streaming job counting views per page
per minute into `page_counts` (exactly once) and Parquet; the leader of one partition killed
midway and restarted; every few seconds each partition's log start / LWM (and what holds it) /
HW / LEO and the queries' cursor lag. It ends by checking the counts against what was produced.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tidelog.cli.args import at_least
from tidelog.cli.clickstream import Clickstream
from tidelog.cli.cluster import LocalCluster
from tidelog.cli.progress import Progress
from tidelog.cli.tables import table_lines
from tidelog.client.sync_client import Client
from tidelog.cluster_status import partition_rows

EVENTS_CONFIG = {
    # Small segments and a short retention, so that the cleaner deletes during the demo and the
    # cursors' hold shows: a segment goes only when both queries have finished with it.
    "segment.bytes": str(256 * 1024),
    "retention.ms": "20000",
    "retention.check.interval.ms": "2000",
    "file.delete.delay.ms": "2000",
}


def add_demo_command(sub: Any) -> None:
    demo = sub.add_parser(
        "demo", help="run the main job (cluster + clickstream + Spark) on this machine and check it"
    )
    demo.add_argument("--nodes", type=at_least(1), default=3)
    demo.add_argument("--duration", type=float, default=60.0, help="seconds of clickstream")
    demo.add_argument("--rate", type=int, default=400, help="page views per second")
    demo.add_argument("--status-every", type=float, default=5.0, help="seconds between status")
    demo.add_argument("--no-kill", action="store_true", help="do not kill a leader midway")
    demo.add_argument("--data", type=Path, help="keep data here (default: a temp dir, removed)")
    demo.add_argument(
        "--spark-master",
        default="local[2]",
        metavar="URL",
        help="where the Spark queries run: local[N] (default local[2]), a standalone cluster "
        "spark://HOST:PORT, or a Spark Connect server sc://HOST:PORT",
    )
    demo.set_defaults(func=cmd_demo)


def say(message: str) -> None:
    if sys.stdout.isatty():
        sys.stdout.write("\r\x1b[2K")  # over a progress line, if one is drawn
    print(f"[demo {time.strftime('%H:%M:%S')}] {message}", flush=True)


def cmd_demo(args: argparse.Namespace) -> int:
    data = args.data or Path(tempfile.mkdtemp(prefix="tidelog-demo-"))
    cluster = LocalCluster(data / "cluster", args.nodes, log_level="WARNING", kafka=True, http=True)
    say(f"starting a {args.nodes}-node cluster in {data}")
    started = time.monotonic()
    try:
        with cluster:
            ok = Demo(cluster, data, args).run()
    finally:
        if args.data is None:
            shutil.rmtree(data, ignore_errors=True)
    say(f"demo {'PASSED' if ok else 'FAILED'} in {time.monotonic() - started:.0f}s")
    return 0 if ok else 1


class Demo:
    def __init__(self, cluster: LocalCluster, work: Path, args: argparse.Namespace) -> None:
        self.cluster = cluster
        self.work = work
        self.args = args
        self.client = Client(cluster.bootstrap)
        self.rf = min(3, args.nodes)

    def run(self) -> bool:
        from tidelog.spark.page_counts import start_queries
        from tidelog.spark.session import spark_session

        bootstrap = self.cluster.bootstrap
        self.client.create_topic(
            "events", partitions=3, replication_factor=self.rf, configs=EVENTS_CONFIG
        )
        self.client.create_topic(
            "page_counts", partitions=3, replication_factor=self.rf, kind="table"
        )
        say(f"created topics events (3 partitions, RF {self.rf}) and page_counts (a table)")
        say(
            f"tidelog clients connect to {bootstrap}; Kafka clients and tools (kcat, "
            f"kafka-console-consumer, librdkafka) to {self.cluster.kafka_bootstrap}"
        )
        say(
            f"watch the watermarks live: the console at {self.cluster.http_url(1)}/ "
            f"(Prometheus metrics at {self.cluster.http_url(1)}/metrics, on every node)"
        )
        say(f"starting Spark ({self.args.spark_master}) and the page_counts streaming queries")
        spark = spark_session(
            "tidelog-demo", self.args.spark_master, local_dir=self.work / "spark-local"
        )
        clicks = Clickstream(bootstrap, "events", 3, self.args.rate, self.args.duration)
        queries: tuple[Any, ...] = ()
        try:
            queries = start_queries(spark, bootstrap, self.work)
            clicks.start()
            say(
                f"producing a clickstream at {self.args.rate} views/s for {self.args.duration:.0f}s"
            )
            self._watch(clicks, queries)
            return self._check(spark, clicks, queries)
        finally:
            clicks.stop()
            for q in queries:
                q.stop()
            spark.stop()
            self.client.close()

    def _watch(self, clicks: Clickstream, queries: tuple[Any, ...]) -> None:
        """Status until the clickstream is done; a leader dies at half time and comes back."""
        started = time.monotonic()
        kill_at = None if self.args.no_kill else self.args.duration / 2
        killed: int | None = None
        next_status = 0.0
        progress = Progress("clickstream", self.args.duration, unit="views")
        while clicks.is_alive():
            now = time.monotonic() - started
            progress.update(clicks.produced, now)
            self._raise_if_failed(queries)
            if kill_at is not None and now >= kill_at and killed is None:
                killed = self._kill_leader("events", 0)
            elif killed is not None and now >= kill_at + 8 and not self.cluster.alive(killed):  # type: ignore[operator]
                self.cluster.start(killed)
                say(f"restarted node {killed}; it catches up from the new leader")
            if now >= next_status:
                self._status(clicks)
                next_status = now + self.args.status_every
            time.sleep(0.5)
        progress.close()
        if killed is not None and not self.cluster.alive(killed):
            self.cluster.start(killed)
        if clicks.error is not None:
            raise clicks.error
        say(
            f"clickstream done: {clicks.produced} views acknowledged (acks=all), "
            f"{clicks.retries} batches re-sent after the client gave up (deduplicated by the log)"
        )

    def _kill_leader(self, topic: str, partition: int) -> int:
        rows = partition_rows(self.client.status([topic]), topic)
        leader = next(r.leader for r in rows if r.partition == partition)
        say(f"killing node {leader} (SIGKILL), the leader of {topic}/{partition}")
        self.cluster.kill(leader)
        return int(leader)

    def _status(self, clicks: Clickstream) -> None:
        try:
            rows = partition_rows(self.client.status(["events"]), "events")
        except Exception as exc:  # a status line is not worth failing the demo for
            say(f"status unavailable: {exc}")
            return
        say(f"{clicks.produced} views produced")
        table = [
            (
                r.group,
                r.leader,
                r.log_start_offset,
                r.low_watermark.get("offset", "-"),
                r.high_watermark,
                r.log_end_offset,
                ", ".join(f"{name} {c['lag']}" for name, c in sorted(r.cursors.items())),
            )
            for r in rows
        ]
        notes = [[f"LWM held by {r.low_watermark.get('set_by', '-')}"] for r in rows]
        headings = ("PART", "LEADER", "LOG_START", "LWM", "HW", "LEO", "CURSOR LAG (records)")
        for line in table_lines(headings, table, frozenset(range(1, 6)), notes):
            print("    " + line, flush=True)

    def _raise_if_failed(self, queries: tuple[Any, ...]) -> None:
        for q in queries:
            if not q.isActive and q.exception() is not None:
                raise RuntimeError(f"query {q.name} failed: {q.exception()}")

    def _check(self, spark: Any, clicks: Clickstream, queries: tuple[Any, ...]) -> bool:
        from tidelog.spark.page_counts import parquet_counts

        expected = dict(clicks.counts)
        say(f"waiting for Spark to count all {clicks.produced} views in {len(expected)} windows")
        deadline = time.monotonic() + 90
        table: dict[str, int] = {}
        files: dict[str, int] = {}
        while time.monotonic() < deadline:
            self._raise_if_failed(queries)
            table = {k.decode(): int(v) for k, v in self.client.table_scan("page_counts") if v}
            files = parquet_counts(spark, self.work)
            if table == expected and files == expected:
                break
            time.sleep(2)
        self._status(clicks)
        table_ok, files_ok = table == expected, files == expected
        say(
            f"page_counts table: {len(table)} windows, {sum(table.values())} views - "
            + ("equal to what was produced" if table_ok else _diff(expected, table))
        )
        say(
            f"Parquet output: {len(files)} windows, {sum(files.values())} views - "
            + ("equal to what was produced" if files_ok else _diff(expected, files))
        )
        for q in queries:
            progress = q.recentProgress
            last = progress[-1] if progress else {}
            say(
                f"query {q.name}: {len(progress)} recent micro-batches, event-time watermark "
                f"{last.get('eventTime', {}).get('watermark', '-')}"
            )
        return table_ok and files_ok


def _diff(expected: dict[str, int], got: dict[str, int]) -> str:
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    wrong = sorted(k for k in set(expected) & set(got) if expected[k] != got[k])
    parts = []
    if missing:
        parts.append(f"missing {missing[:5]}")
    if extra:
        parts.append(f"unexpected {extra[:5]}")
    if wrong:
        parts.append("wrong " + ", ".join(f"{k}: {got[k]} != {expected[k]}" for k in wrong[:5]))
    return "MISMATCH: " + "; ".join(parts)
