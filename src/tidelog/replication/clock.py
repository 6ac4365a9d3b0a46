"""The time a replica reads, in ticks: the pure core never reads a clock of its own. A node's
clock counts ticks on the monotonic clock; the simulator's and the tests' are advanced by hand."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class TickSource(Protocol):
    """What a replica reads the time from, in ticks."""

    @property
    def ticks(self) -> int: ...


class Clock:
    """Ticks that someone advances: a replica made without a clock has its own, which tick()
    advances (the simulator); tests share one among replicas."""

    __slots__ = ("ticks",)

    def __init__(self, ticks: int = 0) -> None:
        self.ticks = ticks


class MonotonicClock:
    """A node's clock: ticks of tick_s since it started, read from the monotonic clock, so that
    a replica stamping a message it handles reads the time it is, however long the node's loop
    has slept (it sleeps until the next deadline when nothing is due)."""

    def __init__(self, tick_s: float, now: Callable[[], float]) -> None:
        self._tick_s = tick_s
        self._now = now
        self._start = now()

    @property
    def ticks(self) -> int:
        return int((self._now() - self._start) / self._tick_s)

    def time_of(self, ticks: int) -> float:
        """When (on the monotonic clock) the given tick begins."""
        return self._start + ticks * self._tick_s
