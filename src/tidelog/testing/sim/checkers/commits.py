"""No lost or changed commit: every batch below any replica's HW, and every batch a read
returns, is the one batch ever committed at that offset. What this checker saw committed is
the history the other checkers judge by."""

from __future__ import annotations

from tidelog.record.batch import read_header
from tidelog.testing.sim.failure import Violations
from tidelog.testing.sim.nodes import SimNode


def describe_batch(batch: bytes) -> str:
    header = read_header(batch)
    return f"batch(epoch={header.partition_leader_epoch}, offsets {header.base_offset}..{header.last_offset}, crc={header.crc:#x})"


class CommitHistory:
    def __init__(self, violations: Violations) -> None:
        self.violations = violations
        self.committed: dict[int, bytes] = {}
        self.committed_epochs: dict[int, int] = {}  # a committed batch's end -> its epoch
        self.commit_epochs: dict[int, int] = {}  # a committed batch's base -> when it was seen

    def saw(self, base_offset: int, batch: bytes, where: str, epoch: int) -> None:
        """A batch seen committed (below a replica's HW, or read), by a replica in epoch
        (the epoch it was committed in, at the latest: leaders are checked as they commit)."""
        known = self.committed.setdefault(base_offset, batch)
        if known is batch or known == batch:
            self.commit_epochs.setdefault(base_offset, epoch)
            header = read_header(batch)
            self.committed_epochs[header.next_offset] = header.partition_leader_epoch
            return
        self.violations.fail(
            f"offset {base_offset} was committed as {describe_batch(known)} but {where} holds "
            f"{describe_batch(batch)} (a committed record changed or was lost)"
        )

    def saw_below_hw(self, node: SimNode, epoch: int) -> None:
        """The batches below the node's HW that it had not shown yet (by a replica in epoch)."""
        log = node.log
        hw = log.high_watermark
        if hw > node.checked_upto:
            for header, batch in log.batches_between(
                max(node.checked_upto, log.log_start_offset), hw
            ):
                if header.last_offset < hw:
                    self.saw(
                        header.base_offset,
                        batch,
                        f"node {node.node_id} below its HW {hw}",
                        epoch,
                    )
            node.checked_upto = hw
