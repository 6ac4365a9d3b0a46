"""The simulator's checkers, one module per property. They are checked all the time (Jepsen's
queue properties as invariants), each failure named by the property it breaks, before any
assertion deep in the core would trip:
  - election safety (election.py): at most one leader per epoch, and a leader is a voter of
    its membership
  - vote restriction (votes.py): a vote or pre-vote is granted only to a candidate whose log is
    at least as up to date as the voter's, judged from the voter's log and what the checker saw
    committed (a log holding no entry ends with the committed entry below its log start)
  - leader completeness (completeness.py): a replica that becomes leader holds every batch
    committed so far (from its log start on), so it never tells a follower to cut a committed
    entry
  - committed entries stay (truncation.py): no replica's log loses a committed batch to a
    truncation (a crash losing what it had not flushed, and the log start moving past it, are
    not truncations)
  - no lost or changed commit (commits.py, reads.py): every batch below any replica's HW is the
    one batch ever committed at that offset, and every read returns that batch (no
    non-repeatable read); no read returns a record at or above the HW of the replica it read
    from
  - the watermarks (watermarks.py): the HW never moves backwards on a leader within its epoch,
    and no replica's HW exceeds the highest HW a leader has declared; log start <= LSO <= HW
    everywhere, the LSO never moves back on a leader, and a cleaner's LWM is at most the LSO
  - log matching (log_matching.py): two logs holding a batch with the same offset and epoch are
    identical up to it
  - cursors (cursors.py): no leader's log start passes a cursor that is within its caps
    (checked against the caps as the issue states them, not through the LWM code), and only
    such cursors are invalidated
  - transactions (transactions.py, with SimParams.transactions): read_committed readers see
    no aborted or undecided record, no committed transaction partly, no record twice, and
    lose no committed record
  - transactions across partitions (atomicity.py, with SimParams.transaction_partitions, at the
    end): a reader handed a transaction's records in one partition was handed them in every
    other (none stuck below an LSO that never passes them), none the coordinator aborted, and
    no acknowledged transactional batch lost
Checked at the end (convergence.py, tables.py, linearizable_reads.py): every acks=all record
is in the log at the offset its ack named; for state-machine logs, every replica's table equals
the table built from every committed batch, and the history of the table's clients (writes,
and reads through ReadIndex or the lease) is linearizable, every read answered or failed once
the cluster converged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

from tidelog.config import TopicConfig
from tidelog.invariant import InvariantBroken
from tidelog.record.batch import BatchHeader
from tidelog.testing.sim.checkers.commits import CommitHistory
from tidelog.testing.sim.checkers.completeness import LeaderCompleteness
from tidelog.testing.sim.checkers.cursors import CursorCaps
from tidelog.testing.sim.checkers.election import ElectionSafety
from tidelog.testing.sim.checkers.log_matching import check_log_matching
from tidelog.testing.sim.checkers.reads import check_read
from tidelog.testing.sim.checkers.transactions import TransactionAnomalies
from tidelog.testing.sim.checkers.truncation import CommittedEntriesStay
from tidelog.testing.sim.checkers.votes import VoteRestriction
from tidelog.testing.sim.checkers.watermarks import Watermarks
from tidelog.testing.sim.failure import Violations
from tidelog.testing.sim.nodes import SimNode
from tidelog.testing.sim.params import SimParams


class Checkers:
    """Every checker of one run, over the cluster's nodes, and the history they share."""

    def __init__(
        self,
        params: SimParams,
        config: TopicConfig,
        clock: Callable[[], int],
        nodes: dict[int, SimNode],
    ) -> None:
        self.nodes = nodes
        self.violations = Violations(params, clock)
        self.history = CommitHistory(self.violations)
        self.election = ElectionSafety(self.violations)
        self.votes = VoteRestriction(self.history, self.violations)
        self.completeness = LeaderCompleteness(self.history, self.violations)
        self.truncations = CommittedEntriesStay(self.history, self.violations)
        self.watermarks = Watermarks(self.violations)
        self.cursors = CursorCaps(config, clock, self.violations)
        self.transactions = TransactionAnomalies(self.history, self.violations)

    def fail(self, why: str) -> NoReturn:
        self.violations.fail(why)

    def new_leader(self, node: SimNode) -> None:
        """node just became leader."""
        replica = node.replica
        if replica is None:
            raise InvariantBroken("replica is not None")
        self.election.check_voter(node.node_id, replica.epoch, replica.is_learner)
        self.completeness.check(node, replica.epoch)

    def check_node(self, node: SimNode, led: bool = False) -> None:
        """After each of a live node's steps (led: it lost its leadership in that step)."""
        replica = node.replica
        if replica is None:
            raise InvariantBroken("replica is not None")
        self.watermarks.check_bounds(node)
        if replica.is_leader:
            self.election.check_leader(node.node_id, replica.epoch)
            node.led_epoch = replica.epoch
        self.watermarks.check_stable(
            node, replica.last_stable_offset(), replica.is_leader, replica.epoch
        )
        self.watermarks.check_hw(node, replica.is_leader, led)
        self.history.saw_below_hw(node, replica.epoch)

    def check_log_matching(self) -> None:
        check_log_matching(self.nodes, self.violations)

    def read(self, node: SimNode, header: BatchHeader, batch: bytes, hw: int) -> None:
        """One batch of a read from node, whose HW was hw when it was read."""
        check_read(node, header, batch, hw, self.history, self.violations)
