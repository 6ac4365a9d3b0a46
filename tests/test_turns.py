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
    """Counted in work done between two turns of the other task, not in milliseconds: a loaded
    machine stretches every millisecond, but never makes a round do more than a slice of work
    before it lets others run."""

    async def main() -> tuple[int, int]:
        since_other = [0]  # work items done since the other task last ran
        most: list[int] = []
        done = asyncio.Event()

        async def round_of_work() -> None:
            turns = Turns(slice_s=0.002)
            for _ in range(2000):  # 2000 x 0.1 ms: 200 ms of work in one round
                busy(0.0001)
                since_other[0] += 1
                await turns.take()
            done.set()

        async def other() -> None:  # what a request would see: how much ran before it
            while not done.is_set():
                most.append(since_other[0])  # (counted as soon as it runs, then it yields)
                since_other[0] = 0
                await asyncio.sleep(0)

        await asyncio.gather(round_of_work(), other())
        return max(most), len(most)

    worst, turns_given = asyncio.run(main())
    assert turns_given >= 50  # ~100 slices of 2 ms in 200 ms of work
    # A slice of 2 ms holds at most ~20 items of 0.1 ms (fewer when the machine is slow).
    assert worst <= 25, f"the round did {worst} items of 0.1 ms without letting others run"
