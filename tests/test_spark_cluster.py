"""The Spark source and sink beyond one process, on one deployment: a standalone cluster (a
master and two workers, each its own JVM, executors in JVMs of their own, started with pyspark's
spark-class) and a Spark Connect server (pyspark's connect server) that runs its queries on that
cluster. Exactly once end to end: a driver dies right after the sink wrote a micro-batch and
before Spark checkpointed it; the query, resumed through Spark Connect, replays that batch and
the output topic still holds every input record exactly once."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from tidelog.cli.cluster import LocalCluster
from tidelog.client.sync_client import Client
from tidelog.record import ProducerRecord
from tidelog.spark.standalone import connect_server, standalone_cluster

pytestmark = [pytest.mark.process, pytest.mark.spark]  # tiers: pyproject.toml's markers

HERE = Path(__file__).parent
RECORDS = 2000  # 5 micro-batches of 400
CRASH_AT = "spark-sink-commit:1"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("cluster"), 3, log_level="WARNING") as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster.bootstrap) as c:
        yield c


def fill(client: Client, topic: str) -> None:
    client.create_topic(topic, partitions=3, replication_factor=3)
    for lo in range(0, RECORDS, 100):
        client.produce(
            topic,
            [
                ProducerRecord(b"k%d" % (i % 17), b"%s-%d" % (topic.encode(), i))
                for i in range(lo, lo + 100)
            ],
            partition=(lo // 100) % 3,
        )


def run_driver(
    master: str, cluster: LocalCluster, work: Path, source: str, sink: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    # Spark's scratch (the driver's local directory, the JVM's temp files) in the test's own
    # directory: the crash point's driver cannot clean it up, and in the system's temp directory
    # it would be taken for that of the Spark kill test (tests/test_spark.py) running beside.
    scratch = work / "driver-tmp"
    scratch.mkdir(exist_ok=True)
    return subprocess.run(
        [
            sys.executable,
            str(HERE / "spark_copy_driver.py"),
            master,
            cluster.bootstrap,
            str(work / "checkpoint"),
            source,
            sink,
        ],
        env={**os.environ, "TMPDIR": str(scratch), **env},
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,  # its own process group, so that a crash point takes it all
        cwd=work,  # a directory of its own: nothing may rely on the driver's working directory
    )


def check_exactly_once(client: Client, source: str, sink: str) -> None:
    def values(topic: str) -> Counter[bytes]:
        return Counter(
            r.value or b"" for p in range(3) for r in client.consume(topic, p, "earliest")
        )

    copied, wanted = values(sink), values(source)
    assert sum(wanted.values()) == RECORDS
    assert copied == wanted, "the tidelog sink lost or duplicated records"


def test_exactly_once_on_a_standalone_cluster_resumed_through_spark_connect(
    cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    fill(client, "sa_in")
    client.create_topic("sa_out", partitions=3, replication_factor=3)
    with standalone_cluster(tmp_path / "spark", workers=2) as master:
        # A pyspark driver on the cluster: the crash point takes it down, JVM and all.
        crashed = run_driver(
            master, cluster, tmp_path, "sa_in", "sa_out", {"TIDELOG_CRASH_AT": CRASH_AT}
        )
        assert crashed.returncode != 0, crashed.stdout + crashed.stderr[-3000:]
        assert "done" not in crashed.stdout
        written = sum(client.list_offsets("sa_out", p) for p in range(3))
        assert 0 < written < RECORDS  # batch 1 is in the log, not in the checkpoint
        # The query resumed from its checkpoint through a Connect server (the driver there),
        # itself an application of the same cluster: one set of JVMs started for both checks.
        with connect_server(tmp_path / "connect", master=master) as url:
            finished = run_driver(url, cluster, tmp_path, "sa_in", "sa_out", {})
        assert finished.returncode == 0, finished.stdout + finished.stderr[-3000:]
        assert "done" in finished.stdout
        # The executors of both applications ran in the workers' JVMs: their Python workers
        # were the workers' own.
        executors = list((tmp_path / "spark").glob("worker-*/apps/app-*/*/stderr"))
        apps = {e.parent.parent.name for e in executors}
        assert len(apps) == 2, f"not both drivers' executors ran on the workers: {executors}"
    check_exactly_once(client, "sa_in", "sa_out")
