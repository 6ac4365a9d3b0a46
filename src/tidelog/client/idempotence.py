"""The client as one idempotent producer: its producer id, and each partition's epoch and next
sequence number.

The id is a random 63-bit number, drawn at the first idempotent produce. One partition's batches
go one after another, each stamped with the next sequences; a retried batch the log already
holds is then answered as the original was, so retries never duplicate records. A batch whose
fate is unknown may or may not be in the log, and the next one must not leave a gap after it
(the log refuses gaps within an epoch), so the partition goes on in a new epoch."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tidelog.record.batch import SEQUENCE_MAX

PRODUCER_EPOCH_MAX = 0x7FFF

Partition = tuple[str, int]
T = TypeVar("T")


class ProducerSequences:
    def __init__(self) -> None:
        self.producer_id = -1  # drawn at the first idempotent produce
        self._sequences: dict[Partition, tuple[int, int]] = {}  # -> (epoch, next)
        self._partition_locks: dict[Partition, asyncio.Lock] = {}

    async def send_in_order(
        self,
        tp: Partition,
        count: int,
        encode: Callable[[int, int, int], bytes | bytearray],
        send: Callable[[bytes | bytearray, int], Awaitable[T]],
    ) -> T:
        """One batch of count records at a time per partition, so that sequences land in
        order: encode() makes it as (producer id, epoch, base sequence), send() sends it as
        (batch, producer id)."""
        lock = self._partition_locks.setdefault(tp, asyncio.Lock())
        async with lock:
            pid, epoch, sequence = self._take(tp, count)
            batch = encode(pid, epoch, sequence)
            try:
                return await send(batch, pid)
            except BaseException:
                self._next_epoch(tp)
                raise

    def _next_epoch(self, tp: Partition) -> None:
        epoch, _ = self._sequences.get(tp, (0, 0))
        self._sequences[tp] = (epoch + 1, 0)

    def _take(self, tp: Partition, count: int) -> tuple[int, int, int]:
        """(producer id, epoch, base sequence) for the next count records to tp; taken whatever
        happens next, since a sequence that may be in the log must never be reused."""
        if self.producer_id < 0:
            self.producer_id = random.SystemRandom().getrandbits(63)
        epoch, sequence = self._sequences.get(tp, (0, 0))
        if sequence + count > SEQUENCE_MAX:  # sequences do not wrap: the next epoch starts at 0
            epoch, sequence = epoch + 1, 0
        if epoch > PRODUCER_EPOCH_MAX:
            self.producer_id = random.SystemRandom().getrandbits(63)
            self._sequences.clear()
            epoch, sequence = 0, 0
        self._sequences[tp] = (epoch, sequence + count)
        return self.producer_id, epoch, sequence
