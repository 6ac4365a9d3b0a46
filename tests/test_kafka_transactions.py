"""Kafka transactions from clients nobody here wrote (confluent-kafka's librdkafka, kafkajs)
against a 3-node cluster's Kafka ports: commits and aborts end with a marker in every partition
of the transaction, offsets sent to a transaction are committed only when it commits, a second
producer with the same transactional.id fences the first, transaction.timeout.ms aborts a
forgotten transaction, and a coordinator SIGKILLed between EndTxn and the markers is finished
by the next one; tidelog's own client and a Kafka producer share a transactional id's rules.
The markers are read back from the log (read_uncommitted) with
record/markers.py."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import kafka_partitions, wait_for, wait_for_value
from tidelog.cli.cluster import LocalCluster
from tidelog.client.sync_client import Client
from tidelog.errors import TidelogError, TransactionsNotEnabled
from tidelog.features import TRANSACTIONS_LEVEL
from tidelog.record.batch import ProducerRecord, build_batch
from tidelog.record.markers import Marker, read_marker
from wire import kafka_call

pytestmark = pytest.mark.process  # tiers: pyproject.toml's markers

confluent_kafka = pytest.importorskip("confluent_kafka")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("kafka-txn"), 3, kafka=True) as c:
        with Client(c.bootstrap) as client:  # a new cluster finalizes its level just after
            wait_for_value(
                "feature level 3",
                lambda: client.describe_features().finalized_level,
                TRANSACTIONS_LEVEL.__eq__,
            )
        yield c


def create_topic(
    cluster: LocalCluster, topic: str, partitions: int, replication_factor: int = 3
) -> dict[int, list[int]]:
    """The topic, created by a Kafka admin client; each partition's replicas."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    admin.create_topics([NewTopic(topic, partitions, replication_factor)])[topic].result(30)
    with Client(cluster.bootstrap) as client:
        client.wait_for_leaders(topic)
    described = kafka_partitions(admin, topic, partitions)
    return {p: list(meta.replicas) for p, meta in described.items()}


def producer(cluster: LocalCluster, transactional_id: str, **extra: Any) -> Any:
    return confluent_kafka.Producer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "transactional.id": transactional_id,
            **extra,
        }
    )


def log_of(cluster: LocalCluster, topic: str, partition: int) -> tuple[list[Marker], int]:
    """The partition's markers and how many data records it holds (read_uncommitted)."""
    with Client(cluster.bootstrap) as client:
        fetched = client.fetch(topic, partition, 0)
    found, records = [], 0
    for pos, header in fetched.batches:
        marker = read_marker(fetched.raw, header, pos)
        if marker is not None:
            found.append(marker)
        elif not header.is_control:
            records += header.records_count
    return found, records


def kinds(markers: list[Marker]) -> list[str]:
    return ["commit" if m.commit else "abort" for m in markers]


def kafka_ask(cluster: LocalCluster, node: int, api_key: int, values: dict[str, Any]) -> Any:
    """One request at the highest version served, to one node's Kafka port; its answer."""
    return kafka_call(("127.0.0.1", cluster.kafka_ports[node]), api_key, values)


def metadata_leader(cluster: LocalCluster) -> int:
    with Client(cluster.bootstrap) as client:
        return client.describe_cluster(leader_only=True).metadata_leader


def state_of(cluster: LocalCluster, transactional_id: str) -> str:
    """The transaction's state, as ListTransactions gives it."""
    listed = kafka_ask(cluster, metadata_leader(cluster), 66, {"state_filters": []})
    return next(
        str(t["transaction_state"])
        for t in listed["transaction_states"]
        if t["transactional_id"] == transactional_id
    )


def described(cluster: LocalCluster, transactional_id: str) -> dict[str, Any]:
    """DescribeTransactions, asked of the coordinator, of an open or prepared transaction (a
    complete one has no start time: Kafka's -1, which kio's reader here does not parse)."""
    leader = metadata_leader(cluster)
    answer = kafka_ask(cluster, leader, 65, {"transactional_ids": [transactional_id]})
    state: dict[str, Any] = answer["transaction_states"][0]
    return state


