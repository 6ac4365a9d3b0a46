"""Concurrent sends to one partition coalesced into one request (Kafka's producer with
linger.ms=0): the first send goes at once; sends that arrive while it is in flight wait, and
all of them go together as one batch when it returns. An idempotent producer has one request in
flight per partition (so that its sequences land in order), and without this, N concurrent
one-record sends would take N round trips; with it they take about two."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from tidelog.client.results import ProduceResult
from tidelog.record.batch import ProducerRecord

Send = Callable[[list[ProducerRecord]], Awaitable[ProduceResult | None]]

RECORD_OVERHEAD = 24  # a record's framing, at most, beside its key, value and headers


def record_size(record: ProducerRecord) -> int:
    headers = sum(len(k) + len(v or b"") + 10 for k, v in record.headers)
    return len(record.key or b"") + len(record.value or b"") + headers + RECORD_OVERHEAD


@dataclass
class _Waiting:
    records: Sequence[ProducerRecord]
    size: int
    future: asyncio.Future[ProduceResult | None]


class Coalescer:
    """One partition's (and one acks setting's) sends. `send` writes a list of records as one
    batch and returns its offsets; each caller gets the offsets of its own records."""

    def __init__(self, send: Send, max_bytes: int) -> None:
        self._send = send
        self._max_bytes = max_bytes
        self._waiting: deque[_Waiting] = deque()
        self._draining = False
        self._task: asyncio.Task[None] | None = None  # held: the loop keeps only weak references
        self.requests = 0  # batches sent (a metric: requests / submits is the coalescing)
        self.submits = 0

    async def submit(self, records: Sequence[ProducerRecord]) -> ProduceResult | None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[ProduceResult | None] = loop.create_future()
        self._waiting.append(_Waiting(records, sum(map(record_size, records)), future))
        self.submits += 1
        if not self._draining:
            self._draining = True
            self._task = loop.create_task(self._drain())
        return await future

    def _next_group(self) -> list[_Waiting]:
        group: list[_Waiting] = []
        size = 0
        while self._waiting:
            waiting = self._waiting[0]
            if waiting.future.done():  # its caller gave up before it was sent: not sent at all
                self._waiting.popleft()
                continue
            if group and size + waiting.size > self._max_bytes:
                break
            group.append(self._waiting.popleft())
            size += waiting.size
        return group

    async def _drain(self) -> None:
        try:
            while group := self._next_group():
                records = [r for w in group for r in w.records]
                self.requests += 1
                try:
                    result = await self._send(records)
                except Exception as exc:
                    for w in group:
                        if not w.future.done():
                            w.future.set_exception(exc)
                    continue
                start = 0
                for w in group:
                    if not w.future.done():
                        w.future.set_result(_slice(result, start, len(w.records)))
                    start += len(w.records)
        finally:
            self._draining = False
            while self._waiting:  # only if this task itself was cancelled (the loop is closing)
                waiting = self._waiting.popleft()
                if not waiting.future.done():
                    waiting.future.cancel()


def _slice(result: ProduceResult | None, start: int, count: int) -> ProduceResult | None:
    if result is None:
        return None
    if result.base_offset < 0:
        return result
    base = result.base_offset + start
    return ProduceResult(
        result.partition, base, base + count - 1, result.high_watermark, result.duplicate
    )
