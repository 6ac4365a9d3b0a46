"""A node in this process, on a real socket: produce, fetch, long-poll, list offsets, and bad
input that must get a named error or a closed connection while other clients carry on."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from helpers import batch_of
from tidelog.client.async_client import AsyncClient
from tidelog.client.producer import Producer
from tidelog.config import InvalidConfig
from tidelog.errors import (
    CorruptRecord,
    InvalidRequest,
    NotLeader,
    OffsetOutOfRange,
    RecordTooLarge,
    TopicAlreadyExists,
    UnknownTopicOrPartition,
    UnsupportedApi,
)
from tidelog.node.config import NodeConfig
from tidelog.node.server import Node
from tidelog.protocol import api
from tidelog.protocol.api import ApiKey
from tidelog.protocol.framing import PREFIX, FrameDecoder, Kind, encode_prefix
from tidelog.record import ProducerRecord, build_batch
from tidelog.replication.driver import PartitionDriver

pytestmark = pytest.mark.process  # tiers: pyproject.toml's markers


@contextlib.asynccontextmanager
async def running_node(tmp_path: Path, **options: Any) -> AsyncIterator[tuple[Node, AsyncClient]]:
    config = NodeConfig(data_dir=tmp_path / "node", listen=("127.0.0.1", 0), **options)
    node = Node(config)
    await node.start()
    client = AsyncClient(f"127.0.0.1:{node.address[1]}", retries=10)
    try:
        yield node, client
    finally:
        await client.close()
        await node.stop()


def run(
    tmp_path: Path, body: Callable[[Node, AsyncClient], Awaitable[None]], **options: Any
) -> None:
    async def main() -> None:
        async with running_node(tmp_path, **options) as (node, client):
            await asyncio.wait_for(body(node, client), 60)

    asyncio.run(main())


def test_produce_fetch_and_list_offsets(tmp_path: Path) -> None:
    async def body(node: Node, client: AsyncClient) -> None:
        await client.create_topic("t", partitions=2)
        r1 = await client.produce(
            "t", [ProducerRecord(None, v, (), 1_000) for v in (b"a", b"b", b"c")], partition=1
        )
        r2 = await client.produce(
            "t", [ProducerRecord(b"k", b"d", (("h", b"v"),), 5_000)], partition=1, acks=1
        )
        assert r1 is not None and r2 is not None
        assert (r1.base_offset, r1.last_offset, r2.base_offset) == (0, 2, 3)
        await client.produce("t", [b"fire-and-forget"], partition=0, acks=0)
        result = await client.fetch("t", 1, 1)
        assert [(r.offset, r.value) for r in result.records] == [(1, b"b"), (2, b"c"), (3, b"d")]
        assert result.records[-1].headers == (("h", b"v"),) and result.records[-1].key == b"k"
        assert result.high_watermark == 4 and result.next_offset == 4
        assert await client.list_offsets("t", 1, "earliest") == 0
        assert await client.list_offsets("t", 1, "latest") == 4
        assert await client.list_offsets("t", 1, "timestamp", 4_999) == 3
        assert await client.list_offsets("t", 1, "timestamp", 10**15) == 4
        for _ in range(50):
            if await client.list_offsets("t", 0, "latest") == 1:
                break
            await asyncio.sleep(0.02)
        assert [r.value async for r in client.consume("t", 0)] == [b"fire-and-forget"]

    run(tmp_path, body)


def test_long_poll_waits_for_the_high_watermark(tmp_path: Path) -> None:
    async def body(node: Node, client: AsyncClient) -> None:
        await client.create_topic("t")
        loop = asyncio.get_running_loop()
        started = loop.time()
        empty = await client.fetch("t", 0, 0, max_wait_ms=200)
        assert empty.records == [] and loop.time() - started >= 0.18
        waiting = asyncio.create_task(client.fetch("t", 0, 0, max_wait_ms=5_000))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        await client.produce("t", [b"x"], partition=0)
        result = await asyncio.wait_for(waiting, 2)
        assert [r.value for r in result.records] == [b"x"]
        with pytest.raises(OffsetOutOfRange) as info:
            await client.fetch("t", 0, 5)
        assert info.value.high_watermark == 1 and info.value.log_start == 0

    run(tmp_path, body)


def test_producer_batches_and_preserves_order(tmp_path: Path) -> None:
    async def body(node: Node, client: AsyncClient) -> None:
        await client.create_topic("t", partitions=3)
        producer = Producer(client, linger_ms=2, batch_bytes=4096)
        futures = [await producer.send("t", b"v%d" % i, key=b"k%d" % (i % 7)) for i in range(2000)]
        await producer.close()
        metas = [await f for f in futures]
        by_partition: dict[int, list[int]] = {}
        for i, m in enumerate(metas):
            by_partition.setdefault(m.partition, []).append(i)
        for p, items in by_partition.items():
            offsets = [metas[i].offset for i in items]
            assert offsets == sorted(offsets), "records of one partition keep their send order"
            got = {r.offset: r.value async for r in client.consume("t", p)}
            assert all(got[metas[i].offset] == b"v%d" % i for i in items)
        flushes = sum(h.flush_count for h in node.hosts.values())
        assert flushes < 2000, "group commit: far fewer fsyncs than records"

    run(tmp_path, body)


def test_admin_errors_are_named(tmp_path: Path) -> None:
    async def body(node: Node, client: AsyncClient) -> None:
        await client.create_topic("t", partitions=2)
        with pytest.raises(TopicAlreadyExists):
            await client.create_topic("t")
        with pytest.raises(InvalidRequest):
            await client.create_topic("bad/name")
        with pytest.raises(InvalidRequest):
            await client.create_topic("x", replication_factor=2)
        with pytest.raises(InvalidConfig):
            await client.create_topic("y", configs={"segment.bytes": "lots"})
        with pytest.raises(InvalidConfig):
            await client.create_topic("z", configs={"no.such.setting": "1"})
        with pytest.raises(UnknownTopicOrPartition):
            await client.fetch("t", 7, 0)
        with pytest.raises(UnknownTopicOrPartition):
            await client.produce("missing", [b"x"], partition=0)
        info = await client.topic("t")
        assert info.partitions == 2 and info.leaders == [node.node_id, node.node_id]
        topics = [t.name for t in await client.list_topics()]
        assert topics == ["t"]
        created = await client.create_topic(
            "c", configs={"segment.bytes": "4096", "retention.ms": "-1"}
        )
        assert created.configs == {"segment.bytes": "4096", "retention.ms": "-1"}
        assert node.hosts["c/0"].config.segment_bytes == 4096

    run(tmp_path, body)


class RawClient:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.decoder = FrameDecoder()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def request(self, key: int, header: dict[str, Any], payload: bytes = b"", cid: int = 1) -> None:
        self.send(encode_prefix(Kind.REQUEST, key, cid, header, len(payload)) + payload)

    def answer(self) -> dict[str, Any] | None:
        """The next response header, or None if the node closed the connection."""
        while True:
            frame = self.decoder.next_frame()
            if frame is not None:
                return frame.header
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                return None
            if not data:
                return None
            self.decoder.receive_data(data)

    def close(self) -> None:
        self.sock.close()


def test_bad_input_gets_named_errors_or_a_closed_connection(tmp_path: Path) -> None:
    async def body(node: Node, client: AsyncClient) -> None:
        await client.create_topic("t", configs={"max.message.bytes": "10000"})
        await client.produce("t", [b"before"], partition=0)
        port = node.address[1]
        loop = asyncio.get_running_loop()

        def raw_session() -> dict[str, Any]:
            seen: dict[str, Any] = {}
            c = RawClient(port)

            def ask(key: int, header: dict[str, Any], payload: bytes = b"") -> str:
                c.request(key, header, payload)
                answer = c.answer()
                assert answer is not None
                return str(answer.get("error", {}).get("name", "ok"))

            good = batch_of(b"x")
            bad_crc = bytearray(good)
            bad_crc[-1] ^= 0xFF
            seen["bad_crc"] = ask(ApiKey.PRODUCE, {"topic": "t", "partition": 0}, bytes(bad_crc))
            seen["garbage"] = ask(ApiKey.PRODUCE, {"topic": "t", "partition": 0}, b"\x00" * 100)
            seen["too_large"] = ask(
                ApiKey.PRODUCE, {"topic": "t", "partition": 0}, batch_of(b"y" * 20_000)
            )
            seen["unknown_api"] = ask(999, {})
            seen["unknown_topic"] = ask(
                ApiKey.FETCH, {"topic": "nope", "partition": 0, "offset": 0}
            )
            seen["out_of_range"] = ask(ApiKey.FETCH, {"topic": "t", "partition": 0, "offset": 99})
            seen["wrong_type"] = ask(ApiKey.FETCH, {"topic": "t", "partition": "0", "offset": 0})
            seen["bad_acks"] = ask(ApiKey.PRODUCE, {"topic": "t", "partition": 0, "acks": 7}, good)
            seen["no_batch"] = ask(ApiKey.PRODUCE, {"topic": "t", "partition": 0}, b"")
            c.close()
            # A frame longer than the limit: the node hangs up.
            c = RawClient(port)
            c.send(struct.pack(">I", 2**31) + b"\x00" * 20)
            seen["huge_frame"] = c.answer()
            c.close()
            c = RawClient(port)
            c.send(PREFIX.pack(15, 0, 0, 1, 4) + b"nope")
            seen["bad_header"] = c.answer()
            c.close()
            return seen

        seen = await loop.run_in_executor(None, raw_session)
        assert seen["bad_crc"] == CorruptRecord.__name__
        assert seen["garbage"] == CorruptRecord.__name__
        assert seen["too_large"] == RecordTooLarge.__name__
        assert seen["unknown_api"] == UnsupportedApi.__name__
        assert seen["unknown_topic"] == UnknownTopicOrPartition.__name__
        assert seen["out_of_range"] == OffsetOutOfRange.__name__
        assert seen["wrong_type"] == InvalidRequest.__name__
        assert seen["bad_acks"] == InvalidRequest.__name__
        assert seen["no_batch"] == InvalidRequest.__name__
        assert seen["huge_frame"] is None
        assert seen["bad_header"] is None
        # The node is fine, the log is intact, other clients carry on.
        await client.produce("t", [b"after"], partition=0)
        assert [r.value async for r in client.consume("t", 0)] == [b"before", b"after"]

    run(tmp_path, body)


def test_fuzzed_frames_never_hurt_the_node(tmp_path: Path) -> None:
    import random

    async def body(node: Node, client: AsyncClient) -> None:
        await client.create_topic("t")
        port = node.address[1]
        rng = random.Random(7)
        valid = encode_prefix(Kind.REQUEST, ApiKey.PRODUCE, 1, {"topic": "t", "partition": 0}, 0)

        def fuzz() -> None:
            for i in range(300):
                c = RawClient(port)
                if i % 2:
                    blob = bytearray(valid + batch_of(b"z"))
                    struct.pack_into(">I", blob, 0, len(blob) - 4)
                    for _ in range(rng.randint(1, 6)):
                        blob[rng.randrange(len(blob))] = rng.randrange(256)
                else:
                    blob = bytearray(rng.randbytes(rng.randint(1, 200)))
                c.sock.settimeout(0.3)
                try:
                    c.send(bytes(blob))
                    c.answer()
                except (TimeoutError, OSError):
                    pass
                c.close()

        await asyncio.get_running_loop().run_in_executor(None, fuzz)
        result = await client.produce("t", [b"still here"], partition=0)
        assert result is not None
        records = [r.value async for r in client.consume("t", 0)]
        assert records[-1] == b"still here"

    run(tmp_path, body)


def test_restart_serves_the_acknowledged_prefix(tmp_path: Path) -> None:
    acked: list[tuple[int, bytes]] = []

    async def first(node: Node, client: AsyncClient) -> None:
        await client.create_topic("t", configs={"segment.bytes": "4096"})
        for i in range(100):
            r = await client.produce("t", [b"r%d" % i], partition=0)
            assert r is not None
            acked.append((r.base_offset, b"r%d" % i))

    async def second(node: Node, client: AsyncClient) -> None:
        got = [(r.offset, r.value) async for r in client.consume("t", 0)]
        assert got == acked
        assert node.hosts["t/0"].log.segment_count > 1

    run(tmp_path, first)
    run(tmp_path, second)


def test_a_node_listening_before_its_metadata_log_is_open_says_come_again(
    tmp_path: Path,
) -> None:
    """A node binds its listeners (and so chooses its ports) before it opens its metadata log:
    a request in between gets a named, retriable NotLeader ("starting"), never an internal
    error, and a client's retries get through once the node is up."""

    async def main() -> None:
        node = Node(NodeConfig(data_dir=tmp_path / "node", listen=("127.0.0.1", 0)))
        opening = asyncio.Event()
        open_core = node.core.start

        async def held_start() -> None:  # holds the start where the window is
            await opening.wait()
            await open_core()

        node.core.start = held_start  # type: ignore[method-assign]
        starting = asyncio.create_task(node.start())
        try:
            while node.config.listen[1] == 0:
                await asyncio.sleep(0.01)
            address = f"127.0.0.1:{node.config.listen[1]}"
            async with AsyncClient(address, retries=1, admin_timeout_ms=0) as impatient:
                with pytest.raises(NotLeader, match="starting"):
                    await impatient.call(node.config.listen, ApiKey.METADATA, api.MetadataRequest())
                with pytest.raises(NotLeader, match="starting"):
                    await impatient.create_topic("t")
            async with AsyncClient(address, retries=20) as patient:
                creating = asyncio.create_task(patient.create_topic("t"))
                await asyncio.sleep(0.3)
                assert not creating.done()
                opening.set()
                await starting
                info = await asyncio.wait_for(creating, 30)
                assert info.partitions == 1
        finally:
            opening.set()
            await starting
            await node.stop()

    asyncio.run(main())


