"""The transactional workload of the Jepsen-style runs (issue 36), from confluent-kafka clients
against any cluster's Kafka ports; its history goes to tests/txn_anomalies.py.

  - plain transactional writers: each transaction writes one record to each of two or three
    partitions of txn-data, and one in seven is aborted on purpose (after a flush, so its
    records are in the log)
  - consume-transform-produce loops: one per group, each consuming every partition of txn-in
    and writing each input's output to txn-out, the input's offsets sent to the transaction
    (send_offsets_to_transaction); on an abort or an error the loop goes back to its group's
    committed offsets
  - a feeder of txn-in (plain acks=all writes) and read_committed consumers of txn-data and
    txn-out, who note every record they are handed

An error whose outcome is not known (a timeout, a fatal error, a fenced producer) makes the
transaction UNKNOWN and its producer is replaced by a new one with the same transactional.id
(which fences the old one and settles what it left). After the run and the faults, every
producer is closed, the transactions their coordinator still holds open time out, and
final_read reads every partition to its end with a fresh read_committed consumer, and each
partition's raw log and read_committed reads by other ways (tests/txn_logs.py) for the filter
check.
"""

from __future__ import annotations

import random
import sys
import threading
import time
import traceback
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from helpers import retry, wait_for
from tidelog.client.sync_client import Client
from tidelog.errors import TidelogError
from tidelog.record import ProducerRecord
from txn_anomalies import ABORTED, COMMITTED, UNKNOWN, History, Source, Txn
from txn_logs import read_logs

PARTITIONS = 3
DATA, INPUT, OUTPUT = "txn-data", "txn-in", "txn-out"
GROUPS = ("ctp-a", "ctp-b")
TXN_TIMEOUT_MS = 8000  # what the coordinator aborts a forgotten transaction after
ABORT_ONE_IN = 7


def create_topics(bootstrap: str) -> None:
    """The three topics, RF 3 and min.insync.replicas 2, retried while the cluster forms."""
    with Client(bootstrap, retries=30, request_timeout_ms=3000) as admin:
        for topic in (DATA, INPUT, OUTPUT):
            retry(
                f"the cluster to create {topic}",
                lambda t=topic: admin.create_topic(  # type: ignore[misc]
                    t,
                    partitions=PARTITIONS,
                    replication_factor=3,
                    configs={"min.insync.replicas": "2"},
                ),
                60,
                every_s=0.5,
                tolerating=(TidelogError,),
            )
            admin.wait_for_leaders(topic)


