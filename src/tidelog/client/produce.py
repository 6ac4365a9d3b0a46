"""Writing to partitions: records or encoded batches to a partition's leader, as this client's
idempotent producer (idempotence.py) unless idempotence is off or acks=0, and the outcome of
each write told apart: written, already written (a replay), not written, or unknown.

When retries run out after an attempt whose fate is unknown (sent, then no answer; or appended
by a leader that then lost its leadership), a write raises OutcomeUnknown, never a plain error
that would read as "not written". With `idempotent=False`, such an attempt is not retried."""

from __future__ import annotations

import asyncio
import random
import zlib
from collections.abc import Callable, Sequence
from typing import Protocol

from tidelog.client.coalescing import Coalescer
from tidelog.client.idempotence import ProducerSequences
from tidelog.client.results import ProduceResult
from tidelog.client.routing import Router, is_indeterminate
from tidelog.errors import (
    DuplicateSequence,
    InvalidRequest,
    OutcomeUnknown,
    OutOfOrderSequence,
    TidelogError,
)
from tidelog.protocol import api
from tidelog.protocol.api import ApiKey
from tidelog.record.batch import (
    NO_PRODUCER_ID,
    ProducerRecord,
    build_batch,
    iter_headers,
    read_header,
    restamp_producer,
)

ACKS = {"0": api.ACKS_NONE, "1": api.ACKS_LEADER, "all": api.ACKS_ALL, "-1": api.ACKS_ALL}
# Concurrent sends to one partition that go together as one batch, at most (below the default
# max.message.bytes of 8 MiB; one send larger than this still goes, alone).
COALESCE_BYTES_MAX = 512 * 1024


def parse_acks(acks: int | str) -> int:
    if isinstance(acks, int) and acks in (0, 1, -1):
        return acks
    value = ACKS.get(str(acks).lower())
    if value is None:
        raise InvalidRequest(f"acks must be 0, 1 or all, got {acks!r}")
    return value


class WriteSettings(Protocol):
    """The client's setting a write reads, at each write (AsyncClient's constructor sets it)."""

    idempotent: bool