def test_request_types_and_the_cores_handlers_are_the_same_set(tmp_path: Path) -> None:
    """Every request type the protocol names has a handler in the core (and no handler serves
    a type the protocol cannot carry); ApiVersions advertises exactly those keys, and a key
    outside them is refused by name."""
    from tidelog.errors import UnsupportedApi
    from wire import Wire

    async def body(node: Node, client: AsyncClient) -> None:
        handled = set(node.core._handlers)
        assert handled == set(api.REQUEST_TYPES.values())

        def ask() -> tuple[Any, Any]:
            wire = Wire(node.address)
            versions = wire.request(ApiKey.API_VERSIONS, api.ApiVersionsRequest())
            unknown = wire.request(250, api.ApiVersionsRequest())
            wire.close()
            return versions.header, api.error_of(unknown.header)

        versions, error = await asyncio.get_running_loop().run_in_executor(None, ask)
        assert sorted(versions["apis"]) == sorted(int(k) for k in api.REQUEST_TYPES)
        assert isinstance(error, UnsupportedApi)

    run(tmp_path, body)


def test_reset_policy_when_the_offset_fell_below_the_log_start(tmp_path: Path) -> None:
    async def body(node: Node, client: AsyncClient) -> None:
        await client.create_topic("t", configs={"segment.bytes": "2048"})
        for i in range(30):
            await client.produce("t", [b"%03d" % i + b"x" * 200], partition=0)
        host = node.hosts["t/0"]
        assert host.log.advance_log_start(20)
        host.log.delete_segments_below_log_start()
        with pytest.raises(OffsetOutOfRange) as info:
            await client.fetch("t", 0, 5)
        assert (info.value.log_start, info.value.high_watermark) == (20, 30)
        earliest = [r.offset async for r in client.consume("t", 0, 5, reset="earliest")]
        assert earliest == list(range(20, 30))
        latest = [r.offset async for r in client.consume("t", 0, 5, reset="latest")]
        assert latest == []
        with pytest.raises(OffsetOutOfRange):
            [r async for r in client.consume("t", 0, 5, reset="none")]
        assert await client.list_offsets("t", 0, "earliest") == 20

    run(tmp_path, body)


