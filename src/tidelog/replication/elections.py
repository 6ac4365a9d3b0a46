"""Elections: pre-vote and vote (Raft, with KRaft's and etcd's pre-vote).

A replica whose election timer runs out first asks for pre-votes for the next epoch, which move
nobody's epoch; only with a majority of its membership's voters does it raise its own epoch and
ask for votes. A voter grants its vote at most once per epoch (durably, before it answers), and
only to a candidate whose log is at least as up to date as its own (Raft's election
restriction); it grants no pre-vote while it hears from a live leader. Learners and observers
(replaced disks) do not stand when their timer runs out.
"""

from __future__ import annotations

from tidelog.replication.faults import FAULT_EMPTY_LOG_FORGETS_EPOCH
from tidelog.replication.leading import Leading
from tidelog.replication.messages import Resign, VoteRequest, VoteResponse
from tidelog.replication.quorum import majority
from tidelog.replication.ready import NO_VOTE
from tidelog.replication.replica_state import NO_LEADER, Role


class Elections(Leading):
    """Standing for election and voting (a candidate becomes leader, or follows)."""

    # -- who stands, and whose log is up to date ------------------------------------------------

    @property
    def _single_voter(self) -> bool:
        """The only voter of its membership: it leads without asking anyone. Never a replaced
        disk (an observer): catching up, its log may end in a membership of it alone that the
        group left long ago, and it elected itself on a restart, without 300 committed
        records (fresh seed 368196973)."""
        return self.voters == (self.node_id,) and not self.is_learner and not self.is_observer

    @property
    def _may_stand(self) -> bool:
        """Stands when its election timer runs out: not a learner, not a replaced disk catching
        up (an observer), not a replica whose node is stopping (leaving)."""
        return not (self.is_observer or self.is_learner or self.leaving)

    @property
    def _hears_leader(self) -> bool:
        """A follower that heard from its leader within an election timeout."""
        if self.role is not Role.FOLLOWER or self.leader_id == NO_LEADER:
            return False
        if self.quiesced:
            return self._quiesced_leader_alive()
        return self.now - self.last_leader_contact < self.config.election_timeout_ticks

    @property
    def _last_epoch(self) -> int:
        """The epoch of the log's last entry; for a log that holds none, of the last entry below
        its log start (its prefix epoch: a Raft snapshot's last term)."""
        if (
            FAULT_EMPTY_LOG_FORGETS_EPOCH in self.config.faults
            and self.log.log_start_offset == self.log.log_end_offset
        ):
            return -1
        return self.log.epochs.latest_epoch

    def _log_is_up_to_date(self, last_epoch: int, log_end_offset: int) -> bool:
        """Raft's election restriction: a vote only for a candidate whose log ends in a later
        epoch than ours, or in the same one no shorter. Nothing else stops a candidate that
        lacks committed entries: votes are granted without consulting memberships (Raft thesis
        4.1, KRaft's handleVoteRequest), so a voter of a membership the group left long ago
        still counts for a stale candidate that has nothing later (seed 300028)."""
        mine = (self._last_epoch, self.log.log_end_offset)
        return (last_epoch, log_end_offset) >= mine

    # -- campaigns ------------------------------------------------------------------------------

    def _start_prevote(self) -> None:
        self._set_role(Role.PROSPECTIVE)
        self.leader_id = NO_LEADER
        self.votes = {self.node_id}
        self._reset_election_timer()
        if self._single_voter:
            self._start_election()
            return
        request = VoteRequest(
            self.epoch + 1,
            self.node_id,
            self._last_epoch,
            self.log.log_end_offset,
            pre_vote=True,
            admitted=self.is_admitted,
        )
        self._ask_voters(request)

    def _start_election(self) -> None:
        self._set_role(Role.CANDIDATE)
        self._set_state(self.epoch + 1, self.node_id)
        self.leader_id = NO_LEADER
        self.votes = {self.node_id}
        self._reset_election_timer()
        if self._single_voter:
            self._become_leader()
            return
        request = VoteRequest(
            self.epoch,
            self.node_id,
            self._last_epoch,
            self.log.log_end_offset,
            pre_vote=False,
            admitted=self.is_admitted,
        )
        self._ask_voters(request)

    def _ask_voters(self, request: VoteRequest) -> None:
        self._vote_request = request
        self._asked = set()
        for v in self._others():
            self._send(v, request)
            if self.liveness is None or self.liveness.is_alive(v):
                self._asked.add(v)

    def _ask_voters_come_alive(self) -> None:
        """A campaign's request to a voter whose node was not alive went nowhere (no link yet):
        now that it is, ask again (a duplicate request gets the same answer). Called only while
        we campaign, so the request is this campaign's: each one stores its own."""
        request = self._vote_request
        if request is None or self.liveness is None:
            return
        for v in self._others():
            if v not in self._asked and v not in self.votes and self.liveness.is_alive(v):
                self._asked.add(v)
                self._send(v, request)

    # -- votes ----------------------------------------------------------------------------------

    def _on_vote_request(self, sender: int, req: VoteRequest) -> None:
        up_to_date = self._log_is_up_to_date(req.last_epoch, req.log_end_offset)
        if self.role is Role.LEADER and sender in self.progress and self.progress[sender].quiesced:
            # A quiesced follower that stands for election restarted (or lost its leader's
            # word): tell it who leads.
            self._wake_progress(sender, self.progress[sender])
        if self.quiesced and req.candidate == self.leader_id:
            # Our leader campaigns: it no longer leads (it stepped down, or restarted and
            # forgot); trusting its liveness, we would refuse it for good.
            self.quiesced = False
            self.leader_id = NO_LEADER
            self.last_leader_contact = -(10**12)
        if req.pre_vote:
            # A replica that restarted less than an election timeout ago may have heard a
            # leader just before it stopped: it refuses as if it still heard it, so a leader's
            # lease (read_index.py) holds across the restart of a voter that confirmed it.
            just_started = (
                self.restarted_tick is not None
                and self.now - self.restarted_tick < self.config.election_timeout_ticks
            )
            leader_alive = self.role is Role.LEADER or self._hears_leader or just_started
            granted = req.epoch > self.epoch and up_to_date and not leader_alive
            # A refusal carries our own epoch (etcd's rule): a prospective candidate behind it
            # moves up, or two nodes each refusing the other's pre-vote could wait forever.
            epoch = req.epoch if granted else self.epoch
            self._send(
                sender,
                VoteResponse(epoch, self.node_id, granted, True, self.leader_id, self.is_admitted),
            )
            return
        granted = (
            req.epoch == self.epoch
            and self.voted_for in (NO_VOTE, req.candidate)
            and self.role is not Role.LEADER
            and up_to_date
        )
        if granted:
            self._set_state(self.epoch, req.candidate)
            self._reset_election_timer()
        self._send(
            sender,
            VoteResponse(
                self.epoch, self.node_id, granted, False, self.leader_id, self.is_admitted
            ),
        )

    def _on_vote_response(self, sender: int, resp: VoteResponse) -> None:
        if resp.pre_vote:
            if self.role is not Role.PROSPECTIVE or resp.epoch != self.epoch + 1:
                return
            if not resp.granted or sender not in self.voters:
                return
            self.votes.add(sender)
            if self._won():
                self._start_election()
            return
        if self.role is not Role.CANDIDATE or resp.epoch != self.epoch or not resp.granted:
            return
        if sender in self.voters:  # a vote counts only from a voter of our own membership
            self.votes.add(sender)
        if self._won():
            self._become_leader()

    def _won(self) -> bool:
        """A majority of our newest membership's voters (ourselves only if we are one)."""
        return len(self.votes & set(self.voters)) >= majority(len(self.voters))

    # -- a leader hands over --------------------------------------------------------------------

    def _on_resign(self, sender: int, msg: Resign) -> None:
        if msg.epoch != self.epoch or self.leader_id != sender or self.role is not Role.FOLLOWER:
            return
        self.leader_id = NO_LEADER  # no longer alive, as far as pre-votes are concerned
        self.quiesced = False
        self.last_leader_contact = -(10**12)
        if msg.successor == self.node_id and not (self.is_learner or self.leaving):
            self._start_election()
