"""After a transactional run (tests/txn_workload.py), every partition read again three ways for
tests/txn_anomalies.py's filter check: raw (read_uncommitted, control batches and markers too)
with tidelog's client; read_committed with tidelog's client; and read_committed through Kafka's
Fetch (isolation level 1) at the partition's leader, handed out as a Kafka consumer would from
the answer's aborted transactions (txn_anomalies.kafka_consumer_view). No Kafka client library
is in the way of the last: the node's LSO and aborted-transaction list are what is judged."""

from __future__ import annotations

from typing import Any

from helpers import retry
from tidelog.client.sync_client import Client
from tidelog.errors import TidelogError
from tidelog.record.batch import BatchHeader, decode_records, iter_headers
from tidelog.record.markers import read_marker
from txn_anomalies import (
    ABORT_MARKER,
    COMMIT_MARKER,
    OTHER_CONTROL,
    LogBatch,
    Partition,
    PartitionLog,
    Placed,
    kafka_consumer_view,
)
from wire import kafka_call

FETCH, METADATA = 1, 3  # Kafka's API keys
FETCH_BYTES = 1 << 20
READ_COMMITTED = 1  # Kafka's isolation level


def log_batch(raw: bytes, pos: int, header: BatchHeader) -> LogBatch:
    control: str | None = None
    records: tuple[tuple[int, bytes], ...] = ()
    if header.is_control:
        marker = read_marker(raw, header, pos)
        if marker is None:
            control = OTHER_CONTROL
        else:
            control = COMMIT_MARKER if marker.commit else ABORT_MARKER
    else:
        records = tuple((r.offset, r.value or b"") for r in decode_records(raw, pos))
    return LogBatch(
        header.producer_id, header.is_transactional, control, records, header.next_offset
    )


def raw_log(client: Client, topic: str, partition: int) -> PartitionLog:
    """The partition to its high watermark, every batch as the log holds it."""
    batches: list[LogBatch] = []
    offset = 0
    while True:
        fetched = client.fetch(
            topic, partition, offset, include_control=True, max_bytes=FETCH_BYTES
        )
        for pos, header in fetched.batches or ():
            if header.next_offset > offset:
                batches.append(log_batch(fetched.raw, pos, header))
        if fetched.next_offset >= fetched.high_watermark or fetched.next_offset <= offset:
            return PartitionLog(batches, fetched.high_watermark)
        offset = fetched.next_offset


def tidelog_committed(client: Client, topic: str, partition: int) -> Placed:
    """A read_committed read with tidelog's client, from 0 to the LSO."""
    got: Placed = []
    offset = 0
    while True:
        fetched = client.fetch(
            topic, partition, offset, max_bytes=FETCH_BYTES, isolation_level="read_committed"
        )
        got += [(r.offset, r.value or b"") for r in fetched.records if r.offset >= offset]
        if fetched.next_offset >= fetched.last_stable_offset or fetched.next_offset <= offset:
            return got
        offset = fetched.next_offset


class KafkaFetcher:
    """read_committed Fetch requests, each to the partition's leader as Metadata names it."""

    def __init__(self, kafka_bootstrap: str, topics: list[str]) -> None:
        host, port = kafka_bootstrap.split(",")[0].rsplit(":", 1)
        self.bootstrap = (host, int(port))
        self.topics = topics
        self.leaders: dict[Partition, tuple[str, int]] = {}
        self.topic_ids: dict[str, Any] = {}

    def learn_leaders(self) -> None:
        answer = kafka_call(
            self.bootstrap, METADATA, {"topics": [{"name": t} for t in self.topics]}
        )
        brokers = {b["node_id"]: (b["host"], int(b["port"])) for b in answer["brokers"]}
        for topic in answer["topics"]:
            self.topic_ids[topic["name"]] = topic["topic_id"]
            for p in topic["partitions"]:
                assert p["leader_id"] in brokers, f"no leader for {topic['name']}/{p}"
                self.leaders[(topic["name"], p["partition_index"])] = brokers[p["leader_id"]]

    def fetch_once(self, topic: str, partition: int, offset: int) -> dict[str, Any]:
        answer = kafka_call(
            self.leaders[(topic, partition)],
            FETCH,
            {
                "max_wait": 0,
                "min_bytes": 1,
                "max_bytes": FETCH_BYTES,
                "isolation_level": READ_COMMITTED,
                "topics": [
                    {
                        "topic": topic,
                        "topic_id": self.topic_ids[topic],
                        "partitions": [
                            {
                                "partition": partition,
                                "fetch_offset": offset,
                                "partition_max_bytes": FETCH_BYTES,
                            }
                        ],
                    }
                ],
            },
        )
        data: dict[str, Any] = answer["responses"][0]["partitions"][0]
        assert int(data["error_code"]) == 0, f"Fetch of {topic}/{partition}: {data['error_code']}"
        return data

    def committed(self, topic: str, partition: int) -> Placed:
        """A read_committed read from 0 to the LSO, answer by answer as a Kafka consumer goes."""
        self.learn_leaders()
        got: Placed = []
        offset = 0
        while True:
            data = self.fetch_once(topic, partition, offset)
            raw = bytes(data["records"] or b"")
            # (tidelog answers whole batches, as its own client expects: iter_headers checks)
            batches = [log_batch(raw, pos, h) for pos, h in iter_headers(raw)]
            aborted = [
                (int(a["producer_id"]), int(a["first_offset"]))
                for a in data["aborted_transactions"] or ()
            ]
            got += [r for r in kafka_consumer_view(batches, aborted) if r[0] >= offset]
            after = max([offset, *(b.next_offset for b in batches)])
            if after >= int(data["last_stable_offset"]) or after <= offset:
                return got
            offset = after


def read_logs(
    bootstrap: str, kafka_bootstrap: str, partitions: list[Partition]
) -> tuple[dict[Partition, PartitionLog], dict[str, dict[Partition, Placed]]]:
    """Each partition's raw log, and its read_committed reads by way of reading."""
    logs: dict[Partition, PartitionLog] = {}
    reads: dict[str, dict[Partition, Placed]] = {"kafka fetch": {}, "tidelog client": {}}
    fetcher = KafkaFetcher(kafka_bootstrap, sorted({t for t, _ in partitions}))
    with Client(bootstrap, retries=10, request_timeout_ms=5000) as client:
        for topic, p in partitions:
            logs[(topic, p)] = raw_log(client, topic, p)
            reads["tidelog client"][(topic, p)] = tidelog_committed(client, topic, p)
            reads["kafka fetch"][(topic, p)] = retry(
                f"a read_committed Kafka Fetch of {topic}/{p}",
                lambda t=topic, q=p: fetcher.committed(t, q),  # type: ignore[misc]
                60,
                every_s=0.5,
                tolerating=(AssertionError, OSError, TidelogError),
            )
    return logs, reads
