"""A producer always knows what happened (issue 9): producing is idempotent by default, so a
retry after a lost answer never duplicates; a write whose fate is unknown raises OutcomeUnknown,
never an error that reads as "not written"; a replay is answered only once the original is as
durable as acks asks. Through a proxy that loses answers, against real nodes."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from frame_proxy import FrameProxy, node_behind
from helpers import retry, values_in
from test_cluster import leader_of
from test_node import running_node
from tidelog.cli.cluster import LocalCluster
from tidelog.client.async_client import AsyncClient
from tidelog.client.producer import Producer
from tidelog.client.sync_client import Client
from tidelog.errors import (
    OutcomeUnknown,
    OutOfOrderSequence,
    RecordTooLarge,
    TidelogError,
    UnknownTopicOrPartition,
)
from tidelog.node.server import Node
from tidelog.protocol.api import ApiKey
from tidelog.protocol.framing import Frame
from tidelog.record import ProducerRecord, build_batch

pytestmark = pytest.mark.process  # tiers: pyproject.toml's markers


class LossyProxy(FrameProxy):
    """Forwards clients' connections to a node, and drops the node's answers to produce
    requests while told to (closing the client's connection, as a broken network would)."""

    def __init__(self) -> None:
        super().__init__()
        self.drop_produce_answers = 0  # how many more to drop (-1: every one)
        self.drop_every = 0  # or: drop every n-th answer to a produce
        self.dropped = 0
        self.answered = 0

    def from_node(self, frame: Frame) -> bool:
        if frame.api != ApiKey.PRODUCE:
            return True
        self.answered += 1
        every = self.drop_every and self.answered % self.drop_every == 0
        if self.drop_produce_answers == 0 and not every:
            return True
        if self.drop_produce_answers > 0:
            self.drop_produce_answers -= 1
        self.dropped += 1
        return False


@contextlib.asynccontextmanager
async def through_proxy(
    tmp_path: Path, **client_options: Any
) -> AsyncIterator[tuple[Node, LossyProxy, AsyncClient]]:
    """A node that advertises the proxy as its address, so that clients go through it."""
    proxy = LossyProxy()
    async with (
        node_behind(proxy, tmp_path / "node") as (node, address),
        AsyncClient(address, **client_options) as client,
    ):
        await client.create_topic("t", partitions=2)
        yield node, proxy, client


def values(node: Node, group: str) -> list[bytes | None]:
    host = node.hosts[group]
    chunk = host.log.read(host.log.log_start_offset, 1 << 30, host.log.high_watermark)
    return [v for _, v in values_in(chunk.read())] if chunk is not None else []


def test_a_lost_answer_is_retried_without_duplicating_the_record(tmp_path: Path) -> None:
    async def main() -> None:
        async with through_proxy(tmp_path) as (node, proxy, client):
            first = await client.produce("t", [b"a"], partition=0)
            proxy.drop_produce_answers = 1
            second = await client.produce("t", [b"b", b"c"], partition=0)
            assert proxy.dropped == 1
            assert first is not None and second is not None
            assert second.duplicate and (second.base_offset, second.last_offset) == (1, 2)
            assert values(node, "t/0") == [b"a", b"b", b"c"]

    asyncio.run(main())


def test_when_every_answer_is_lost_the_outcome_is_unknown_never_a_plain_failure(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with through_proxy(tmp_path, retries=4) as (node, proxy, client):
            proxy.drop_produce_answers = -1
            with pytest.raises(OutcomeUnknown) as caught:
                await client.produce("t", [b"x"], partition=1)
            assert caught.value.details["cause"] == "NetworkError"
            assert values(node, "t/1") == [b"x"]  # written once, though sent four times
            proxy.drop_produce_answers = 0
            again = await client.produce("t", [b"y"], partition=1)
            assert again is not None and not again.duplicate
            assert values(node, "t/1") == [b"x", b"y"]

    asyncio.run(main())


def test_a_non_idempotent_client_does_not_retry_what_may_have_been_written(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with through_proxy(tmp_path, idempotent=False) as (node, proxy, client):
            proxy.drop_produce_answers = 1
            with pytest.raises(OutcomeUnknown, match="not retried"):
                await client.produce("t", [b"once"], partition=0)
            assert values(node, "t/0") == [b"once"]

    asyncio.run(main())


def test_definite_failures_stay_definite(tmp_path: Path) -> None:
    async def main() -> None:
        async with through_proxy(tmp_path) as (_node, _proxy, client):
            with pytest.raises(UnknownTopicOrPartition):
                await client.produce("t", [b"x"], partition=7)
            big = ProducerRecord(None, b"x" * (9 * 1024 * 1024))
            with pytest.raises(RecordTooLarge):
                await client.produce("t", [big], partition=0)
            # The refused batch took its sequences; the next one goes on in a new epoch rather
            # than leaving a gap the log would refuse.
            await client.produce("t", [b"after"], partition=0)

    asyncio.run(main())


def test_a_batching_producer_through_lost_answers_writes_each_record_once_in_order(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with through_proxy(tmp_path) as (node, proxy, client):
            producer = Producer(client, linger_ms=2, batch_bytes=400, max_in_flight=8)
            proxy.drop_every = 7
            futures = []
            for i in range(600):
                futures.append(await producer.send("t", b"%04d" % i, partition=i % 2))
                if i % 50 == 0:
                    await asyncio.sleep(0.01)
            await producer.close()
            offsets = [(await f).offset for f in futures]
            assert proxy.dropped >= 3, (proxy.dropped, proxy.answered)
            for p in (0, 1):
                assert values(node, f"t/{p}") == [b"%04d" % i for i in range(p, 600, 2)]
                mine = [o for i, o in enumerate(offsets) if i % 2 == p]
                assert mine == list(range(300))

    asyncio.run(main())


def test_keyless_records_of_short_runs_spread_over_the_partitions(tmp_path: Path) -> None:
    """Each producer (each `tidelog produce` run) starts its keyless batches at a partition
    drawn at random and moves on per batch: short runs all began at partition 0, and a third
    of a 3-partition topic got nothing."""

    async def main() -> None:
        async with running_node(tmp_path) as (_node, client):
            await client.create_topic("spread", partitions=3)
            used = []
            for run in range(12):  # twelve short runs, one batch each
                producer = Producer(client, linger_ms=1)
                future = await producer.send("spread", b"line %d" % run)
                await producer.close()
                used.append((await future).partition)
            assert len(set(used)) >= 2, used  # all twelve on one: (1/3)^11, about 6e-6

    asyncio.run(main())


def test_consume_past_the_high_watermark_with_reset_none_fails(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_node(tmp_path) as (node, client):
            await client.create_topic("t")
            await client.produce("t", [b"a", b"b"], partition=0)
            bootstrap = f"127.0.0.1:{node.address[1]}"

            def consume(*args: str) -> subprocess.CompletedProcess[str]:
                return subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "tidelog",
                        "consume",
                        "t",
                        "--bootstrap",
                        bootstrap,
                        *args,
                    ],
                    capture_output=True,
                    text=True,
                    timeout=60,
                )

            loop = asyncio.get_running_loop()
            none = await loop.run_in_executor(None, consume, "--from", "5", "--reset", "none")
            latest = await loop.run_in_executor(None, consume, "--from", "5", "--reset", "latest")
            earliest = await loop.run_in_executor(None, consume, "--from", "5")
            assert none.returncode != 0 and "OffsetOutOfRange" in none.stderr
            assert latest.returncode == 0 and latest.stdout == ""
            assert earliest.returncode == 0 and earliest.stdout.split() == ["a", "b"]

    asyncio.run(main())


def test_a_replay_is_answered_only_once_the_original_is_committed(tmp_path: Path) -> None:
    """The original batch is appended but not committed (followers frozen): its replay must not
    be acknowledged as acks=all before the original is, or a leader crash could lose a record
    the producer was told is safe. The election timeout outlasts the freeze: with the default
    (800 ms) the leader steps down (check-quorum), a follower may win when they wake, and the
    uncommitted acks=1 original is then rightly truncated, so the replay is new, not a
    duplicate."""
    with (
        LocalCluster(
            tmp_path, 3, log_level="WARNING", serve_args=["--set", "election_timeout_ms=3000"]
        ) as cluster,
        Client(cluster.bootstrap) as client,
    ):
        client.create_topic("t", replication_factor=3)
        leader = leader_of(client, "t")
        followers = [n for n in cluster.node_ids if n != leader]
        batch = build_batch(
            [ProducerRecord(None, b"once")], producer_id=4242, producer_epoch=0, base_sequence=0
        )
        for n in followers:
            cluster.freeze(n)
        try:
            first = client.produce_batch("t", 0, batch, acks=1)
            assert first is not None and not first.duplicate
            # Bootstrapped at the leader alone: a frozen node accepts connections (its kernel
            # does) but never answers, and would hold the freeze for a whole request timeout.
            with Client(cluster.address(leader), retries=1) as impatient:
                started = time.monotonic()
                with pytest.raises(TidelogError) as caught:
                    impatient._run(impatient.async_client.produce_batch("t", 0, batch, "all", 1500))
                assert time.monotonic() - started >= 1.4
                assert isinstance(caught.value, OutcomeUnknown | TidelogError)
                assert caught.value.name in ("OutcomeUnknown", "Timeout", "NotLeader")
        finally:
            for n in followers:
                cluster.resume(n)
        replay = client.produce_batch("t", 0, batch)
        assert replay is not None and replay.duplicate
        assert (replay.base_offset, replay.last_offset) == (first.base_offset, first.last_offset)
        assert replay.high_watermark > replay.last_offset
        assert [r.value for r in client.consume("t", 0)] == [b"once"]


@pytest.mark.timeout(600)
def test_under_kills_and_freezes_every_outcome_is_what_the_producer_was_told(
    tmp_path: Path,
) -> None:
    """The default (idempotent) producer, retrying, while leaders are SIGKILLed and frozen:
    no record is stored twice, every acknowledged record is where its answer said, no record
    whose produce failed definitely is stored, and only OutcomeUnknown leaves the fate open."""
    import random
    import threading

    acked: dict[bytes, int] = {}
    failed: dict[bytes, str] = {}
    unknown: list[bytes] = []
    stop = threading.Event()

    def produce(bootstrap: str) -> None:
        with Client(bootstrap, retries=8, request_timeout_ms=3000) as client:
            n = 0
            while not stop.is_set():
                value = b"v%06d" % n
                n += 1
                try:
                    result = client.produce("orders", [value], partition=0, timeout_ms=3000)
                except OutcomeUnknown:
                    unknown.append(value)
                except TidelogError as exc:
                    failed[value] = exc.name
                    time.sleep(0.02)
                else:
                    assert result is not None
                    acked[value] = result.base_offset

    with (
        LocalCluster(tmp_path, 3, log_level="WARNING") as cluster,
        Client(cluster.bootstrap) as admin,
    ):
        admin.create_topic("orders", replication_factor=3, configs={"min.insync.replicas": "2"})
        thread = threading.Thread(target=produce, args=(cluster.bootstrap,), daemon=True)
        thread.start()
        rng = random.Random(9)
        try:
            for round_ in range(6):
                time.sleep(rng.uniform(0.5, 1.2))
                leader = leader_of(admin, "orders")
                if round_ % 2 == 0:
                    cluster.kill(leader)
                    time.sleep(rng.uniform(1.0, 2.0))
                    cluster.start(leader)
                    cluster.wait_ready()
                else:
                    cluster.freeze(leader)
                    time.sleep(rng.uniform(1.5, 2.5))
                    cluster.resume(leader)
            time.sleep(1.0)
        finally:
            stop.set()
            thread.join(60)
        final = retry(
            "orders/0 to be readable again",
            lambda: [(r.offset, r.value) for r in admin.consume("orders", 0)],
            30,
            every_s=0.5,
            tolerating=(TidelogError,),
        )
    values = [v for _, v in final]
    where = {v: o for o, v in final}
    assert len(values) == len(set(values)), "a record is stored twice"
    assert all(where.get(v) == o for v, o in acked.items()), "an acknowledged record moved"
    stored_failures = [v for v in failed if v in where]
    assert not stored_failures, f"definite failures stored anyway: {stored_failures[:5]}"
    print(
        f"acknowledged {len(acked)}, definite failures {len(failed)} "
        f"({sorted(set(failed.values()))}), unknown outcomes {len(unknown)} "
        f"({sum(1 for v in unknown if v in where)} of them stored)"
    )
    assert len(acked) > 100


def sink_chunks(pid: int, epoch: int, chunks: int, per_chunk: int) -> list[bytes]:
    """One idempotent producer's chunks, sequenced as the Spark sink sequences them."""
    return [
        build_batch(
            [ProducerRecord(None, b"%d-%d" % (c, i)) for i in range(per_chunk)],
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=c * per_chunk,
        )
        for c in range(chunks)
    ]


def test_the_log_refuses_a_gap_in_a_producers_sequences(tmp_path: Path) -> None:
    async def main() -> None:
        async with through_proxy(tmp_path) as (node, _proxy, client):
            chunks = sink_chunks(4242, 0, 4, 3)
            await client.produce_batch("t", 0, chunks[0])
            with pytest.raises(OutOfOrderSequence, match="expects 3 next"):
                await client.produce_batch("t", 0, chunks[2])
            assert values(node, "t/0") == [b"0-0", b"0-1", b"0-2"]
            await client.produce_batch("t", 0, chunks[1])
            await client.produce_batch("t", 0, chunks[2])
            replay = await client.produce_batch("t", 0, chunks[1])
            assert replay is not None and replay.duplicate
            # A new epoch may start anywhere (the sink's next micro-batch starts at 0).
            await client.produce_batch("t", 0, sink_chunks(4242, 1, 1, 3)[0])
            assert len(values(node, "t/0")) == 12

    asyncio.run(main())


def test_pipelined_chunks_through_lost_answers_land_once_in_order(tmp_path: Path) -> None:
    """Five chunks in flight per partition while every fourth answer is lost (closing the
    connection under every chunk in flight): retried chunks arrive out of order, the log refuses
    those ahead of a gap, and the pipeline sends them again; each chunk lands once, in order."""

    async def main() -> None:
        async with through_proxy(tmp_path) as (node, proxy, client):
            proxy.drop_every = 4
            chunks = {("t", 0): sink_chunks(777, 0, 30, 5), ("t", 1): sink_chunks(778, 0, 30, 5)}
            results = await client.produce_pipelined(chunks, acks="all", in_flight=5)
            assert proxy.dropped > 3
            for p in range(2):
                assert values(node, f"t/{p}") == [
                    b"%d-%d" % (c, i) for c in range(30) for i in range(5)
                ]
                assert len(results[("t", p)]) == 30
            # Sent again (a replayed task): nothing new lands.
            proxy.drop_every = 0
            again = await client.produce_pipelined(chunks, acks="all", in_flight=5)
            assert all(r is not None and r.duplicate for rs in again.values() for r in rs)
            assert len(values(node, "t/0")) == 150

    asyncio.run(main())


def test_a_failed_chunk_mid_pipeline_leaves_a_prefix(tmp_path: Path) -> None:
    async def main() -> None:
        async with through_proxy(tmp_path) as (node, _proxy, client):
            await client.alter_topic("t", {"max.message.bytes": "4096"})
            chunks = sink_chunks(99, 0, 10, 4)
            big = build_batch(
                [ProducerRecord(None, b"x" * 5000)] * 4,
                producer_id=99,
                producer_epoch=0,
                base_sequence=16,
            )
            chunks[4] = big
            with pytest.raises(RecordTooLarge):
                await client.produce_pipelined({("t", 0): chunks}, in_flight=5)
            assert values(node, "t/0") == [b"%d-%d" % (c, i) for c in range(4) for i in range(4)]
            await client.alter_topic("t", {"max.message.bytes": "1048576"})
            await client.produce_pipelined({("t", 0): chunks}, in_flight=5)
            assert len(values(node, "t/0")) == 40

    asyncio.run(main())


def test_concurrent_sends_to_one_partition_are_coalesced(tmp_path: Path) -> None:
    """200 one-record sends at once from one idempotent client: they go as a few batches (one
    in flight at a time), every caller gets the offset of its own record, and each record is in
    the log once, at that offset. Through lost answers too."""

    async def main() -> None:
        async with through_proxy(tmp_path) as (node, proxy, client):
            values = [b"r%03d" % i for i in range(200)]
            results = await asyncio.gather(
                *(client.produce("t", [v], partition=0, acks="all") for v in values)
            )
            offsets = [r.base_offset for r in results if r is not None]
            assert sorted(offsets) == list(range(200))
            log = values_at(node, "t/0")
            assert all(log[r.base_offset] == v for r, v in zip(results, values, strict=True))  # type: ignore[union-attr]
            coalescer = next(iter(client._writer.coalescers.values()))
            assert coalescer.submits == 200 and coalescer.requests < 20
            proxy.drop_produce_answers = 1  # the answer to the next batch is lost
            more = [b"s%03d" % i for i in range(100)]
            await asyncio.gather(*(client.produce("t", [v], partition=0) for v in more))
            assert proxy.dropped > 0
            assert sorted(values_at(node, "t/0").values()) == sorted(values + more)

    asyncio.run(main())


def values_at(node: Node, group: str) -> dict[int, bytes | None]:
    host = node.hosts[group]
    chunk = host.log.read(host.log.log_start_offset, 1 << 30, host.log.high_watermark)
    assert chunk is not None
    from tidelog.record import decode_records, iter_headers

    data = chunk.read()
    return {r.offset: r.value for pos, _ in iter_headers(data) for r in decode_records(data, pos)}
