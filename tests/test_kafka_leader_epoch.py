"""KIP-320 on the Kafka port: a Kafka client names the leader epoch it knows (Fetch 9+,
ListOffsets 4+, OffsetForLeaderEpoch), and a replica that knows a newer one answers
FENCED_LEADER_EPOCH (74), one that knows only an older one UNKNOWN_LEADER_EPOCH (75), as
tidelog's own protocol does (docs/design.md, "Reads that are current"). Raw requests over a
socket at every version that carries the field, then real clients (kafka-python, librdkafka)
reading on while the leadership moves, fenced and back on the new leader."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest

from helpers import wait_for, wait_for_value
from test_kafka import kafka_call
from tidelog.cli.cluster import LocalCluster
from tidelog.client.sync_client import Client
from tidelog.errors import UnknownTopicOrPartition
from tidelog.record.batch import iter_headers

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")

pytestmark = pytest.mark.process  # tiers: pyproject.toml's markers

FENCED_LEADER_EPOCH = 74
UNKNOWN_LEADER_EPOCH = 75
NOT_LEADER_OR_FOLLOWER = 6


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("kafka-epochs"), 3, kafka=True) as c:
        yield c


def kafka_leader(cluster: LocalCluster, node: int, topic: str) -> tuple[int, int, Any]:
    """(leader, leader_epoch, topic_id) of partition 0 as a node's Metadata v12 answers."""
    meta = kafka_call(cluster.kafka_ports[node], 3, 12, {"topics": [{"name": topic}]})
    (found,) = meta.topics
    part = found.partitions[0]
    return int(part.leader_id), int(part.leader_epoch), found.topic_id


def move_leader(cluster: LocalCluster, client: Client, topic: str) -> tuple[int, int]:
    """Elect another node leader of partition 0; (the new leader, its epoch) once its Kafka
    port says so."""
    leader = client.topic(topic, refresh=True).leaders[0]
    successor = next(n for n in cluster.node_ids if n != leader)

    def elected() -> bool:
        try:
            client.elect_preferred_leader(topic, 0, successor)
        except UnknownTopicOrPartition:
            return False  # (its replica of a new topic is still being made)
        return True

    wait_for(f"node {successor} to lead {topic}/0", elected, 20, every_s=0.1)
    found = wait_for_value(
        f"node {successor} to answer Metadata as the leader of {topic}/0",
        lambda: kafka_leader(cluster, successor, topic),
        lambda found: found[0] == successor,
        20,
        every_s=0.1,
    )
    return successor, found[1]


def fetch_body(version: int, topic: str, topic_id: Any, epoch: int | None) -> dict[str, Any]:
    partition: dict[str, Any] = {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}
    if epoch is not None:
        partition["current_leader_epoch"] = epoch
    named = {"topic_id": topic_id} if version >= 13 else {"topic": topic}
    return {
        "replica_id": -1,
        "max_wait": 0,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "topics": [{**named, "partitions": [partition]}],
    }


def fetch(
    cluster: LocalCluster, node: int, version: int, topic: str, topic_id: Any, epoch: int | None
) -> tuple[Any, Any]:
    """(partition 0's answer, the whole answer) of one Fetch to a node."""
    answer = kafka_call(
        cluster.kafka_ports[node], 1, version, fetch_body(version, topic, topic_id, epoch)
    )
    return answer.responses[0].partitions[0], answer


def list_offsets(
    cluster: LocalCluster, node: int, version: int, topic: str, epoch: int, timestamp: int = -1
) -> Any:
    body = {
        "replica_id": -1,
        "isolation_level": 0,
        "topics": [
            {
                "name": topic,
                "partitions": [
                    {"partition_index": 0, "current_leader_epoch": epoch, "timestamp": timestamp}
                ],
            }
        ],
    }
    answer = kafka_call(cluster.kafka_ports[node], 2, version, body)
    return answer.topics[0].partitions[0]


def epoch_end(
    cluster: LocalCluster, node: int, version: int, topic: str, current: int, epoch: int
) -> Any:
    body = {
        "replica_id": -1,
        "topics": [
            {
                "topic": topic,
                "partitions": [
                    {"partition": 0, "current_leader_epoch": current, "leader_epoch": epoch}
                ],
            }
        ],
    }
    answer = kafka_call(cluster.kafka_ports[node], 23, version, body)
    return answer.topics[0].partitions[0]