class Writer:
    def __init__(self, router: Router, settings: WriteSettings) -> None:
        self._router = router
        self._settings = settings
        self.sequences = ProducerSequences()
        # (topic, partition, acks, timeout_ms) -> the sends waiting to go together
        self.coalescers: dict[tuple[str, int, int, int], Coalescer] = {}
        self._rng = random.Random()

    async def partition_for(self, topic: str, key: bytes | None) -> int:
        info = await self._router.topic(topic)
        if key is None:
            return self._rng.randrange(info.partitions)
        return zlib.crc32(key) % info.partitions

    async def produce(
        self,
        topic: str,
        records: Sequence[ProducerRecord | bytes],
        partition: int | None,
        acks: int | str,
        timeout_ms: int,
    ) -> ProduceResult | None:
        recs = [r if isinstance(r, ProducerRecord) else ProducerRecord(None, r) for r in records]
        if partition is None:
            partition = await self.partition_for(topic, recs[0].key)
        return await self.produce_records(topic, partition, recs, acks, timeout_ms)

    async def produce_batch(
        self,
        topic: str,
        partition: int,
        batch: bytes,
        acks: int | str,
        timeout_ms: int,
        producer_id: int,
    ) -> ProduceResult | None:
        acks_value = parse_acks(acks)
        owned = read_header(batch).producer_id != NO_PRODUCER_ID
        if owned or not self._settings.idempotent or acks_value == api.ACKS_NONE:
            return await self.send(
                topic, partition, batch, acks_value, timeout_ms, producer_id, retry=owned
            )
        count = sum(h.last_offset_delta + 1 for _, h in iter_headers(batch, verify=False))

        def stamped(pid: int, epoch: int, sequence: int) -> bytes | bytearray:
            return restamp_producer(batch, pid, epoch, sequence)[0]

        return await self._send_idempotent(topic, partition, count, stamped, acks_value, timeout_ms)

    async def produce_records(
        self,
        topic: str,
        partition: int,
        records: Sequence[ProducerRecord],
        acks: int | str,
        timeout_ms: int,
    ) -> ProduceResult | None:
        acks_value = parse_acks(acks)
        if not self._settings.idempotent or acks_value == api.ACKS_NONE:
            batch = build_batch(records)
            return await self.send(topic, partition, batch, acks_value, timeout_ms, -1, retry=False)

        key = (topic, partition, acks_value, timeout_ms)
        coalescer = self.coalescers.get(key)
        if coalescer is None:

            async def send(batch: list[ProducerRecord]) -> ProduceResult | None:
                def built(pid: int, epoch: int, sequence: int) -> bytes:
                    return build_batch(
                        batch, producer_id=pid, producer_epoch=epoch, base_sequence=sequence
                    )

                return await self._send_idempotent(
                    topic, partition, len(batch), built, acks_value, timeout_ms
                )

            coalescer = self.coalescers[key] = Coalescer(send, COALESCE_BYTES_MAX)
        return await coalescer.submit(records)

    async def _send_idempotent(
        self,
        topic: str,
        partition: int,
        count: int,
        encode: Callable[[int, int, int], bytes | bytearray],
        acks_value: int,
        timeout_ms: int,
    ) -> ProduceResult | None:
        async def send(batch: bytes | bytearray, pid: int) -> ProduceResult | None:
            return await self.send(topic, partition, batch, acks_value, timeout_ms, pid, True)

        return await self.sequences.send_in_order((topic, partition), count, encode, send)

    async def send(
        self,
        topic: str,
        partition: int,
        batch: bytes | bytearray,
        acks_value: int,
        timeout_ms: int,
        producer_id: int,
        retry: bool,
        transactional_id: str = "",
    ) -> ProduceResult | None:
        """One PRODUCE request to the partition's leader, retried (with retry: also after an
        attempt that may have taken effect) and its outcome told apart. transactional_id: a
        transactional batch's (client/transactions.py)."""
        request = api.ProduceRequest(
            topic, partition, acks_value, timeout_ms, producer_id, transactional_id
        )
        unknown: list[TidelogError] = []

        def note(exc: TidelogError) -> None:
            if is_indeterminate(exc):
                unknown.append(exc)

        try:
            header, _ = await self._router.to_leader(
                topic,
                partition,
                ApiKey.PRODUCE,
                request,
                batch,
                timeout_s=timeout_ms / 1000 + 5,
                expect_response=acks_value != api.ACKS_NONE,
                note=note,
                retry_indeterminate=retry,
            )
        except DuplicateSequence as exc:
            # Our own earlier attempt (or a replay) is already in the log: that is success.
            return ProduceResult(
                partition,
                int(exc.details.get("base_offset", -1)),
                int(exc.details.get("last_offset", -1)),
                -1,
                duplicate=True,
            )
        except (OutcomeUnknown, OutOfOrderSequence):
            # OutOfOrderSequence is definite even after a lost attempt: the log expects an
            # earlier sequence next, so this batch is not in it.
            raise
        except TidelogError as exc:
            if unknown:
                raise OutcomeUnknown(
                    f"{topic}/{partition}: the write may or may not be in the log: an attempt "
                    f"was lost in flight ({unknown[-1]}), and the last one failed ({exc})",
                    topic=topic,
                    partition=partition,
                    cause=exc.name,
                ) from exc
            raise
        if acks_value == api.ACKS_NONE:
            return None
        resp = api.decode(api.ProduceResponse, header)
        return ProduceResult(
            partition, resp.base_offset, resp.last_offset, resp.high_watermark, resp.duplicate
        )

    async def produce_pipelined(
        self,
        batches: dict[tuple[str, int], list[bytes]],
        acks: int | str,
        in_flight: int,
        timeout_ms: int,
    ) -> dict[tuple[str, int], list[ProduceResult | None]]:
        if in_flight < 1:
            raise InvalidRequest(f"in_flight must be at least 1, got {in_flight}")
        acks_value = parse_acks(acks)
        keys = list(batches)
        results = await asyncio.gather(
            *(
                self._pipeline(t, p, batches[(t, p)], acks_value, in_flight, timeout_ms)
                for t, p in keys
            )
        )
        return dict(zip(keys, results, strict=True))

    async def _pipeline(
        self,
        topic: str,
        partition: int,
        items: list[bytes],
        acks_value: int,
        in_flight: int,
        timeout_ms: int,
    ) -> list[ProduceResult | None]:
        """One partition's batches, up to in_flight of them sent before the first lands; a
        batch refused for a gap is sent again once its predecessor is in."""
        loop = asyncio.get_running_loop()
        landed: list[asyncio.Future[bool]] = [loop.create_future() for _ in items]
        window = asyncio.Semaphore(in_flight)

        async def send(i: int) -> ProduceResult | None:
            batch = items[i]
            pid = read_header(batch).producer_id
            try:
                async with window:
                    while True:
                        after_predecessor = i == 0 or landed[i - 1].done()
                        try:
                            result = await self.send(
                                topic, partition, batch, acks_value, timeout_ms, pid, True
                            )
                            break
                        except OutOfOrderSequence:
                            # Sent ahead of a predecessor still being retried: wait for it
                            # and send again (a gap behind a landed predecessor is real).
                            if after_predecessor or not await landed[i - 1]:
                                raise
                landed[i].set_result(True)
                return result
            except BaseException:
                landed[i].set_result(False)
                raise

        outcomes = await asyncio.gather(
            *(send(i) for i in range(len(items))), return_exceptions=True
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return outcomes  # type: ignore[return-value]
