"""The node's side of feature levels (tidelog/features.py decides what is allowed): the range
this node supports and those its peers announce in their heartbeats, the cluster's finalized
level as this node has applied it, and a new cluster's first level.

One place tells the rest of the node that the finalized level changed: `subscribe(callback)`;
the callback gets the new level, once at start with the level the metadata log holds and again
at every change this node applies (a record, or a snapshot installed). `finalized` is the same
level, to be read at any time.

A node whose range does not include the finalized level stops: refused at start
(`check_at_start`, UnsupportedFeatureLevel), and, if it applies such a level while running (a
race with an upgrade: the upgrade asked every node first), fail-stopped, as a Kafka broker
shuts down on a finalized level it does not support.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from tidelog.errors import UnsupportedFeatureLevel
from tidelog.features import (
    FEATURE,
    SupportedRange,
    announced_range,
    announcement,
    check_supported,
)
from tidelog.node.failstop import FailStop
from tidelog.node.metadata_log import MetadataLog
from tidelog.node.registry import NodeRegistry
from tidelog.replication.liveness import Liveness
from tidelog.replication.metadata_commands import FeatureLevel, MetadataCommand

log = logging.getLogger(__name__)


class FeatureLevels:
    def __init__(
        self,
        node_id: int,
        supported: SupportedRange,
        metadata: MetadataLog,
        registry: NodeRegistry,
        liveness: Liveness,
        fail_stop: FailStop,
    ) -> None:
        self.node_id = node_id
        self.supported = supported
        self.metadata = metadata
        self.registry = registry
        self.liveness = liveness
        self.fail_stop = fail_stop
        self.announced: dict[int, SupportedRange] = {}  # by peer, as its last heartbeat said
        self.finalized = metadata.state.finalized_level
        self._listeners: list[Callable[[int], None]] = []
        # This node opened an empty metadata log of a cluster it did not join: if it comes to
        # lead that log before any level is recorded, it finalizes the highest level it can.
        self.new_cluster = False
        self._started = False

    # -- the hook -------------------------------------------------------------------------------

    def subscribe(self, callback: Callable[[int], None]) -> None:
        """Call back with the finalized level: now, and whenever this node applies a change."""
        self._listeners.append(callback)
        callback(self.finalized)

    # -- what nodes support ---------------------------------------------------------------------

    def announcement(self) -> dict[str, list[int]]:
        """What this node's heartbeats carry."""
        return announcement(self.supported)

    def on_heartbeat(self, sender: int, features: object) -> None:
        """A peer's heartbeat: the range it supports (none announced: a 0.1.0 node, 1..1)."""
        self.announced[sender] = announced_range(features)

    def range_of(self, node_id: int) -> SupportedRange | None:
        """What a node supports, if it is live (None: not live, so unknown)."""
        if node_id == self.node_id:
            return self.supported
        if not self.liveness.is_alive(node_id):
            return None
        return self.announced.get(node_id)

    def last_announced(self, node_id: int) -> SupportedRange | None:
        """What a node said last, live or not (None: never heard)."""
        return self.supported if node_id == self.node_id else self.announced.get(node_id)

    def ranges(self) -> dict[int, SupportedRange | None]:
        """Every registered node's range (None: not live, or live but not heard yet)."""
        return {n: self.range_of(n) for n in sorted(self.registry.nodes())}

    # -- the finalized level --------------------------------------------------------------------

    def check_at_start(self, new_log: bool) -> None:
        """After the metadata log opened (its committed records applied): refused if this node
        does not support the level the cluster finalized."""
        self.new_cluster = new_log
        level = self.metadata.state.finalized_level
        check_supported(level, self.supported, self.node_id)
        self._started = True
        log.info(
            "node %d: %s finalized at %d; this node supports %s",
            self.node_id,
            FEATURE,
            level,
            self.supported,
        )
        self._follow(level)

    def on_applied(self, command: MetadataCommand | None) -> None:
        """The metadata machine applied a command (None: installed a snapshot)."""
        if not self._started:
            return  # the metadata log opening: check_at_start decides
        state = self.metadata.state
        if command is not None and not isinstance(command, FeatureLevel):
            if not self.metadata.is_leader:
                self.new_cluster = False  # another leader's cluster, in use: not ours to start
            return
        if FEATURE in state.features:
            self.new_cluster = False
        level = state.finalized_level
        if level != self.finalized:
            log.warning("cluster: %s finalized at %d (was %d)", FEATURE, level, self.finalized)
        if level not in self.supported:
            why = (
                f"cluster finalized {FEATURE}={level}; node {self.node_id} supports "
                f"{self.supported}"
            )
            self.fail_stop.trip(UnsupportedFeatureLevel(why), "the metadata log")
            return
        self._follow(level)

    def _follow(self, level: int) -> None:
        if level == self.finalized:
            return
        self.finalized = level
        for callback in self._listeners:
            callback(level)

    def check(self) -> None:
        """Often (the node's checks): the first leader of a new cluster finalizes the highest
        level this node and every node it has heard from support, before anything else."""
        metadata = self.metadata
        if not self.new_cluster or not metadata.opened or not metadata.is_leader:
            return
        state, replica = metadata.state, metadata.host.replica
        if state.applied_offset < replica.high_watermark:
            return
        if FEATURE in state.features:
            self.new_cluster = False
            return
        heard = [r for r in self.ranges().values() if r is not None]
        level = min(r.max_level for r in heard)
        metadata.propose_in_background(
            f"a new cluster: {FEATURE} finalized at {level}",
            FeatureLevel(FEATURE, level, True, int(time.time() * 1000)),
        )
