"""At the end of the liveness phase (every fault healed): the members converged to their
leader's log, with HW = LEO, and every acks=all record is in it at the offset its ack named
(unless the low-water mark deleted it since)."""

from __future__ import annotations

from tidelog.record.batch import BatchHeader
from tidelog.testing.sim.failure import Violations
from tidelog.testing.sim.nodes import SimNode


def check_converged(
    leader: SimNode, members: list[SimNode], acked: dict[bytes, int], violations: Violations
) -> None:
    start = max(n.log.log_start_offset for n in members)

    def kept(node: SimNode) -> list[tuple[BatchHeader, bytes]]:
        # A follower that started over at the log start lacks a batch straddling it.
        return [(h, b) for h, b in node.log.batches() if h.base_offset >= start]

    reference = kept(leader)
    for node in members:
        if kept(node) != reference:
            violations.fail(f"liveness: node {node.node_id} did not converge to the leader's log")
        if node.log.high_watermark != node.log.log_end_offset:
            violations.fail(
                f"liveness: node {node.node_id} HW {node.log.high_watermark} != LEO {node.log.log_end_offset}"
            )
    final = {h.base_offset: b for h, b in reference}
    for value, offset in acked.items():
        if offset < start:
            continue  # deleted by the low-water mark: gone by design
        batch = final.get(offset)
        if batch is None or value not in batch:
            violations.fail(
                f"acknowledged (acks=all) record {value.decode()} is not at offset {offset}"
            )
