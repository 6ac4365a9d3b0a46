"""The Spark source's isolationLevel=read_committed, below a session: the option, the ranges it
plans ("latest" is the LSO), what an executor's task reads of them (aborted transactions
left out), and the cursor it commits (read_committed: never past the LSO, the node checks). The transactions are the Python client's (`client.transaction`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from test_node import run
from test_read_committed import open_transaction, transactions_enabled
from tidelog.client.async_client import AsyncClient
from tidelog.errors import CursorPastStableOffset, InvalidConfig
from tidelog.node.server import Node
from tidelog.spark.connection import client_of
from tidelog.spark.options import SourceOptions
from tidelog.spark.planning import high_watermarks, plan_tasks
from tidelog.spark.reading import read_ranges
from tidelog.spark.source import StreamReader

pytestmark = [pytest.mark.spark, pytest.mark.process]


def test_the_option_is_checked() -> None:
    opts = SourceOptions.parse({"bootstrap": "h:1", "subscribe": "t"}, streaming=False)
    assert opts.isolation_level == "read_uncommitted"
    opts = SourceOptions.parse(
        {"bootstrap": "h:1", "subscribe": "t", "isolationLevel": "read_committed"},
        streaming=False,
    )
    assert opts.isolation_level == "read_committed"
    with pytest.raises(InvalidConfig, match="isolationLevel"):
        SourceOptions.parse(
            {"bootstrap": "h:1", "subscribe": "t", "isolationLevel": "snapshot"}, streaming=False
        )


def test_a_read_committed_query_ends_at_the_lso_without_aborted_records(tmp_path: Path) -> None:
    async def body(node: Node, client: AsyncClient) -> None:
        await transactions_enabled(client)
        await client.create_topic("t")
        await client.produce("t", [b"p0"], partition=0)  # 0
        aborted = await open_transaction(client, "a", b"a1")  # 1
        committed = await open_transaction(client, "c", b"c1")  # 2
        await aborted.abort()  # its ABORT marker: 3
        await committed.commit()  # its COMMIT marker: 4
        await open_transaction(client, "o", b"open")  # 5: open
        await client.produce("t", [b"z"], partition=0)  # 6
        address = f"127.0.0.1:{node.address[1]}"
        opts = SourceOptions.parse(
            {"bootstrap": address, "subscribe": "t", "isolationLevel": "read_committed"},
            streaming=False,
        )

        def plan_and_read() -> tuple[int, int, list[bytes]]:
            sync = client_of(opts)
            lso = high_watermarks(sync, [("t", 0)], opts.isolation_level)[("t", 0)]
            hw = high_watermarks(sync, [("t", 0)])[("t", 0)]
            tasks = plan_tasks(opts, {("t", 0): 0}, {("t", 0): lso}, (), {})
            read = [
                v.as_py() for task in tasks for b in read_ranges(task) for v in b.column("value")
            ]
            return lso, hw, read

        lso, hw, read = await asyncio.to_thread(plan_and_read)
        assert (lso, hw) == (5, 7)
        assert read == [b"p0", b"c1"]

    run(tmp_path, body)


def test_a_read_committed_stream_commits_its_cursor_as_read_committed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def body(node: Node, client: AsyncClient) -> None:
        await transactions_enabled(client)
        await client.create_topic("t")
        await client.produce("t", [b"p0"], partition=0)  # 0
        await open_transaction(client, "o", b"open")  # 1: open, holds the LSO
        await client.produce("t", [b"z"], partition=0)  # 2; the HW is 3
        address = f"127.0.0.1:{node.address[1]}"
        opts = SourceOptions.parse(
            {
                "bootstrap": address,
                "subscribe": "t",
                "isolationLevel": "read_committed",
                "cursor": "stream",
                "startingOffsets": "earliest",
            },
            streaming=True,
        )
        reader = StreamReader(opts, ())

        def run_batches() -> None:
            start = reader.initialOffset()
            assert start == {"t": {"0": 0}}
            end = reader.latestOffset(start, reader.getDefaultReadLimit())
            assert end == {"t": {"0": 1}}  # the LSO
            reader.commit(end)
            # A batch end past the LSO (made by hand: the source never plans one) is refused,
            # and, as any failed cursor commit, logged (the cursor is not the query's progress).
            reader.commit({"t": {"0": 3}})

        await asyncio.to_thread(run_batches)
        [cursor] = await client.cursors("stream")
        assert cursor["positions"] == {"0": 1}
        assert f"{CursorPastStableOffset.__name__}: cursor 'stream'" in caplog.text
        assert "at 3 is past its last stable offset 1" in caplog.text

    run(tmp_path, body)
