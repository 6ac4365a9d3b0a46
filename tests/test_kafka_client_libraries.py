"""Kafka client libraries nobody here wrote, against a 3-node cluster's Kafka ports: kafka-python,
aiokafka, confluent-kafka (librdkafka), kcat, kafkajs and @platformatic/kafka (node.js, tests/js) each create a topic, produce keys and headers with
every codec, consume from the earliest offset and from a timestamp in a group, commit, and after
a restart resume from the committed offset, which is a tidelog cursor named after the group."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from helpers import wait_for, wait_for_async
from tidelog.cli.cluster import LocalCluster
from tidelog.client.sync_client import Client

pytestmark = pytest.mark.process  # tiers: pyproject.toml's markers

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
PARTITIONS = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("kafka-clients"), 3, kafka=True) as c:
        yield c


Row = tuple[bytes, bytes, tuple[tuple[str, bytes], ...]]  # key, value, headers


@dataclass
class Plan:
    """What one client sends: a first burst in every codec, a timestamp mark, a second burst,
    and (after the restart) a third."""

    name: str
    first: list[tuple[str, Row]] = field(default_factory=list)  # (codec, row)
    second: list[Row] = field(default_factory=list)
    third: list[Row] = field(default_factory=list)

    def __post_init__(self) -> None:
        for codec in CODECS:
            for i in range(8):
                row = self.row(f"{codec}-{i}", codec)
                self.first.append((codec, row))
        self.second = [self.row(f"late-{i}", "none") for i in range(6)]
        self.third = [self.row(f"after-restart-{i}", "none") for i in range(6)]

    def produce_bursts(self, produce: Callable[[list[tuple[str, Row]]], None]) -> int:
        """The first burst (every codec), then the second; the time between them."""
        produce(self.first)
        mark = mark_between_bursts()
        produce([("none", r) for r in self.second])
        return mark

    def row(self, tag: str, codec: str) -> Row:
        return (
            f"{self.name}-key-{tag}".encode(),
            f"{self.name}-value-{tag}".encode() * 4,
            (("codec", codec.encode()), ("tag", tag.encode())),
        )


def wait_for_topic(cluster: LocalCluster, topic: str) -> None:
    with Client(cluster.bootstrap) as client:
        client.wait_for_leaders(topic)


def check_cursor(cluster: LocalCluster, group: str, topic: str) -> dict[str, int]:
    """The group's committed offsets are the tidelog cursor named after it."""
    with Client(cluster.bootstrap) as client:
        cursors = {c["name"]: c for c in client.cursors()}
    assert group in cursors, sorted(cursors)
    assert cursors[group]["topic"] == topic and not cursors[group]["invalidated"]
    return {str(p): int(o) for p, o in cursors[group]["positions"].items()}


def check_first_read(plan: Plan, got: list[tuple[int, int, Row]]) -> None:
    """Every row of the first two bursts exactly once, offsets rising per partition."""
    rows = [r for _, _, r in got]
    want = [r for _, r in plan.first] + plan.second
    assert sorted(rows) == sorted(want)
    for p in range(PARTITIONS):
        offsets = [o for q, o, _ in got if q == p]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)


def check_resume(
    cluster: LocalCluster,
    plan: Plan,
    group: str,
    topic: str,
    produce: Callable[[list[tuple[str, Row]]], None],
    consume: Callable[[int], list[tuple[int, int, Row]]],
) -> None:
    """The group's cursor holds what it read; a new member ("restarted") gets only what came
    after."""
    positions = check_cursor(cluster, group, topic)
    assert sum(positions.values()) == len(plan.first) + len(plan.second)
    produce([("none", r) for r in plan.third])
    assert sorted(r for _, _, r in consume(len(plan.third))) == sorted(plan.third)


def mark_between_bursts() -> int:
    time.sleep(0.05)
    mark = int(time.time() * 1000)
    time.sleep(0.05)
    return mark


# -- kafka-python ---------------------------------------------------------------------------------


