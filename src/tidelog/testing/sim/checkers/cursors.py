"""Cursors within their caps hold the log: no leader's log start passes a cursor that is
within its caps, and only cursors past them are invalidated. The caps are judged as the issue
states them to users, not through the LWM code under test."""

from __future__ import annotations

from collections.abc import Callable

from tidelog.config import TopicConfig
from tidelog.testing.sim.cursors import SimCursor
from tidelog.testing.sim.failure import Violations
from tidelog.testing.sim.nodes import SimNode


class CursorCaps:
    def __init__(
        self, config: TopicConfig, clock: Callable[[], int], violations: Violations
    ) -> None:
        self.config = config
        self.clock = clock
        self.violations = violations

    def entitled(self, cursor: SimCursor, node: SimNode) -> bool:
        """Whether the cursor may still hold the log, by the caps as users are told them
        (cursor.max.idle.ms, cursor.max.lag.bytes), computed here, not by the code under test."""
        if cursor.invalidated:
            return False
        idle = self.clock() - cursor.committed_ms
        lag = sum(len(b) for h, b in node.log.batches() if h.last_offset >= cursor.position)
        max_idle, max_lag = self.config.cursor_max_idle_ms, self.config.cursor_max_lag_bytes
        return not (0 <= max_idle < idle) and not (0 <= max_lag < lag)

    def check_log_start(self, node: SimNode, cursors: list[SimCursor]) -> None:
        """The node's log start just moved."""
        for cursor in cursors:
            if node.log.log_start_offset > cursor.position and self.entitled(cursor, node):
                self.violations.fail(
                    f"node {node.node_id} moved its log start to {node.log.log_start_offset} past "
                    f"cursor {cursor.name} at {cursor.position}, which is within its caps"
                )

    def check_invalidation(self, cursor: SimCursor, node: SimNode, reason: str) -> None:
        """node's cleaner invalidates the cursor, for reason."""
        if self.entitled(cursor, node) and cursor.position >= node.log.log_start_offset:
            self.violations.fail(f"cursor {cursor.name} invalidated within its caps: {reason}")