def test_commit_and_abort_end_with_a_marker_in_every_partition(cluster: LocalCluster) -> None:
    create_topic(cluster, "txn-out", 3)
    p = producer(cluster, "txn-basic")
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(9):
        p.produce("txn-out", key=b"k%d" % i, value=b"committed-%d" % i, partition=i % 3)
    p.commit_transaction(30)
    p.begin_transaction()
    for partition in (0, 2):
        p.produce("txn-out", value=b"aborted", partition=partition)
    p.flush(30)
    p.abort_transaction(30)

    def ended() -> bool:
        return all(len(log_of(cluster, "txn-out", q)[0]) == (2 if q != 1 else 1) for q in range(3))

    wait_for("the markers in every partition", ended, 30)
    for partition in range(3):
        markers, records = log_of(cluster, "txn-out", partition)
        expected = ["commit", "abort"] if partition != 1 else ["commit"]
        assert kinds(markers) == expected, (partition, markers)
        assert records == 3 + (1 if partition != 1 else 0)
        assert len({(m.producer_id, m.producer_epoch) for m in markers}) == 1
    assert state_of(cluster, "txn-basic") == "CompleteAbort"


def test_offsets_sent_to_a_transaction_commit_only_with_it(cluster: LocalCluster) -> None:
    """A consume-transform-produce loop: the group's offsets move when its output commits,
    and stay where they were when it aborts."""
    from confluent_kafka import Consumer, TopicPartition

    create_topic(cluster, "txn-in", 1)
    create_topic(cluster, "txn-loop-out", 1)
    with Client(cluster.bootstrap) as client:
        client.produce("txn-in", [b"a", b"b", b"c", b"d"], partition=0)
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": "txn-loop",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe(["txn-in"])
    p = producer(cluster, "txn-loop")
    p.init_transactions(30)
    try:
        got: list[Any] = []
        wait_for("two records", lambda: read_some(consumer, got, 2), 30, every_s=0)
        p.begin_transaction()
        for m in got:
            p.produce("txn-loop-out", value=m.value().upper(), partition=0)
        p.send_offsets_to_transaction(
            [TopicPartition("txn-in", 0, got[-1].offset() + 1)],
            consumer.consumer_group_metadata(),
            30,
        )
        p.commit_transaction(30)
        assert committed_offset(cluster, "txn-loop") == got[-1].offset() + 1

        more: list[Any] = []
        wait_for("two more records", lambda: read_some(consumer, more, 2), 30, every_s=0)
        p.begin_transaction()
        p.produce("txn-loop-out", value=b"never", partition=0)
        p.send_offsets_to_transaction(
            [TopicPartition("txn-in", 0, more[-1].offset() + 1)],
            consumer.consumer_group_metadata(),
            30,
        )
        # KIP-447: while the offsets are pending, a stable fetch of them is refused.
        assert stable_offset(cluster, "txn-loop") == (88, got[-1].offset() + 1)
        p.abort_transaction(30)
        assert committed_offset(cluster, "txn-loop") == got[-1].offset() + 1
        assert stable_offset(cluster, "txn-loop") == (0, got[-1].offset() + 1)
    finally:
        consumer.close()
    markers, records = wait_for_value(
        "both markers", lambda: log_of(cluster, "txn-loop-out", 0), lambda v: len(v[0]) == 2
    )
    assert kinds(markers) == ["commit", "abort"] and records == 3


def read_some(consumer: Any, got: list[Any], n: int) -> bool:
    m = consumer.poll(0.5)
    if m is not None and not m.error():
        got.append(m)
    return len(got) >= n


def stable_offset(cluster: LocalCluster, group: str) -> tuple[int, int]:
    """OffsetFetch with require_stable of txn-in/0: (its error code, its offset)."""
    asked = {
        "groups": [{"group_id": group, "topics": [{"name": "txn-in", "partition_indexes": [0]}]}],
        "require_stable": True,
    }
    answer = kafka_ask(cluster, metadata_leader(cluster), 9, asked)
    partition = answer["groups"][0]["topics"][0]["partitions"][0]
    return int(partition["error_code"]), int(partition["committed_offset"])


def committed_offset(cluster: LocalCluster, group: str) -> int:
    with Client(cluster.bootstrap) as client:
        cursors = {c["name"]: c for c in client.cursors()}
    return int(cursors[group]["positions"]["0"]) if group in cursors else -1