def test_kafka_python(cluster: LocalCluster) -> None:
    from kafka.admin import NewTopic

    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition

    plan, topic, group = Plan("kp"), "kafka-python", "kafka-python-group"
    boot = cluster.kafka_bootstrap.split(",")
    admin = KafkaAdminClient(bootstrap_servers=boot)
    try:
        admin.create_topics([NewTopic(topic, PARTITIONS, 3)])
    finally:
        admin.close()
    wait_for_topic(cluster, topic)

    def produce(rows: list[tuple[str, Row]]) -> None:
        for codec in dict.fromkeys(c for c, _ in rows):
            producer = KafkaProducer(
                bootstrap_servers=boot,
                acks="all",
                compression_type=None if codec == "none" else codec,
            )
            for _, (key, value, headers) in [r for r in rows if r[0] == codec]:
                producer.send(topic, key=key, value=value, headers=list(headers))
            producer.flush(30)
            producer.close()

    def consume(n: int) -> list[tuple[int, int, Row]]:
        consumer = KafkaConsumer(
            topic,
            bootstrap_servers=boot,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            consumer_timeout_ms=15_000,
        )
        got = []
        for m in consumer:
            got.append((m.partition, m.offset, (m.key, m.value, tuple(m.headers))))
            if len(got) >= n:
                break
        consumer.commit()
        consumer.close()
        return got

    mark = plan.produce_bursts(produce)
    check_first_read(plan, consume(len(plan.first) + len(plan.second)))

    reader = KafkaConsumer(bootstrap_servers=boot, enable_auto_commit=False)
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    reader.assign(tps)
    found = reader.offsets_for_times({tp: mark for tp in tps})
    ends = reader.end_offsets(tps)
    since = []
    for tp in tps:
        start = found[tp].offset if found[tp] is not None else ends[tp]
        reader.seek(tp, start)

    def read_on() -> bool:
        for records in reader.poll(500).values():
            since.extend((r.key, r.value, tuple(r.headers)) for r in records)
        return len(since) >= len(plan.second)

    try:
        wait_for("the second burst, read from its timestamp", read_on, 15, every_s=0)
    finally:
        reader.close()
    assert sorted(since) == sorted(plan.second)

    check_resume(cluster, plan, group, topic, produce, consume)


# -- aiokafka --------------------------------------------------------------------------------------


def test_aiokafka(cluster: LocalCluster) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    plan, topic, group = Plan("ak"), "aiokafka", "aiokafka-group"
    boot = cluster.kafka_bootstrap

    async def produce(rows: list[tuple[str, Row]]) -> None:
        for codec in dict.fromkeys(c for c, _ in rows):
            producer = AIOKafkaProducer(
                bootstrap_servers=boot,
                acks="all",
                compression_type=None if codec == "none" else codec,
            )
            await producer.start()
            try:
                for _, (key, value, headers) in [r for r in rows if r[0] == codec]:
                    await producer.send(topic, key=key, value=value, headers=list(headers))
                await producer.flush()
            finally:
                await producer.stop()

    async def consume(n: int) -> list[tuple[int, int, Row]]:
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=boot,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await consumer.start()
        got: list[tuple[int, int, Row]] = []

        async def read_on() -> bool:
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                got.extend(
                    (r.partition, r.offset, (r.key, r.value, tuple(r.headers))) for r in records
                )
            return len(got) >= n

        try:
            await wait_for_async(f"the group to read {n} records", read_on, 20, every_s=0)
            await consumer.commit()
        finally:
            await consumer.stop()
        return got

    async def since(mark: int) -> list[Row]:
        consumer = AIOKafkaConsumer(bootstrap_servers=boot, enable_auto_commit=False)
        await consumer.start()
        got: list[Row] = []
        try:
            tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
            consumer.assign(tps)
            found = await consumer.offsets_for_times({tp: mark for tp in tps})
            ends = await consumer.end_offsets(tps)
            for tp in tps:
                consumer.seek(tp, found[tp].offset if found[tp] is not None else ends[tp])

            async def read_on() -> bool:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    got.extend((r.key, r.value, tuple(r.headers)) for r in records)
                return len(got) >= len(plan.second)

            await wait_for_async(
                "the second burst, read from its timestamp", read_on, 15, every_s=0
            )
        finally:
            await consumer.stop()
        return got

    async def run() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=boot)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, PARTITIONS, 3)])
        finally:
            await admin.close()
        await asyncio.get_running_loop().run_in_executor(None, wait_for_topic, cluster, topic)
        await produce(plan.first)
        mark = mark_between_bursts()
        await produce([("none", r) for r in plan.second])
        check_first_read(plan, await consume(len(plan.first) + len(plan.second)))
        assert sorted(await since(mark)) == sorted(plan.second)
        await produce([("none", r) for r in plan.third])

    asyncio.run(run())
    positions = check_cursor(cluster, group, topic)
    assert sum(positions.values()) == len(plan.first) + len(plan.second)
    third = asyncio.run(consume(len(plan.third)))
    assert sorted(r for _, _, r in third) == sorted(plan.third)


