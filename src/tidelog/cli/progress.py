"""A progress line for long operations (`produce --file`, the demo, benchmarks): what is done,
the rate, and how far along when the total is known. Drawn on stderr only when stderr is a
terminal, at most a few times a second; silent otherwise (pipes, files, CI logs)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

REDRAW_S = 0.25
BAR = 24


def _si(n: float) -> str:
    for unit in ("", "k", "M", "G"):
        if abs(n) < 1000:
            return f"{n:.0f}{unit}" if unit == "" else f"{n:.1f}{unit}"
        n /= 1000
    return f"{n:.1f}T"


class Progress:
    def __init__(
        self,
        what: str,
        total: float | None = None,
        unit: str = "records",
        stream: TextIO | None = None,
        shown: bool | None = None,
    ) -> None:
        self.what = what
        self.total = total  # in the unit of `amount` passed to advance(..., amount=)
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.shown = self.stream.isatty() if shown is None else shown
        self.count = 0
        self.amount = 0.0
        self.started = time.monotonic()
        self._drawn = 0.0

    def advance(self, count: int = 1, amount: float = 0.0) -> None:
        self.update(self.count + count, self.amount + amount)

    def update(self, count: int, amount: float) -> None:
        """Where it is now: count done, amount of the total (bytes read, seconds run, ...)."""
        self.count, self.amount = count, amount
        if self.shown:
            now = time.monotonic()
            if now - self._drawn >= REDRAW_S:
                self._drawn = now
                self._draw(now)

    def line(self, now: float | None = None) -> str:
        elapsed = max(1e-9, (now or time.monotonic()) - self.started)
        text = f"{self.what}: {_si(self.count)} {self.unit}, {_si(self.count / elapsed)}/s"
        if self.total:
            done = min(1.0, self.amount / self.total)
            filled = int(done * BAR)
            text += f" [{'#' * filled}{'.' * (BAR - filled)}] {done * 100:3.0f}%"
        return text + f" {elapsed:.0f}s"

    def _draw(self, now: float) -> None:
        self.stream.write("\r\x1b[2K" + self.line(now))
        self.stream.flush()

    def close(self) -> None:
        if self.shown:
            self._draw(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()
