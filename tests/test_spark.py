"""The Spark source and sink against a real 3-node cluster and a real local Spark: batch reads
with offsets and minPartitions, maxOffsetsPerTrigger and Trigger.AvailableNow across restarts,
cursors holding retention up to their cap, failOnDataLoss both ways, table reads, and exactly
once end to end with a partition leader and the Spark driver SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("pyspark")

from helpers import wait_for, wait_for_value
from invalid_batches import INVALID
from test_cluster import leader_of
from tidelog.cli.cluster import LocalCluster
from tidelog.client.sync_client import Client
from tidelog.cluster_status import merge_status
from tidelog.errors import TidelogError
from tidelog.record import ProducerRecord

pytestmark = [pytest.mark.process, pytest.mark.spark]  # tiers: pyproject.toml's markers

HERE = Path(__file__).parent
ROOT = HERE.parent
# Drivers the streaming kill test SIGKILLs mid-run besides the one its crash point kills: none
# in `make test` (every run kills a driver and a leader), more in `make spark-kills`.
DRIVER_KILLS = int(os.environ.get("TIDELOG_SPARK_DRIVER_KILLS", "0"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(
        tmp_path_factory.mktemp("spark-cluster"), 3, log_level="WARNING", kafka=True
    ) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster.bootstrap) as c:
        yield c


@pytest.fixture(scope="module")
def spark(cluster: LocalCluster, spark_session: Any) -> Any:
    return spark_session


def produce(client: Client, topic: str, partition: int, values: list[bytes]) -> None:
    for lo in range(0, len(values), 100):
        client.produce(
            topic,
            [ProducerRecord(b"k%d" % (i % 7), v) for i, v in enumerate(values[lo : lo + 100])],
            partition=partition,
        )


def committed(client: Client, topic: str, partition: int) -> dict[int, bytes]:
    return {r.offset: r.value or b"" for r in client.consume(topic, partition, "earliest")}


def reader(spark: Any, cluster: LocalCluster, **options: Any) -> Any:
    r = spark.read.format("tidelog").option("bootstrap", cluster.bootstrap)
    for key, value in options.items():
        r = r.option(key, value)
    return r.load()


def stream(spark: Any, cluster: LocalCluster, topic: str, **options: Any) -> Any:
    r = spark.readStream.format("tidelog").option("bootstrap", cluster.bootstrap)
    r = r.option("subscribe", topic)
    for key, value in options.items():
        r = r.option(key, value)
    return r.load()


def rows_of(df: Any) -> list[tuple[int, int, bytes]]:
    return sorted(
        (r["partition"], r["offset"], bytes(r["value"]))
        for r in df.select("partition", "offset", "value").collect()
    )


def test_batch_reads_offsets_min_partitions_headers_and_bad_options(
    spark: Any, cluster: LocalCluster, client: Client
) -> None:
    client.create_topic("batch", partitions=3, replication_factor=3)
    for p in range(3):
        produce(client, "batch", p, [b"%d-%d" % (p, i) for i in range(300)])
    mark = int(time.time() * 1000)
    time.sleep(0.05)
    client.produce(
        "batch", [ProducerRecord(b"h", b"with-headers", (("trace", b"t1"),))], partition=0
    )
    log = {(p, o): v for p in range(3) for o, v in committed(client, "batch", p).items()}

    everything = reader(spark, cluster, subscribe="batch")
    assert rows_of(everything) == sorted((p, o, v) for (p, o), v in log.items())
    assert everything.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int>"
    )

    # Exclusive ends, -2 earliest and -1 latest, as in Spark's Kafka source.
    ranged = reader(
        spark,
        cluster,
        subscribe="batch",
        startingOffsets='{"batch": {"0": 10, "1": -2, "2": 50}}',
        endingOffsets='{"batch": {"0": 20, "1": -1, "2": 60}}',
    )
    want = [(0, o, log[(0, o)]) for o in range(10, 20)]
    want += [(1, o, log[(1, o)]) for o in range(300)]
    want += [(2, o, log[(2, o)]) for o in range(50, 60)]
    assert rows_of(ranged) == sorted(want)

    since = reader(spark, cluster, subscribe="batch", startingTimestamp=str(mark))
    assert rows_of(since) == [(0, 300, b"with-headers")]

    split = reader(spark, cluster, assign='{"batch": [1, 2]}', minPartitions="9")
    assert split.rdd.getNumPartitions() >= 9
    assert rows_of(split) == sorted((p, o, v) for (p, o), v in log.items() if p in (1, 2))

    pattern = reader(spark, cluster, subscribePattern="ba.ch", includeHeaders="true")
    headers = pattern.where("value = 'with-headers'").select("headers").collect()
    assert [(h["key"], bytes(h["value"])) for h in headers[0]["headers"]] == [("trace", b"t1")]

    with pytest.raises(Exception, match="endingOffsets"):
        reader(
            spark,
            cluster,
            subscribe="batch",
            endingOffsets='{"batch": {"0": 99999, "1": -1, "2": -1}}',
        ).count()
    with pytest.raises(Exception, match="subscribe"):
        reader(spark, cluster).count()
    bad = stream(spark, cluster, "batch", maxOffsetsPerTrigger="0").writeStream.format("noop")
    with pytest.raises(Exception, match="maxOffsetsPerTrigger"):
        bad.start().awaitTermination(60)


def test_batch_write_and_table_topic_read(
    spark: Any, cluster: LocalCluster, client: Client
) -> None:
    client.create_topic("tbl", partitions=2, replication_factor=3, kind="table")
    rows = [(f"k{i % 50}", f"v{i}") for i in range(200)]  # later rows win per key
    df = spark.createDataFrame(rows, "key string, value string").coalesce(1)
    df.write.format("tidelog").option("bootstrap", cluster.bootstrap).option("topic", "tbl").mode(
        "append"
    ).save()
    table = reader(spark, cluster, table="tbl")
    assert table.count() == 50
    got = {bytes(r["key"]).decode(): bytes(r["value"]).decode() for r in table.collect()}
    assert got == dict(rows) == {k.decode(): v.decode() for k, v in client.table_scan("tbl")}


KAFKA_CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def test_kafka_producers_and_the_spark_source_and_sink_see_the_same_records(
    spark: Any, cluster: LocalCluster, client: Client
) -> None:
    """Records a Kafka producer sent (keys, headers, every codec) are what tidelog's client and
    the Spark source read; rows the Spark sink wrote are what a Kafka consumer reads."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    client.create_topic("via-kafka", partitions=1, replication_factor=3)
    client.wait_for_leaders("via-kafka")
    sent = []
    for codec in KAFKA_CODECS:
        producer = Producer(
            {"bootstrap.servers": cluster.kafka_bootstrap, "compression.type": codec}
        )
        for i in range(50):
            key, value = f"{codec}-{i % 5}".encode(), f"{codec}-{i}".encode() * 10
            producer.produce("via-kafka", key=key, value=value, headers=[("codec", codec)])
            sent.append((key, value, codec.encode()))
        assert producer.flush(30) == 0
    by_client = [(r.key, r.value, dict(r.headers)["codec"]) for r in client.consume("via-kafka", 0)]
    assert by_client == sent
    df = reader(spark, cluster, subscribe="via-kafka", includeHeaders="true")
    by_spark = [
        (bytes(r["key"]), bytes(r["value"]), bytes(r["headers"][0]["value"]))
        for r in df.orderBy("offset").collect()
    ]
    assert by_spark == sent

    client.create_topic("from-spark", partitions=2, replication_factor=3)
    rows = [(f"k{i}", f"v{i}") for i in range(100)]
    spark.createDataFrame(rows, "key string, value string").write.format("tidelog").option(
        "bootstrap", cluster.bootstrap
    ).option("topic", "from-spark").mode("append").save()
    consumer = Consumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": "reads-spark"})
    consumer.assign([TopicPartition("from-spark", p, 0) for p in (0, 1)])
    got = set()

    def read_on() -> bool:
        m = consumer.poll(0.5)
        if m is not None and not m.error():
            got.add((m.key().decode(), m.value().decode()))
        return len(got) >= len(rows)

    try:
        wait_for("the rows Spark wrote, through the Kafka port", read_on, 60, every_s=0)
    finally:
        consumer.close()
    assert got == set(rows)


