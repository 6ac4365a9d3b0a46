"""Election safety: at most one leader per epoch, and a leader is a voter of its membership."""

from __future__ import annotations

from tidelog.testing.sim.failure import Violations


class ElectionSafety:
    def __init__(self, violations: Violations) -> None:
        self.violations = violations
        self.leaders: dict[int, int] = {}  # epoch -> the node that led it

    def check_voter(self, node_id: int, epoch: int, is_learner: bool) -> None:
        """A node that just became leader of epoch is a voter."""
        if is_learner:
            self.violations.fail(
                f"election safety: node {node_id} leads epoch {epoch} but is no voter"
            )

    def check_leader(self, node_id: int, epoch: int) -> None:
        """node_id leads epoch now: no other node led it."""
        leader = self.leaders.setdefault(epoch, node_id)
        if leader != node_id:
            self.violations.fail(
                f"election safety: two leaders in epoch {epoch}: {leader} and {node_id}"
            )