class TxnWorkload:
    def __init__(self, bootstrap: str, kafka_bootstrap: str, seed: int) -> None:
        self.bootstrap = bootstrap
        self.kafka_bootstrap = kafka_bootstrap
        self.seed = seed
        self.history = History()
        self.stop = threading.Event()
        self.lock = threading.Lock()  # the history's lists, appended to by every thread
        self.errors: list[str] = []  # client errors, for the report (not anomalies)
        self.replaced_producers = 0
        self.threads: list[threading.Thread] = []
        self.began = time.monotonic()
        self.began_at: dict[str, float] = {}  # each transaction's, for the error report

    def start(self, writers: int = 2, readers: int = 2) -> None:
        work: list[tuple[Any, tuple[Any, ...]]] = [(self.feed, ())]
        work += [(self.write, (w,)) for w in range(writers)]
        work += [(self.transform, (g,)) for g in GROUPS]
        work += [(self.read, (r,)) for r in range(readers)]
        for target, args in work:
            name = f"{target.__name__}{args}"
            thread = threading.Thread(target=target, args=args, daemon=True, name=name)
            thread.start()
            self.threads.append(thread)

    def finish(self) -> list[str]:
        """Every thread stopped; the names of those still running after two minutes (a client
        that cannot get on once the faults are healed: stuck)."""
        self.stop.set()
        deadline = time.monotonic() + 120
        for thread in self.threads:
            thread.join(max(0.1, deadline - time.monotonic()))
        stuck = [t for t in self.threads if t.is_alive()]
        frames = sys._current_frames()
        for thread in stuck:  # where each is stuck, for the report
            where = traceback.format_stack(frames[thread.ident])[-3:] if thread.ident else []
            self.error(f"{thread.name} stuck at: {''.join(where)}")
        return [t.name for t in stuck]

    # -- clients ------------------------------------------------------------------------------

    def producer(self, transactional_id: str) -> Any:
        """A transactional producer, its transactions initialised (retried through faults)."""
        config = {
            "bootstrap.servers": self.kafka_bootstrap,
            "transactional.id": transactional_id,
            "transaction.timeout.ms": TXN_TIMEOUT_MS,
            "socket.timeout.ms": 5000,
            "log_level": 0,  # (librdkafka logs every refused connect while a node is down)
            # librdkafka (2.16) asks the group coordinator's FindCoordinator again only when a
            # broker connection changes state, and does not time out meanwhile: after a
            # COORDINATOR_NOT_AVAILABLE under a partition, send_offsets_to_transaction hung for
            # minutes (confluentinc/librdkafka#5456). Idle connections closed soon make that
            # change.
            "connections.max.idle.ms": 3000,
        }

        def fresh() -> Any:
            p = Producer(config)
            p.init_transactions(20)
            return p

        return retry(
            f"init_transactions of {transactional_id}",
            fresh,
            120,
            every_s=0.5,
            tolerating=(KafkaException,),
        )

    def consumer(self, group: str) -> Any:
        return Consumer(
            {
                "bootstrap.servers": self.kafka_bootstrap,
                "group.id": group,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "enable.partition.eof": True,
                "log_level": 0,
            }
        )

    def error(self, what: str) -> None:
        self.errors.append(f"{time.monotonic() - self.began:.1f}s {what}")

    def note(self, txn: Txn) -> None:
        self.began_at[txn.name] = time.monotonic()  # (an age over the timeout: fenced by it)
        with self.lock:
            self.history.txns.append(txn)

    def failed(self, txn: Txn, producer: Any, error: KafkaException) -> Any:
        """The transaction's outcome after an error, and the producer to go on with: aborted
        when the client says an abort is what it needs and the abort is done; otherwise
        unknown, and a new producer with the same transactional.id."""
        age = time.monotonic() - self.began_at.get(txn.name, time.monotonic())
        self.error(f"{txn.name} (begun {age:.1f} s before): {error.args[0]}")
        kafka_error = error.args[0]
        if isinstance(kafka_error, KafkaError) and kafka_error.txn_requires_abort():
            try:
                producer.abort_transaction(20)
                txn.outcome = ABORTED
                return producer
            except KafkaException as abort_error:
                self.error(f"{txn.name} abort: {abort_error.args[0]}")
        txn.outcome = UNKNOWN
        self.replaced_producers += 1
        return None

    # -- the feeder and the plain writers -----------------------------------------------------

    def feed(self) -> None:
        n = 0
        with Client(self.bootstrap, retries=3, request_timeout_ms=3000) as client:
            while not self.stop.wait(0.02):
                values = [b"in-%06d-%d" % (n, i) for i in range(5)]
                try:
                    client.produce(INPUT, [ProducerRecord(None, v) for v in values], n % 3, "all")
                except TidelogError:
                    self.stop.wait(0.2)
                n += 1

    def write(self, writer: int) -> None:
        rng = random.Random(self.seed * 100 + writer)
        transactional_id = f"writer-{writer}"
        producer = None
        n = 0
        while not self.stop.is_set():
            if producer is None:
                producer = self.producer(transactional_id)
            txn = Txn(f"w{writer}.{n}")
            n += 1
            self.note(txn)
            try:
                producer.begin_transaction()
                for i, partition in enumerate(rng.sample(range(PARTITIONS), rng.choice((2, 3)))):
                    value = f"{txn.name}:{i}".encode()
                    txn.writes.append(((DATA, partition), value))
                    producer.produce(DATA, value=value, partition=partition)
                if rng.randrange(ABORT_ONE_IN) == 0:
                    producer.flush(20)
                    producer.abort_transaction(20)
                    txn.outcome = ABORTED
                else:
                    producer.commit_transaction(20)
                    txn.outcome = COMMITTED
            except KafkaException as error:
                producer = self.failed(txn, producer, error)
        if producer is not None:
            producer.flush(5)

    # -- consume-transform-produce ------------------------------------------------------------

    def transform(self, group: str) -> None:
        rng = random.Random(hash(group) ^ self.seed)
        consumer = self.consumer(group)
        inputs = [TopicPartition(INPUT, p) for p in range(PARTITIONS)]
        producer = None
        n = 0
        try:
            while not self.stop.is_set():
                if producer is None:
                    producer = self.producer(f"transform-{group}")
                    self.rewind(consumer, group, inputs)
                taken = [m for m in consumer.consume(20, 0.5) if not m.error()]
                if not taken:
                    continue
                txn = Txn(f"{group}.{n}")
                n += 1
                self.note(txn)
                error = self.transform_once(producer, consumer, txn, taken, group, rng)
                if txn.outcome != COMMITTED:
                    producer = self.failed_transform(txn, producer, consumer, group, inputs, error)
        finally:
            consumer.close()

    def transform_once(
        self,
        producer: Any,
        consumer: Any,
        txn: Txn,
        taken: list[Any],
        group: str,
        rng: random.Random,
    ) -> KafkaException | None:
        """One transaction of outputs and their inputs' offsets (its outcome in txn); the
        error that ended it, if one did."""
        try:
            producer.begin_transaction()
            ends: dict[int, int] = {}
            for m in taken:
                value = b"out:%s:%d:%d:%s" % (
                    group.encode(),
                    m.partition(),
                    m.offset(),
                    txn.name.encode(),
                )
                target = (m.offset() + m.partition()) % PARTITIONS
                txn.writes.append(((OUTPUT, target), value))
                with self.lock:
                    self.history.sources[value] = Source(group, INPUT, m.partition(), m.offset())
                producer.produce(OUTPUT, value=value, partition=target)
                ends[m.partition()] = m.offset() + 1
            offsets = [TopicPartition(INPUT, p, o) for p, o in ends.items()]
            producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), 20)
            if rng.randrange(ABORT_ONE_IN) == 0:
                producer.flush(20)
                producer.abort_transaction(20)
                txn.outcome = ABORTED
                return None
            producer.commit_transaction(20)
            txn.outcome = COMMITTED
            return None
        except KafkaException as error:
            return error

    def failed_transform(
        self,
        txn: Txn,
        producer: Any,
        consumer: Any,
        group: str,
        inputs: list[Any],
        error: KafkaException | None,
    ) -> Any:
        """After an abort (on purpose or not) or an error: the producer to go on with, and the
        consumer back at the group's committed offsets."""
        if error is not None:
            producer = self.failed(txn, producer, error)
        if producer is not None:
            self.rewind(consumer, group, inputs)
        return producer

    def rewind(self, consumer: Any, group: str, inputs: list[Any]) -> None:
        """The consumer assigned every input partition at the group's committed offset (a
        stable fetch: it waits out a pending transaction's offsets)."""
        committed = retry(
            f"the committed offsets of {group}",
            lambda: consumer.committed(inputs, 10),
            120,
            every_s=0.5,
            tolerating=(KafkaException,),
        )
        consumer.assign(
            [TopicPartition(INPUT, tp.partition, max(tp.offset, 0)) for tp in committed]
        )

    # -- readers ------------------------------------------------------------------------------

    def read(self, reader: int) -> None:
        consumer = self.consumer(f"reader-{reader}")
        consumer.assign(
            [TopicPartition(t, p, 0) for t in (DATA, OUTPUT) for p in range(PARTITIONS)]
        )
        name = f"reader-{reader}"
        try:
            while not self.stop.is_set():
                for m in consumer.consume(100, 0.5):
                    if not m.error():
                        with self.lock:
                            self.history.read(
                                name, (m.topic(), m.partition()), m.offset(), m.value()
                            )
        finally:
            consumer.close()

    # -- after the run ------------------------------------------------------------------------

    def final_read(self) -> None:
        """Every partition read to its end by a fresh read_committed consumer, once no
        transaction is open (txn-in's offsets only); each group's committed offsets; then every
        partition read raw and read_committed again without librdkafka (tests/txn_logs.py)."""
        time.sleep(TXN_TIMEOUT_MS / 1000 + 5)  # the coordinator aborts what was left open
        consumer = self.consumer("final-reader")
        partitions = [(t, p) for t in (DATA, OUTPUT, INPUT) for p in range(PARTITIONS)]
        consumer.assign([TopicPartition(t, p, 0) for t, p in partitions])
        at_end: set[tuple[str, int]] = set()
        final, inputs = self.history.final, self.history.inputs

        def read_to_the_end() -> bool:
            for m in consumer.consume(500, 0.5):
                where = (m.topic(), m.partition())
                if m.error() is None:
                    at_end.discard(where)
                    if m.topic() == INPUT:
                        inputs.setdefault(where, []).append(m.offset())
                    else:
                        final.setdefault(where, []).append((m.offset(), m.value()))
                elif m.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(where)
            return at_end == set(partitions)

        try:
            wait_for(
                "the final read to reach every partition's end", read_to_the_end, 180, every_s=0
            )
        finally:
            consumer.close()
        for group in GROUPS:
            self.history.group_offsets[group] = self.committed_offsets(group)
        self.history.logs, self.history.committed_reads = read_logs(
            self.bootstrap, self.kafka_bootstrap, partitions
        )

    def committed_offsets(self, group: str) -> dict[tuple[str, int], int]:
        reader = self.consumer(group)
        try:
            committed = retry(
                f"the final offsets of {group}",
                lambda: reader.committed([TopicPartition(INPUT, p) for p in range(PARTITIONS)], 10),
                60,
                every_s=0.5,
                tolerating=(KafkaException,),
            )
        finally:
            reader.close()
        return {(INPUT, tp.partition): max(tp.offset, 0) for tp in committed}