def run_available_now(df: Any, work: Path, name: str, timeout_s: float = 120) -> list[int]:
    q = (
        df.select("partition", "offset", "value")
        .writeStream.format("parquet")
        .option("path", str(work / name))
        .option("checkpointLocation", str(work / f"{name}-ck"))
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(timeout_s), "AvailableNow did not finish"
    return [int(p["numInputRows"]) for p in q.recentProgress]


def parquet_rows(spark: Any, path: Path) -> list[tuple[int, int, bytes]]:
    return rows_of(spark.read.parquet(str(path)))


def test_max_offsets_per_trigger_and_available_now_across_restart(
    spark: Any, cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    client.create_topic("an", partitions=3, replication_factor=3)
    for p in range(3):
        produce(client, "an", p, [b"a%d-%d" % (p, i) for i in range(300)])
    df = stream(spark, cluster, "an", startingOffsets="earliest", maxOffsetsPerTrigger="250")
    batches = run_available_now(df, tmp_path, "out")
    assert sum(batches) == 900 and max(batches) <= 250 and len(batches) >= 4, batches

    for p in range(3):
        produce(client, "an", p, [b"b%d-%d" % (p, i) for i in range(50)])
    again = run_available_now(df, tmp_path, "out")
    assert sum(again) == 150, again
    got = parquet_rows(spark, tmp_path / "out")
    log = sorted((p, o, v) for p in range(3) for o, v in committed(client, "an", p).items())
    # Exactly once across the restart, and every row is the committed log's row at its offset.
    assert got == log


class Feeder(threading.Thread):
    """Keeps producing unique values into a topic (acks=all) until stopped."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.client = Client(bootstrap)
        self.topic = topic
        self.halt = threading.Event()
        self.sent = 0

    def run(self) -> None:
        while not self.halt.is_set():
            values = [b"f-%d" % (self.sent + i) for i in range(40)]
            try:
                self.client.produce(self.topic, [ProducerRecord(v, v) for v in values])
                self.sent += len(values)
            except TidelogError:
                time.sleep(0.2)
            time.sleep(0.2)
        self.client.close()


def start_driver(work: Path, cluster: LocalCluster, crash_at: str = "") -> subprocess.Popen[str]:
    # Spark's scratch (block manager, the JVM's temp files) in the test's own directory: a
    # SIGKILLed driver cannot clean it up, so it must not be /tmp.
    scratch = work / "driver-tmp"
    scratch.mkdir(exist_ok=True)
    env = dict(os.environ, TIDELOG_CRASH_AT=crash_at, PYTHONPATH=str(ROOT), TMPDIR=str(scratch))
    return subprocess.Popen(
        [
            sys.executable,
            str(HERE / "spark_driver.py"),
            cluster.bootstrap,
            str(work),
            "copy_in",
            "copy_out",
        ],
        stdout=subprocess.PIPE,
        stderr=open(work / "driver.err", "a"),
        text=True,
        env=env,
        start_new_session=True,  # SIGKILL to the group takes its JVM and Python workers too
    )


def wait_batches(driver: subprocess.Popen[str], count: int, timeout_s: float = 300) -> list[str]:
    """The driver's output lines until it has reported count batches, or its output ended."""
    stdout = driver.stdout
    assert stdout is not None
    lines: list[str] = []

    def read_line() -> tuple[bool, list[str]]:  # (the output ended, every line so far)
        line = stdout.readline()
        if line:
            lines.append(line.strip())
        return not line, lines

    def enough(read: tuple[bool, list[str]]) -> bool:
        ended, seen = read
        return ended or len([line for line in seen if line.startswith("batch")]) >= count

    wait_for_value(f"{count} batches from the driver", read_line, enough, timeout_s, every_s=0)
    return lines


def spark_temp_dirs() -> set[str]:
    """What Spark leaves in the system temp directory when its driver dies."""
    return {p.name for p in Path("/tmp").iterdir() if p.name.startswith(("blockmgr-", "spark-"))}


def kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@pytest.mark.timeout(1200)  # (its waits are for progress, however slow a busy machine makes it)
def test_streaming_exactly_once_through_leader_and_driver_kills(
    spark: Any, cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    client.create_topic("copy_in", partitions=3, replication_factor=3)
    client.create_topic("copy_out", partitions=3, replication_factor=3)
    spark_dirs_before = spark_temp_dirs()
    feeder = Feeder(cluster.bootstrap, "copy_in")
    feeder.start()
    drivers: list[subprocess.Popen[str]] = []
    try:
        # 1. The sink writes batch 2, then the driver's JVM dies before Spark's checkpoint
        # records it: the restarted query replays batch 2 (batch ids 0, 1, 2, 2, 3, ...).
        first = start_driver(tmp_path, cluster, crash_at="spark-sink-commit:2")
        drivers.append(first)
        t0 = time.monotonic()
        lines = wait_batches(first, 100)  # until it dies
        first.wait(30)
        print("first driver", first.returncode, time.monotonic() - t0, lines)
        assert first.returncode == -signal.SIGKILL, lines
        assert first.returncode != 0

        driver = start_driver(tmp_path, cluster)
        drivers.append(driver)
        wait_batches(driver, 4)
        # 2. A partition leader dies under the running queries (source and sink alike).
        victim = leader_of(client, "copy_out", 0)
        cluster.kill(victim)
        wait_batches(driver, 4)
        cluster.start(victim)
        # 3. The long variant (`make spark-kills`): the driver is SIGKILLed mid-run, JVM and
        # all, DRIVER_KILLS times, a new driver taking over each time.
        for _ in range(DRIVER_KILLS):
            kill_group(driver)
            print("driver killed", time.monotonic() - t0)
            driver = start_driver(tmp_path, cluster)
            drivers.append(driver)
            wait_batches(driver, 3)
        feeder.halt.set()
        feeder.join(30)
        total = sum(client.list_offsets("copy_in", p) for p in range(3))

        def caught_up() -> bool:
            if sum(client.list_offsets("copy_out", p) for p in range(3)) >= total:
                return True
            assert driver.poll() is None, "driver died"
            return False

        wait_for("the copy to catch up", caught_up, 300, every_s=1)
        print("caught up", time.monotonic() - t0)
        time.sleep(3)  # a duplicate would arrive now, if any
        kill_group(driver)
    finally:
        feeder.halt.set()
        for d in drivers:
            kill_group(d)

    source = {(p, o): v for p in range(3) for o, v in committed(client, "copy_in", p).items()}
    copied = Counter(v for p in range(3) for v in committed(client, "copy_out", p).values())
    assert copied == Counter(source.values()), "the tidelog sink lost or duplicated records"
    assert feeder.sent > 0 and len(source) >= feeder.sent

    # Every driver SIGKILLed: their scratch stayed in the test's directory, none in /tmp.
    assert spark_temp_dirs() <= spark_dirs_before
    assert list((tmp_path / "driver-tmp").glob("blockmgr-*"))

    files = parquet_rows(spark, tmp_path / "parquet")
    # No uncommitted read: every row the source returned is the committed record at its offset.
    assert len(files) == len(set((p, o) for p, o, _ in files))
    assert files == sorted((p, o, v) for (p, o), v in source.items())


@pytest.mark.timed  # the cursor's 30 s idle cap
def test_cursor_holds_retention_until_its_cap_then_fail_on_data_loss_both_ways(
    spark: Any, cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    client.create_topic(
        "held",
        replication_factor=3,
        configs={
            "segment.bytes": "2048",
            "segment.ms": "300",
            "retention.ms": "500",
            "cursor.max.idle.ms": "30000",  # a busy machine's slow first batch
            "retention.check.interval.ms": "100",
            "file.delete.delay.ms": "0",
        },
    )
    client.create_cursor("held-q", "held", "earliest")  # the query resumes from it

    def fill(lo: int, hi: int) -> None:
        for i in range(lo, hi, 10):
            client.produce(
                "held", [b"h%03d" % j + b"." * 100 for j in range(i, i + 10)], partition=0
            )

    def log_start() -> int:
        return int(client.list_offsets("held", 0, "earliest"))

    fill(0, 60)
    df = stream(spark, cluster, "held", cursor="held-q", maxOffsetsPerTrigger="20")
    assert run_available_now(df, tmp_path, "held") == [20, 20, 20]
    # commit(end) trails by a batch: the cursor holds the last batch, which a restart may replay.
    position = int(client.cursors("held-q")[0]["positions"]["0"])
    assert position == 40
    fill(60, 120)
    time.sleep(1.5)  # three times retention.ms: only the cursor keeps offsets 40 and up
    assert log_start() <= position
    lwm = merge_status(client.status(["held"]), "held")[0]["low_watermark"]
    assert lwm["set_by"].startswith("cursor held-q"), lwm

    assert sum(run_available_now(df, tmp_path, "held")) == 60  # resumed, nothing lost
    got = parquet_rows(spark, tmp_path / "held")
    assert [o for _, o, _ in got] == list(range(120))

    # Abandoned: past cursor.max.idle.ms the cursor stops holding, and retention deletes.
    fill(120, 180)
    wait_for(
        "the cursor to be invalidated and retention to delete past 130",
        lambda: client.cursors("held-q")[0]["invalidated"] and log_start() > 130,
        90,
        every_s=0.2,
    )
    lost_until = log_start()

    with pytest.raises(Exception, match="failOnDataLoss") as failure:
        run_available_now(df, tmp_path, "held")
    assert "held/0: offsets" in str(failure.value)

    lenient = stream(
        spark, cluster, "held", cursor="held-q", maxOffsetsPerTrigger="20", failOnDataLoss="false"
    )
    run_available_now(lenient, tmp_path, "held")
    offsets = [o for _, o, _ in parquet_rows(spark, tmp_path / "held")]
    assert len(offsets) == len(set(offsets))
    assert set(offsets) >= set(range(120)) | set(range(lost_until, 180))


@pytest.mark.timeout(400)
def test_the_demo_runs_and_its_final_check_passes(tmp_path: Path) -> None:
    """The main job, shortened: cluster, clickstream, Spark, a leader killed, counts checked."""
    done = subprocess.run(
        [sys.executable, "-m", "tidelog", "demo", "--duration", "25", "--status-every", "5"],
        capture_output=True,
        text=True,
        timeout=360,
        env=dict(os.environ, TMPDIR=str(tmp_path)),
    )
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    assert "killing node" in out and "restarted node" in out
    assert "page_counts table:" in out and "equal to what was produced" in out
    assert "LWM" in out and "CURSOR LAG" in out
    assert "demo PASSED" in out
    assert "the console at http://127.0.0.1:" in out and "/metrics" in out
    assert not list(tmp_path.glob("tidelog-demo-*")), "the demo left its data behind"


@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.sampled_from([b"a", b"b", b"c", b"d"])), st.binary(max_size=3)
        ),
        max_size=60,
    ),
    st.randoms(use_true_random=False),
    st.integers(1, 7),
)
@settings(max_examples=300, deadline=None)
def test_a_replay_cuts_the_same_chunks_whatever_the_row_order(
    rows: list[tuple[bytes | None, bytes]], rnd: Any, target: int
) -> None:
    """What makes the sink exactly once: a replayed task, given the same rows in any order,
    cuts chunks holding the same rows, so sequence N always means the same records; and the
    rows of a key keep the order they came in unless the key outgrows a chunk."""
    from tidelog.spark.sink import replayable_chunks

    records = [ProducerRecord(k, v + b"#%d" % i) for i, (k, v) in enumerate(rows)]
    by_key: dict[bytes | None, list[ProducerRecord]] = {}
    for r in records:
        by_key.setdefault(r.key, []).append(r)
    replayed = list(records)
    rnd.shuffle(replayed)  # Spark may hand a replayed task its rows in any order
    first = replayable_chunks(records, target)
    again = replayable_chunks(replayed, target)
    assert [Counter(c) for c in first] == [Counter(c) for c in again]
    assert Counter(r for c in first for r in c) == Counter(records)
    for key, group in by_key.items():
        if key is not None and len(group) <= target:
            assert [r for c in first for r in c if r.key == key] == group


