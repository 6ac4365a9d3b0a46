"""Cursors as the metadata log holds them, and their consumers: each reads committed data and
commits its position, or stalls, and may fall past cursor.max.idle.ms or
cursor.max.lag.bytes."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass
class SimCursor:
    """A cursor as the metadata log holds it, and its consumer."""

    name: str
    backup: bool
    position: int = 0
    committed_ms: int = 0
    invalidated: str = ""
    stalled_until: int = 0


def commit_cursors(
    cursors: list[SimCursor], rng: random.Random, now: int, stall: float, declared_hw: int
) -> None:
    """Each cursor's consumer reads committed data (below the highest HW a leader declared)
    and commits, unless it is stalled."""
    for cursor in cursors:
        if cursor.invalidated or now < cursor.stalled_until:
            continue
        if rng.random() < stall:
            cursor.stalled_until = now + rng.randint(10, 600)
            continue
        hw = max(declared_hw, cursor.position)
        cursor.position = min(hw, cursor.position + rng.randint(0, 30))
        cursor.committed_ms = now