def test_read_committed_consumers_stop_at_the_lso_and_skip_aborted_transactions(
    cluster: LocalCluster,
) -> None:
    """Kafka's Fetch and ListOffsets with isolation_level=1: below the LSO only, with the
    aborted transactions listed, as librdkafka's and kafka-python's read_committed consumers
    expect; read_uncommitted sees everything below the HW."""
    from confluent_kafka import Consumer, TopicPartition

    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTopicPartition

    create_topic(cluster, "txn-rc", 1)
    p = producer(cluster, "txn-rc")
    p.init_transactions(30)
    for outcome in ("commit", "abort", "commit"):
        p.begin_transaction()
        for i in range(3):
            p.produce("txn-rc", value=f"{outcome}-{i}".encode(), partition=0)
        p.flush(30)
        if outcome == "commit":
            p.commit_transaction(30)
        else:
            p.abort_transaction(30)
    p.begin_transaction()  # left open: it holds the LSO
    p.produce("txn-rc", value=b"open", partition=0)
    p.flush(30)

    def end_offsets(isolation: str) -> int:
        reader = KafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap, isolation_level=isolation)
        try:
            tp = KTopicPartition("txn-rc", 0)
            return int(reader.end_offsets([tp])[tp])
        finally:
            reader.close()

    # 3 commits + 3 aborted + 3 commits with 3 markers, then the open one at offset 12.
    wait_for("the open transaction's record", lambda: end_offsets("read_uncommitted") == 13, 30)
    assert end_offsets("read_committed") == 12  # the LSO: the open transaction's first offset

    raw = kafka_ask(
        cluster,
        cluster_leader(cluster, "txn-rc"),
        1,
        {
            "max_wait": 0,
            "min_bytes": 1,
            "max_bytes": 1 << 20,
            "isolation_level": 1,
            "topics": [
                {
                    "topic": "txn-rc",
                    "topic_id": topic_id(cluster, "txn-rc"),
                    "partitions": [
                        {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}
                    ],
                }
            ],
        },
    )
    answer = raw["responses"][0]["partitions"][0]
    assert (answer["high_watermark"], answer["last_stable_offset"]) == (13, 12), answer
    aborted = [(a["producer_id"], a["first_offset"]) for a in answer["aborted_transactions"]]
    assert len(aborted) == 1 and aborted[0][1] == 4, aborted  # the second transaction's

    committed_values = [f"commit-{i}".encode() for i in range(3)] * 2
    rc = Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": "txn-rc-reader",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        rc.assign([TopicPartition("txn-rc", 0, 0)])
        got: list[Any] = []
        wait_for("six committed records", lambda: read_some(rc, got, 6), 30)
        time.sleep(1.0)  # nothing more: the open transaction is above the LSO
        read_some(rc, got, 7)
        assert [m.value() for m in got] == committed_values
        assert [m.offset() for m in got] == [0, 1, 2, 8, 9, 10]
        p.commit_transaction(30)
        wait_for("the committed open transaction", lambda: read_some(rc, got, 7), 30)
        assert got[-1].value() == b"open"
    finally:
        rc.close()

    def kafka_python_read(isolation: str) -> list[bytes]:
        reader = KafkaConsumer(
            bootstrap_servers=cluster.kafka_bootstrap,
            isolation_level=isolation,
            auto_offset_reset="earliest",
            consumer_timeout_ms=5000,
        )
        try:
            reader.assign([KTopicPartition("txn-rc", 0)])
            return [m.value for m in reader]
        finally:
            reader.close()

    assert kafka_python_read("read_committed") == [*committed_values, b"open"]
    assert len(kafka_python_read("read_uncommitted")) == 10  # the aborted ones too, no markers


def cluster_leader(cluster: LocalCluster, topic: str, partitions: int = 1) -> int:
    """Partition 0's leader, as Kafka's Metadata names it (asked again until it names one)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    return int(kafka_partitions(admin, topic, partitions)[0].leader)


def topic_id(cluster: LocalCluster, topic: str) -> Any:
    """The topic's Kafka id, as Metadata gives it (Fetch 13+ names topics by id)."""
    answer = kafka_ask(cluster, 1, 3, {"topics": [{"name": topic}]})
    return answer["topics"][0]["topic_id"]


