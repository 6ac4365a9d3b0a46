"""read_committed through a real node, the Python client and the CLI: reads stop at the last
stable offset, aborted transactions' batches and markers are left out, "latest" is the LSO, and
status shows the LSO and the transaction that holds the LWM. The transactions are the client's
own (`client.transaction`), their markers the coordinator's."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import run_tidelog, wait_for_async
from test_node import run
from tidelog.client.async_client import AsyncClient
from tidelog.client.consume import committed_only
from tidelog.client.transactions import AsyncTransaction
from tidelog.errors import CursorPastStableOffset, InvalidRequest, UnsupportedApi
from tidelog.features import TRANSACTIONS_LEVEL
from tidelog.node.server import Node
from tidelog.protocol import api
from tidelog.record.batch import ProducerRecord, build_batch, iter_headers

pytestmark = pytest.mark.process  # tiers: pyproject.toml's markers


async def transactions_enabled(client: AsyncClient) -> None:
    """A new cluster finalizes feature level 3 just after it starts."""

    async def level() -> bool:
        return (await client.describe_features()).finalized_level >= TRANSACTIONS_LEVEL

    await wait_for_async("feature level 3", level)


async def open_transaction(
    client: AsyncClient, transactional_id: str, *values: bytes
) -> AsyncTransaction:
    """A transaction of the id that wrote values (one batch) to t/0 and is still open."""
    txn = client.transaction(transactional_id)
    await txn.begin()
    await txn.produce("t", list(values), partition=0)
    return txn


async def values(client: AsyncClient, **options: object) -> list[bytes | None]:
    return [r.value async for r in client.consume("t", 0, **options)]  # type: ignore[arg-type]


def test_read_committed_stops_at_the_lso_and_drops_aborted_batches(tmp_path: Path) -> None:
    async def body(node: Node, client: AsyncClient) -> None:
        await transactions_enabled(client)
        await client.create_topic("t")
        await client.produce("t", [b"p0"], partition=0)  # 0
        aborted = await open_transaction(client, "a", b"a1", b"a2")  # 1, 2
        committed = await open_transaction(client, "c", b"c1")  # 3
        await client.produce("t", [b"b"], partition=0)  # 4
        await aborted.abort()  # its ABORT marker: 5
        await committed.commit()  # its COMMIT marker: 6
        still_open = await open_transaction(client, "o", b"o1")  # 7: open
        await client.produce("t", [b"z"], partition=0)  # 8
        holder = f"producer {still_open.producer_id}"

        everything = [b"p0", b"a1", b"a2", b"c1", b"b", b"o1", b"z"]
        assert await values(client) == everything
        assert await values(client, isolation_level="read_committed") == [b"p0", b"c1", b"b"]
        assert await client.list_offsets("t", 0, "latest") == 9
        assert await client.list_offsets("t", 0, "latest", isolation_level="read_committed") == 7
        fetched = await client.fetch("t", 0, 0, isolation_level="read_committed")
        assert fetched.last_stable_offset == 7 and fetched.high_watermark == 9
        assert [r.offset for r in fetched.records] == [0, 3, 4]
        assert fetched.next_offset == 7  # the markers' offsets are gaps the reader passes
        with pytest.raises(InvalidRequest, match="isolation_level"):
            await client.fetch("t", 0, 0, isolation_level="serializable")

        [status] = await client.status(["t"])
        part = next(p for p in status["partitions"] if p["topic"] == "t")
        assert part["last_stable_offset"] == 7 and part["high_watermark"] == 9
        holds = [h for h in part["low_watermark"]["holds"] if h["kind"] == "transaction"]
        assert [(h["name"], h["offset"]) for h in holds] == [(holder, 7)]

        address = f"127.0.0.1:{node.address[1]}"
        shown = await asyncio.to_thread(
            run_tidelog,
            "consume",
            "--bootstrap",
            address,
            "t",
            "--isolation-level",
            "read_committed",
            "--format",
            "json",
        )
        assert shown.returncode == 0, shown.stderr
        read = [json.loads(line)["value"] for line in shown.stdout.splitlines()]
        assert read == ["p0", "c1", "b"]
        table = await asyncio.to_thread(run_tidelog, "status", "--bootstrap", address)
        assert "LSO" in table.stdout
        assert f"transaction {holder} from offset 7: epoch 0, open" in table.stdout

        # The open transaction commits: everything it held back is readable.
        await still_open.commit()  # its COMMIT marker: 9
        assert await values(client, isolation_level="read_committed") == [
            b"p0",
            b"c1",
            b"b",
            b"o1",
            b"z",
        ]
        assert await client.list_offsets("t", 0, "latest", isolation_level="read_committed") == 10

    run(tmp_path, body)


def test_a_cursor_of_a_read_committed_reader_starts_at_the_lso(tmp_path: Path) -> None:
    async def body(node: Node, client: AsyncClient) -> None:
        await transactions_enabled(client)
        await client.create_topic("t")
        await client.produce("t", [b"p0"], partition=0)
        await open_transaction(client, "open", b"open")  # 1: open
        await client.produce("t", [b"later"], partition=0)
        address = f"127.0.0.1:{node.address[1]}"
        shown = await asyncio.to_thread(
            run_tidelog,
            "consume",
            "--bootstrap",
            address,
            "t",
            "--from",
            "latest",
            "--cursor",
            "etl",
            "--isolation-level",
            "read_committed",
        )
        assert shown.returncode == 0, shown.stderr
        [cursor] = await client.cursors("etl")
        assert cursor["positions"] == {"0": 1}  # the LSO, not the HW (3)
        # The node holds it there for read_committed commits too (this node leads t/0).
        with pytest.raises(CursorPastStableOffset, match=r"at 3 is past its last stable offset 1"):
            await client.commit_cursor("etl", {0: 3}, isolation_level="read_committed")
        await client.commit_cursor("etl", {0: 3})  # read_uncommitted: as it always was
        [cursor] = await client.cursors("etl")
        assert cursor["positions"] == {"0": 3}
        # A read_committed reader at a position past the LSO (not the HW) waits there, as a
        # Kafka consumer does: nothing to read yet, no reset to the start, the cursor unmoved.
        assert await values(client, start=3, isolation_level="read_committed") == []
        for reset in ("earliest", "none"):
            again = await asyncio.to_thread(
                run_tidelog,
                "consume",
                "--bootstrap",
                address,
                "t",
                "--cursor",
                "etl",
                "--isolation-level",
                "read_committed",
                "--reset",
                reset,
            )
            assert again.returncode == 0, again.stderr
            assert again.stdout.split() == []
        [cursor] = await client.cursors("etl")
        assert cursor["positions"] == {"0": 3}
        # and an old client's cursor request decodes as read_uncommitted
        request = api.decode(api.CursorRequest, {"op": "commit", "name": "etl"})
        assert request.isolation_level == "read_uncommitted"

    run(tmp_path, body)


def test_a_cursor_commits_the_position_past_trailing_markers(tmp_path: Path) -> None:
    """A partition that ends in an aborted transaction and its marker: `consume --cursor`
    commits the position past them (a Kafka consumer's fetch position), not the offset after
    the last record printed, so a partition read to its end shows no lag; consume_batches()
    hands the same position as next_offset, an empty fetch included."""

    async def body(node: Node, client: AsyncClient) -> None:
        await transactions_enabled(client)
        await client.create_topic("t")
        await client.produce("t", [b"kept"], partition=0)
        txn = await open_transaction(client, "dropped", b"a1", b"a2")  # 1-2, then a marker
        await txn.abort()
        end = await client.list_offsets("t", 0, "latest", isolation_level="read_committed")
        assert end == 4  # the LSO is the HW: nothing open
        fetches = [
            (list(f), f.next_offset)
            async for f in client.consume_batches("t", 0, 1, isolation_level="read_committed")
        ]
        assert fetches == [([], 4)]  # only skipped batches: no record, the position moves
        shown = await asyncio.to_thread(
            run_tidelog,
            "consume",
            "--bootstrap",
            f"127.0.0.1:{node.address[1]}",
            "t",
            "--cursor",
            "tail",
            "--isolation-level",
            "read_committed",
        )
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.split() == ["kept"]
        [cursor] = await client.cursors("tail")
        assert cursor["positions"] == {"0": 4}  # not 1, after "kept"

    run(tmp_path, body)


def test_a_following_cursor_commits_when_idle_and_when_terminated(tmp_path: Path) -> None:
    """`consume --follow --cursor` that reached the end commits its position within half a
    second, markers included, though no record comes after (it committed only when it printed a
    record, so a follower at the end kept a lag for good); SIGTERM commits what it printed,
    then it exits 143 (it lost the last half second's records before)."""

    async def body(node: Node, client: AsyncClient) -> None:
        await transactions_enabled(client)
        await client.create_topic("t")
        await client.produce("t", [b"kept"], partition=0)  # 0
        txn = await open_transaction(client, "dropped", b"a1", b"a2")  # 1-2
        await txn.abort()  # its marker: 3
        follower = subprocess.Popen(
            [
                sys.executable, "-m", "tidelog", "consume", "t", "--follow", "--cursor", "tail",
                "--isolation-level", "read_committed", "--from", "earliest",
                "--bootstrap", f"127.0.0.1:{node.address[1]}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:

            async def at(position: int) -> bool:
                found = await client.cursors()
                return any(c["name"] == "tail" and c["positions"] == {"0": position} for c in found)

            await wait_for_async("the idle follower to commit past the marker", lambda: at(4))
            await client.produce("t", [b"last"], partition=0)  # 4
            await wait_for_async("the follower to commit past the last record", lambda: at(5))
            await client.produce("t", [b"final"], partition=0)  # 5
            # SIGTERM at once: the idle commit may not have come; the one on the way out must.
            follower.send_signal(signal.SIGTERM)
            out, err = await asyncio.to_thread(follower.communicate, timeout=30)
        finally:
            if follower.poll() is None:
                follower.kill()
                follower.wait()
        assert follower.returncode == 128 + signal.SIGTERM, err
        printed = out.split()
        assert printed[:2] == ["kept", "last"], out
        [cursor] = await client.cursors("tail")
        assert cursor["positions"] == {"0": 4 + len(printed[1:])}, (cursor, out)

    run(tmp_path, body)


def test_an_answer_without_an_lso_is_refused_for_read_committed() -> None:
    """A node from before transactions ignores isolation_level (unknown request fields are
    ignored) and answers without last_stable_offset: the client refuses, by name, rather
    than hand over records that may be aborted."""
    batch = build_batch([ProducerRecord(None, b"x")])
    batches = tuple(iter_headers(batch))
    old = api.decode(
        api.FetchResponse,
        {
            "high_watermark": 1,
            "log_start_offset": 0,
            "log_end_offset": 1,
            "leader_epoch": 1,
            "node_id": 3,
        },
    )
    with pytest.raises(UnsupportedApi, match="node 3 predates transactions"):
        committed_only(batch, batches, old, "t/0")
    new = api.decode(api.FetchResponse, {**api.encode(old), "last_stable_offset": 1})
    assert committed_only(batch, batches, new, "t/0") == batches
    # and an old client's request decodes as read_uncommitted
    request = api.decode(api.FetchRequest, {"topic": "t", "partition": 0, "offset": 0})
    assert request.isolation_level == "read_uncommitted"