def test_compaction_gaps_are_not_data_loss(
    spark: Any, cluster: LocalCluster, client: Client
) -> None:
    client.create_topic(
        "compacted",
        replication_factor=3,
        configs={
            "cleanup.policy": "compact",
            "segment.bytes": "2048",
            "min.cleanable.dirty.ratio": "0.01",
            "retention.check.interval.ms": "100",
            "file.delete.delay.ms": "0",
        },
    )
    for round_ in range(5):
        client.produce(
            "compacted",
            [ProducerRecord(b"key%d" % k, b"v%d-%d" % (round_, k)) for k in range(10)],
            partition=0,
        )
    for i in range(40):  # filler, so that every version above sits in closed segments
        client.produce("compacted", [ProducerRecord(b"filler%d" % i, b"f" * 100)], partition=0)
    wait_for(
        "compaction to leave at most 10 records below offset 50",
        lambda: len([o for o in committed(client, "compacted", 0) if o < 50]) <= 10,
        60,
        every_s=0.2,
    )
    log = committed(client, "compacted", 0)
    assert len(log) < 90 and client.list_offsets("compacted", 0, "earliest") == 0
    # failOnDataLoss is on (the default): the gaps compaction leaves are not loss.
    got = rows_of(reader(spark, cluster, subscribe="compacted", minPartitions="4"))
    assert got == sorted((0, o, v) for o, v in log.items())


