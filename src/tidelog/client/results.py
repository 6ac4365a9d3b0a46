"""What a write returns (shared by the client and its send coalescing)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProduceResult:
    partition: int
    base_offset: int
    last_offset: int
    high_watermark: int
    duplicate: bool = False  # an idempotent producer's replay: it was already in the log
