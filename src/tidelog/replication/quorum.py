"""Pure functions of acknowledged offsets: what a quorum holds (etcd's quorum/majority.go)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tidelog.invariant import invariant


def majority(voter_count: int) -> int:
    return voter_count // 2 + 1


def quorum_offset(match_offsets: Sequence[int]) -> int:
    """The highest offset that a majority of replicas hold (exclusive end offsets)."""
    invariant(match_offsets, "match_offsets")
    ordered = sorted(match_offsets, reverse=True)
    return ordered[majority(len(ordered)) - 1]


def isr_offset(match: Mapping[int, int], in_sync: set[int], leader: int) -> tuple[int, set[int]]:
    """Kafka's rule: HW = min over the in-sync set. The set is padded with the best-matched
    replicas until it is a majority, so an HW it allows is always on a quorum (elections stay
    safe). Returns (offset, effective in-sync set)."""
    effective = set(in_sync) | {leader}
    need = majority(len(match))
    if len(effective) < need:
        rest = sorted((r for r in match if r not in effective), key=lambda r: -match[r])
        effective |= set(rest[: need - len(effective)])
    return min(match[r] for r in effective), effective