def test_a_second_producer_with_the_same_id_fences_the_first(cluster: LocalCluster) -> None:
    create_topic(cluster, "txn-zombie", 1)
    zombie = producer(cluster, "txn-zombie")
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce("txn-zombie", value=b"from the zombie", partition=0)
    zombie.flush(30)
    successor = producer(cluster, "txn-zombie")
    successor.init_transactions(30)  # aborts the zombie's open transaction first
    with pytest.raises(confluent_kafka.KafkaException) as fenced:
        zombie.commit_transaction(30)
    assert fenced.value.args[0].fatal() or fenced.value.args[0].txn_requires_abort()
    successor.begin_transaction()
    successor.produce("txn-zombie", value=b"from the successor", partition=0)
    successor.commit_transaction(30)
    markers, records = wait_for_value(
        "the abort and the commit",
        lambda: log_of(cluster, "txn-zombie", 0),
        lambda v: len(v[0]) == 2,
    )
    assert kinds(markers) == ["abort", "commit"] and records == 2
    assert markers[0].producer_epoch < markers[1].producer_epoch  # the abort fenced epoch 0
    assert state_of(cluster, "txn-zombie") == "CompleteCommit"


def test_one_set_of_rules_serves_both_listeners(cluster: LocalCluster) -> None:
    """A transactional id is one whoever uses it: tidelog's client taking it over fences a
    Kafka producer of it, and `tidelog transactions` sees the Kafka producer's transaction."""
    create_topic(cluster, "txn-shared", 1)
    kafka_side = producer(cluster, "txn-shared")
    kafka_side.init_transactions(30)
    kafka_side.begin_transaction()
    kafka_side.produce("txn-shared", value=b"from kafka", partition=0)
    kafka_side.flush(30)
    with Client(cluster.bootstrap) as client:
        described = wait_for_value(
            "the Kafka producer's partition in its transaction",
            lambda: client.describe_transaction("txn-shared"),
            lambda t: t["partitions"] == {"txn-shared": [0]},
        )
        assert described["state"] == "Ongoing"
        with client.transaction("txn-shared") as txn:  # aborts the Kafka producer's first
            assert txn.epoch > described["epoch"]
            txn.produce("txn-shared", [b"from tidelog"], partition=0)
        with pytest.raises(confluent_kafka.KafkaException) as fenced:
            kafka_side.commit_transaction(30)
        assert fenced.value.args[0].fatal() or fenced.value.args[0].txn_requires_abort()
        read = [r.value for r in client.consume("txn-shared", 0, isolation_level="read_committed")]
        assert read == [b"from tidelog"]
    markers, records = log_of(cluster, "txn-shared", 0)
    assert kinds(markers) == ["abort", "commit"] and records == 2


@pytest.mark.timed  # seen Ongoing within the 2 s timeout
def test_transaction_timeout_aborts_a_forgotten_transaction(cluster: LocalCluster) -> None:
    create_topic(cluster, "txn-forgotten", 1)
    p = producer(cluster, "txn-forgotten", **{"transaction.timeout.ms": 2000})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce("txn-forgotten", value=b"forgotten", partition=0)
    p.flush(30)
    state = described(cluster, "txn-forgotten")
    assert state["transaction_state"] == "Ongoing" and list(state["topics"][0]["partitions"]) == [0]
    epoch = state["producer_epoch"]
    markers, _ = wait_for_value(
        "the coordinator's abort",
        lambda: log_of(cluster, "txn-forgotten", 0),
        lambda v: len(v[0]) == 1,
        15,
    )
    assert kinds(markers) == ["abort"] and markers[0].producer_epoch == epoch + 1
    assert state_of(cluster, "txn-forgotten") == "CompleteAbort"
    with pytest.raises(confluent_kafka.KafkaException):
        p.commit_transaction(10)  # fenced by the abort's epoch


