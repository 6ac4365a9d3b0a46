"""Log matching: two logs holding a batch with the same offset and epoch are identical up to
it."""

from __future__ import annotations

from tidelog.testing.sim.failure import Violations
from tidelog.testing.sim.nodes import SimNode


def check_log_matching(nodes: dict[int, SimNode], violations: Violations) -> None:
    logs = {
        n: dict((h.base_offset, (h.partition_leader_epoch, b)) for h, b in node.log.batches())
        for n, node in nodes.items()
    }
    ids = list(logs)
    for i, a in enumerate(ids):
        for b in ids[i + 1 :]:
            la, lb = logs[a], logs[b]
            common = sorted(set(la) & set(lb))
            last_match = -1
            for offset in common:
                if la[offset][0] == lb[offset][0]:
                    last_match = offset
            for offset in common:
                if offset > last_match:
                    break
                if la[offset] != lb[offset]:
                    violations.fail(
                        f"log matching: nodes {a} and {b} share epoch {la[last_match][0]} at {last_match} but differ at {offset}"
                    )
