"""The low-water mark: the minimum over everything that still needs the log.

Every hold is named and inspectable. A hold past its cap does not hold (and says why); the
caller turns that into an invalidation the owner hears about. The LWM never passes the HW:
uncommitted data is never discarded.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

KIND_REPLICA = "replica"
KIND_CURSOR = "cursor"
KIND_BACKUP = "backup"
KIND_SNAPSHOT = "snapshot"
KIND_RETENTION = "retention"
KIND_HIGH_WATERMARK = "high-watermark"


@dataclass(frozen=True)
class Hold:
    kind: str
    name: str
    offset: int
    detail: str = ""
    live: bool = True  # False: past its cap; reported but not holding
    why_not: str = ""

    def describe(self) -> str:
        text = f"{self.kind} {self.name} at {self.offset}"
        if self.detail:
            text += f" ({self.detail})"
        if not self.live:
            text += f" [not holding: {self.why_not}]"
        return text


@dataclass(frozen=True)
class LowWatermark:
    offset: int
    hold: Hold  # the hold that sets it
    holds: tuple[Hold, ...]  # every hold considered, live or not

    def to_dict(self) -> dict[str, object]:
        return {
            "offset": self.offset,
            "set_by": self.hold.describe(),
            "holds": [
                {
                    "kind": h.kind,
                    "name": h.name,
                    "offset": h.offset,
                    "live": h.live,
                    "detail": h.detail,
                    "why_not": h.why_not,
                }
                for h in self.holds
            ],
        }


def compute_low_watermark(
    holds: Iterable[Hold], log_start_offset: int, high_watermark: int
) -> LowWatermark:
    """min over live holds, never below the log start, never above the HW."""
    all_holds = tuple(holds)
    ceiling = Hold(KIND_HIGH_WATERMARK, "hw", high_watermark, "nothing uncommitted is discarded")
    best = ceiling
    for hold in all_holds:
        if hold.live and hold.offset < best.offset:
            best = hold
    offset = max(log_start_offset, best.offset)
    return LowWatermark(offset, best, all_holds)