def test_flush_messages_trades_fsyncs_for_speed_like_kafka(tmp_path: Path) -> None:
    async def body(node: Node, client: AsyncClient) -> None:
        await client.create_topic("lazy", configs={"flush.messages": "1000000", "flush.ms": "3000"})
        await client.create_topic("safe")
        lazy, safe = node.hosts["lazy/0"], node.hosts["safe/0"]
        for i in range(50):
            await client.produce("safe", [b"r%d" % i], partition=0)
            await client.produce("lazy", [b"r%d" % i], partition=0)
        # Acknowledged, and (the flush.ms timer not due yet) not yet on disk:
        assert lazy.log.log_end_offset == 50 and lazy.log.durable_end_offset < 50
        assert safe.flush_count >= 25, "default: an fsync before acknowledging"
        assert lazy.flush_count <= 1
        assert safe.log.durable_end_offset == 50
        for _ in range(60):
            if lazy.log.durable_end_offset == 50:
                break
            await asyncio.sleep(0.1)
        assert lazy.log.durable_end_offset == 50, "flush.ms flushed it"
        assert [r.value async for r in client.consume("lazy", 0)][-1] == b"r49"

    run(tmp_path, body)


def test_min_bytes_waits_for_enough_data(tmp_path: Path) -> None:
    async def body(node: Node, client: AsyncClient) -> None:
        await client.create_topic("t")
        await client.produce("t", [b"small"], partition=0)
        waiting = asyncio.create_task(client.fetch("t", 0, 0, min_bytes=2000, max_wait_ms=3000))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        await client.produce("t", [b"y" * 3000], partition=0)
        result = await asyncio.wait_for(waiting, 2)
        assert [r.offset for r in result.records] == [0, 1]

    run(tmp_path, body)


