"""Vote restriction: a vote or pre-vote is granted only to a candidate whose log is at least as
up to date as the voter's, judged from the voter's log and what the checker saw committed (a
log holding no entry ends with the committed entry below its log start)."""

from __future__ import annotations

from tidelog.replication.messages import Message, VoteRequest, VoteResponse
from tidelog.testing.sim.checkers.commits import CommitHistory
from tidelog.testing.sim.failure import Violations
from tidelog.testing.sim.nodes import SimLog


class VoteRestriction:
    def __init__(self, history: CommitHistory, violations: Violations) -> None:
        self.history = history
        self.violations = violations
        # The last request each voter got from each candidate: (voter, candidate, epoch, pre)
        self.asked: dict[tuple[int, int, int, bool], tuple[int, int]] = {}

    def delivered(self, voter: int, candidate: int, message: Message) -> None:
        """A message handed to a voter: what it is asked is noted, so that the checker can
        tell what each grant answered."""
        if isinstance(message, VoteRequest):
            self.asked[(voter, candidate, message.epoch, message.pre_vote)] = (
                message.last_epoch,
                message.log_end_offset,
            )

    def sent(self, voter: int, candidate: int, message: Message, log: SimLog) -> None:
        """Raft's election restriction, from the checker's own view of the voter's log: a vote
        (or pre-vote) is granted only to a candidate whose log is at least as up to date. A log
        holding no entry ends with the committed entry below its log start, whose epoch the
        checker knows from what it saw committed, whatever the voter's epoch history says."""
        if not isinstance(message, VoteResponse) or not message.granted:
            return
        claimed = self.asked.get((voter, candidate, message.epoch, message.pre_vote))
        if claimed is None:
            return
        mine = (self._last_epoch(log), log.log_end_offset)
        if mine[0] is not None and claimed < mine:
            kind = "pre-vote" if message.pre_vote else "vote"
            self.violations.defer(
                f"vote restriction: node {voter} granted its {kind} in epoch {message.epoch} to "
                f"node {candidate}, whose log ends at (e{claimed[0]},{claimed[1]}), behind its "
                f"own (e{mine[0]},{mine[1]})"
            )

    def _last_epoch(self, log: SimLog) -> int | None:
        """The epoch of the log's last entry (None: not known to the checker)."""
        start, end = log.log_start_offset, log.log_end_offset
        if end > start:
            return log.batches()[-1][0].partition_leader_epoch
        if end == 0:
            return -1
        for header, _ in log.batches_between(end - 1, end):
            return header.partition_leader_epoch
        epoch = self.history.committed_epochs.get(end)
        return epoch
