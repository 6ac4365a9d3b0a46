"""Linearizable table reads: at the end of a state-machine run, the history the table's clients
saw (table_clients.py: unique values written to a few keys, keys read through ReadIndex or the
lease) is linearizable (testing/linearizability.py); and once the cluster has healed and
converged, every read is answered or failed within a few round trips (a leader that keeps its
leadership confirms its reads; one that loses it fails them)."""

from __future__ import annotations

from collections.abc import Sequence

from tidelog.testing.linearizability import Operation, Verdict, check
from tidelog.testing.sim.failure import Violations

# Ticks a converged cluster has to answer every read still waiting: a few fetch round trips
# (a follower's retry included), far more than a healthy leader needs.
READ_DRAIN_TICKS = 200


def check_linearizable_reads(
    history: Sequence[Operation], unanswered: Sequence[str], violations: Violations
) -> Verdict:
    if unanswered:
        violations.fail(
            f"linearizable table reads: {len(unanswered)} reads still unanswered "
            f"{READ_DRAIN_TICKS} ticks after the cluster converged; the first: {unanswered[0]}"
        )
    verdict = check(history)
    if not verdict.linearizable:
        violations.fail(f"linearizable table reads: {verdict.explain()}")
    return verdict
