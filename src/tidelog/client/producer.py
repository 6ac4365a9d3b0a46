"""A batching producer: records accumulate per partition until `batch_bytes` or `linger_ms`,
then go out as one RecordBatch; each send() returns a future of the record's offset."""

from __future__ import annotations

import asyncio
import random
import zlib
from dataclasses import dataclass, field

from tidelog.client.async_client import AsyncClient
from tidelog.client.produce import parse_acks
from tidelog.errors import InvalidRequest, TidelogError
from tidelog.record.batch import ProducerRecord

RECORD_OVERHEAD_BYTES = 24  # varints and attributes, roughly, per record


@dataclass(frozen=True)
class RecordMetadata:
    topic: str
    partition: int
    offset: int


@dataclass
class _Pending:
    records: list[ProducerRecord] = field(default_factory=list)
    futures: list[asyncio.Future[RecordMetadata]] = field(default_factory=list)
    size: int = 0
    timer: asyncio.TimerHandle | None = None


class Producer:
    def __init__(
        self,
        client: AsyncClient,
        *,
        acks: int | str = "all",
        linger_ms: int = 5,
        batch_bytes: int = 256 * 1024,
        max_in_flight: int = 8,
        timeout_ms: int = 30_000,
    ) -> None:
        if linger_ms < 0 or batch_bytes < 1 or max_in_flight < 1:
            raise InvalidRequest("linger_ms >= 0, batch_bytes >= 1 and max_in_flight >= 1")
        self.client = client
        self.acks = parse_acks(acks)
        self.linger_s = linger_ms / 1000
        self.batch_bytes = batch_bytes
        self.timeout_ms = timeout_ms
        self._pending: dict[tuple[str, int], _Pending] = {}
        self._in_flight: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(max_in_flight)
        # Keyless records go to one partition per batch, moving on with each batch (Kafka's
        # sticky partitioner, KIP-480), from a partition drawn at random: starting every run at
        # partition 0 put 11,778 of 12,000 lines of four short runs on it, and none on a third.
        self._round_robin = random.randrange(1 << 30)
        self.closed = False

    async def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        partition: int | None = None,
        headers: tuple[tuple[str, bytes | None], ...] = (),
        timestamp_ms: int | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        if self.closed:
            raise InvalidRequest("producer is closed")
        if partition is None:
            info = await self.client.topic(topic)
            if key is not None:
                partition = zlib.crc32(key) % info.partitions
            else:
                partition = self._round_robin % info.partitions
        pending = self._pending.setdefault((topic, partition), _Pending())
        future: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        pending.records.append(ProducerRecord(key, value, headers, timestamp_ms))
        pending.futures.append(future)
        pending.size += len(value or b"") + len(key or b"") + RECORD_OVERHEAD_BYTES
        if pending.size >= self.batch_bytes:
            await self._ship(topic, partition)
        elif pending.timer is None:
            loop = asyncio.get_running_loop()
            pending.timer = loop.call_later(self.linger_s, self._linger_expired, topic, partition)
        return future

    def _linger_expired(self, topic: str, partition: int) -> None:
        pending = self._pending.get((topic, partition))
        if pending is not None:
            pending.timer = None
        task = asyncio.get_running_loop().create_task(self._ship(topic, partition))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    async def _ship(self, topic: str, partition: int) -> None:
        pending = self._pending.pop((topic, partition), None)
        if pending is None or not pending.records:
            return
        if pending.timer is not None:
            pending.timer.cancel()
        self._round_robin += 1
        await self._slots.acquire()
        task = asyncio.get_running_loop().create_task(self._deliver(topic, partition, pending))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    async def _deliver(self, topic: str, partition: int, pending: _Pending) -> None:
        try:
            result = await self.client.produce_records(
                topic, partition, pending.records, self.acks, self.timeout_ms
            )
        except TidelogError as exc:
            for future in pending.futures:
                if not future.done():
                    future.set_exception(exc)
            return
        finally:
            self._slots.release()
        base = result.base_offset if result is not None else -1
        for i, future in enumerate(pending.futures):
            if not future.done():
                future.set_result(RecordMetadata(topic, partition, base + i if base >= 0 else -1))

    async def flush(self) -> None:
        for topic, partition in list(self._pending):
            await self._ship(topic, partition)
        while self._in_flight:
            await asyncio.gather(*list(self._in_flight), return_exceptions=True)

    async def close(self) -> None:
        await self.flush()
        self.closed = True
