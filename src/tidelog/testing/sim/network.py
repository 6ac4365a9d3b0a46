"""The simulated network between nodes: every message in flight with the tick it arrives at,
and the faults a seed draws for it: drops, duplicates, delays (and so reordering), and
partitions, both ways or one way."""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterator
from typing import NamedTuple

from tidelog.replication.liveness import Heartbeat
from tidelog.replication.messages import Message
from tidelog.testing.sim.params import SimParams


class InFlight(NamedTuple):
    due: int  # the tick it arrives at
    seq: int  # the order it was sent in: ties on `due` arrive in that order
    src: int
    dst: int
    directory: str  # the sender's data directory's id
    message: Message | Heartbeat


class SimNetwork:
    def __init__(self, params: SimParams, rng: random.Random) -> None:
        self.params = params
        self.rng = rng
        self._in_flight: list[InFlight] = []  # a heap
        self._seq = 0
        self.blocked: set[tuple[int, int]] = set()  # (src, dst): links a partition cut

    def send(
        self,
        now: int,
        src: int,
        dst: int,
        directory: str,
        message: Message | Heartbeat,
        faults: bool,
    ) -> bool:
        """Put a message in flight (twice, if duplicated); False: it was dropped."""
        if faults and self.rng.random() < self.params.drop:
            return False
        copies = 2 if faults and self.rng.random() < self.params.duplicate else 1
        for _ in range(copies):
            delay = self.rng.randint(1, self.params.delay_max)
            self._seq += 1
            heapq.heappush(
                self._in_flight, InFlight(now + delay, self._seq, src, dst, directory, message)
            )
        return True

    def due(self, now: int) -> Iterator[InFlight]:
        """Take out every message that has arrived by now, in order of arrival."""
        while self._in_flight and self._in_flight[0].due <= now:
            yield heapq.heappop(self._in_flight)

    def hold(self, held: list[InFlight]) -> None:
        """Put messages back in flight (each with the tick it now arrives at)."""
        for item in held:
            heapq.heappush(self._in_flight, item)

    def cut(self, left: list[int], right: list[int], one_way: bool) -> None:
        """A partition: nothing from left reaches right (nor, both ways, back)."""
        for a in left:
            for b in right:
                self.blocked.add((a, b))
                if not one_way:
                    self.blocked.add((b, a))
