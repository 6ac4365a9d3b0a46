"""Leader completeness: a replica that becomes leader holds every batch committed so far (from
its log start on), so it never tells a follower to cut a committed entry."""

from __future__ import annotations

from tidelog.record.batch import read_header
from tidelog.testing.sim.checkers.commits import CommitHistory, describe_batch
from tidelog.testing.sim.failure import Violations
from tidelog.testing.sim.nodes import SimNode


class LeaderCompleteness:
    def __init__(self, history: CommitHistory, violations: Violations) -> None:
        self.history = history
        self.violations = violations

    def check(self, node: SimNode, epoch: int) -> None:
        """Raft's leader completeness: a new leader's log holds every batch committed in an
        earlier epoch, at or above its log start (below it, they were deleted by design). A
        leader of an older epoch than the newest (a candidate paused after it won) need not
        hold what later epochs committed."""
        committed, commit_epochs = self.history.committed, self.history.commit_epochs
        log = node.log
        start = log.log_start_offset
        required = [b for b, e in commit_epochs.items() if e < epoch and b >= start]
        end = max((read_header(committed[b]).next_offset for b in required), default=0)
        if log.log_end_offset < end:
            self.violations.defer(
                f"leader completeness: node {node.node_id} leads epoch {epoch} with log end "
                f"{log.log_end_offset}, but offsets up to {end} were committed before it"
            )
        held = {h.base_offset: b for h, b in log.batches_between(start, end)}
        for base in sorted(required):
            batch = committed[base]
            if held.get(base) != batch:
                theirs = held.get(base)
                self.violations.defer(
                    f"leader completeness: node {node.node_id} leads epoch {epoch} but holds "
                    f"{describe_batch(theirs) if theirs is not None else 'nothing'} at offset "
                    f"{base}, committed as {describe_batch(batch)}"
                )
                return
