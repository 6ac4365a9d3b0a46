"""Invalid batches already in a log (written by an older version, before batches were validated):
the node finds and reports them, keeps serving and starting, compaction and table topics pass
over them, and readers skip them when told to (issue 9)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import wait_for_async
from invalid_batches import INVALID, good
from test_node import running_node
from tidelog.client.async_client import AsyncClient
from tidelog.config import TopicConfig
from tidelog.errors import CorruptRecord
from tidelog.record import ProducerRecord, build_batch
from tidelog.storage.log import SegmentedLog

pytestmark = pytest.mark.process  # tiers: pyproject.toml's markers

POISON = {c.name: c for c in INVALID}


def append_as_an_old_version(
    partition_dir: Path, *batches: bytes, config: TopicConfig | None = None
) -> None:
    """What a tidelog that did not validate batches would have appended: the storage layer
    checks layout and CRC only."""
    log = SegmentedLog(partition_dir, config or TopicConfig())
    for batch in batches:
        log.append_as_leader(batch, epoch=max(1, log.last_epoch))
    log.flush()
    log.close()


async def wait_for_invalid(client: AsyncClient, topic: str, count: int) -> list[dict[str, object]]:
    async def reported() -> list[dict[str, object]] | None:
        status = await client.status([topic])
        found = [b for p in status[0]["partitions"] for b in p.get("invalid_batches", [])]
        return found if len(found) >= count else None

    what = f"{count} invalid batches of {topic} in the status"
    found: list[dict[str, object]] = await wait_for_async(what, reported, 20, every_s=0.1)
    return found


def test_a_stream_with_an_old_invalid_batch_is_reported_and_readable_past_it(
    tmp_path: Path,
) -> None:
    async def first() -> None:
        async with running_node(tmp_path) as (_node, client):
            await client.create_topic("s")
            await client.produce("s", [b"a", b"b"], partition=0)

    asyncio.run(first())
    unreadable = POISON["codec_5_does_not_exist"].make()
    lengths = POISON["record_length_disagrees_with_fields"].make()
    append_as_an_old_version(tmp_path / "node" / "s-0", unreadable, good(2), lengths, good(1))

    async def second() -> None:
        async with running_node(tmp_path) as (node, client):
            found = await wait_for_invalid(client, "s", 2)
            assert [(b["base_offset"], b["error"]) for b in found] == [
                (2, "UnsupportedCompression"),
                (7, "CorruptRecord"),
            ]
            with pytest.raises(CorruptRecord, match=r"s/0 offsets 2\.\.4 hold a batch") as caught:
                [r async for r in client.consume("s", 0)]
            assert caught.value.details["base_offset"] == 2
            skipped = [r.offset async for r in client.consume("s", 0, skip_invalid=True)]
            assert skipped == [0, 1, 5, 6, 8]
            await client.produce("s", [b"new"], partition=0)  # it takes writes as before
            port = node.address[1]

            def cli(*args: str) -> subprocess.CompletedProcess[str]:
                return subprocess.run(
                    [sys.executable, "-m", "tidelog", *args, "--bootstrap", f"127.0.0.1:{port}"],
                    capture_output=True,
                    text=True,
                    timeout=60,
                )

            loop = asyncio.get_running_loop()
            plain = await loop.run_in_executor(None, cli, "consume", "s")
            skipping = await loop.run_in_executor(None, cli, "consume", "s", "--skip-invalid")
            status = await loop.run_in_executor(None, cli, "status", "s", "--json")
            text = await loop.run_in_executor(None, cli, "status", "s")
            assert plain.returncode != 0 and "--skip-invalid" in plain.stderr
            assert skipping.returncode == 0 and skipping.stdout.split()[-1] == "new"
            assert "skipping" in skipping.stderr
            row = json.loads(status.stdout)["partitions"][0]
            assert row["invalid_batches"][0]["base_offset"] == 2
            assert row["invalid_batches"][0]["nodes"] == [1]
            assert "INVALID" in text.stdout and "2..4" in text.stdout

    asyncio.run(second())


def test_a_table_with_an_old_invalid_batch_starts_applies_past_it_and_takes_writes(
    tmp_path: Path,
) -> None:
    """The failure the issue found: one unreadable batch (then: the zstd bit, which tidelog did
    not read; now: a codec that does not exist) in a table topic left every node unable to
    start. Now the state machine passes over it (every replica alike) and says so."""

    async def first() -> None:
        async with running_node(tmp_path) as (_node, client):
            await client.create_topic("kv", kind="table")
            await client.produce("kv", [ProducerRecord(b"a", b"1")])

    asyncio.run(first())
    unreadable = POISON["codec_5_does_not_exist"].make()
    later = build_batch([ProducerRecord(b"b", b"2")])
    append_as_an_old_version(tmp_path / "node" / "kv-0", unreadable, later)

    async def second() -> None:
        async with running_node(tmp_path) as (_node, client):
            await client.produce("kv", [ProducerRecord(b"c", b"3")])
            assert await client.table_scan("kv") == [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]
            found = await wait_for_invalid(client, "kv", 1)
            assert found and found[0]["error"] == "UnsupportedCompression"

    asyncio.run(second())


def test_compaction_keeps_an_old_invalid_batch_as_it_is_and_compacts_the_rest(
    tmp_path: Path,
) -> None:
    configs = {
        "cleanup.policy": "compact",
        "segment.bytes": "2048",
        "min.cleanable.dirty.ratio": "0",
        "retention.check.interval.ms": "100",
    }

    async def first() -> None:
        async with running_node(tmp_path) as (_node, client):
            await client.create_topic("c", configs=configs)

    asyncio.run(first())
    poison = POISON["offset_deltas_not_0_to_n"].make()
    updates = [
        build_batch([ProducerRecord(b"k%d" % (i % 3), b"v%d" % i + b"." * 300)]) for i in range(30)
    ]
    append_as_an_old_version(
        tmp_path / "node" / "c-0",
        *updates[:10],
        poison,
        *updates[10:],
        config=TopicConfig.from_mapping(configs),
    )

    async def second() -> None:
        async with running_node(tmp_path) as (node, client):
            host = node.hosts["c/0"]

            async def compacted() -> bool:
                if host.compactions > 0:
                    return True
                await client.produce("c", [ProducerRecord(b"tail", b"x" * 300)])
                return False

            await wait_for_async("a compaction of c/0", compacted, 30, every_s=0.2)
            records = [(r.key, r.value) async for r in client.consume("c", 0, skip_invalid=True)]
            latest = {k: v for k, v in records}
            assert latest[b"k2"] == b"v29" + b"." * 300
            assert len([k for k, _ in records if k == b"k0"]) < 10  # compacted
            found = await wait_for_invalid(client, "c", 1)
            assert found and found[0]["base_offset"] == 10  # kept, at its offsets

    asyncio.run(second())
