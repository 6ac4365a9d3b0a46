"""fsync threads: the event loop hands over a flush job and is called back when it is done.

Lighter than run_in_executor (no concurrent.futures.Future chained to an asyncio one), which
matters because a follower runs one fsync per fetch answer.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable

from tidelog.invariant import invariant

log = logging.getLogger(__name__)

Job = Callable[[], None]
Done = Callable[[BaseException | None], None]


class Flusher:
    def __init__(self, threads: int, loop: asyncio.AbstractEventLoop, name: str) -> None:
        invariant(threads >= 1, "threads >= 1")
        self._loop = loop
        self._jobs: queue.SimpleQueue[tuple[Job, Done] | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
            for i in range(threads)
        ]
        for t in self._threads:
            t.start()
        self.in_flight = 0

    def submit(self, job: Job, done: Done) -> None:
        self.in_flight += 1
        self._jobs.put((job, done))

    def _work(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            job, done = item
            error: BaseException | None = None
            try:
                job()
            except BaseException as exc:  # handed to the loop, which decides
                error = exc
            try:
                self._loop.call_soon_threadsafe(self._finish, done, error)
            except RuntimeError:
                log.debug("event loop closed before a flush finished")

    def _finish(self, done: Done, error: BaseException | None) -> None:
        self.in_flight -= 1
        done(error)

    def shutdown(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)
        for t in self._threads:
            t.join(timeout=10)
