"""At the end of a transactional run: every member's transaction state, kept up batch by batch
as it appended, copied, truncated, deleted and compacted, must say what a scan of the log it
holds derives (what an unclean restart, or a new follower, would rebuild). A difference means
replicas can disagree on the LSO, on the compaction bound, or on what read_committed drops.

Compared: where each undecided transaction holds the LSO from (storage/transactions.py: its
first batch reaching past the log start), and the LSO; and the batches the aborted lists make
a read_committed reader drop. The lists themselves may differ where that changes nothing: an
aborted transaction whose first batches were deleted keeps its first offset in memory (a scan
starts it at its first batch left, or, with none left, does not list it)."""

from __future__ import annotations

from collections.abc import Iterable

from tidelog.record.batch import BatchHeader
from tidelog.record.markers import read_marker
from tidelog.storage.transactions import AbortedTransaction, TransactionState
from tidelog.testing.sim.failure import Violations
from tidelog.testing.sim.nodes import SimNode


def check_derived_transactions(members: list[SimNode], violations: Violations) -> None:
    for node in members:
        check_node_transactions(node, violations)


def check_node_transactions(node: SimNode, violations: Violations) -> None:
    """One replica's state against a scan of its log, and against a scan of only what every
    replica holds (the batches reaching past the log start): segments are cut at different
    offsets on each replica, and the LSO must not depend on where (also run right after
    segments go, where a state kept in memory and a scan's part first)."""
    log = node.log
    batches = log.batches()
    hw, start = log.high_watermark, log.log_start_offset
    kept = log.transactions
    mine = kept.holding_from(hw, start)
    for what, seen in (
        ("a scan of its log", batches),
        (
            "a scan of what every replica holds",
            [(h, b) for h, b in batches if h.next_offset > start],
        ),
    ):
        scan = TransactionState()
        scan.rebuild(
            ((h, read_marker(b, h) if h.is_transactional else None) for h, b in seen), hw, 0
        )
        scanned = scan.holding_from(hw, start)
        if mine != scanned:
            violations.fail(
                f"node {node.node_id}: undecided transactions hold the LSO from {mine}, "
                f"{what} says {scanned}"
            )
        if kept.stable_offset(hw, start) != scan.stable_offset(hw, start):
            violations.fail(f"node {node.node_id}: its LSO differs from what {what} derives")
        headers = [h for h, _ in seen]
        dropped, dropped_by_scan = _dropped(headers, kept.aborted), _dropped(headers, scan.aborted)
        if dropped != dropped_by_scan:
            violations.fail(
                f"node {node.node_id}: its aborted list drops the batches at "
                f"{sorted(dropped)}, {what}'s at {sorted(dropped_by_scan)}"
            )


def _dropped(headers: list[BatchHeader], aborted: Iterable[AbortedTransaction]) -> set[int]:
    """The base offsets of the data batches a read_committed reader drops by this list."""
    spans: dict[int, list[tuple[int, int]]] = {}
    for t in aborted:
        spans.setdefault(t.producer_id, []).append((t.first_offset, t.marker_offset))
    return {
        h.base_offset
        for h in headers
        if h.is_transactional
        and not h.is_control
        and any(a <= h.base_offset < b for a, b in spans.get(h.producer_id, ()))
    }
