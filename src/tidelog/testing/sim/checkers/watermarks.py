"""The watermarks: every replica keeps log start <= LSO <= HW <= LEO, the HW never moves
backwards on a leader within its epoch, and no replica's HW exceeds the highest HW a leader has
declared; the LWM a leader's cleaner decides is within log start <= LWM <= LSO (an open
transaction holds the log as a cursor does)."""

from __future__ import annotations

from tidelog.replication.low_watermark import LowWatermark
from tidelog.testing.sim.failure import Violations
from tidelog.testing.sim.nodes import SimNode


class Watermarks:
    def __init__(self, violations: Violations) -> None:
        self.violations = violations
        self.leader_hw: dict[tuple[int, int], int] = {}  # (node, epoch it led) -> its HW
        self.leader_lso: dict[tuple[int, int], int] = {}  # (node, epoch it leads) -> its LSO
        self.max_declared_hw = 0

    def check_bounds(self, node: SimNode) -> None:
        log = node.log
        hw = log.high_watermark
        if not log.log_start_offset <= hw <= log.log_end_offset:
            self.violations.fail(
                f"node {node.node_id}: log start {log.log_start_offset} <= HW {hw} <= LEO {log.log_end_offset} broken"
            )

    def check_stable(self, node: SimNode, lso: int, leading: bool, epoch: int) -> None:
        """log start <= LSO <= HW on every replica; on a leader the LSO never moves back within
        its epoch (a transaction opens at the LEO, at or above the HW)."""
        log = node.log
        if not log.log_start_offset <= lso <= log.high_watermark:
            self.violations.fail(
                f"node {node.node_id}: log start {log.log_start_offset} <= LSO {lso} <= HW "
                f"{log.high_watermark} broken"
            )
        if leading:
            key = (node.node_id, epoch)
            if lso < self.leader_lso.get(key, 0):
                self.violations.fail(
                    f"leader {node.node_id} moved its LSO back from {self.leader_lso[key]} to "
                    f"{lso} in epoch {epoch}"
                )
            self.leader_lso[key] = lso

    def check_low_watermark(self, node: SimNode, lwm: LowWatermark, lso: int) -> None:
        """As the leader's cleaner decided it, before it moved the log start."""
        if not node.log.log_start_offset <= lwm.offset <= lso:
            self.violations.fail(
                f"node {node.node_id}: log start {node.log.log_start_offset} <= LWM "
                f"{lwm.offset} <= LSO {lso} broken (set by {lwm.hold.describe()})"
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
