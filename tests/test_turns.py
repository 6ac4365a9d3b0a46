"""The node's loops over every partition take turns with the rest of the event loop
(node/turns.py): a long round of work never holds the loop for much more than a slice."""

from __future__ import annotations

import asyncio
import time

from tidelog.node.turns import Turns


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_long_round_lets_others_run_between_slices() -> None:
    async def main() -> tuple[float, int]:
        waits: list[float] = []
        done = asyncio.Event()

        async def round_of_work() -> None:
            turns = Turns(slice_s=0.002)
            for _ in range(2000):  # 2000 x 0.1 ms: 200 ms of work in one round
                busy(0.0001)
                await turns.take()
            done.set()

        async def other() -> None:  # what a request would see: how late it is woken
            while not done.is_set():
                asked = time.perf_counter()
                await asyncio.sleep(0)
                waits.append(time.perf_counter() - asked)

        await asyncio.gather(round_of_work(), other())
        return max(waits), len(waits)

    worst, turns_given = asyncio.run(main())
    assert turns_given >= 50  # ~100 slices of 2 ms in 200 ms of work
    assert worst < 0.02, f"the round held the loop for {worst * 1000:.1f} ms"
