"""Failed logins cost their sender, not everyone else: a token or SCRAM proof that fails is
answered late, later for each failure from that address; attempts for a name that failed wait
a little before they are checked; and attempts from where logins failed take turns for the
password-hash checks.

Each token check is an Argon2id hash (125 ms on two threads): 32 connections sending bad tokens
pushed a valid login from 0.15 s to 3.4-3.9 s, and one connection made 428 guesses a second
(SCRAM: 200 failures in 1.2 s). Now:
- after FREE failures within FORGET_S, a failed attempt's answer waits
  BASE_S * 2^(failures - FREE) for its address, at most CAP_S (Kafka's
  connection.failed.authentication.delay.ms, with backoff). The guesser waits, holding one of
  its `max.connections.per.ip`; a valid login from the same address (a NAT, a shared host, a
  colleague with a wrong token on the same machine) is answered at once. A first design made
  every attempt from the address wait before its check: one misconfigured client on 127.0.0.1
  then held every login on the machine at 5 s for five minutes;
- an attempt for a name with failures to its debit waits before its check, at most NAME_CAP_S
  (its owner may be the one logging in), so guesses at one principal from many addresses slow;
- attempts from an address or for a name with a failure to its debit are checked one at a time
  node-wide (SUSPECT_SLOTS), so they never queue ahead of a clean login for the hash threads;
  at most SUSPECT_QUEUE_MAX wait for that turn, more are answered Timeout (retriable) at once.
A success clears the name's debit; an address's fades after FORGET_S (an attacker with an
account of its own cannot clear it by logging in between guesses).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from tidelog.errors import AuthenticationFailed, Timeout

FREE = 3  # failures allowed before any wait
BASE_S = 0.1
CAP_S = 5.0
NAME_CAP_S = 1.0
FORGET_S = 300.0  # a debit not added to for this long is forgotten
SUSPECT_SLOTS = 1
SUSPECT_QUEUE_MAX = 64  # suspects waiting for a slot, at most; more are turned away unchecked
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
        self.turned_away = 0  # suspects refused unchecked: the queue was full
        self._queued = 0

    def _failures(self, key: str) -> int:
        debit = self._debits.get(key)
        if debit is None:
            return 0
        if self._clock() - debit.last > FORGET_S:
            del self._debits[key]
            return 0
        return debit.failures

    def wait_before_s(self, name: str) -> float:
        """How long an attempt for name waits before it is checked."""
        return _backoff(self._failures("p:" + name), NAME_CAP_S)

    def wait_after_failure_s(self, address: str) -> float:
        """How long a failed attempt from address waits before it is answered."""
        return _backoff(self._failures("a:" + address), CAP_S)

    def suspect(self, address: str, name: str) -> bool:
        return bool(self._failures("a:" + address) or self._failures("p:" + name))

    @contextlib.asynccontextmanager
    async def attempt(self, address: str, name: str) -> AsyncIterator[None]:
        """Around one check that raises AuthenticationFailed when it fails: waits what the
        name's debit asks, takes a suspect's turn, and holds a failure's answer back."""
        before = self.wait_before_s(name)
        if before > 0:
            self.delayed += 1
            await asyncio.sleep(before)
        suspect = self.suspect(address, name)
        if suspect:
            if self._queued >= SUSPECT_QUEUE_MAX:
                # A bounded queue: past it a suspect is turned away unchecked (no hash), and
                # retries; memory and the wait of those queued stay bounded.
                self.turned_away += 1
                raise Timeout(
                    f"{SUSPECT_QUEUE_MAX} logins from addresses or for names with failed logins "
                    "already wait to be checked: try again later"
                )
            self._queued += 1
            try:
                await self._suspects.acquire()
            finally:
                self._queued -= 1
        try:
            try:
                yield
            finally:
                if suspect:
                    self._suspects.release()
        except AuthenticationFailed:
            self.failed(address, name)
            after = self.wait_after_failure_s(address)
            if after > 0:  # (after the suspects' turn: a held answer blocks no one)
                self.delayed += 1
                await asyncio.sleep(after)
            raise
        self.succeeded(name)

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
