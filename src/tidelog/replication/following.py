"""The follower's side of a replica: whom it follows, and fetching from that leader.

A follower fetches from its log end, naming the epoch of its last entry. The leader answers
with records, or with where their logs part (the follower truncates there), or with its log
start to start over at (a state-machine log first installs the leader's snapshot, chunk by
chunk: snapshot_transfer.py). Only an answer that matches the follower's log moves its HW, up
to its log end. A follower fetches ahead of its own fsync and reports what it holds durably in
its next fetch; the leader counts only that. Told to quiesce, it stops fetching until its
leader wakes it, or the node's liveness says the leader's node died or restarted
(quiescence.py).

Invariants:
    at most one fetch (or snapshot request) is outstanding: fetch_in_flight
    a divergence never truncates below the HW (else CommittedPrefixBroken: the node fails stop)
    the log start never passes the HW nor, in a state-machine log, its own newest snapshot
"""

from __future__ import annotations

from tidelog.invariant import InvariantBroken
from tidelog.record.batch import read_header
from tidelog.replication.faults import FAULT_DISCARD_PAST_SNAPSHOT, FAULT_TRUNCATE_TO_HW
from tidelog.replication.messages import (
    FETCH_FENCED,
    FETCH_NOT_LEADER,
    BeginEpoch,
    EpochNotice,
    FetchRequest,
    FetchResponse,
    FetchSnapshotResponse,
)
from tidelog.replication.quiescence import first_to_stand, follower_may_quiesce
from tidelog.replication.ready import NO_VOTE
from tidelog.replication.replica_state import NO_LEADER, ReplicaState, Role
from tidelog.replication.snapshot_transfer import SnapshotFetch


class CommittedPrefixBroken(AssertionError):
    """An invariant failed: a rule the design depends on is broken (the node fails stop)."""


