"""The high-water marks: every replica keeps log start <= HW <= LEO, the HW never moves
backwards on a leader within its epoch, and no replica's HW exceeds the highest HW a leader has
declared."""

from __future__ import annotations

from tidelog.testing.sim.failure import Violations
from tidelog.testing.sim.nodes import SimNode


class Watermarks:
    def __init__(self, violations: Violations) -> None:
        self.violations = violations
        self.leader_hw: dict[tuple[int, int], int] = {}  # (node, epoch it led) -> its HW
        self.max_declared_hw = 0

    def check_bounds(self, node: SimNode) -> None:
        log = node.log
        hw = log.high_watermark
        if not log.log_start_offset <= hw <= log.log_end_offset:
            self.violations.fail(
                f"node {node.node_id}: log start {log.log_start_offset} <= HW {hw} <= LEO {log.log_end_offset} broken"
            )

    def check_hw(self, node: SimNode, leading: bool, led: bool) -> None:
        """leading: the node leads now; led: it led until this step (a leader may advance its
        HW and step down in one step, and that HW was still declared by a leader)."""
        hw = node.log.high_watermark
        if leading or (led and node.led_epoch >= 0):
            key = (node.node_id, node.led_epoch)
            if hw < self.leader_hw.get(key, 0):
                self.violations.fail(
                    f"leader {node.node_id} moved its HW back from {self.leader_hw[key]} to {hw}"
                )
            self.leader_hw[key] = hw
            self.max_declared_hw = max(self.max_declared_hw, hw)
        elif hw > self.max_declared_hw:
            self.violations.fail(
                f"node {node.node_id} has HW {hw}, above any leader's ({self.max_declared_hw})"
            )
