"""tidelog's own transactions (client/transactions.py over node/ops/transactions.py) on a 3-node
cluster: writes to three partitions and a cursor commit become visible together on commit and
never on abort, to read_committed readers, while read_uncommitted readers see every write; a
second holder of a transactional id fences the first; and `tidelog transactions
list|describe|abort` ends a hanging transaction, after which the LSO moves on; and a
read_committed cursor commit never moves a position past the LSO at the partition's leader."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import run_tidelog, wait_for_value
from tidelog.cli.cluster import LocalCluster
from tidelog.client.sync_client import Client
from tidelog.errors import (
    CursorPastStableOffset,
    InvalidTransactionTimeout,
    InvalidTxnState,
    ProducerFenced,
    UnknownCursor,
    UnknownTransactionalId,
)
from tidelog.features import TRANSACTIONS_LEVEL

pytestmark = pytest.mark.process  # tiers: pyproject.toml's markers

PARTITIONS = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("client-txn"), 3) as c:
        with Client(c.bootstrap) as client:  # a new cluster finalizes its level just after
            wait_for_value(
                "feature level 3",
                lambda: client.describe_features().finalized_level,
                TRANSACTIONS_LEVEL.__eq__,
            )
        yield c


def values(client: Client, topic: str, partition: int, isolation_level: str) -> list[bytes]:
    return [
        r.value or b"" for r in client.consume(topic, partition, isolation_level=isolation_level)
    ]


def everywhere(client: Client, topic: str, isolation_level: str) -> list[list[bytes]]:
    return [values(client, topic, p, isolation_level) for p in range(PARTITIONS)]


def test_a_transaction_commits_three_partitions_and_a_cursor_together_or_not_at_all(
    cluster: LocalCluster,
) -> None:
    with Client(cluster.bootstrap) as client:
        client.create_topic("out", PARTITIONS, 3)
        client.create_topic("in", 1, 3)
        client.produce("in", [b"i0", b"i1", b"i2", b"i3", b"i4"], partition=0)
        client.create_cursor("reader", "in", "earliest")

        with client.transaction("etl-1") as txn:
            for p in range(PARTITIONS):
                txn.produce("out", [f"c{p}".encode()], partition=p)
            txn.commit_cursor("reader", {0: 3})
            # Open: read_uncommitted readers see the writes, read_committed ones nothing, and
            # the cursor has not moved.
            assert everywhere(client, "out", "read_uncommitted") == [[b"c0"], [b"c1"], [b"c2"]]
            assert everywhere(client, "out", "read_committed") == [[], [], []]
            assert client.list_offsets("out", 0, "latest", isolation_level="read_committed") == 0
            assert client.cursors("reader")[0]["positions"] == {"0": 0}
        assert txn.state == "committed"
        assert everywhere(client, "out", "read_committed") == [[b"c0"], [b"c1"], [b"c2"]]
        assert client.cursors("reader")[0]["positions"] == {"0": 3}
        for p in range(PARTITIONS):  # the marker is in: the LSO is the HW again
            latest = client.list_offsets("out", p, "latest")
            assert (
                client.list_offsets("out", p, "latest", isolation_level="read_committed") == latest
            )

        failing = client.transaction("etl-1")
        with pytest.raises(RuntimeError, match="the job failed"), failing as txn:
            for p in range(PARTITIONS):
                txn.produce("out", [f"a{p}".encode()], partition=p)
            txn.commit_cursor("reader", {0: 5})
            raise RuntimeError("the job failed")
        assert txn.state == "aborted"
        assert everywhere(client, "out", "read_committed") == [[b"c0"], [b"c1"], [b"c2"]]
        assert everywhere(client, "out", "read_uncommitted") == [
            [b"c0", b"a0"],
            [b"c1", b"a1"],
            [b"c2", b"a2"],
        ]
        assert client.cursors("reader")[0]["positions"] == {"0": 3}  # the abort kept it

        # The next transaction of the id commits after the aborted one, and read_committed
        # readers skip the aborted batches between.
        with client.transaction("etl-1") as txn:
            txn.produce("out", [b"c0'"], partition=0)
            txn.commit_cursor("reader", {0: 5})
        assert values(client, "out", 0, "read_committed") == [b"c0", b"c0'"]
        assert client.cursors("reader")[0]["positions"] == {"0": 5}

        unnamed = client.transaction("etl-1")
        with pytest.raises(UnknownCursor, match="name its topic"), unnamed as txn:
            txn.commit_cursor("nobody", {0: 1})
        assert txn.state == "aborted"


def test_a_transaction_ended_inside_its_block_stays_as_it_was_ended(
    cluster: LocalCluster,
) -> None:
    """txn.abort() (or commit()) within `with client.transaction(...)` ends it there; leaving
    the block then neither commits it nor raises InvalidTxnState."""
    with Client(cluster.bootstrap) as client:
        client.create_topic("ended", 1, 3)
        with client.transaction("ender") as txn:
            txn.produce("ended", [b"dropped"], partition=0)
            txn.abort()
        assert txn.state == "aborted"
        with client.transaction("ender") as txn:
            txn.produce("ended", [b"kept"], partition=0)
            txn.commit()
        assert txn.state == "committed"
        assert values(client, "ended", 0, "read_committed") == [b"kept"]
        assert values(client, "ended", 0, "read_uncommitted") == [b"dropped", b"kept"]


def test_a_second_holder_of_a_transactional_id_fences_the_first(cluster: LocalCluster) -> None:
    with Client(cluster.bootstrap) as client, Client(cluster.bootstrap) as other:
        client.create_topic("fenced", 1, 3)
        zombie = client.transaction("job-7")
        zombie.begin()
        zombie.produce("fenced", [b"zombie"], partition=0)
        with other.transaction("job-7") as successor:  # aborts the zombie's open transaction
            assert successor.epoch > zombie.epoch
            with pytest.raises(ProducerFenced):
                zombie.produce("fenced", [b"late"], partition=0)
            successor.produce("fenced", [b"successor"], partition=0)
        with pytest.raises(ProducerFenced):
            zombie.commit()
        assert values(client, "fenced", 0, "read_committed") == [b"successor"]
        assert b"late" not in values(client, "fenced", 0, "read_uncommitted")


def cli_json(cluster: LocalCluster, *args: str) -> object:
    done = run_tidelog("transactions", *args, "--bootstrap", cluster.bootstrap, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_transactions_cli_lists_describes_and_aborts_a_hanging_transaction(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    with Client(cluster.bootstrap) as client:
        client.create_topic("hang", 2, 3)
        client.produce("hang", [b"before"], partition=0)
        # A producer that begins and never ends, with a timeout far beyond the test's.
        hanging = client.transaction("stuck-1", timeout_ms=600_000)
        hanging.begin()
        hanging.produce("hang", [b"h0"], partition=0)
        hanging.produce("hang", [b"h1"], partition=1)
        client.produce("hang", [b"after"], partition=0)
        assert client.list_offsets("hang", 0, "latest", isolation_level="read_committed") == 1
        assert values(client, "hang", 0, "read_committed") == [b"before"]

        listed = cli_json(cluster, "list", "--state", "Ongoing")
        assert isinstance(listed, list)
        assert [t["transactional_id"] for t in listed] == ["stuck-1"]
        assert 0 <= listed[0]["open_for_ms"] < 600_000  # the text table's OPEN FOR
        described = cli_json(cluster, "describe", "stuck-1")
        assert isinstance(described, dict)
        assert described["state"] == "Ongoing" and described["open_for_ms"] >= 0
        assert described["partitions"] == {"hang": [0, 1]}
        text = run_tidelog("transactions", "list", "--bootstrap", cluster.bootstrap)
        assert "stuck-1" in text.stdout and "hang/0, hang/1" in text.stdout
        negative = run_tidelog("transactions", "list", "--min-age-ms", "-5", "--bootstrap", "x:1")
        assert negative.returncode == 2 and "must be 0 or more" in negative.stderr

        # status names the transactional id that holds the LSO, the one `abort` takes
        status = run_tidelog("status", "hang", "--bootstrap", cluster.bootstrap)
        assert status.returncode == 0, status.stderr
        assert "LSO" in status.stdout
        assert "from offset 1: epoch 0, open" in status.stdout
        assert "; transactional id stuck-1\n" in status.stdout, status.stdout
        status_json = run_tidelog("status", "hang", "--bootstrap", cluster.bootstrap, "--json")
        rows = json.loads(status_json.stdout)["partitions"]
        holds = [
            hold
            for row in rows
            for hold in row["low_watermark"]["holds"]
            if hold["kind"] == "transaction"
        ]
        assert [(h["transactional_id"], h["offset"]) for h in holds] == [
            ("stuck-1", 1),
            ("stuck-1", 0),
        ]
        assert [row["last_stable_offset"] for row in rows] == [1, 0]

        aborted = cli_json(cluster, "abort", "stuck-1")
        assert isinstance(aborted, dict)
        assert aborted["state"] == "CompleteAbort"
        assert aborted["epoch"] == hanging.epoch + 1  # the producer is fenced
        for p in range(2):
            latest = client.list_offsets("hang", p, "latest")
            assert (
                client.list_offsets("hang", p, "latest", isolation_level="read_committed") == latest
            )
        assert values(client, "hang", 0, "read_committed") == [b"before", b"after"]
        assert values(client, "hang", 1, "read_committed") == []
        with pytest.raises(ProducerFenced):
            hanging.produce("hang", [b"zombie"], partition=0)
        refused = run_tidelog("transactions", "abort", "stuck-1", "--bootstrap", cluster.bootstrap)
        assert refused.returncode != 0 and "InvalidTxnState" in refused.stderr


def test_what_a_transaction_refuses_is_named(cluster: LocalCluster) -> None:
    with Client(cluster.bootstrap) as client:
        with pytest.raises(InvalidTransactionTimeout, match=r"transaction\.max\.timeout\.ms"):
            client.transaction("too-long", timeout_ms=10**9).begin()
        with pytest.raises(UnknownTransactionalId):
            client.describe_transaction("never-used")
        with pytest.raises(UnknownTransactionalId):
            client.abort_transaction("never-used")
        with pytest.raises(UnknownCursor, match=r"topic="), client.transaction("no-cursor") as txn:
            txn.commit_cursor("never-created", {0: 1})
        # A transaction open past its timeout is aborted by the coordinator; its producer's
        # commit is fenced, and the error says a timeout is one of the reasons.
        client.create_topic("short-lived", 1, 3)
        expired = client.transaction("expires", timeout_ms=500)
        expired.begin()
        expired.produce("short-lived", [b"too late"], partition=0)
        wait_for_value(
            "the coordinator's abort",
            lambda: client.describe_transaction("expires")["state"],
            "CompleteAbort".__eq__,
        )
        with pytest.raises(ProducerFenced, match=r"transaction\.timeout\.ms"):
            expired.commit()
        with client.transaction("idle") as txn:  # nothing written: nothing to end
            pass
        assert txn.state == "committed"
        with pytest.raises(InvalidTxnState, match="committed"):
            txn.produce("out", [b"after the end"], partition=0)
        with pytest.raises(InvalidTxnState, match="no open transaction"):
            client.abort_transaction("idle")


def test_a_read_committed_cursor_commit_never_passes_the_lso_at_the_leader(
    cluster: LocalCluster,
) -> None:
    """The metadata leader checks each partition's LSO where it is: its own, or asked of the
    partition's leader (one replica each, so two of the three are on other nodes)."""
    with Client(cluster.bootstrap) as client:
        client.create_topic("held", PARTITIONS, 1)
        client.create_cursor("rc-reader", "held", "earliest")
        hanging = client.transaction("held-1", timeout_ms=600_000)
        hanging.begin()
        for p in range(PARTITIONS):
            client.produce("held", [b"before"], partition=p)  # 0
            hanging.produce("held", [b"open"], partition=p)  # 1: holds the LSO at 1
            client.produce("held", [b"after"], partition=p)  # 2; the HW is 3
        [metadata_leader] = {int(s["metadata"]["leader"]) for s in client.status(["held"])}
        leaders = client.topic("held").assignments
        assert any(nodes[0] != metadata_leader for nodes in leaders), (leaders, metadata_leader)

        for p in range(PARTITIONS):
            with pytest.raises(CursorPastStableOffset, match="last stable offset 1") as refused:
                client.commit_cursor("rc-reader", {p: 3}, isolation_level="read_committed")
            assert refused.value.details["position"] == 3
            assert refused.value.details["last_stable_offset"] == 1
            assert refused.value.details["partition"] == p
            client.commit_cursor("rc-reader", {p: 1}, isolation_level="read_committed")
        assert client.cursors("rc-reader")[0]["positions"] == {"0": 1, "1": 1, "2": 1}

        # read_uncommitted (the default, and every client before the field) is not checked; a
        # position kept or moved back is not either.
        client.commit_cursor("rc-reader", {0: 3})
        client.commit_cursor("rc-reader", {0: 3, 1: 1}, isolation_level="read_committed")
        client.commit_cursor("rc-reader", {0: 0}, isolation_level="read_committed")
        assert client.cursors("rc-reader")[0]["positions"] == {"0": 0, "1": 1, "2": 1}

        hanging.abort()  # the markers are in: the LSO is the HW again
        ends = {p: client.list_offsets("held", p, "latest") for p in range(PARTITIONS)}
        client.commit_cursor("rc-reader", ends, isolation_level="read_committed")
        assert client.cursors("rc-reader")[0]["positions"] == {str(p): 4 for p in ends}