# -- confluent-kafka (librdkafka) ------------------------------------------------------------------


def test_confluent_kafka(cluster: LocalCluster) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    plan, topic, group = Plan("ck"), "confluent", "confluent-group"
    config: dict[str, Any] = {"bootstrap.servers": cluster.kafka_bootstrap}
    admin = AdminClient(config)  # kept: a handle collected early fails its futures
    admin.create_topics([NewTopic(topic, PARTITIONS, 3)])[topic].result(30)
    wait_for_topic(cluster, topic)

    def produce(rows: list[tuple[str, Row]]) -> None:
        for codec in dict.fromkeys(c for c, _ in rows):
            producer = Producer({**config, "compression.type": codec, "enable.idempotence": True})
            for _, (key, value, headers) in [r for r in rows if r[0] == codec]:
                producer.produce(topic, key=key, value=value, headers=list(headers))
            assert producer.flush(30) == 0

    def consume(n: int) -> list[tuple[int, int, Row]]:
        consumer = Consumer(
            {
                **config,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        consumer.subscribe([topic])
        got = []

        def read_on() -> bool:
            m = consumer.poll(0.5)
            if m is not None and not m.error():
                headers = tuple(m.headers() or ())
                got.append((m.partition(), m.offset(), (m.key(), m.value(), headers)))
            return len(got) >= n

        try:
            wait_for(f"the group to read {n} records", read_on, 30, every_s=0)
            consumer.commit(asynchronous=False)
        finally:
            consumer.close()
        return got

    mark = plan.produce_bursts(produce)
    check_first_read(plan, consume(len(plan.first) + len(plan.second)))

    reader = Consumer({**config, "group.id": "confluent-by-time", "enable.auto.commit": False})
    found = reader.offsets_for_times(
        [TopicPartition(topic, p, mark) for p in range(PARTITIONS)], timeout=10
    )
    reader.assign(found)  # an offset of -1 (none that late) is the end
    since: list[Row] = []

    def read_on() -> bool:
        m = reader.poll(0.5)
        if m is not None and not m.error():
            since.append((m.key(), m.value(), tuple(m.headers() or ())))
        return len(since) >= len(plan.second)

    try:
        wait_for("the second burst, read from its timestamp", read_on, 15, every_s=0)
    finally:
        reader.close()
    assert sorted(since) == sorted(plan.second)

    check_resume(cluster, plan, group, topic, produce, consume)


# -- kcat --------------------------------------------------------------------------------------


def kcat(*args: str, stdin: str = "", timeout_s: float = 60) -> str:
    proc = subprocess.run(
        ["kcat", *args], input=stdin, capture_output=True, text=True, timeout=timeout_s
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_kcat(cluster: LocalCluster) -> None:
    plan, topic, group = Plan("kc"), "kcat", "kcat-group"
    boot = cluster.kafka_bootstrap
    with Client(cluster.bootstrap) as client:
        client.create_topic(topic, partitions=PARTITIONS, replication_factor=3)
        client.wait_for_leaders(topic)

    def produce(rows: list[tuple[str, Row]]) -> None:
        for codec in dict.fromkeys(c for c, _ in rows):
            mine = [r for c, r in rows if c == codec]
            for key, value, headers in mine:  # kcat's -H applies to every line it sends
                kcat(
                    "-P", "-b", boot, "-t", topic, "-z", codec, "-K", ":",
                    *[a for k, v in headers for a in ("-H", f"{k}={v.decode()}")],
                    stdin=f"{key.decode()}:{value.decode()}\n",
                )  # fmt: skip

    def parse(out: str) -> list[tuple[int, int, Row]]:
        got = []
        for line in out.splitlines():
            partition, offset, key, value, headers = line.split("|")
            pairs = tuple(
                (k, v.encode()) for k, _, v in (h.partition("=") for h in headers.split(","))
            )
            got.append((int(partition), int(offset), (key.encode(), value.encode(), pairs)))
        return got

    fmt = "%p|%o|%k|%s|%h\\n"
    mark = plan.produce_bursts(produce)
    everything = parse(kcat("-C", "-b", boot, "-t", topic, "-o", "beginning", "-e", "-f", fmt))
    check_first_read(plan, everything)
    since = parse(kcat("-C", "-b", boot, "-t", topic, "-o", f"s@{mark}", "-e", "-f", fmt))
    assert sorted(r for _, _, r in since) == sorted(plan.second)

    def group_read() -> list[tuple[int, int, Row]]:
        # (-o would seek on every assignment; a group starts from its committed offsets)
        out = kcat(
            "-G", group, "-b", boot, "-e", "-f", fmt, "-X", "auto.offset.reset=earliest",
            "-X", "enable.auto.commit=true", "-X", "auto.commit.interval.ms=100", topic,
        )  # fmt: skip
        return parse(out)

    check_first_read(plan, group_read())
    wait_for(  # kcat commits as it goes and when it leaves
        "the group's cursor to hold the first two bursts",
        lambda: (
            sum(check_cursor(cluster, group, topic).values()) == len(plan.first) + len(plan.second)
        ),
        10,
        every_s=0.2,
    )
    produce([("none", r) for r in plan.third])
    assert sorted(r for _, _, r in group_read()) == sorted(plan.third)


JS = Path(__file__).parent / "js"


def run_js(cluster: LocalCluster, script: str, topic: str, group: str) -> dict[str, Any]:
    """A node.js client script of tests/js against the cluster: its JSON line."""
    done = subprocess.run(
        ["node", str(JS / script), cluster.kafka_bootstrap, topic, group],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def check_js(
    cluster: LocalCluster, result: dict[str, Any], group: str, count: int
) -> dict[int, int]:
    """Every record once with its key and header, the topic's altered config, the group listed;
    the offsets the group committed (as the client sees them) are a tidelog cursor's."""
    assert result["retention"] == "3600000"
    got = result["got"]
    assert sorted(int(m["value"][1:]) for m in got) == list(range(count))  # each once
    assert all(
        m["key"] == "k" + m["value"][1:] and m["header"] == "x" + m["value"][1:] for m in got
    )
    assert group in result["groups"]
    ends = {
        p: 1 + max(m["offset"] for m in got if m["partition"] == p)
        for p in {m["partition"] for m in got}
    }
    with Client(cluster.bootstrap) as client:
        cursor = next(c for c in client.cursors() if c["name"] == group)
        assert {int(p): o for p, o in cursor["positions"].items() if int(p) in ends} == ends
    return ends


def test_kafkajs(cluster: LocalCluster) -> None:
    """kafkajs 2.2.4 (node.js, tests/js): createTopics, alterConfigs (it has no incremental
    one), describeConfigs, an idempotent producer with gzip, a group that reads everything and
    commits, listGroups on a 3-node cluster, fetchOffsets."""
    result = run_js(cluster, "kafkajs_client.js", "js-topic", "js-group")
    ends = check_js(cluster, result, "js-group", 60)
    assert {
        o["partition"]: o["offset"] for o in result["offsets"] if o["partition"] in ends
    } == ends


def test_platformatic_kafka(cluster: LocalCluster) -> None:
    """@platformatic/kafka 2.12.1 (node.js, tests/js): createTopics, alterConfigs,
    describeConfigs, a producer, a group consuming from the earliest offset with autocommit,
    listGroups on a 3-node cluster, listConsumerGroupOffsets."""
    result = run_js(cluster, "platformatic_client.mjs", "platformatic-topic", "platformatic-group")
    ends = check_js(cluster, result, "platformatic-group", 30)
    (listed,) = result["offsets"]
    committed = {
        p["partitionIndex"]: p["committedOffset"]
        for t in listed["topics"]
        for p in t["partitions"]
        if p["partitionIndex"] in ends
    }
    assert committed == ends
