"""The Kafka port: its codec over every version it serves, its error mapping, bad input, and
real Kafka clients against real node processes — a consumer group whose committed offsets hold
retention, and a partition leader SIGKILLed under an idempotent producer and a group consumer.
(Each client library's round trip is in test_kafka_clients.py.)"""

from __future__ import annotations

import socket
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.index import load_response_schema
from kio.serial import entity_reader

from helpers import kafka_partitions, kafka_topic_config, wait_for, wait_for_value
from test_kafka_bounds import HOSTILE, THE_20_BYTES, hostile_request
from tidelog import errors
from tidelog.cli.cluster import LocalCluster
from tidelog.client.sync_client import Client
from tidelog.kafka.codec import SUPPORTED_VERSIONS, encode_response, parse_request
from tidelog.kafka.errors import KAFKA_CODES, kafka_code

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

pytestmark = pytest.mark.process  # tiers: pyproject.toml's markers

# -- the codec and the error map, without a node -------------------------------------------------


def test_every_served_version_encodes_an_answer_kafka_clients_parse() -> None:
    """Every api and version offered in ApiVersions can be answered: an empty answer is fitted
    to the version's message class, and kio's reader (Kafka's schemas) parses it back whole."""
    for api_key, (low, high) in SUPPORTED_VERSIONS.items():
        for version in range(low, high + 1):
            frame = encode_response(api_key, version, 42, {})
            schema = load_response_schema(api_key, version)
            view = memoryview(frame)
            assert struct.unpack(">i", frame[:4])[0] == len(frame) - 4
            header, used = entity_reader(schema.__header_schema__)(view[4:], 0)
            assert header.correlation_id == 42
            _, body_used = entity_reader(schema)(view[4 + used :], 0)
            assert 4 + used + body_used == len(frame), (api_key, version)


def test_every_tidelog_error_has_a_kafka_code_outside_tidelogs_own_range() -> None:
    stack: list[type[errors.TidelogError]] = [errors.TidelogError]
    seen = []
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if cls.__module__ != "tidelog.errors":
            continue  # a listener's own refinements (their parents carry the code)
        seen.append(cls)
        assert cls in KAFKA_CODES, f"{cls.__name__} has no Kafka error code"
        code = KAFKA_CODES[cls]
        # tidelog's own 100-109 mean other things to Kafka clients; 104 is Kafka's too
        # (INCONSISTENT_CLUSTER_ID), and only that error maps to it.
        assert not 100 <= code <= 109 or cls is errors.InconsistentClusterId, (cls, code)
    assert len(seen) > 25
    appended = errors.NotEnoughReplicas("x", appended=True)
    assert kafka_code(appended) == 20  # NOT_ENOUGH_REPLICAS_AFTER_APPEND
    assert kafka_code(errors.NotLeader("x"), not_leader=41) == 41  # NOT_CONTROLLER
    assert kafka_code(errors.CursorInvalidated("x")) == 1  # the consumer resets its offset


def test_requests_that_do_not_parse_are_refused_by_name() -> None:
    with pytest.raises(errors.UnsupportedApi):
        parse_request(struct.pack(">hhi", 9999, 0, 1))  # no such api
    with pytest.raises(errors.UnsupportedApi):
        parse_request(struct.pack(">hhi", 0, 2, 1))  # Produce v2: older than Kafka 4 serves
    with pytest.raises(errors.InvalidRequest):
        parse_request(struct.pack(">hhi", 3, 1, 1) + b"\x00\x05ab")  # a cut-short client id


# -- a cluster of real nodes ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("kafka"), 3, kafka=True) as c:
        yield c


