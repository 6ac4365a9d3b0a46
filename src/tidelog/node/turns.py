"""Work over every partition that takes turns with the rest of the event loop: a loop of the
node's own (ticks, the cleaner's passes, checkpoints) yields after each slice of work, so that
requests and peers' messages are served between slices however many partitions there are."""

from __future__ import annotations

import asyncio

SLICE_S = 0.002  # at most this much work before the loop serves others


class Turns:
    def __init__(self, slice_s: float = SLICE_S) -> None:
        self.slice_s = slice_s
        self._loop = asyncio.get_running_loop()
        self._ends = self._loop.time() + slice_s

    def due(self) -> bool:
        """This turn's slice is used up (ask after each unit of work; cheap: no await)."""
        return self._loop.time() >= self._ends

    async def give(self) -> None:
        """Let the rest of the loop run, then start a new slice."""
        await asyncio.sleep(0)
        self._ends = self._loop.time() + self.slice_s

    async def take(self) -> None:
        """give() if due(): for loops whose units are large enough that an await is nothing."""
        if self.due():
            await self.give()
