"""Reads: no read returns a record at or above the HW of the replica it read from, and every
batch a read returns is the one committed at its offset (no non-repeatable read)."""

from __future__ import annotations

from tidelog.record.batch import BatchHeader
from tidelog.testing.sim.checkers.commits import CommitHistory
from tidelog.testing.sim.failure import Violations
from tidelog.testing.sim.nodes import SimNode


def check_read(
    node: SimNode,
    header: BatchHeader,
    batch: bytes,
    hw: int,
    history: CommitHistory,
    violations: Violations,
) -> None:
    """One batch of a read from node, whose HW was hw when it was read."""
    if header.last_offset >= hw:
        violations.fail(
            f"node {node.node_id} returned offset {header.last_offset} at or above its HW {hw}"
        )
    epoch = node.replica.epoch if node.replica is not None else 1 << 62
    history.saw(header.base_offset, batch, f"read from node {node.node_id}", epoch)