def test_metadata_snapshots_let_the_metadata_log_go_and_survive_restart(tmp_path: Path) -> None:
    async def first(node: Node, client: AsyncClient) -> None:
        await client.create_topic("t", partitions=2)
        await client.create_cursor("c", "t", "earliest")
        for i in range(60):
            await client.commit_cursor("c", {0: i, 1: i})
        host = node.metadata_host
        assert host.state_machine is not None and host.state_machine.snapshots_taken >= 2
        # The class the simulator runs under its faults is the one driving this replica.
        assert type(host.driver) is PartitionDriver and host.driver.machine is host.state_machine
        node.cleaner.clean(host)
        assert host.log.log_start_offset > 0, "the metadata log below the snapshot hold went"

    async def second(node: Node, client: AsyncClient) -> None:
        cursor = (await client.cursors("c"))[0]
        assert cursor["positions"] == {"0": 59, "1": 59}
        assert (await client.topic("t")).partitions == 2
        assert node.metadata.applied_offset >= node.metadata_host.log.log_start_offset

    options = {"metadata_snapshot_entries": 10}
    run(tmp_path, first, **options)
    run(tmp_path, second, **options)


def test_idempotent_producers_are_deduplicated_by_the_log(tmp_path: Path) -> None:
    async def body(node: Node, client: AsyncClient) -> None:
        await client.create_topic("t")

        def batch(seq: int, value: bytes) -> bytes:
            return build_batch(
                [ProducerRecord(None, value)] * 3,
                producer_id=77,
                producer_epoch=0,
                base_sequence=seq,
            )

        first = await client.produce_batch("t", 0, batch(0, b"a"))
        again = await client.produce_batch("t", 0, batch(0, b"a"))  # a retry or a replay
        second = await client.produce_batch("t", 0, batch(3, b"b"))
        stale = await client.produce_batch("t", 0, batch(0, b"a"))
        assert first is not None and again is not None and second is not None and stale is not None
        assert (
            not first.duplicate
            and again.duplicate
            and (again.base_offset, again.last_offset) == (0, 2)
        )
        assert (second.base_offset, second.duplicate) == (3, False) and stale.duplicate
        assert [r.value async for r in client.consume("t", 0)] == [b"a"] * 3 + [b"b"] * 3

    run(tmp_path, body)
    # The producer state survives a restart (from its checkpoint or the batch headers).

    async def after(node: Node, client: AsyncClient) -> None:
        replay = await client.produce_batch(
            "t",
            0,
            build_batch(
                [ProducerRecord(None, b"b")] * 3, producer_id=77, producer_epoch=0, base_sequence=3
            ),
        )
        assert replay is not None and replay.duplicate
        node.hosts["t/0"].log.rebuild_producers()
        assert node.hosts["t/0"].log.producers.producers[77].sequence == 3

    run(tmp_path, after)