def test_fetch_list_offsets_and_epoch_ends_are_fenced_by_the_leader_epoch(
    cluster: LocalCluster,
) -> None:
    topic = "fenced"
    with Client(cluster.bootstrap) as client:
        client.create_topic(topic, 1, 3)
        client.wait_for_leaders(topic)
        client.produce(topic, [b"a", b"b", b"c"], partition=0)
        deposed, old_epoch = move_leader(cluster, client, topic)
        client.produce(topic, [b"d", b"e"], partition=0)  # written in the next epoch, at 3
        leader, epoch = move_leader(cluster, client, topic)
    assert epoch > old_epoch >= 0
    # Every node's Metadata carries the epoch the leader checks (v7+), once it has heard.
    wait_for_value(
        f"every node's Metadata to name leader {leader} in epoch {epoch}",
        lambda: {kafka_leader(cluster, node, topic)[:2] for node in cluster.node_ids},
        lambda found: found == {(leader, epoch)},
        20,
        every_s=0.1,
    )
    topic_id = kafka_leader(cluster, leader, topic)[2]
    # What the log holds: five records, and a leader's marker where an election found entries
    # not yet known committed (replication/leading.py), so offsets and epochs are read back.
    whole, _ = fetch(cluster, leader, 12, topic, None, epoch)
    hw = whole.high_watermark
    batches = [h for _, h in iter_headers(whole.records)]
    assert 5 <= hw <= 7 and batches[-1].last_offset == hw - 1

    def end_of(asked: int) -> int:
        """Where the log ends epoch asked: the first batch of a later one, else the end."""
        return next((b.base_offset for b in batches if b.partition_leader_epoch > asked), hw)

    for version in (9, 11, 12, 13, 16):
        stale, answer = fetch(cluster, leader, version, topic, topic_id, old_epoch)
        assert stale.error_code == FENCED_LEADER_EPOCH and not stale.records, (version, stale)
        if version >= 12:  # KIP-951: the refusal names the leader it knows, and where it is
            assert (stale.current_leader.leader_id, stale.current_leader.leader_epoch) == (
                leader,
                epoch,
            )
        if version >= 16:
            assert [(e.node_id, e.port) for e in answer.node_endpoints] == [
                (leader, cluster.kafka_ports[leader])
            ]
        future, _ = fetch(cluster, leader, version, topic, topic_id, epoch + 1)
        assert future.error_code == UNKNOWN_LEADER_EPOCH and not future.records, (version, future)
        for current in (epoch, -1):
            served, _ = fetch(cluster, leader, version, topic, topic_id, current)
            assert served.error_code == 0 and served.high_watermark == hw, (version, served)
            assert served.records and len(served.records) > 60
            if version >= 12:
                assert served.current_leader.leader_id == -1  # (refusals name the leader)
        # The deposed leader still holds a replica (Fetch 11+ may read any): it fences a
        # client that still thinks it leads, and points it at its successor.
        if version >= 11:
            there, _ = fetch(cluster, deposed, version, topic, topic_id, old_epoch)
            assert there.error_code == FENCED_LEADER_EPOCH, (version, there)
            if version >= 12:
                assert there.current_leader.leader_id == leader
    unnamed, _ = fetch(cluster, leader, 8, topic, None, None)  # before Fetch 9: no epoch
    assert unnamed.error_code == 0 and unnamed.high_watermark == hw

    for version in (4, 5, 6):
        assert list_offsets(cluster, leader, version, topic, old_epoch).error_code == (
            FENCED_LEADER_EPOCH
        )
        assert list_offsets(cluster, leader, version, topic, epoch + 1).error_code == (
            UNKNOWN_LEADER_EPOCH
        )
        for current in (epoch, -1):
            latest = list_offsets(cluster, leader, version, topic, current)
            assert (latest.error_code, latest.offset, latest.leader_epoch) == (0, hw, epoch)
            earliest = list_offsets(cluster, leader, version, topic, current, timestamp=-2)
            assert (earliest.error_code, earliest.offset) == (0, 0)

    # OffsetForLeaderEpoch: where each epoch ends, answered by the leader, fenced alike.
    for version in (2, 3, 4):
        first = epoch_end(cluster, leader, version, topic, epoch, old_epoch - 1)
        assert (first.error_code, first.end_offset) == (0, 3), first  # a, b, c
        middle = epoch_end(cluster, leader, version, topic, epoch, old_epoch)
        assert (middle.error_code, middle.leader_epoch) == (0, old_epoch), middle
        assert 5 <= middle.end_offset == end_of(old_epoch), (middle, batches)
        current = epoch_end(cluster, leader, version, topic, -1, epoch)
        assert (current.error_code, current.end_offset) == (0, hw)
        fenced = epoch_end(cluster, leader, version, topic, old_epoch, old_epoch)
        assert fenced.error_code == FENCED_LEADER_EPOCH
        unknown = epoch_end(cluster, leader, version, topic, epoch + 1, old_epoch)
        assert unknown.error_code == UNKNOWN_LEADER_EPOCH
        follower = epoch_end(cluster, deposed, version, topic, epoch, old_epoch)
        assert follower.error_code == NOT_LEADER_OR_FOLLOWER