def test_a_new_coordinator_completes_what_the_killed_one_decided(cluster: LocalCluster) -> None:
    """The partition's only replica is frozen (SIGSTOP) so its marker cannot be written; the
    producer commits (EndTxn answers once PrepareCommit is committed); the coordinator is
    SIGKILLed; the partition's node comes back: the next metadata leader writes the marker."""
    coordinator = metadata_leader(cluster)
    replicas = create_topic(cluster, "txn-failover", 3, replication_factor=1)
    partition, [holder] = next((p, r) for p, r in replicas.items() if r != [coordinator])
    p = producer(cluster, "txn-failover")
    p.init_transactions(30)
    p.begin_transaction()
    p.produce("txn-failover", value=b"decided", partition=partition)
    p.flush(30)
    cluster.freeze(holder)
    try:
        p.commit_transaction(30)
        assert described(cluster, "txn-failover")["transaction_state"] == "PrepareCommit"
        cluster.kill(coordinator)
    finally:
        cluster.resume(holder)
    try:
        markers, records = wait_for_value(
            "the commit marker, from the new coordinator",
            lambda: log_of(cluster, "txn-failover", partition),
            lambda v: len(v[0]) == 1,
            60,
            tolerating=(Exception,),
        )
        assert kinds(markers) == ["commit"] and records == 1
        assert metadata_leader(cluster) != coordinator
        wait_for_value(
            "the transaction complete",
            lambda: state_of(cluster, "txn-failover"),
            "CompleteCommit".__eq__,
            30,
            tolerating=(Exception,),
        )
    finally:
        cluster.start(coordinator)
        cluster.wait_ready()


def test_a_new_partition_leader_writes_the_marker_its_frozen_leader_could_not(
    cluster: LocalCluster,
) -> None:
    """The partition's leader is frozen (SIGSTOP) before the commit: the coordinator's asks go
    unanswered until the partition elects another leader, which writes the marker. Re-sent asks
    may leave more than one COMMIT marker, never anything else."""
    from confluent_kafka.admin import AdminClient

    create_topic(cluster, "txn-partition-failover", 3)
    coordinator = metadata_leader(cluster)
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})

    def leaders() -> dict[int, int]:
        topic = admin.list_topics("txn-partition-failover", timeout=10).topics
        return {p: meta.leader for p, meta in topic["txn-partition-failover"].partitions.items()}

    known = wait_for_value(
        "every partition's leader",
        leaders,
        lambda found: all(n >= 0 for n in found.values()) and set(found.values()) - {coordinator},
    )
    partition, leader = next((p, n) for p, n in known.items() if n != coordinator)
    p = producer(cluster, "txn-partition-failover")
    p.init_transactions(30)
    p.begin_transaction()
    p.produce("txn-partition-failover", value=b"kept", partition=partition)
    p.flush(30)
    cluster.freeze(leader)
    try:
        p.commit_transaction(30)

        def committed_elsewhere() -> bool:
            return state_of(cluster, "txn-partition-failover") == "CompleteCommit"

        wait_for("the marker from a new leader", committed_elsewhere, 60, tolerating=(Exception,))
    finally:
        cluster.resume(leader)
    markers, records = wait_for_value(
        "the partition's log",
        lambda: log_of(cluster, "txn-partition-failover", partition),
        lambda v: len(v[0]) >= 1,
        30,
        tolerating=(Exception,),
    )
    assert set(kinds(markers)) == {"commit"} and records == 1, markers


JS = Path(__file__).parent / "js"