def test_a_broken_invariant_stops_the_node(tmp_path: Path) -> None:
    """Fail-stop: an AssertionError in a partition's tick (a HW that went back, say) is not
    logged and served past; the node closes its listeners and stops ticking, and says why."""

    async def main() -> None:
        async with running_node(tmp_path) as (node, client):
            await client.create_topic("t")
            await client.produce("t", [b"a"], partition=0)
            host = node.hosts["t/0"]
            ticks = []

            def broken() -> None:
                ticks.append(1)
                raise AssertionError("the high watermark went back")

            host.replica.tick = broken  # type: ignore[method-assign]
            host.driver.nudge()  # (an idle lone leader has no deadline: make it act)
            await asyncio.sleep(0.2)
            assert isinstance(node.failed, AssertionError)
            assert "went back" in str(node.failed)
            seen = len(ticks)
            await asyncio.sleep(0.2)
            assert len(ticks) == seen == 1  # no tick after the first failure
            with pytest.raises(OSError):
                socket.create_connection(node.address, timeout=1).close()

    asyncio.run(main())


def test_consume_pipelines_fetches_and_stops_where_it_is_told(tmp_path: Path) -> None:
    """consume() sends the next fetch before it hands over a fetch's records: every record
    once, in order, across hundreds of small fetches; max_records stops exactly; a consumer
    that stops early leaves no fetch behind to fail later."""

    async def body(node: Node, client: AsyncClient) -> None:
        await client.create_topic("pipe")
        values = [b"v%05d" % i + b"x" * 300 for i in range(3000)]
        for lo in range(0, len(values), 10):
            await client.produce("pipe", values[lo : lo + 10], partition=0)
        got = [r async for r in client.consume("pipe", 0, max_bytes=4096)]
        assert [r.offset for r in got] == list(range(3000))
        assert [r.value for r in got] == values
        few = [r.offset async for r in client.consume("pipe", 0, 1234, max_records=77)]
        assert few == list(range(1234, 1311))
        batches = client.consume_batches("pipe", 0, "earliest", max_bytes=4096)
        first = await batches.__anext__()
        await batches.aclose()  # the fetch sent ahead is cancelled, not left running
        assert first[0].offset == 0
        assert not [
            t
            for t in asyncio.all_tasks()
            if t is not asyncio.current_task() and "fetch_at" in repr(t.get_coro())
        ]
        assert await client.list_offsets("pipe", 0) == 3000

    run(tmp_path, body)


