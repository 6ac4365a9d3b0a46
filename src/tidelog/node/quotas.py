"""Quotas per principal, as Kafka's client quotas: a principal over its rate is slowed, not
refused. Each answer says how long the client is held (throttle_time_ms) and the node reads
nothing more from that connection for that long (KIP-219), so one principal's burst does not
take another's share of the node.

Rates are per node (as Kafka's are per broker), kept as token buckets: a principal may burst one
second's worth, and a request that overdraws the bucket holds its connection until the debt is
paid back at the quota's rate (at most THROTTLE_MAX_S per answer; a debt left over holds the
next answer too).

The limits live in the metadata log (put_quota / remove_quota), by principal; `*` is the
default for every principal without limits of its own (anonymous included).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tidelog.errors import InvalidRequest

PRODUCER_BYTE_RATE = "producer_byte_rate"  # bytes/s a principal may produce (Kafka's name)
CONSUMER_BYTE_RATE = "consumer_byte_rate"  # bytes/s it may fetch (Kafka's name)
ADMIN_REQUEST_RATE = "admin_request_rate"  # admin requests/s: topics, partitions, cursors, ...
QUOTA_KEYS = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, ADMIN_REQUEST_RATE)
DEFAULT_ENTITY = "*"
THROTTLE_MAX_S = 10.0  # Kafka: quota.window.size.seconds x quota.window.num, about 11 s


def check_limits(limits: dict[str, Any]) -> dict[str, float]:
    checked = {}
    for key, value in dict(limits).items():
        if key not in QUOTA_KEYS:
            raise InvalidRequest(f"unknown quota {key!r}: one of {', '.join(QUOTA_KEYS)}")
        try:
            rate = float(value)
        except (TypeError, ValueError):
            raise InvalidRequest(f"quota {key}: {value!r} is not a number") from None
        if not rate > 0 or rate != rate or rate == float("inf"):
            raise InvalidRequest(f"quota {key} must be a positive rate, got {value!r}")
        checked[key] = rate
    if not checked:
        raise InvalidRequest(f"a quota sets at least one of {', '.join(QUOTA_KEYS)}")
    return checked


class _Bucket:
    __slots__ = ("at", "rate", "tokens")

    def __init__(self, rate: float, now: float) -> None:
        self.rate = rate
        self.tokens = rate  # one second's burst
        self.at = now

    def refill(self, rate: float, now: float) -> None:
        if rate != self.rate:  # a changed quota starts from its own burst
            self.rate, self.tokens = rate, min(self.tokens, rate)
        self.tokens = min(self.rate, self.tokens + (now - self.at) * self.rate)
        self.at = now


class Quotas:
    def __init__(
        self,
        limits_of: Callable[[str], dict[str, float]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits_of = limits_of  # principal -> its limits (its own, else the default's)
        self.clock = clock
        self._buckets: dict[tuple[str, str], _Bucket] = {}
        self.throttled_answers = 0

    def charge(self, principal: str, key: str, amount: float) -> None:
        rate = self.limits_of(principal).get(key)
        if rate is None:
            return
        now = self.clock()
        bucket = self._buckets.get((principal, key))
        if bucket is None:
            bucket = self._buckets[(principal, key)] = _Bucket(rate, now)
        bucket.refill(rate, now)
        bucket.tokens -= amount

    def throttle_ms(self, principal: str) -> int:
        """How long principal's connection is held now: the longest of its debts."""
        limits = self.limits_of(principal)
        if not limits:
            return 0
        now = self.clock()
        longest = 0.0
        for key, rate in limits.items():
            bucket = self._buckets.get((principal, key))
            if bucket is None:
                continue
            bucket.refill(rate, now)
            if bucket.tokens < 0:
                longest = max(longest, -bucket.tokens / rate)
        held = int(min(longest, THROTTLE_MAX_S) * 1000)
        self.throttled_answers += held > 0
        return held