def test_kafkajs_transactions_commit_and_abort(cluster: LocalCluster) -> None:
    """kafkajs 2.2.4's transactional producer: a commit and an abort over three partitions."""
    create_topic(cluster, "txn-js", 3)
    done = subprocess.run(
        ["node", str(JS / "kafkajs_transactions.js"), cluster.kafka_bootstrap, "txn-js"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    time.sleep(0.5)
    for partition in range(3):
        markers, records = wait_for_value(
            f"both markers in txn-js/{partition}",
            lambda q=partition: log_of(cluster, "txn-js", q),  # type: ignore[misc]
            lambda v: len(v[0]) == 2,
        )
        assert kinds(markers) == ["commit", "abort"] and records == 2


def test_transactions_are_refused_by_name_until_feature_level_3(tmp_path: Path) -> None:
    """A cluster finalized at level 2 (its node acts as a build of levels 1..2): ApiVersions
    lists no transaction API (librdkafka finds "no brokers available for Transactions" and
    init_transactions times out, as against a Kafka without them), FindCoordinator for a
    transactional id answers UNSUPPORTED_VERSION naming the level, and a transactional batch
    from tidelog's protocol is TransactionsNotEnabled; nothing is written."""
    capped = ["--set", "feature.max.level=2"]
    with LocalCluster(tmp_path, 1, kafka=True, serve_args=capped) as early:
        served = {a["api_key"] for a in kafka_ask(early, 1, 18, {})["api_keys"]}
        assert 22 in served and not served & {24, 25, 26, 28, 65, 66}
        answer = kafka_ask(early, 1, 10, {"key_type": 1, "coordinator_keys": ["early"]})
        coordinator = answer["coordinators"][0]
        assert coordinator["error_code"] == 35  # UNSUPPORTED_VERSION
        assert "feature level 3" in coordinator["error_message"]
        p = producer(early, "early")
        with pytest.raises(confluent_kafka.KafkaException):
            p.init_transactions(3)
        with Client(early.bootstrap) as client:
            client.create_topic("early", 1)
            batch = build_batch(
                [ProducerRecord(b"k", b"v")],
                producer_id=7,
                producer_epoch=0,
                base_sequence=0,
                transactional=True,
            )
            with pytest.raises(TransactionsNotEnabled):
                client.produce_batch("early", 0, batch, producer_id=7)
            assert client.fetch("early", 0, 0).high_watermark == 0


def test_the_coordinators_answers_to_requests_out_of_turn(cluster: LocalCluster) -> None:
    """What raw requests get that well-behaved clients never send: another producer id, a
    fenced epoch, an EndTxn with nothing open or against the decision, a retried EndTxn, a
    timeout over transaction.max.timeout.ms, and a transactional batch for a partition its
    transaction did not add."""
    create_topic(cluster, "txn-raw", 1)
    node = metadata_leader(cluster)

    def ask(api_key: int, values: dict[str, Any]) -> Any:
        return kafka_ask(cluster, node, api_key, values)

    def init(timeout_ms: int = 60_000) -> Any:
        return ask(22, {"transactional_id": "raw", "transaction_timeout": timeout_ms,
                        "producer_id": -1, "producer_epoch": -1})  # fmt: skip

    assert init(10**9)["error_code"] == 50  # INVALID_TRANSACTION_TIMEOUT
    first = init()
    pid, epoch = first["producer_id"], first["producer_epoch"]
    assert first["error_code"] == 0 and pid > 0

    def end(producer_id: int, producer_epoch: int, commit: bool) -> int:
        answer = ask(
            26,
            {
                "transactional_id": "raw",
                "producer_id": producer_id,
                "producer_epoch": producer_epoch,
                "committed": commit,
            },
        )
        return int(answer["error_code"])

    def add(producer_id: int, producer_epoch: int) -> int:
        answer = ask(
            24,
            {
                "v3_and_below_transactional_id": "raw",
                "v3_and_below_producer_id": producer_id,
                "v3_and_below_producer_epoch": producer_epoch,
                "v3_and_below_topics": [{"name": "txn-raw", "partitions": [0]}],
            },
        )
        return int(answer["results_by_topic_v3_and_below"][0]["results_by_partition"][0][
            "partition_error_code"])  # fmt: skip

    assert end(pid, epoch, True) == 48  # INVALID_TXN_STATE: nothing open
    assert add(pid + 1, epoch) == 49  # INVALID_PRODUCER_ID_MAPPING
    assert add(pid, epoch) == 0
    assert end(pid, epoch, True) == 0
    assert end(pid, epoch, True) == 0, "a retried EndTxn gets the same answer"
    assert end(pid, epoch, False) == 48, "an abort of what committed"
    # A batch for a partition the transaction did not add: refused by the partition's leader.
    with Client(cluster.bootstrap) as client:
        batch = build_batch(
            [ProducerRecord(b"k", b"v")],
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=0,
            transactional=True,
        )
        with pytest.raises(TidelogError) as refused:
            client.produce_batch("txn-raw", 0, batch, producer_id=pid)
        assert refused.value.name == "InvalidTxnState", refused.value
    second = init()
    assert (second["producer_id"], second["producer_epoch"]) == (pid, epoch + 1)
    assert add(pid, epoch) == 90  # PRODUCER_FENCED
    assert end(pid, epoch, False) == 90
