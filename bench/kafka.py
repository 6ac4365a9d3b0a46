"""Kafka clients on tidelog's Kafka port against tidelog's own client, same cluster, same run.

    .venv/bin/python bench/kafka.py [--nodes 3] [--records 200000] [--value-bytes 100]

One topic per row (3 partitions, RF = nodes, acks=all). Produce: confluent-kafka (librdkafka,
batching in C, idempotent, linger 5 ms) against tidelog's asyncio Producer (idempotent, linger
5 ms), each sending the same number of records of the same size, timed to the last ack.
Consume: a confluent-kafka consumer reading the whole topic from the Kafka port against
tidelog's client reading it from tidelog's protocol. The ratio column is Kafka port / tidelog
protocol for the same work.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from confluent_kafka import Consumer, Producer, TopicPartition

from common import print_table, scratch_dir
from tidelog.cli.args import run_loop
from tidelog.cli.cluster import LocalCluster
from tidelog.client.async_client import AsyncClient
from tidelog.client.producer import Producer as TidelogProducer
from tidelog.client.sync_client import Client

PARTITIONS = 3


def kafka_produce(bootstrap: str, topic: str, records: int, value: bytes) -> float:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "batch.size": 1_000_000,
        }
    )
    failed = 0

    def done(err: object, _: object) -> None:
        nonlocal failed
        failed += err is not None

    started = time.perf_counter()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value=value, partition=i % PARTITIONS, on_delivery=done)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 1000 == 0:
            producer.poll(0)
    left = producer.flush(120)
    elapsed = time.perf_counter() - started
    assert left == 0 and failed == 0, f"{left} unsent, {failed} failed"
    return records / elapsed


def tidelog_produce(bootstrap: str, topic: str, records: int, value: bytes) -> float:
    async def run() -> float:
        async with AsyncClient(bootstrap) as client:
            producer = TidelogProducer(client, linger_ms=5)
            started = time.perf_counter()
            futures = [
                await producer.send(topic, value, partition=i % PARTITIONS) for i in range(records)
            ]
            await producer.flush()
            await asyncio.gather(*futures)
            elapsed = time.perf_counter() - started
            await producer.close()
            return records / elapsed

    return run_loop(run())


def kafka_consume(bootstrap: str, topic: str, records: int) -> float:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{os.getpid()}-{topic}",
            "enable.auto.commit": False,
            "fetch.max.bytes": 52_428_800,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    got = 0
    started = time.perf_counter()
    while got < records:
        for m in consumer.consume(10_000, 1.0):
            got += m.error() is None
    elapsed = time.perf_counter() - started
    consumer.close()
    return records / elapsed


def tidelog_consume(bootstrap: str, topic: str, records: int) -> float:
    with Client(bootstrap) as client:
        started = time.perf_counter()
        got = sum(sum(1 for _ in client.consume(topic, p, "earliest")) for p in range(PARTITIONS))
        elapsed = time.perf_counter() - started
    assert got == records, (got, records)
    return records / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    value = os.urandom(args.value_bytes)
    rows = []
    cluster = LocalCluster(scratch_dir("kafka-"), args.nodes, log_level="WARNING", kafka=True)
    with cluster as c, Client(c.bootstrap) as client:
        for r in range(args.rounds):
            for name in (f"k{r}", f"t{r}"):
                client.create_topic(name, PARTITIONS, min(3, args.nodes))
                client.wait_for_leaders(name)
            k_prod = kafka_produce(c.kafka_bootstrap, f"k{r}", args.records, value)
            t_prod = tidelog_produce(c.bootstrap, f"t{r}", args.records, value)
            k_cons = kafka_consume(c.kafka_bootstrap, f"k{r}", args.records)
            t_cons = tidelog_consume(c.bootstrap, f"t{r}", args.records)
            rows.append(("produce", r, k_prod, t_prod, k_prod / t_prod))
            rows.append(("consume", r, k_cons, t_cons, k_cons / t_cons))
    print(
        f"{args.nodes} nodes, RF {min(3, args.nodes)}, acks=all, {args.records} records of "
        f"{args.value_bytes} B per row"
    )
    print_table(
        ["path", "round", "Kafka port rec/s", "tidelog rec/s", "Kafka/tidelog"],
        [(p, r, f"{k:,.0f}", f"{t:,.0f}", f"{x:.2f}") for p, r, k, t, x in rows],
    )


if __name__ == "__main__":
    main()
