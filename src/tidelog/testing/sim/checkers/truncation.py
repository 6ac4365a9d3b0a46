"""Committed entries stay: no replica's log loses a committed batch to a truncation (a crash
losing what it had not flushed, and the log start moving past it, are not truncations)."""

from __future__ import annotations

from tidelog.record.batch import BatchHeader
from tidelog.testing.sim.checkers.commits import CommitHistory, describe_batch
from tidelog.testing.sim.failure import Violations


class CommittedEntriesStay:
    def __init__(self, history: CommitHistory, violations: Violations) -> None:
        self.history = history
        self.violations = violations

    def truncated(
        self, node_id: int, offset: int, removed: list[tuple[BatchHeader, bytes]]
    ) -> None:
        """Called from inside the core, as a node's log cuts its tail."""
        for header, batch in removed:
            if self.history.committed.get(header.base_offset) == batch:
                self.violations.defer(
                    f"committed entries stay: node {node_id} truncated its log to {offset}, "
                    f"removing {describe_batch(batch)}, which is committed"
                )
