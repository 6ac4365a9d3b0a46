"""State-machine logs: at the end, every replica's table equals the table built from every
committed batch, applied in order, whether it got there by applying records or by installing
its leader's snapshot."""

from __future__ import annotations

from tidelog.invariant import InvariantBroken
from tidelog.record.batch import decode_records, read_header
from tidelog.replication.table import TableState
from tidelog.testing.sim.checkers.commits import CommitHistory
from tidelog.testing.sim.failure import Violations
from tidelog.testing.sim.nodes import SimNode


def check_tables(
    high_watermark: int,
    members: list[SimNode],
    history: CommitHistory,
    violations: Violations,
) -> None:
    expected = TableState()
    offset = 0
    for base in sorted(history.committed):
        if base != offset:
            violations.fail(f"the checker saw no committed batch at {offset} (next: {base})")
        batch = history.committed[base]
        header = read_header(batch)
        if not header.is_control:
            expected.apply(decode_records(batch))
        offset = header.next_offset
    if offset != high_watermark:
        violations.fail(
            f"the checker saw committed batches up to {offset}, the HW is {high_watermark}"
        )
    for node in members:
        table = node.table
        if table is None:
            raise InvariantBroken("table is not None")
        if table.applied_offset != offset or table.entries != expected.entries:
            violations.fail(
                f"node {node.node_id}'s table (applied to {table.applied_offset}, "
                f"{len(table.entries)} keys) is not the committed log's (to {offset}, "
                f"{len(expected.entries)} keys)"
            )