def test_every_invalid_batch_is_refused_and_every_reader_keeps_reading(
    spark: Any, cluster: LocalCluster, client: Client
) -> None:
    """Issue 9's table: each invalid-batch kind, sent to a stream, a compacted and a table
    topic, is refused with its named error and nothing is appended; the client, compaction,
    table reads and the Spark source read every partition as before, and so they do after every
    node restarts (a poisoned table once left a whole cluster unable to start)."""
    compact = {
        "cleanup.policy": "compact",
        "segment.bytes": "2048",
        "min.cleanable.dirty.ratio": "0.01",
        "retention.check.interval.ms": "100",
    }
    topics = {"poison-stream": ("stream", {}), "poison-compact": ("stream", compact)}
    topics["poison-table"] = ("table", {})
    for name, (kind, configs) in topics.items():
        client.create_topic(name, replication_factor=3, configs=configs, kind=kind)
        client.produce(name, [ProducerRecord(b"k%d" % i, b"before%d" % i) for i in range(20)])
    ends = {name: client.list_offsets(name, 0, "latest") for name in topics}
    refused: dict[str, str] = {}
    raw = Client(cluster.bootstrap, idempotent=False)  # sends batches exactly as they are
    for case in INVALID:
        batch = case.make()
        for name, (kind, configs) in topics.items():
            keyed = kind == "table" or configs
            if case.only_keyed and not keyed:
                continue
            with pytest.raises(case.error) as caught:
                raw.produce_batch(name, 0, batch)
            assert type(caught.value) is case.error, (case.name, name, caught.value)
            assert caught.value.details.get("rule") == case.rule
            refused[f"{name}:{case.name}"] = caught.value.name
    raw.close()
    assert len(refused) >= 3 * len(INVALID) - 2
    for name in topics:  # nothing of any of them was appended
        assert client.list_offsets(name, 0, "latest") == ends[name]
        client.produce(name, [ProducerRecord(b"k%d" % i, b"after%d" % i) for i in range(60)])

    def every_reader_reads() -> None:
        for name in topics:
            consumed = [(r.offset, r.key, r.value) for r in client.consume(name, 0)]
            latest = {k: v for _, k, v in consumed}
            assert latest[b"k5"] == b"after5" and latest[b"k30"] == b"after30"
            rows = reader(spark, cluster, subscribe=name).select("offset", "key", "value")
            got = sorted((r["offset"], bytes(r["key"]), bytes(r["value"])) for r in rows.collect())
            if name == "poison-compact":  # compaction may run between the two reads
                assert {k: v for _, k, v in got} == latest
            else:
                assert got == consumed
        table = dict(client.table_scan("poison-table"))
        assert table[b"k5"] == b"after5" and len(table) == 60
        for row in merge_status(client.status(list(topics)), None):
            assert row["invalid_batches"] == []

    def compactions() -> int:
        return sum(
            p["metrics"]["compactions"]
            for node in client.status(["poison-compact"])
            for p in node["partitions"]
        )

    every_reader_reads()

    def compacted() -> bool:
        if compactions():
            return True
        client.produce("poison-compact", [ProducerRecord(b"k1", b"x" * 200)])
        return False

    wait_for("a compaction of poison-compact", compacted, 60, every_s=0.2)
    client.produce("poison-compact", [ProducerRecord(b"k1", b"after1")])
    cluster.stop_all()
    cluster.start()
    cluster.wait_ready()
    leader_of(client, "poison-table")
    every_reader_reads()