def test_status_comes_in_pages_in_partition_order(tmp_path: Path) -> None:
    """A node's status is paged (KIP-966's cursor): a page holds at most `limit` partitions in
    (topic, partition) order after the one given, and says whether more follow; the client's
    status() asks for every page."""

    async def body(node: Node, client: AsyncClient) -> None:
        await client.create_topic("a", partitions=3)
        await client.create_topic("b", partitions=4)
        address = ("127.0.0.1", node.address[1])

        async def page(**fields: Any) -> api.StatusResponse:
            header, _ = await client.call(address, ApiKey.STATUS, api.StatusRequest(**fields))
            return api.decode(api.StatusResponse, header)

        seen: list[tuple[str, int]] = []
        after: dict[str, Any] = {}
        pages = 0
        while True:
            got = await page(limit=3, **after)
            pages += 1
            assert len(got.partitions) <= 3
            seen += [(p["topic"], p["partition"]) for p in got.partitions]
            if not got.more:
                break
            after = {"after_topic": seen[-1][0], "after_partition": seen[-1][1]}
        assert pages == 3
        assert seen == [("a", p) for p in range(3)] + [("b", p) for p in range(4)]
        only_b = await page(topics=["b"], after_topic="b", after_partition=1)
        assert [p["partition"] for p in only_b.partitions] == [2, 3] and not only_b.more
        for limit in (-1, api.STATUS_PAGE_MAX + 1):
            with pytest.raises(InvalidRequest, match="limit must be"):
                await page(limit=limit)
        nodes = await client.status(None)
        assert [(p["topic"], p["partition"]) for p in nodes[0]["partitions"]] == seen

    run(tmp_path, body)
