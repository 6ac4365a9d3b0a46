"""Feature levels: what the cluster as a whole has agreed its nodes may write (Kafka's
metadata.version and finalized features, KIP-584 and KIP-778).

A build of tidelog supports a range of levels of the feature `tidelog.version`; the cluster's
*finalized* level is a record of its metadata log (replication/metadata_commands.py's
FeatureLevel). A cluster with no such record (one that ran tidelog 0.1.0, commit 0070a26, which
knew nothing of levels) is at level 1. Every node announces the range it supports in its
liveness heartbeats; a node that announces nothing runs 0.1.0 and supports exactly 1..1.

    upgrade     finalize a higher level, once every registered node is live and supports it
    downgrade   finalize a lower one, only where every level passed over allows it

The rules here are pure: the node (node/feature_levels.py) says which nodes are live and what
they announced, and proposes what these functions allow.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tidelog.errors import (
    InvalidRequest,
    TransactionsNotEnabled,
    UnsafeFeatureDowngrade,
    UnsupportedFeatureLevel,
)

FEATURE = "tidelog.version"
DEFAULT_LEVEL = 1  # a cluster whose metadata log holds no level (0070a26's, before any upgrade)


@dataclass(frozen=True)
class Level:
    """One level of the feature: what it means, and whether a cluster finalized at it may go
    back to the level below (a level whose nodes write formats older builds cannot read may
    not)."""

    level: int
    meaning: str
    downgrade_safe: bool

    def to_wire(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "meaning": self.meaning,
            "downgrade_safe": self.downgrade_safe,
        }


LEVELS: dict[int, Level] = {
    level.level: level
    for level in (
        Level(1, "the formats of tidelog 0.1.0 (commit 0070a26)", downgrade_safe=True),
        # Nodes may write new format versions from here (docs/formats.md): a node of a lower
        # level could not read them, so a cluster finalized here never goes back.
        Level(2, "versioned formats (docs/formats.md)", downgrade_safe=False),
        # Transactional batches and markers in segments, the coordinator's metadata commands
        # (version 2) and snapshots holding transactions: nothing of level 2 reads them.
        Level(3, "transactions (Kafka's KIP-98; docs/design.md)", downgrade_safe=False),
    )
}
MIN_LEVEL = min(LEVELS)
MAX_LEVEL = max(LEVELS)

# What a node sends and proposes only once the cluster is finalized at this level, because a
# 0.1.0 node refuses it: the archive's reports to the metadata leader (peer message
# ARCHIVE_REPORT, metadata commands archive_claimed and archive_extent).
ARCHIVE_REPORTS_LEVEL = 2
# Transactions (a transactional id, a transactional batch, a marker) are refused by name
# (TransactionsNotEnabled) until the cluster is finalized at this level.
TRANSACTIONS_LEVEL = 3


@dataclass(frozen=True)
class SupportedRange:
    """The levels a node can run at, both ends included."""

    min_level: int
    max_level: int

    def __contains__(self, level: object) -> bool:
        return isinstance(level, int) and self.min_level <= level <= self.max_level

    def __str__(self) -> str:
        return f"{self.min_level}-{self.max_level}"

    def to_wire(self) -> list[int]:
        return [self.min_level, self.max_level]

    @staticmethod
    def from_wire(value: Any) -> SupportedRange:
        """A range as a node announced it; what is no range ([min, max] of ints, min <= max)
        is InvalidRequest."""
        if (
            isinstance(value, list | tuple)
            and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            and 1 <= value[0] <= value[1]
        ):
            return SupportedRange(int(value[0]), int(value[1]))
        raise InvalidRequest(f"{value!r} is no range of {FEATURE} levels ([min, max])")


# What a node that announces nothing supports: it runs tidelog 0.1.0 (0070a26).
UNANNOUNCED = SupportedRange(1, 1)


def build_range(max_level: int = 0) -> SupportedRange:
    """What this build supports, capped at max_level when given (the setting
    feature.max.level, for testing upgrades: a node that acts as an older build would)."""
    if max_level == 0:
        return SupportedRange(MIN_LEVEL, MAX_LEVEL)
    if not MIN_LEVEL <= max_level <= MAX_LEVEL:
        raise InvalidRequest(
            f"feature.max.level must be {MIN_LEVEL}..{MAX_LEVEL} (0: {MAX_LEVEL}), got {max_level}"
        )
    return SupportedRange(MIN_LEVEL, max_level)


def announcement(supported: SupportedRange) -> dict[str, list[int]]:
    """What a node's heartbeats carry: {feature: [min, max]}."""
    return {FEATURE: supported.to_wire()}