def test_a_chunk_failing_mid_pipeline_leaves_a_prefix_and_the_replay_writes_the_rest(
    spark: Any, cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    """The sink keeps 5 chunks of 100 rows in flight per partition. Chunk 5 is too large for the
    output topic: it fails, and so does the query (after Spark's second attempt of the task);
    the chunks sent behind it are refused (OutOfOrderSequence), so the topic holds exactly
    chunks 0-4. Once the topic takes the large chunk, the query restarted from its checkpoint
    replays the batch and the topic holds every row once, in order."""
    client.create_topic("mid_in", partitions=1, replication_factor=3)
    client.create_topic(
        "mid_out", partitions=1, replication_factor=3, configs={"max.message.bytes": "20000"}
    )
    values = [b"x" * 30_000 if i == 550 else b"v%04d" % i for i in range(1000)]
    for lo in range(0, 1000, 100):
        client.produce(
            "mid_in",
            [ProducerRecord(b"k%04d" % i, values[i]) for i in range(lo, lo + 100)],
            partition=0,
        )

    def copy() -> Any:
        return (
            stream(spark, cluster, "mid_in", startingOffsets="earliest")
            .select("key", "value")
            .writeStream.format("tidelog")
            .option("bootstrap", cluster.bootstrap)
            .option("topic", "mid_out")
            .option("chunkRecords", "100")
            .option("maxInFlight", "5")
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
        )

    failing = copy()
    with pytest.raises(Exception, match="RecordTooLarge"):
        failing.awaitTermination(120)
    landed = [r.key for r in client.consume("mid_out", 0, "earliest")]
    assert landed == [b"k%04d" % i for i in range(500)]

    client.alter_topic("mid_out", {"max.message.bytes": "1048576"})
    replay = copy()
    assert replay.awaitTermination(120), "the replay did not finish"
    assert replay.exception() is None
    out = [(r.key, r.value) for r in client.consume("mid_out", 0, "earliest")]
    assert out == [(b"k%04d" % i, values[i]) for i in range(1000)]


@given(
    st.lists(
        st.tuples(
            st.sampled_from([None, b"a", b"b", b"", b"zz"]), st.none() | st.binary(max_size=30)
        ),
        min_size=1,
        max_size=50,
    ),
    st.booleans(),
    st.booleans(),
)
@settings(max_examples=200, deadline=None)
def test_the_sink_encodes_from_arrow_what_build_batch_encodes(
    rows: list[tuple[bytes | None, bytes | None]], with_keys: bool, sliced: bool
) -> None:
    """The sink's chunks come from the Arrow buffers in C; they hold the same record section as
    build_batch of the same records (keys, values, nulls, and columns that start mid-buffer)."""
    import pyarrow as pa

    from tidelog.record.batch import build_batch, read_header, records_payload
    from tidelog.spark.sink import _Rows

    pad = [(b"pad", b"pad")] if sliced else []
    all_rows = pad + rows
    columns = {"value": pa.array([v for _, v in all_rows], pa.binary())}
    if with_keys:
        columns["key"] = pa.array([k for k, _ in all_rows], pa.binary())
    table = pa.table(columns).slice(len(pad))
    chunk = list(range(len(rows)))[::-1]
    ours = _Rows(table).encode(chunk, 7, 3, 11)
    want = build_batch(
        [ProducerRecord(rows[i][0] if with_keys else None, rows[i][1]) for i in chunk],
        producer_id=7,
        producer_epoch=3,
        base_sequence=11,
    )
    h_ours, h_want = read_header(ours), read_header(want)
    assert records_payload(ours, h_ours) == records_payload(want, h_want)
    assert (h_ours.producer_id, h_ours.producer_epoch, h_ours.base_sequence) == (7, 3, 11)
    assert h_ours.records_count == h_want.records_count == len(rows)


def test_a_declared_schema_reads_only_its_columns_and_max_partitions_packs_tasks(
    spark: Any, cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    client.create_topic("narrow", partitions=3, replication_factor=3)
    sizes = {0: 250, 1: 40, 2: 110}
    for p, n in sizes.items():
        produce(client, "narrow", p, [b"n%d-%d" % (p, i) for i in range(n)])
    everything = reader(spark, cluster, subscribe="narrow", includeHeaders="true")
    want = rows_of(everything)
    assert len(want) == sum(sizes.values())

    def declared(schema: str, **options: Any) -> Any:
        r = spark.read.format("tidelog").schema(schema).option("bootstrap", cluster.bootstrap)
        for key, value in {"subscribe": "narrow", **options}.items():
            r = r.option(key, value)
        return r.load()

    # Only the declared columns, in the declared order, with the same values.
    two = declared("value binary, offset bigint, partition int")
    assert two.columns == ["value", "offset", "partition"]
    assert rows_of(two) == want
    full = [tuple(r) for r in everything.orderBy("partition", "offset").collect()]
    picked = declared(
        "headers array<struct<key:string,value:binary>>, timestamp timestamp, key binary"
    )
    got = [tuple(r) for r in picked.orderBy("timestamp").collect()]
    assert sorted(got, key=repr) == sorted(((r[7], r[5], r[0]) for r in full), key=repr)

    # maxPartitions packs 3 partitions into 2 tasks of near-equal size; every row once.
    packed = declared("partition int, offset bigint, value binary", maxPartitions="2")
    assert packed.rdd.getNumPartitions() == 2
    per_task = packed.rdd.glom().map(len).collect()
    assert sorted(per_task) == [200, 200], per_task
    assert rows_of(packed) == want
    split_then_packed = reader(
        spark, cluster, subscribe="narrow", minPartitions="5", maxPartitions="5"
    )
    assert split_then_packed.rdd.getNumPartitions() == 5
    assert rows_of(split_then_packed) == want

    # A stream with a declared schema, and a table read of two of its columns.
    df = (
        spark.readStream.format("tidelog")
        .schema("partition int, offset bigint, value binary")
        .option("bootstrap", cluster.bootstrap)
        .option("subscribe", "narrow")
        .option("startingOffsets", "earliest")
        .option("maxPartitions", "1")
        .load()
    )
    assert sum(run_available_now(df, tmp_path, "narrow")) == len(want)
    assert parquet_rows(spark, tmp_path / "narrow") == want
    client.create_topic("narrow-tbl", partitions=1, replication_factor=3, kind="table")
    client.produce("narrow-tbl", [ProducerRecord(b"a", b"1"), ProducerRecord(b"a", b"2")])
    tbl = (
        spark.read.format("tidelog")
        .schema("value binary")
        .option("bootstrap", cluster.bootstrap)
        .option("table", "narrow-tbl")
        .load()
    )
    assert [bytes(r["value"]) for r in tbl.collect()] == [b"2"]

    # A column the source does not have, a wrong type, NOT NULL: named errors.
    for schema, words in (
        ("value binary, colour string", "colour"),
        ("value string", "type string"),
        ("value binary not null", "NOT NULL"),
    ):
        with pytest.raises(Exception, match=words):
            declared(schema).collect()
    with pytest.raises(Exception, match="maxPartitions"):
        reader(spark, cluster, subscribe="narrow", minPartitions="3", maxPartitions="2").count()


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 50), min_size=1, max_size=6),
    max_partitions=st.integers(1, 8),
)
def test_packed_tasks_cover_every_offset_once_in_near_equal_pieces(
    sizes: list[int], max_partitions: int
) -> None:
    from tidelog.spark.planning import OffsetRange, pack_ranges

    ranges = [OffsetRange("b", "t", p, 7, 7 + n, True, False, 1024) for p, n in enumerate(sizes)]
    tasks = pack_ranges(ranges, max_partitions)
    live = [r for r in ranges if r.size]
    if len(live) <= max_partitions:
        assert tasks == [(r,) for r in live]
        return
    assert len(tasks) == max_partitions
    covered = [(r.partition, o) for task in tasks for r in task for o in range(r.start, r.end)]
    assert covered == [(r.partition, o) for r in live for o in range(r.start, r.end)]
    loads = [sum(r.size for r in task) for task in tasks]
    assert max(loads) - min(loads) <= 1
    assert all(r.size > 0 for task in tasks for r in task)
