"""What a node counts about itself, named as Prometheus names them (`*_total`, `*_seconds`), so
that `/metrics` (node/exposition.py) exports them as they are and `tidelog status` shows the
counters. Kept here, not in prometheus_client's objects: the core and the listeners only count,
and the exposition is one layer over them."""

from __future__ import annotations

import bisect
from collections.abc import Iterator

Labels = tuple[tuple[str, str], ...]

# Request and fsync latencies, in seconds: from 100 µs (a cached fetch) to 10 s (a long poll).
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


class Counters:
    def __init__(self) -> None:
        self._values: dict[tuple[str, Labels], int] = {}

    def inc(self, name: str, amount: int = 1, **labels: str) -> None:
        key = (name, _labels(labels))
        self._values[key] = self._values.get(key, 0) + amount

    def get(self, name: str, **labels: str) -> int:
        return self._values.get((name, _labels(labels)), 0)

    def key(self, name: str, **labels: str) -> tuple[str, Labels]:
        """A counter's key, kept by callers on a hot path and given to add()."""
        return name, _labels(labels)

    def add(self, key: tuple[str, Labels], amount: int = 1) -> None:
        self._values[key] = self._values.get(key, 0) + amount

    def items(self) -> Iterator[tuple[str, Labels, int]]:
        for (name, labels), value in sorted(self._values.items()):
            yield name, labels, value

    def snapshot(self) -> dict[str, int]:
        return {_key(name, labels): value for name, labels, value in self.items()}


class Histogram:
    """Counts per bucket (each bucket counts what is ≤ its bound, as Prometheus's `le`)."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf only)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, count ≤ le) per bucket, +Inf last, as the exposition format wants them."""
        out: list[tuple[str, int]] = []
        running = 0
        for bound, count in zip(self.bounds, self.counts, strict=False):
            running += count
            out.append((repr(bound), running))
        out.append(("+Inf", self.count))
        return out


class Histograms:
    def __init__(self) -> None:
        self._values: dict[tuple[str, Labels], Histogram] = {}

    def get(self, name: str, **labels: str) -> Histogram:
        """The histogram of that name and labels (made at first use): callers on a hot path keep
        the object and observe into it."""
        key = (name, _labels(labels))
        found = self._values.get(key)
        if found is None:
            found = self._values[key] = Histogram()
        return found

    def items(self) -> Iterator[tuple[str, Labels, Histogram]]:
        for (name, labels), value in sorted(self._values.items(), key=lambda kv: kv[0]):
            yield name, labels, value


def _labels(labels: dict[str, str]) -> Labels:
    return tuple(sorted(labels.items()))


def _key(name: str, labels: Labels) -> str:
    if not labels:
        return name
    inner = ",".join(f'{k}="{v}"' for k, v in labels)
    return f"{name}{{{inner}}}"


class RequestMetrics:
    """One listener's figures for one request type: how long requests took to be answered, and
    the payload bytes that came in with them and went out in their answers."""

    __slots__ = ("_bytes_in", "_bytes_out", "_counters", "seconds")

    def __init__(
        self, counters: Counters, histograms: Histograms, listener: str, request: str
    ) -> None:
        self._counters = counters
        self.seconds = histograms.get("tidelog_request_seconds", listener=listener, request=request)
        labels = {"listener": listener, "request": request}
        self._bytes_in = counters.key("tidelog_request_bytes_total", **labels)
        self._bytes_out = counters.key("tidelog_response_bytes_total", **labels)

    def answered(self, seconds: float, bytes_in: int, bytes_out: int) -> None:
        self.seconds.observe(seconds)
        if bytes_in:
            self._counters.add(self._bytes_in, bytes_in)
        if bytes_out:
            self._counters.add(self._bytes_out, bytes_out)