def test_kafka_clients_read_on_across_leader_changes_fenced_and_refreshed(
    cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """kafka-python and librdkafka consumers send the epoch Metadata gave them; when the
    leadership moves under them, the deposed leader fences their next fetch, they refresh,
    check their position with OffsetForLeaderEpoch on the new leader and read on, every
    record once and in order."""
    topic = "moving"
    caplog.set_level(logging.DEBUG, logger="kafka.consumer.fetcher")
    rdkafka_log = logging.getLogger("test.librdkafka")
    rdkafka_log.setLevel(logging.DEBUG)
    with Client(cluster.bootstrap) as client:
        client.create_topic(topic, 1, 3)
        client.wait_for_leaders(topic)
        python_consumer = kafka.KafkaConsumer(
            bootstrap_servers=cluster.kafka_bootstrap, auto_offset_reset="earliest"
        )
        python_consumer.assign([kafka.TopicPartition(topic, 0)])
        rd_consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": cluster.kafka_bootstrap,
                "group.id": "epoch-readers",
                "enable.auto.commit": False,
                "debug": "fetch",
            },
            logger=rdkafka_log,
        )
        rd_consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
        read: dict[str, list[bytes]] = {"kafka-python": [], "librdkafka": []}
        errors: list[str] = []

        def poll_both() -> None:
            for records in python_consumer.poll(timeout_ms=100).values():
                read["kafka-python"].extend(r.value for r in records)
            message = rd_consumer.poll(0.1)
            if message is not None:
                if message.error():
                    errors.append(str(message.error()))
                else:
                    read["librdkafka"].append(message.value())

        def read_all(total: int) -> None:
            def done() -> bool:
                poll_both()
                return all(len(values) >= total for values in read.values())

            wait_for(f"both consumers to read {total} records", done, 60, every_s=0)

        sent: list[bytes] = []
        epochs = []
        try:
            with caplog.at_level(logging.DEBUG, logger="test.librdkafka"):
                for round_ in range(3):
                    batch = [b"%d-%d" % (round_, i) for i in range(20)]
                    client.produce(topic, batch, partition=0)
                    sent.extend(batch)
                    read_all(len(sent))
                    time.sleep(0.3)  # both park a fetch at the leader: it is deposed under it
                    if round_ < 2:
                        epochs.append(move_leader(cluster, client, topic)[1])
        finally:
            python_consumer.close()
            rd_consumer.close()
    assert epochs == sorted(epochs) and len(set(epochs)) == 2
    assert not errors, errors
    assert read == {"kafka-python": sent, "librdkafka": sent}
    logged = [r.getMessage() for r in caplog.records]
    assert any("FencedLeaderEpochError" in m for m in logged), "kafka-python was never fenced"
    assert any("FENCED_LEADER_EPOCH" in m for m in logged), "librdkafka was never fenced"