def kafka_config(cluster: LocalCluster, **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": cluster.kafka_bootstrap, **extra}


def create_topic(cluster: LocalCluster, name: str, partitions: int, **configs: str) -> None:
    admin = AdminClient(kafka_config(cluster))
    futures = admin.create_topics([NewTopic(name, partitions, 3, config=configs)])
    futures[name].result(30)
    with Client(cluster.bootstrap) as client:
        client.wait_for_leaders(name)


def kafka_frame(api_key: int, version: int, correlation_id: int, body: bytes) -> bytes:
    header = struct.pack(">hhih", api_key, version, correlation_id, 4) + b"test"
    return struct.pack(">i", len(header) + len(body)) + header + body


def exchange(port: int, data: bytes, timeout_s: float = 5.0) -> bytes:
    """Send bytes; what comes back before the node closes the connection or goes quiet."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(data)
        out = b""
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    return out
                out += chunk
        except TimeoutError:
            return out


def test_bad_input_on_the_kafka_port_gets_an_error_or_a_closed_connection(
    cluster: LocalCluster,
) -> None:
    port = cluster.kafka_ports[1]
    # ApiVersions of a version the node does not know: UNSUPPORTED_VERSION (35) and the list.
    answer = exchange(port, kafka_frame(18, 99, 7, b""), timeout_s=2.0)
    size, correlation_id, error_code = struct.unpack(">iih", answer[:10])
    assert size == len(answer) - 4 and correlation_id == 7 and error_code == 35
    # Unknown api keys, unknown versions, garbage, a cut-short frame, an oversized one: closed.
    for bad in (
        kafka_frame(9999, 0, 1, b""),
        kafka_frame(0, 1, 1, b"\x00" * 20),
        kafka_frame(3, 4, 1, b"\xff" * 3),
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        struct.pack(">i", 2**31 - 1) + b"\x00" * 100,
        struct.pack(">i", -5),
    ):
        assert exchange(port, bad, timeout_s=5.0) == b"", bad[:20]
    truncated = kafka_frame(3, 1, 1, b"")[:-3]
    with socket.create_connection(("127.0.0.1", port), timeout=2.0) as sock:
        sock.sendall(truncated)
        sock.settimeout(1.0)
        with pytest.raises(TimeoutError):
            sock.recv(10)  # waits for the rest: nothing is answered for half a request
    # Arrays declaring more elements than the frame holds (issue 32: the 20 bytes aborted every
    # node they reached, before SASL and ACLs): closed, on every node, for every such version.
    for node_port in cluster.kafka_ports.values():
        assert exchange(node_port, THE_20_BYTES, timeout_s=5.0) == b""
    for api_key, version in HOSTILE:
        assert exchange(port, hostile_request(api_key, version), timeout_s=5.0) == b""
    # ... and the nodes keep serving Kafka clients.
    admin = AdminClient(kafka_config(cluster))
    assert admin.list_topics(timeout=10).brokers.keys() == {1, 2, 3}
    assert all(cluster.alive(n) for n in (1, 2, 3))


def group_member(cluster: LocalCluster, group: str, **extra: Any) -> Any:
    """A consumer in a group that commits only when told, with a short session."""
    settings = {
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
        **extra,
    }
    return Consumer(kafka_config(cluster, **settings))


def committed(consumer: Any, topic: str, partitions: int) -> dict[int, int]:
    tps = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
    return {tp.partition: tp.offset for tp in tps}


def log_start(client: Client, topic: str, partition: int) -> int:
    return client.list_offsets(topic, partition, "earliest")


@pytest.mark.timed  # retention acts within 1.5 s
def test_a_group_shares_partitions_takes_over_and_its_commits_hold_retention(
    cluster: LocalCluster,
) -> None:
    topic = "held"
    create_topic(
        cluster,
        topic,
        2,
        **{
            "segment.bytes": "1024",
            "file.delete.delay.ms": "0",
            "retention.check.interval.ms": "100",
        },
    )
    producer = Producer(kafka_config(cluster, **{"linger.ms": 0}))
    for i in range(400):
        producer.produce(topic, value=b"%04d" % i + b"x" * 60, partition=i % 2)
        if i % 20 == 0:
            producer.flush(10)  # small batches: many segments
    assert producer.flush(30) == 0

    def member() -> Any:  # incremental rebalancing (KIP-429) over the classic protocol
        c = group_member(
            cluster, "sharers", **{"partition.assignment.strategy": "cooperative-sticky"}
        )
        c.subscribe([topic])
        return c

    first, second = member(), member()
    seen: dict[str, set[int]] = {"first": set(), "second": set()}

    def both_read() -> bool:
        for name, c in (("first", first), ("second", second)):
            m = c.poll(0.2)
            if m is not None and not m.error():
                seen[name].add(m.partition())
        return bool(seen["first"] and seen["second"])

    wait_for("both members to read records", both_read, 60, every_s=0)
    assert seen["first"] and seen["second"] and not seen["first"] & seen["second"], seen
    # Commit both partitions at offset 30 (from the first member, which then leaves).
    first_partitions = sorted(seen["first"])
    first.commit(
        offsets=[TopicPartition(topic, p, 30) for p in first_partitions], asynchronous=False
    )
    second.commit(
        offsets=[TopicPartition(topic, p, 30) for p in sorted(seen["second"])], asynchronous=False
    )
    first.close()  # LeaveGroup: the second takes over both partitions
    taken: set[int] = set()

    def took_both() -> bool:
        m = second.poll(0.2)
        if m is not None and not m.error():
            taken.add(m.partition())
        return taken == {0, 1}

    wait_for("the second member to read both partitions", took_both, 60, every_s=0)
    with Client(cluster.bootstrap) as client:
        cursors = {c["name"]: c for c in client.cursors()}
        assert cursors["sharers"]["topic"] == topic
        assert cursors["sharers"]["positions"] == {"0": 30, "1": 30}
        # retention.ms=1 wants everything but the active segment gone; the group holds 30.
        admin = AdminClient(kafka_config(cluster))
        resource = ConfigResource(
            ConfigResource.Type.TOPIC,
            topic,
            incremental_configs=[
                ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
                for name, value in (("retention.ms", "1"),)
            ],
        )
        admin.incremental_alter_configs([resource])[resource].result(30)
        kafka_topic_config(admin, topic, "retention.ms", "1")

        def log_starts_past(offset: int, what: str) -> list[int]:
            return list(
                wait_for_value(
                    what,
                    lambda: [log_start(client, topic, p) for p in (0, 1)],
                    lambda starts: all(s > offset for s in starts),
                    20,
                    every_s=0.2,
                )
            )

        starts = log_starts_past(0, "retention to delete up to the group's offset 30")
        assert all(s <= 30 for s in starts), starts
        second.commit(offsets=[TopicPartition(topic, p, 150) for p in (0, 1)], asynchronous=False)
        starts = log_starts_past(30, "retention to delete past 30 once the group committed 150")
        assert all(s <= 150 for s in starts), starts
    assert committed(second, topic, 2) == {0: 150, 1: 150}
    second.close()


def test_a_leader_killed_under_an_idempotent_producer_and_a_group_loses_and_repeats_nothing(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    topic = "failover"
    create_topic(cluster, topic, 3, **{"min.insync.replicas": "2"})
    admin = AdminClient(kafka_config(cluster))
    leader = kafka_partitions(admin, topic, 3)[0].leader
    total = 4000
    acked: set[int] = set()
    acked_at: list[float] = []
    failed: list[str] = []
    read: list[tuple[int, int, int]] = []  # partition, offset, value: counted once committed
    stop = threading.Event()

    def produce() -> None:
        producer = Producer(
            kafka_config(
                cluster,
                **{
                    "enable.idempotence": True,
                    "acks": "all",
                    "linger.ms": 2,
                    "message.timeout.ms": 120_000,
                },
            )
        )

        def done(err: Any, msg: Any) -> None:
            if err is None:
                acked.add(int(msg.value()))
                acked_at.append(time.monotonic())
            else:
                failed.append(str(err))

        for i in range(total):
            producer.produce(topic, key=b"%d" % (i % 7), value=b"%d" % i, on_delivery=done)
            producer.poll(0)
            if i % 50 == 0:
                time.sleep(0.05)  # about four seconds of producing: the kill lands midway
        producer.flush(150)

    def consume() -> None:
        consumer = group_member(cluster, "exactly-once")
        consumer.subscribe([topic])
        try:
            while not stop.is_set():
                batch = consumer.consume(200, 0.2)
                good = [m for m in batch if not m.error()]
                if not good:
                    continue
                try:
                    consumer.commit(asynchronous=False)
                except confluent_kafka.KafkaException:
                    continue  # not committed: the group reads these again, and counts them then
                read.extend((m.partition(), m.offset(), int(m.value())) for m in good)
        finally:
            consumer.close()

    threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    cluster.kill(leader)
    killed_at = time.monotonic()
    time.sleep(3.0)
    cluster.start(leader)
    threads[0].join(200)
    try:
        wait_for_value(
            "the group to read every acknowledged record (the value: how many it has not)",
            lambda: len(acked - {v for _, _, v in read}),
            lambda unread: unread == 0,
            90,
            every_s=0.2,
        )
    finally:
        stop.set()
        threads[1].join(60)
    assert len(acked) > total // 2, f"only {len(acked)} acknowledged; failures {failed[:3]}"
    assert sum(t > killed_at for t in acked_at) > 100, "the kill did not land while producing"
    values = [v for _, _, v in read]
    missing = acked - set(values)
    assert not missing, f"{len(missing)} acknowledged records never read"
    duplicates = len(values) - len(set(values))
    assert duplicates == 0, f"{duplicates} records read twice"
    for p in range(3):
        offsets = [o for q, o, _ in read if q == p]
        assert offsets == sorted(offsets), f"partition {p} read out of order"
        ordered = [v for q, _, v in read if q == p]
        for key in range(7):  # one producer: each key's values rise within its partition
            mine = [v for v in ordered if v % 7 == key]
            assert mine == sorted(mine)


def test_records_cross_between_the_kafka_port_and_tidelogs_client(cluster: LocalCluster) -> None:
    topic = "crossing"
    create_topic(cluster, topic, 1)
    producer = Producer(kafka_config(cluster, **{"compression.type": "gzip"}))
    for i in range(20):
        producer.produce(topic, key=b"k%d" % i, value=b"v%d" % i, headers=[("h", b"%d" % i)])
    assert producer.flush(30) == 0
    with Client(cluster.bootstrap) as client:
        got = list(client.consume(topic, 0, "earliest"))
        assert [(r.key, r.value) for r in got] == [(b"k%d" % i, b"v%d" % i) for i in range(20)]
        assert [dict(r.headers)["h"] for r in got] == [b"%d" % i for i in range(20)]
        client.produce(topic, [b"from-tidelog"], partition=0)
    consumer = Consumer(
        kafka_config(cluster, **{"group.id": "cross", "auto.offset.reset": "earliest"})
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    values = []

    def read_on() -> bool:
        m = consumer.poll(0.5)
        if m is not None and not m.error():
            values.append(m.value())
        return len(values) >= 21

    try:
        wait_for("21 records through the Kafka port", read_on, 30, every_s=0)
    finally:
        consumer.close()
    assert values == [b"v%d" % i for i in range(20)] + [b"from-tidelog"]


@pytest.mark.timed  # heartbeats within the session timeout
def test_a_group_outlives_its_coordinator_without_a_rebalance(cluster: LocalCluster) -> None:
    """The group's membership is in the metadata log: when the coordinator (the metadata
    leader) is SIGKILLed, the new one carries the group on in the same generation."""
    topic = "coordinated"
    create_topic(cluster, topic, 3)
    assignments: list[list[int]] = []
    consumer = Consumer(
        kafka_config(
            cluster,
            **{
                "group.id": "survivors",
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 10_000,
                "heartbeat.interval.ms": 300,
            },
        )
    )
    consumer.subscribe(
        [topic], on_assign=lambda c, ps: assignments.append(sorted(p.partition for p in ps))
    )
    producer = Producer(kafka_config(cluster))

    def read(n: int) -> int:
        for i in range(n):
            producer.produce(topic, value=b"%d" % i, partition=i % 3)
        assert producer.flush(60) == 0
        got = 0

        def read_on() -> bool:
            nonlocal got
            m = consumer.poll(0.2)
            got += m is not None and not m.error()
            return got >= n

        wait_for(f"the group to read {n} records", read_on, 60, every_s=0)
        return got

    try:
        assert read(30) == 30 and assignments == [[0, 1, 2]]
        with Client(cluster.bootstrap) as client:
            coordinator = client.describe_cluster().metadata_leader
        cluster.kill(coordinator)
        try:
            assert read(30) == 30
            time.sleep(2.0)  # heartbeats to the new coordinator, in the old generation
            assert assignments == [[0, 1, 2]], "the group rebalanced"
        finally:
            cluster.start(coordinator)
            cluster.wait_ready()
    finally:
        consumer.close()


@pytest.mark.filterwarnings("ignore:alter_configs has been deprecated")
def test_admin_clients_list_groups_on_any_node_and_get_kafkas_error_codes(
    cluster: LocalCluster,
) -> None:
    """An admin client asks every broker for its groups and fails if any answers an error:
    nodes that coordinate none answered NOT_COORDINATOR (kafkajs's listGroups failed on any
    multi-node cluster). Too high a replication factor is INVALID_REPLICATION_FACTOR (38),
    not INVALID_REQUEST."""
    create_topic(cluster, "listed", 1)
    member = group_member(cluster, "listed-group")
    try:
        member.subscribe(["listed"])

        def joined() -> bool:
            if not member.assignment():
                member.poll(0.5)
            return bool(member.assignment())

        # (joining took over 5 s on a loaded CI machine)
        wait_for("the member to join its group", joined, 60, every_s=0)
        lister = AdminClient(kafka_config(cluster))  # (kept: its handle must outlive the call)
        listed = lister.list_consumer_groups().result(30)
        assert not listed.errors, listed.errors
        assert "listed-group" in {g.group_id for g in listed.valid}
    finally:
        member.close()
    admin = AdminClient(kafka_config(cluster))
    futures = admin.create_topics([NewTopic("too-many-copies", 1, 5)])
    with pytest.raises(Exception) as info:
        futures["too-many-copies"].result(30)
    error = info.value.args[0]
    assert error.code() == confluent_kafka.KafkaError.INVALID_REPLICATION_FACTOR, error
    # AlterConfigs (33), the whole-set kind kafkajs has (confluent's alter_configs too): the
    # topic's overrides become exactly those given, the others go back to their defaults.
    create_topic(cluster, "altered", 1, **{"retention.ms": "600000"})
    whole = ConfigResource("topic", "altered", set_config={"max.message.bytes": "200000"})
    admin.alter_configs([whole])[whole].result(30)
    kafka_topic_config(admin, "altered", "max.message.bytes", "200000")
    described = admin.describe_configs([ConfigResource("topic", "altered")])
    configs = next(iter(described.values())).result(30)
    assert configs["retention.ms"].value == str(7 * 24 * 3600 * 1000)  # back to its default
    bad = ConfigResource("topic", "altered", set_config={"retention.ms": "soon"})
    with pytest.raises(Exception) as info:
        admin.alter_configs([bad], validate_only=True)[bad].result(30)
    assert info.value.args[0].code() == confluent_kafka.KafkaError.INVALID_CONFIG


def kafka_call(port: int, api_key: int, version: int, body: dict[str, Any]) -> Any:
    """One request (a mapping fitted to kio's class of that api and version) to a node's Kafka
    port, and its parsed answer."""
    import io

    from kio.index import load_request_schema
    from kio.serial import entity_writer

    from tidelog.kafka.codec import build

    schema = load_request_schema(api_key, version)
    out = io.BytesIO()
    header = schema.__header_schema__(
        request_api_key=api_key, request_api_version=version, correlation_id=9, client_id="t"
    )
    entity_writer(schema.__header_schema__)(out, header)
    entity_writer(schema)(out, build(schema, body))
    request = out.getvalue()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(struct.pack(">i", len(request)) + request)
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
            chunk = sock.recv(65536)
            assert chunk, "the node closed the connection"
            data += chunk
    view = memoryview(data)[4:]
    response = load_response_schema(api_key, version)
    _, used = entity_reader(response.__header_schema__)(view, 0)
    return entity_reader(response)(view[used:], 0)[0]


def test_fetch_by_topic_id_and_offset_fetch_of_several_groups(cluster: LocalCluster) -> None:
    """Issue 32: Kafka >= 3.5 serves Fetch 13+ (topics by id, KIP-516) and OffsetFetch 8+
    (several groups in one request); clients that speak only those could not consume."""
    create_topic(cluster, "by-id", 1)
    with Client(cluster.bootstrap) as client:
        client.produce("by-id", [b"a", b"b", b"c"], partition=0)
    port = next(iter(cluster.kafka_ports.values()))
    meta = kafka_call(port, 3, 12, {"topics": [{"name": "by-id"}]})
    (topic,) = meta.topics
    leader = topic.partitions[0].leader_id
    topic_id = topic.topic_id
    for version in (13, 15, 16):
        fetch = {
            "max_wait": 100,
            "min_bytes": 1,
            "topics": [
                {
                    "topic_id": topic_id,
                    "partitions": [
                        {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}
                    ],
                },
                {
                    "topic_id": uuid.uuid4(),
                    "partitions": [
                        {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}
                    ],
                },
            ],
        }
        answer = kafka_call(cluster.kafka_ports[leader], 1, version, fetch)
        found = {r.topic_id: r.partitions[0] for r in answer.responses}
        assert found[topic_id].error_code == 0 and found[topic_id].high_watermark == 3
        assert found[topic_id].records and len(found[topic_id].records) > 30
        assert [p.error_code for t, p in found.items() if t != topic_id] == [
            100
        ]  # UNKNOWN_TOPIC_ID

    # Two groups' offsets in one OffsetFetch v8/v9, from whichever node coordinates groups.
    for group, offset in (("first-group", 1), ("second-group", 3)):
        committer = Consumer(kafka_config(cluster, **{"group.id": group}))
        committer.commit(offsets=[TopicPartition("by-id", 0, offset)], asynchronous=False)
        committer.close()
    for version in (8, 9):
        wanted = {
            "groups": [
                {"group_id": g, "topics": [{"name": "by-id", "partition_indexes": [0]}]}
                for g in ("first-group", "second-group", "no-such-group")
            ]
        }
        answers = [kafka_call(p, 9, version, wanted) for p in cluster.kafka_ports.values()]
        answer = next(a for a in answers if all(g.error_code == 0 for g in a.groups))
        offsets = {g.group_id: g.topics[0].partitions[0].committed_offset for g in answer.groups}
        assert offsets == {"first-group": 1, "second-group": 3, "no-such-group": -1}
