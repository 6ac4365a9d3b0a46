"""Counters a node keeps about itself, named as Prometheus names them (`*_total`), so that the
metrics endpoint can export them as they are. Read through `tidelog status` today."""

from __future__ import annotations

from collections import Counter


class Counters:
    def __init__(self) -> None:
        self._values: Counter[str] = Counter()

    def inc(self, name: str, amount: int = 1, **labels: str) -> None:
        self._values[_key(name, labels)] += amount

    def get(self, name: str, **labels: str) -> int:
        return self._values[_key(name, labels)]

    def snapshot(self) -> dict[str, int]:
        return dict(sorted(self._values.items()))


def _key(name: str, labels: dict[str, str]) -> str:
    if not labels:
        return name
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"