def announced_range(features: Any) -> SupportedRange:
    """The range a heartbeat's `features` announce (none: a 0.1.0 node, 1..1)."""
    if features is None:
        return UNANNOUNCED
    if not isinstance(features, dict):
        raise InvalidRequest(f"a heartbeat's features must be an object, not {features!r}")
    return SupportedRange.from_wire(features[FEATURE]) if FEATURE in features else UNANNOUNCED


def check_supported(finalized: int, supported: SupportedRange, node_id: int) -> None:
    """A node may run in a cluster finalized at a level only if it supports that level."""
    if finalized not in supported:
        raise UnsupportedFeatureLevel(
            f"cluster finalized {FEATURE}={finalized}; node {node_id} supports {supported}",
            feature=FEATURE,
            finalized=finalized,
            node_id=node_id,
            supported=supported.to_wire(),
        )


def check_known(level: int) -> None:
    if level not in LEVELS:
        raise UnsupportedFeatureLevel(
            f"{FEATURE} has levels {MIN_LEVEL}..{MAX_LEVEL} in this build, not {level}",
            feature=FEATURE,
            level=level,
        )


def check_every_node(level: int, nodes: Mapping[int, SupportedRange | None]) -> None:
    """Every registered node must be live (None: not live, its range unknown) and support the
    level, as Kafka requires of every broker before a feature is finalized."""
    down = sorted(n for n, r in nodes.items() if r is None)
    if down:
        raise UnsupportedFeatureLevel(
            f"node(s) {down} are not live: whether they support {FEATURE}={level} is unknown; "
            "start them (or remove them from the cluster) first",
            feature=FEATURE,
            level=level,
            nodes=down,
        )
    short = {n: r for n, r in sorted(nodes.items()) if r is not None and level not in r}
    if short:
        said = ", ".join(f"node {n} supports {r}" for n, r in short.items())
        raise UnsupportedFeatureLevel(
            f"cannot finalize {FEATURE}={level}: {said}; upgrade their binaries first",
            feature=FEATURE,
            level=level,
            nodes=sorted(short),
        )


def highest_common(nodes: Mapping[int, SupportedRange | None]) -> int:
    """The highest level every node supports (the nodes not live count as supporting
    nothing above the lowest level)."""
    return min([MAX_LEVEL, *(r.max_level if r is not None else MIN_LEVEL for r in nodes.values())])


def upgrade_target(
    finalized: int, requested: int, nodes: Mapping[int, SupportedRange | None]
) -> int:
    """The level an upgrade finalizes: the one requested, or (0) the highest every node
    supports. That is unknown while a registered node is not live, unless this build knows no
    level above the finalized one: refused then, naming the nodes."""
    if requested:
        return requested
    if finalized < MAX_LEVEL:
        check_every_node(finalized + 1, {n: r for n, r in nodes.items() if r is None})
    return max(highest_common(nodes), finalized)


def check_upgrade(finalized: int, level: int, nodes: Mapping[int, SupportedRange | None]) -> None:
    """Raises unless the level may be finalized. The finalized level itself passes without
    asking the nodes: nothing changes, and every node had to support it to run."""
    check_known(level)
    if level < finalized:
        raise InvalidRequest(
            f"{FEATURE} is finalized at {finalized}; {level} is lower: that is a downgrade"
        )
    if level > finalized:
        check_every_node(level, nodes)


def check_downgrade(finalized: int, level: int, nodes: Mapping[int, SupportedRange | None]) -> None:
    """A downgrade passes over every level above the target: each must allow going back. The
    finalized level itself passes: nothing changes."""
    if level == finalized:
        return
    if finalized <= MIN_LEVEL:
        raise InvalidRequest(f"{FEATURE} is finalized at its lowest level, {finalized}")
    check_known(level)
    if level > finalized:
        raise InvalidRequest(
            f"{FEATURE} is finalized at {finalized}; {level} is higher: that is no downgrade"
        )
    for passed in range(finalized, level, -1):
        if not LEVELS[passed].downgrade_safe:
            raise UnsafeFeatureDowngrade(
                f"cannot downgrade {FEATURE} from {finalized} to {level}: at level {passed} "
                f"({LEVELS[passed].meaning}) nodes may have written what a node of level "
                f"{passed - 1} cannot read. Downgrade a node's binary only before finalizing "
                "a level",
                feature=FEATURE,
                finalized=finalized,
                level=level,
            )
    check_every_node(level, nodes)


def require_transactions(level: int, what: str = "transactions") -> None:
    """TransactionsNotEnabled below TRANSACTIONS_LEVEL: nodes of a lower level could not read
    the markers and metadata commands transactions write."""
    if level < TRANSACTIONS_LEVEL:
        raise TransactionsNotEnabled(
            f"{what} need feature level {TRANSACTIONS_LEVEL}; the cluster is finalized at "
            f"{level} (tidelog features upgrade)",
            level=level,
        )
