"""Operators' tools for hanging transactions (KIP-664) on the Kafka port of a 3-node cluster.

DescribeProducers shows a confluent-kafka transactional producer's open transaction and where it
starts, and none once it commits; WriteTxnMarkers refuses to end a transaction the coordinator
still holds. The one way this design left a transaction hanging (a producer whose idempotence
entry expired while its transaction was open got no abort marker) is closed, and its test shows
the marker written and find-hanging finding nothing. The rules an operator's marker meets for a
transaction that hangs (ABORT only, only past transaction.max.timeout.ms) are checked in
process by test_marker_rules.py; WriteTxnMarkers without cluster admin is refused in
test_acl.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from helpers import run_tidelog, wait_for, wait_for_value
from test_kafka_transactions import cluster_leader, kafka_ask, kinds, log_of
from tidelog.cli.cluster import LocalCluster
from tidelog.client.sync_client import Client
from tidelog.features import TRANSACTIONS_LEVEL

pytestmark = pytest.mark.process  # tiers: pyproject.toml's markers

confluent_kafka = pytest.importorskip("confluent_kafka")

MAX_TIMEOUT_MS = 10_000  # the nodes' transaction.max.timeout.ms: a hanging verdict's age
NOT_LEADER_OR_FOLLOWER = 6
UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_TXN_STATE = 48


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    serve = ["--set", f"transaction.max.timeout.ms={MAX_TIMEOUT_MS}"]
    with LocalCluster(
        tmp_path_factory.mktemp("kafka-txn-admin"), 3, kafka=True, serve_args=serve
    ) as c:
        with Client(c.bootstrap) as client:
            wait_for_value(
                "feature level 3",
                lambda: client.describe_features().finalized_level,
                TRANSACTIONS_LEVEL.__eq__,
            )
        yield c


def producer(cluster: LocalCluster, transactional_id: str) -> Any:
    return confluent_kafka.Producer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "transactional.id": transactional_id,
            "transaction.timeout.ms": MAX_TIMEOUT_MS,
        }
    )


def describe_producers(cluster: LocalCluster, node: int, topic: str) -> dict[str, Any]:
    """DescribeProducers of partition 0, asked of one node: its partition answer."""
    answer = kafka_ask(cluster, node, 61, {"topics": [{"name": topic, "partition_indexes": [0]}]})
    partition: dict[str, Any] = answer["topics"][0]["partitions"][0]
    return partition


def open_transactions(cluster: LocalCluster, topic: str) -> list[dict[str, Any]]:
    """The producers with a transaction open in partition 0, as its leader describes them."""
    found = describe_producers(cluster, cluster_leader(cluster, topic), topic)
    assert found["error_code"] == 0, found
    return [p for p in found["active_producers"] if p["current_txn_start_offset"] >= 0]


def write_marker(
    cluster: LocalCluster, node: int, topic: str, state: dict[str, Any], commit: bool
) -> int:
    """WriteTxnMarkers for partition 0 of one producer, as kafka-transactions.sh abort sends
    it (the producer's id and epoch as DescribeProducers gave them); the partition's code."""
    marker = {
        "producer_id": state["producer_id"],
        "producer_epoch": state["producer_epoch"],
        "transaction_result": commit,
        "coordinator_epoch": max(state["coordinator_epoch"], 0),
        "topics": [{"name": topic, "partition_indexes": [0]}],
    }
    answer = kafka_ask(cluster, node, 27, {"markers": [marker]})
    [result] = answer["markers"]
    assert result["producer_id"] == state["producer_id"]
    return int(result["topics"][0]["partitions"][0]["error_code"])


def committed_end(cluster: LocalCluster, node: int, topic: str, isolation: int) -> int:
    """ListOffsets latest of partition 0 (isolation 1: read_committed, the LSO)."""
    asked = {
        "replica_id": -1,
        "isolation_level": isolation,
        "topics": [{"name": topic, "partitions": [{"partition_index": 0, "timestamp": -1}]}],
    }
    answer = kafka_ask(cluster, node, 2, asked)
    return int(answer["topics"][0]["partitions"][0]["offset"])


def other_node(cluster: LocalCluster, node: int) -> int:
    return next(n for n in cluster.kafka_ports if n != node)


def test_describe_producers_shows_an_open_transaction_until_it_commits(
    cluster: LocalCluster,
) -> None:
    topic = "adm-open"
    with Client(cluster.bootstrap) as client:
        client.create_topic(topic, 1, 3)
    p = producer(cluster, "adm-open")
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(3):
        p.produce(topic, value=b"open-%d" % i, partition=0)
    p.flush(30)
    leader = cluster_leader(cluster, topic)
    [state] = open_transactions(cluster, topic)
    assert state["current_txn_start_offset"] == 0
    assert state["last_sequence"] == 2  # three records, one batch
    assert abs(state["last_timestamp"] - time.time() * 1000) < 60_000
    listed = kafka_ask(cluster, leader, 66, {"state_filters": [], "producer_id_filters": []})
    by_node = [
        kafka_ask(cluster, n, 66, {"state_filters": [], "producer_id_filters": []})
        for n in cluster.kafka_ports
    ]
    owners = {
        t["transactional_id"]: t["producer_id"]
        for answer in [listed, *by_node]
        for t in answer["transaction_states"]
    }
    assert owners["adm-open"] == state["producer_id"]
    # tidelog's protocol asks the same op: the client and `tidelog transactions producers`.
    with Client(cluster.bootstrap) as client:
        [own] = client.describe_producers(topic, 0)
    assert (own["producer_id"], own["producer_epoch"], own["txn_start_offset"]) == (
        state["producer_id"],
        state["producer_epoch"],
        0,
    )
    shown = run_tidelog("transactions", "producers", topic, "0", "--bootstrap", cluster.bootstrap)
    assert shown.returncode == 0, shown.stderr
    assert "OPEN TRANSACTION FROM" in shown.stdout
    [row] = shown.stdout.splitlines()[1:]
    assert row.split()[0] == str(state["producer_id"]) and row.split()[-1] == "0"

    # Only the leader answers; a topic nobody created is unknown.
    assert describe_producers(cluster, other_node(cluster, leader), topic)["error_code"] == (
        NOT_LEADER_OR_FOLLOWER
    )
    assert describe_producers(cluster, leader, "adm-nothing")["error_code"] == (
        UNKNOWN_TOPIC_OR_PARTITION
    )
    # The coordinator holds it Ongoing: no marker of an operator may end it, either way.
    assert write_marker(cluster, leader, topic, state, commit=False) == INVALID_TXN_STATE
    assert write_marker(cluster, leader, topic, state, commit=True) == INVALID_TXN_STATE

    p.commit_transaction(30)
    wait_for("no transaction open", lambda: not open_transactions(cluster, topic), 30)
    found = describe_producers(cluster, leader, topic)["active_producers"]
    assert [s["producer_id"] for s in found] == [state["producer_id"]]
    markers, records = log_of(cluster, topic, 0)
    assert kinds(markers) == ["commit"] and records == 3


def test_an_open_transaction_outlives_its_producers_expiry_and_its_abort_ends_it(
    cluster: LocalCluster,
) -> None:
    """A transaction left open longer than producer.id.expiration.ms (200 ms here, checked
    every 100 ms) keeps its producer's entry, as Kafka's does: the coordinator's abort then
    writes its marker and the LSO moves on. (Forgetting the producer made the leader take it
    for one that never wrote, skip the marker and hold the LSO for good: a hanging
    transaction, found while building find-hanging.) find-hanging finds nothing, and an
    operator's markers for it write nothing."""
    topic = "adm-expiry"
    with Client(cluster.bootstrap) as client:
        configs = {"producer.id.expiration.ms": "200", "retention.check.interval.ms": "100"}
        client.create_topic(topic, 1, 3, configs=configs)
    p = producer(cluster, topic)
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, value=b"aborted later", partition=0)
    p.flush(30)
    time.sleep(1.5)  # well past the expiry, on every replica
    leader = cluster_leader(cluster, topic)
    [state] = open_transactions(cluster, topic)
    assert state["current_txn_start_offset"] == 0
    p.abort_transaction(30)
    with Client(cluster.bootstrap) as client:
        wait_for_value(
            "the coordinator's CompleteAbort",
            lambda: client.describe_transaction(topic)["state"],
            "CompleteAbort".__eq__,
        )
        client.produce(topic, [b"after-1", b"after-2", b"after-3"], partition=0)
    wait_for("the abort marker", lambda: kinds(log_of(cluster, topic, 0)[0]) == ["abort"], 30)
    assert open_transactions(cluster, topic) == []  # find-hanging's first question: none
    assert committed_end(cluster, leader, topic, isolation=1) == 5  # the LSO is the HW
    # An operator's markers for it find nothing open: answered, and nothing written.
    assert write_marker(cluster, leader, topic, state, commit=True) == 0
    assert write_marker(cluster, leader, topic, state, commit=False) == 0
    assert kinds(log_of(cluster, topic, 0)[0]) == ["abort"]
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": "adm-expiry-reader",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
        got: list[bytes] = []

        def read_all() -> bool:
            m = consumer.poll(0.5)
            if m is not None and not m.error():
                got.append(m.value())
            return len(got) >= 3

        wait_for("the records after the aborted transaction", read_all, 30)
    finally:
        consumer.close()
    assert got == [b"after-1", b"after-2", b"after-3"]
