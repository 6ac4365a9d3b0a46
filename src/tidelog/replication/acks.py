"""The acknowledgements a leader owes its producers, and the rule that keeps them honest.

An ack is registered when its batch is appended, with the epoch of the leadership that appended
it, and only that leadership's own progress releases it: acks=all once the HW passes the batch,
acks=1 once this leader's durable end does. A leadership that ends (or a log truncated under it)
fails every ack it still owes. A node's HW as a follower, or as the leader of a later epoch,
says nothing of a batch an earlier leadership appended: the offset may hold another leader's
batch by then. (Registering at the producer's first await instead, and releasing on any HW, is
how hw.policy=isr once acknowledged a record that was then replaced; the simulator keeps that
behaviour as a fault, `acks-registered-late`, and a seed that catches it.)

The node keeps asyncio futures here, the simulator its model of producers; both call the
partition driver, which says when to release and when to fail.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")

ANY_EPOCH = -1  # only the simulator's fault registers this: released by whatever HW passes


@dataclass(order=True)
class _Owed(Generic[T]):
    offset: int  # released once the mark passes it
    seq: int
    epoch: int = field(compare=False)
    waiter: T = field(compare=False)


class OwedAcks(Generic[T]):
    def __init__(self) -> None:
        self._committed: list[_Owed[T]] = []  # acks=all: released by the HW
        self._durable: list[_Owed[T]] = []  # acks=1: released by the durable end
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._committed) + len(self._durable)

    @property
    def awaiting_commit(self) -> int:
        return len(self._committed)

    def register(self, last_offset: int, durable_only: bool, epoch: int, waiter: T) -> None:
        heap = self._durable if durable_only else self._committed
        heapq.heappush(heap, _Owed(last_offset, next(self._seq), epoch, waiter))

    def due(
        self, high_watermark: int, durable_end: int, leading_epoch: int | None
    ) -> tuple[list[T], list[T]]:
        """(waiters to acknowledge, waiters to fail) now that the marks are where they are;
        leading_epoch is the epoch this replica leads (None: it does not lead)."""
        acked: list[T] = []
        failed: list[T] = []
        for heap, mark in ((self._committed, high_watermark), (self._durable, durable_end)):
            while heap and heap[0].offset < mark:
                owed = heapq.heappop(heap)
                if owed.epoch == leading_epoch or owed.epoch == ANY_EPOCH:
                    acked.append(owed.waiter)
                else:  # never: a lost leadership fails these first; but never acknowledge then
                    failed.append(owed.waiter)
        return acked, failed

    def fail_all(self) -> list[T]:
        """The leadership ended or its log was truncated: every ack it owes fails."""
        failed = [o.waiter for o in self._committed + self._durable]
        self._committed, self._durable = [], []
        return failed

    def fail_durable(self) -> list[T]:
        """A group commit failed: the acks=1 waiters cannot be given (acks=all ones wait on)."""
        failed = [o.waiter for o in self._durable]
        self._durable = []
        return failed
