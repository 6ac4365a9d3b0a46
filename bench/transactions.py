"""What Kafka transactions cost on tidelog (issue 36): confluent-kafka producers on one cluster's
Kafka ports, same run, each mode on a topic of its own (3 partitions, RF 3, acks=all).

    .venv/bin/python bench/transactions.py [--seconds 8] [--rate 1000] [--rounds 2]

Modes: an idempotent producer (no transactions), and a transactional one committing every 10,
100 and 1,000 ms (begin, produce until the interval is up, commit_transaction, again).

  - throughput: each mode produces as fast as it can for --seconds; the records committed
    (acknowledged, for the idempotent one) per second, and the transactions: a commit takes
    its round trips (EndTxn, the decision in the metadata log, the markers), so a 10 ms
    interval commits less often than every 10 ms on a busy machine
  - latency: each mode sends --rate records a second for --seconds, each carrying its send
    time; a read_committed and a read_uncommitted consumer (same process, same clock) note when
    each is handed over: p50 and p99 from send to visibility. A transaction's records become
    visible to read_committed readers at its commit, so about half the interval plus the
    commit is expected there; read_uncommitted readers see them at the high watermark.
"""

from __future__ import annotations

import argparse
import os
import struct
import threading
import time
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from common import percentile, print_table, scratch_dir
from tidelog.cli.cluster import LocalCluster
from tidelog.client.sync_client import Client
from tidelog.features import TRANSACTIONS_LEVEL

PARTITIONS = 3
INTERVALS_MS = (10, 100, 1000)
STAMP = struct.Struct(">d")  # the send time (perf_counter), first in every value


def producer(bootstrap: str, transactional_id: str | None) -> Any:
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
    }
    if transactional_id is not None:
        config["transactional.id"] = transactional_id
    p = Producer(config)
    if transactional_id is not None:
        p.init_transactions(30)
    return p


def send(p: Any, topic: str, i: int, padding: bytes) -> None:
    value = STAMP.pack(time.perf_counter()) + padding
    while True:
        try:
            p.produce(topic, value=value, partition=i % PARTITIONS)
            return
        except BufferError:
            p.poll(0.005)


def run_mode(
    bootstrap: str,
    topic: str,
    interval_ms: int | None,
    seconds: float,
    rate: float,
    padding: bytes,
) -> tuple[int, int, float]:
    """Records sent for seconds, at rate a second (0: as fast as possible), committed every
    interval_ms (None: no transactions): how many were committed or acknowledged, how many
    transactions committed, and the seconds to the last commit or acknowledgement."""
    p = producer(bootstrap, None if interval_ms is None else f"bench-{topic}")
    sent = committed = commits = 0
    started = time.perf_counter()
    end = started + seconds
    while time.perf_counter() < end:
        if interval_ms is not None:
            p.begin_transaction()
        until = min(end, time.perf_counter() + (interval_ms or 100) / 1000)
        batch = 0
        while time.perf_counter() < until:
            if rate and sent >= rate * (time.perf_counter() - started):
                time.sleep(0.0005)
                continue
            send(p, topic, sent, padding)
            sent += 1
            batch += 1
            if sent % 1000 == 0:
                p.poll(0)
        if interval_ms is not None:
            p.commit_transaction(60)
            committed += batch
            commits += 1
    assert p.flush(60) == 0
    elapsed = time.perf_counter() - started
    return (committed if interval_ms is not None else sent), commits, elapsed


class Visibility:
    """A consumer of the topic from its start, noting each record's send-to-handed-over time."""

    def __init__(self, bootstrap: str, topic: str, isolation: str) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-{topic}-{isolation}",
                "isolation.level": isolation,
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 10,
            }
        )
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        self.latencies: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            m = self.consumer.poll(0.1)  # (consume(n, t) would wait for n records or t)
            if m is not None and m.error() is None:
                now = time.perf_counter()
                self.latencies.append((now - STAMP.unpack_from(m.value())[0]) * 1000)

    def finish(self, expected: int) -> list[float]:
        for _ in range(200):  # up to 10 s for the last records
            if len(self.latencies) >= expected:
                break
            time.sleep(0.05)
        self.stop.set()
        self.thread.join(10)
        self.consumer.close()
        return self.latencies


def measure(c: LocalCluster, admin: Client, args: argparse.Namespace) -> list[tuple[Any, ...]]:
    padding = os.urandom(max(0, args.value_bytes - STAMP.size))
    modes: list[tuple[str, int | None]] = [("idempotent", None)]
    modes += [(f"txn every {ms} ms", ms) for ms in INTERVALS_MS]
    rows: list[tuple[Any, ...]] = []
    runs = [(r, mode) for r in range(args.rounds) for mode in modes]
    for n, (r, (name, interval_ms)) in enumerate(runs):
        topics = (f"tput-{n}", f"lat-{n}")
        for topic in topics:
            admin.create_topic(topic, PARTITIONS, 3, configs={"min.insync.replicas": "2"})
            admin.wait_for_leaders(topic)
        count, commits, elapsed = run_mode(
            c.kafka_bootstrap, topics[0], interval_ms, args.seconds, 0, padding
        )
        throughput = count / elapsed
        commit_rate = commits / elapsed if interval_ms is not None else float("nan")
        readers = [
            Visibility(c.kafka_bootstrap, topics[1], i)
            for i in ("read_committed", "read_uncommitted")
        ]
        time.sleep(1.0)  # the consumers assigned and fetching before the first send
        sent, _, _ = run_mode(
            c.kafka_bootstrap, topics[1], interval_ms, args.seconds, args.rate, padding
        )
        rc, ru = (r.finish(sent) for r in readers)
        rows.append(
            (
                name,
                r,
                throughput,
                commit_rate,
                percentile(rc, 50),
                percentile(rc, 99),
                percentile(ru, 50),
                percentile(ru, 99),
                f"{len(rc)}/{len(ru)}/{sent}",
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rate", type=float, default=1000.0, help="records/s in the latency run")
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2, help="every mode again, in turn")
    args = parser.parse_args()
    with (
        LocalCluster(scratch_dir("txn-"), 3, log_level="WARNING", kafka=True) as c,
        Client(c.bootstrap) as admin,
    ):
        for _ in range(600):  # a new cluster finalizes the transactions level just after
            if admin.describe_features().finalized_level == TRANSACTIONS_LEVEL:
                break
            time.sleep(0.05)
        rows = measure(c, admin, args)
    print(
        f"3 nodes, RF 3, acks=all, {args.value_bytes} B values, {args.seconds:.0f} s per row; "
        f"latency at {args.rate:,.0f} records/s; load {os.getloadavg()[0]:.2f}"
    )
    print_table(
        [
            "mode",
            "round",
            "records/s",
            "commits/s",
            "rc p50 ms",
            "rc p99 ms",
            "ru p50 ms",
            "ru p99 ms",
            "seen rc/ru/sent",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
