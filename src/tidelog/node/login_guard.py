"""Failed logins cost their sender, not everyone else: a token or SCRAM proof that fails makes
the next attempts from that address, and for that principal name, wait longer and longer, and
attempts from where logins failed take turns for the password-hash checks.

Each token check is an Argon2id hash (125 ms on two threads): 32 connections sending bad tokens
pushed a valid login from 0.15 s to 3.4-3.9 s, and one connection made 428 guesses a second
(SCRAM: 200 failures in 1.2 s). Now:
- after FREE failures within FORGET_S, each further attempt from that address or for that name
  waits BASE_S * 2^(failures - FREE), at most CAP_S for an address and NAME_CAP_S for a name
  (whose owner may be the one logging in), before it is checked (Kafka's
  connection.failed.authentication.delay.ms, with backoff);
- attempts from an address or for a name with a failure to its debit are checked one at a time
  node-wide (SUSPECT_SLOTS), so they never queue ahead of a clean login for the hash threads.
A success clears the name's debit; an address's fades after FORGET_S (an attacker with an
account of its own cannot clear it by logging in between guesses).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

FREE = 3  # failures allowed before any wait
BASE_S = 0.1
CAP_S = 5.0
NAME_CAP_S = 1.0
FORGET_S = 300.0  # a debit not added to for this long is forgotten
SUSPECT_SLOTS = 1
MAX_TRACKED = 100_000  # addresses and names remembered at most (the oldest go first)


@dataclass
class _Debit:
    failures: int
    last: float


class LoginGuard:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._debits: dict[str, _Debit] = {}
        self._suspects = asyncio.Semaphore(SUSPECT_SLOTS)
        self.delayed = 0  # attempts made to wait (a counter for /metrics)

    def _failures(self, key: str) -> int:
        debit = self._debits.get(key)
        if debit is None:
            return 0
        if self._clock() - debit.last > FORGET_S:
            del self._debits[key]
            return 0
        return debit.failures

    def delay_s(self, address: str, name: str) -> float:
        """How long an attempt from address for name waits before it is checked."""
        by_address = _backoff(self._failures("a:" + address), CAP_S)
        return max(by_address, _backoff(self._failures("p:" + name), NAME_CAP_S))

    def suspect(self, address: str, name: str) -> bool:
        return bool(self._failures("a:" + address) or self._failures("p:" + name))

    @contextlib.asynccontextmanager
    async def attempt(self, address: str, name: str) -> AsyncIterator[None]:
        """Around one check: waits what the debits ask, and takes a suspect's turn."""
        delay = self.delay_s(address, name)
        if delay > 0:
            self.delayed += 1
            await asyncio.sleep(delay)
        if not self.suspect(address, name):
            yield
            return
        async with self._suspects:
            yield

    def failed(self, address: str, name: str) -> None:
        now = self._clock()
        for key in ("a:" + address, "p:" + name):
            failures = self._failures(key)
            self._debits.pop(key, None)  # (re-inserted last: the dict stays oldest-first)
            self._debits[key] = _Debit(failures + 1, now)
        while len(self._debits) > MAX_TRACKED:
            del self._debits[next(iter(self._debits))]

    def succeeded(self, name: str) -> None:
        self._debits.pop("p:" + name, None)


def _backoff(failures: int, cap: float) -> float:
    return 0.0 if failures <= FREE else min(cap, BASE_S * 2.0 ** (failures - FREE - 1))