class Following(ReplicaState):
    """The follower's side of a replica."""

    # -- whom to follow -------------------------------------------------------------------------

    def _become_follower(self, epoch: int, leader: int) -> None:
        voted = self.voted_for if epoch == self.epoch else NO_VOTE
        self._set_state(epoch, voted)
        self._set_role(Role.FOLLOWER)
        self.leader_id = leader
        self.quiesced = False
        self.heard_read_round = 0  # rounds are a leadership's own
        self.fetch_in_flight = False
        self.reported_durable = -1
        self.installing = None
        self.last_leader_contact = self.now
        self._reset_election_timer()
        if FAULT_TRUNCATE_TO_HW in self.config.faults and leader != NO_LEADER:
            # The pre-KIP-101 bug: trusting the local HW as the end of the committed log.
            self.log.truncate_to(self.log.high_watermark)
            self._truncated()
        self._maybe_send_fetch()

    def _on_begin_epoch(self, sender: int, msg: BeginEpoch) -> None:
        if msg.epoch < self.epoch:
            return
        if self.role is not Role.FOLLOWER or self.leader_id != msg.leader:
            self._become_follower(msg.epoch, msg.leader)
        self._heard_read_round(msg.read_round)
        if self.quiesced:
            self._unquiesce_follower(leader_dead=False)  # the leader has news: fetch it

    def _on_epoch_notice(self, sender: int, msg: EpochNotice) -> None:
        """(A later epoch was handled above, as for any message.) In our own epoch, a notice
        from the epoch's leader itself tells us whom to follow."""
        if (
            msg.epoch == self.epoch
            and self.role is not Role.LEADER
            and msg.leader == sender
            and (self.role is not Role.FOLLOWER or self.leader_id != msg.leader)
        ):
            self._become_follower(msg.epoch, msg.leader)

    def _unquiesce_follower(self, leader_dead: bool) -> None:
        self.quiesced = False
        self.fetch_in_flight = False
        if leader_dead:
            # One voter stands at once, the others after a jitter (their votes would split).
            self.last_leader_contact = -(10**12)
            first = first_to_stand(self.voters, self.leader_id, self.epoch, self.liveness)
            jitter = self.config.election_jitter_ticks
            wait = 0 if first in (None, self.node_id) else jitter // 2 + self.rng.randint(0, jitter)
            self.election_deadline = self.now + wait
        else:
            self.last_leader_contact = self.now
            self._reset_election_timer()
        self._maybe_send_fetch()

    # -- fetching from the leader ---------------------------------------------------------------

    def _maybe_send_fetch(self, report_durability: bool = False) -> None:
        if self.role is not Role.FOLLOWER or self.leader_id == NO_LEADER or self.quiesced:
            return
        if self.fetch_in_flight and not report_durability:
            return
        if self.installing is not None:
            if not self.fetch_in_flight:
                self._request_snapshot_chunk()
            return
        # Fetch ahead of our own fsync (the answer's records overlap it); the leader counts
        # only durable_offset toward the HW, and a later request reports the fsync.
        durable = self.log.effective_durable_end
        self.fetch_in_flight = True
        self.fetch_sent_tick = self.now
        self.reported_durable = durable
        self._send(
            self.leader_id,
            FetchRequest(
                self.epoch,
                self.node_id,
                self.log.log_end_offset,
                self.log.epochs.latest_epoch,
                self.log.high_watermark,
                self.config.fetch_max_bytes,
                durable,
                self.admission.crc,
                self.history.current.digest,
                self.heard_read_round,
            ),
        )

    def _heard_read_round(self, read_round: int) -> None:
        """A message from this epoch's leader, sent after it started read_round: our next fetch
        tells it so (read_index.py)."""
        self.heard_read_round = max(self.heard_read_round, read_round)

    def _on_fetch_response(self, sender: int, resp: FetchResponse) -> None:
        if resp.epoch < self.epoch:
            return
        if resp.error:
            if resp.leader == sender and resp.leader != self.leader_id and resp.epoch == self.epoch:
                self._become_follower(self.epoch, resp.leader)
            elif sender == self.leader_id:
                self.fetch_in_flight = False
            return
        if self.role is not Role.FOLLOWER or self.leader_id != sender:
            self._become_follower(resp.epoch, sender)
            return
        self._heard_read_round(resp.read_round)  # (a late answer was sent after it, too)
        if (
            resp.fetch_offset != self.log.log_end_offset
            or resp.last_fetched_epoch != self.log.epochs.latest_epoch
            or not self.fetch_in_flight
        ):
            return  # a late or duplicated answer, computed for a log we no longer have
        self.fetch_in_flight = False
        self.last_leader_contact = self.now
        self._reset_election_timer()
        if resp.directories:
            self.admission.adopt(resp.directories)
        self.leader_high_watermark = resp.high_watermark
        self.leader_log_start = resp.log_start_offset
        if resp.snapshot_required and self.config.state_machine and self.snapshots is not None:
            # A state-machine log cannot skip what the leader discarded: take its snapshot.
            self.installing = SnapshotFetch(self.snapshots)
        elif resp.snapshot_required:
            # A stream has no state to rebuild: start over at the leader's log start.
            self._start_over(resp.log_start_offset, resp.memberships, resp.log_start_epoch)
        elif resp.diverging:
            self._truncate_diverging(resp.diverging_epoch, resp.diverging_end_offset)
        else:
            # Only an answer without divergence proves our log matches the leader's up to the
            # fetch offset, so only then may the leader's HW become ours (up to our log end).
            records = resp.records if resp.records is not None and resp.records.size > 0 else None
            if records is not None:
                data = records.read()
                self._start_at_first_batch(data)
                self.log.append_as_follower(data)
            if resp.memberships and self.history.adopt(
                resp.memberships, resp.fetch_offset, self.log.log_end_offset
            ):
                self._persist_state()
            self._follow_high_watermark(resp.high_watermark)
            self._follow_log_start(resp.log_start_offset)
            if resp.quiesce and follower_may_quiesce(
                self.liveness, sender, records is not None, self.log, self.installing is not None
            ):
                self.quiesced = True
                if self.liveness is None:
                    raise InvariantBroken("self.liveness is not None")
                self.quiesced_incarnation = self.liveness.incarnation(sender)
                return  # no next fetch: the leader wakes us with news
            if (
                records is not None
                and records.size < self.config.fetch_max_bytes // 2
                and self.log.effective_durable_end < self.log.log_end_offset
            ):
                # The leader had no more than this: the next fetch goes when the fsync is done
                # (on_flushed), carrying the durability report the HW waits for, instead of one
                # fetch now and a report after. A full answer means more is waiting: fetch
                # ahead, overlapping the transfer with the fsync.
                return
        self._maybe_send_fetch()

    def _start_at_first_batch(self, data: bytes | bytearray | memoryview) -> None:
        """A log that started over at the leader's log start holds nothing yet. When that start
        lies inside one of the leader's batches (delete-records, or a cursor's LWM, may put it
        there), the leader answers with the whole batch: the log begins at the batch's base
        instead, as Kafka's follower does on its UnexpectedAppendOffsetException, and its log
        start follows the leader's again once the batch is committed here. Refusing the batch,
        the follower fetched the same answer forever and never caught up (simulator seed 39,
        --delete-records). The epoch below the batch is not known here: the batch's own stands
        for it, and is the log's last epoch as soon as the batch is appended."""
        first = read_header(data)
        end = self.log.log_end_offset
        if first.base_offset < end < first.next_offset and end == self.log.log_start_offset:
            self.log.truncate_fully_and_start_at(first.base_offset, first.partition_leader_epoch)
            self._ready.truncated = True

    def _truncate_diverging(self, epoch: int, end_offset: int) -> None:
        local_epoch, local_end = self.log.epochs.end_offset_for(epoch, self.log.log_end_offset)
        target = min(local_end, end_offset) if local_epoch == epoch else local_end
        target = max(target, self.log.log_start_offset)
        if target < self.log.log_end_offset:
            if target < self.log.high_watermark and FAULT_TRUNCATE_TO_HW not in self.config.faults:
                # A leader that lacks what we committed (it was elected by a broken rule). Not an
                # `assert`, which `python -O` strips: the node fails stop instead of cutting.
                raise CommittedPrefixBroken(
                    f"replica {self.node_id}: told to truncate to {target}, below its HW "
                    f"{self.log.high_watermark}: divergence never reaches below the committed "
                    "prefix"
                )
            self.log.truncate_to(target)
            self._truncated()

    def _follow_log_start(self, leader_log_start: int) -> None:
        """Discard the prefix the leader discarded: only what is committed here too and, for a
        state-machine log, only what this replica's own newest snapshot covers (as in Raft,
        each replica compacts behind its own snapshot). A restart rebuilds the machine from
        that snapshot and the log after it; discarding past it strands the machine below the
        log start with nothing to bring it forward (simulator seeds 6 and 91, found when the
        simulator began to run the production state-machine driver)."""
        target = min(leader_log_start, self.log.high_watermark)
        if (
            self.config.state_machine
            and self.snapshots is not None
            and FAULT_DISCARD_PAST_SNAPSHOT not in self.config.faults
        ):
            latest = self.snapshots.latest_snapshot()
            target = min(target, latest[0] if latest is not None else self.log.log_start_offset)
        if target > self.log.log_start_offset and self.log.advance_log_start(target):
            self._log_start_moved()

    def _follow_high_watermark(self, leader_hw: int) -> None:
        hw = min(leader_hw, self.log.log_end_offset)
        if hw > self.log.high_watermark:
            self.log.set_high_watermark(hw)
            self._ready.high_watermark_changed = True

    # -- snapshots (snapshot_transfer.py) -------------------------------------------------------

    def _request_snapshot_chunk(self) -> None:
        if self.installing is None:
            raise InvariantBroken("self.installing is not None")
        request = self.installing.request(self.epoch, self.node_id, self.config.fetch_max_bytes)
        self.fetch_in_flight = True
        self.fetch_sent_tick = self.now
        self._send(self.leader_id, request)

    def _on_fetch_snapshot_response(self, sender: int, resp: FetchSnapshotResponse) -> None:
        if resp.epoch < self.epoch or self.installing is None:
            return
        if self.role is not Role.FOLLOWER or self.leader_id != sender:
            self._become_follower(resp.epoch, sender)
            return
        if not self.fetch_in_flight or not self.installing.answers(resp):
            return  # a late or duplicated answer
        self.fetch_in_flight = False
        if resp.error in (FETCH_NOT_LEADER, FETCH_FENCED):
            # It leads no more: no word from a leader, and the election timer runs on. (Taken
            # for the leader's word, it kept a follower installing a snapshot from refusing
            # every pre-vote for good: fresh seed 546208268.)
            return
        self.last_leader_contact = self.now
        self._reset_election_timer()
        if resp.error:
            return  # (no snapshot yet) asked again on the next tick
        if self.installing.take(resp):
            self._start_over(resp.snapshot_offset, resp.memberships, resp.snapshot_epoch)
            self._ready.snapshot_installed = resp.snapshot_offset
            self.installing = None
            self._maybe_send_fetch()
            return
        self._request_snapshot_chunk()

    # -- the log's changes, and the membership history in it ------------------------------------

    def _truncated(self) -> None:
        """The log lost its tail: so did the membership changes in it."""
        self._ready.truncated = True
        if self.history.truncate(self.log.log_end_offset):
            self._persist_state()

    def _start_over(self, offset: int, encoded: str, prefix_epoch: int) -> None:
        """The log starts over at offset (a leader's log start or snapshot), with the membership
        the leader had there, and the epoch of the leader's entry below it as its last epoch
        (an empty log that claimed epoch -1 granted its vote to candidates missing what it had
        committed: simulator seed 300028)."""
        self.log.truncate_fully_and_start_at(offset, prefix_epoch)
        self._ready.truncated = True
        self.history.start_over_at(offset, encoded)
        self._persist_state()

    def _log_start_moved(self) -> None:
        self._ready.log_start_changed = True
        if self.history.forget_below(self.log.log_start_offset):
            self._persist_state()
