"""The leader's side of a replica: serving fetches, the high-water mark, check-quorum, the
membership walk.

A leader answers each fetch that matches its log with records, or parks it until there is
something to say. It counts what each follower reports durable (progress.py) and moves the HW
to what a quorum of voters holds (hw.policy=isr: what the in-sync ones hold, padded to a
quorum), once an entry of its own epoch is among it (Raft's 5.4.2). It resends BeginEpoch to
voters that do not fetch, wakes quiesced followers when it has news, steps down when it has
not heard from a quorum for check_quorum_ticks (check-quorum), and walks the group towards
its target voters one membership change at a time. When its node stops, it first hands its
leadership to an in-sync voter (a controlled shutdown: Replica.hand_over).

Invariants:
    the HW never decreases while it leads, and never passes its log end
    a follower counts toward the HW only up to what it reported durable; an observer, not at all
"""

from __future__ import annotations

import json

from tidelog.invariant import InvariantBroken, invariant
from tidelog.record.batch import ProducerRecord, build_batch
from tidelog.replication.faults import FAULT_COMMIT_OLD_EPOCH, FAULT_UNCOMMITTED_CHANGES
from tidelog.replication.fetch_serving import (
    answer_now,
    divergence,
    must_start_over,
    refusal,
    start_over_point,
)
from tidelog.replication.following import Following
from tidelog.replication.membership import Membership, next_membership
from tidelog.replication.messages import (
    FETCH_FENCED,
    FETCH_NOT_LEADER,
    BeginEpoch,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    Resign,
    TransferLeadership,
)
from tidelog.replication.progress import Progress, heard_from, in_sync, next_due, reported_durable
from tidelog.replication.quiescence import alive, alive_as_quiesced, leader_may_quiesce
from tidelog.replication.quorum import isr_offset, majority, quorum_offset
from tidelog.replication.read_index import ReadIndex
from tidelog.replication.replica_state import NO_LEADER, Role
from tidelog.replication.snapshot_transfer import snapshot_answer, snapshot_refusal

LEADER_CHANGE_CONTROL_KEY = b"\x00\x00\x00\x02"  # Kafka's control record key: version 0, type 2


class Leading(Following):
    """The leader's side of a replica (it steps down through the follower's side)."""

    # -- taking the lead ------------------------------------------------------------------------

    def _become_leader(self) -> None:
        self._set_role(Role.LEADER)
        self.leader_id = self.node_id
        self.leader_since_tick = self.now
        self.epoch_start_offset = self.log.log_end_offset
        self.progress = {
            r: Progress(last_fetch_tick=self.now, begin_sent_tick=self.now)
            for r in self._others() + list(self.learners)
        }
        self.admission.lead()
        self.reads = ReadIndex()  # never a round, nor a lease, of an earlier leadership
        if self.log.log_end_offset > self.log.high_watermark:
            # Entries of earlier epochs may be uncommitted; only an entry of our own epoch on a
            # quorum commits them (Raft section 5.4.2), so write one now rather than waiting
            # for a producer.
            self.log.append_as_leader(self._leader_change_marker(), self.epoch)
        for v in self.progress:
            self._send(v, BeginEpoch(self.epoch, self.node_id))
        self._after_leader_append()

    def _leader_change_marker(self) -> bytes:
        value = {"leader": self.node_id, "epoch": self.epoch, "voters": list(self.voters)}
        record = ProducerRecord(LEADER_CHANGE_CONTROL_KEY, json.dumps(value).encode())
        return build_batch([record], control=True, now_ms=0)

    def _after_leader_append(self) -> None:
        self._wake_quiesced()
        self._maybe_advance_high_watermark()
        self._complete_pending_fetches()

    # -- what is due ----------------------------------------------------------------------------

    def _leader_deadline(self) -> int | None:
        if self._changing_membership() or self.leaving:
            # A membership change (and its throttled catch-up) walks tick by tick, and a hand-over
            # looks every tick whether its successor is ready.
            return self.now + 1
        return next_due(
            self.progress,
            self.now,
            self.log.high_watermark,
            self.leader_since_tick,
            self.config,
            self._counts,
        )

    def _leader_tick(self, elapsed: int = 1) -> None:
        retry = self.config.fetch_retry_ticks
        if self.learner_bytes_per_tick > 0:
            self._learner_budget = min(
                self._learner_budget + self.learner_bytes_per_tick * elapsed,
                10 * self.learner_bytes_per_tick,
            )
        if self._changing_membership():
            self._wake_quiesced()  # the walk needs its followers fetching (caught up, alive)
        self._maybe_change_membership()
        if self.role is not Role.LEADER:
            return
        hw = self.log.high_watermark
        for r, p in self.progress.items():
            if p.quiesced:
                if not alive_as_quiesced(self.liveness, r, p.incarnation, self.config.faults):
                    # Its node died (check-quorum counts it by its fetches again) or restarted
                    # (it forgot whom it follows: tell it).
                    p.quiesced = False
                    if alive(self.liveness, r):
                        self._wake_progress(r, p)
                continue
            if p.pending is not None and (
                self.now >= p.pending_deadline or p.pending.high_watermark < hw
            ):
                # A parked fetch learns of a new HW here, at most a tick late, unless records
                # carried it sooner: one answer per tick instead of one per commit. One that
                # waited its whole time for nothing may quiesce its follower.
                quiesce = self.now >= p.pending_deadline and leader_may_quiesce(
                    self.liveness,
                    r,
                    p.pending,
                    self.log,
                    r in self.observers,
                    self._changing_membership(),
                )
                self._answer_fetch(r, p.pending, quiesce=quiesce)
            elif self.now - p.last_fetch_tick >= retry and self.now - p.begin_sent_tick >= retry:
                # A voter that is not fetching may have missed our election (or be running a
                # pre-vote nobody grants): tell it again, as KRaft resends BeginQuorumEpoch.
                p.begin_sent_tick = self.now
                self._send(r, BeginEpoch(self.epoch, self.node_id, self.reads.round))
        if self.config.hw_policy == "isr":
            self._maybe_advance_high_watermark()
        if self.now - self.leader_since_tick >= self.config.check_quorum_ticks:
            recent = heard_from(
                self.progress, self.now, self.config.check_quorum_ticks, self._counts
            )
            if recent + (self.node_id in self.voters) < majority(len(self.voters)):
                # Cut off from a quorum: stop taking writes that can never commit here.
                self._become_follower(self.epoch, NO_LEADER)
        self._maybe_hand_over()

    # -- serving fetches (fetch_serving.py, progress.py, snapshot_transfer.py) ------------------

    def _on_fetch_request(self, sender: int, req: FetchRequest) -> None:
        if self.role is not Role.LEADER or req.epoch != self.epoch:
            error = FETCH_FENCED if req.epoch < self.epoch else FETCH_NOT_LEADER
            self._send(sender, refusal(self.epoch, self.leader_id, req, self.log, error))
            return
        progress = self.progress[sender]
        progress.pending = None
        progress.quiesced = False  # it fetches: it is counted by its fetches again
        if req.read_round and self._counts(sender):
            self.reads.echo(sender, req.read_round)
            self._confirm_reads()
        if must_start_over(req, self.log):
            memberships, prefix_epoch = start_over_point(self.log, self.history)
            self._send(
                sender,
                self._empty_response(
                    req,
                    snapshot_required=True,
                    memberships=memberships,
                    log_start_epoch=prefix_epoch,
                ),
            )
            return
        diverging = divergence(req, self.log)
        if diverging is not None:
            epoch, end = diverging
            self._send(
                sender,
                self._empty_response(
                    req, diverging=True, diverging_epoch=epoch, diverging_end_offset=end
                ),
            )
            return
        self._record_fetch(sender, progress, req)
        self._maybe_advance_high_watermark()
        if answer_now(req, self.log, self.config.state_machine) or (
            req.read_round < self.reads.round  # it has not heard of a round reads wait for
        ):
            self._answer_fetch(sender, req)
        else:
            progress.pending = req
            progress.pending_deadline = self.now + self.config.fetch_max_wait_ticks

    def _record_fetch(self, sender: int, p: Progress, req: FetchRequest) -> None:
        leo = self.log.log_end_offset
        invariant(req.fetch_offset <= leo, "req.fetch_offset <= leo")
        durable = reported_durable(req)
        if sender in self.observers and self.admission.maybe_admit(sender, durable):
            self._wake_quiesced()  # the admitted map reaches followers in fetch answers
        if sender in self.observers:
            p.observe_fetch(req, self.now)
        else:
            p.record_fetch(req, durable, leo, self.now)

    def _empty_response(self, req: FetchRequest, **fields: object) -> FetchResponse:
        return FetchResponse(
            self.epoch,
            self.node_id,
            req.fetch_offset,
            self.log.high_watermark,
            self.log.log_start_offset,
            last_fetched_epoch=req.last_fetched_epoch,
            directories=self.admission.for_follower(req.directories_crc),
            read_round=self.reads.round,
            **fields,  # type: ignore[arg-type]
        )

    def _answer_fetch(self, follower: int, req: FetchRequest, quiesce: bool = False) -> None:
        progress = self.progress[follower]
        has_data = req.fetch_offset < self.log.log_end_offset
        throttled = self.learner_bytes_per_tick > 0 and follower in self.learners
        if throttled and has_data and self._learner_budget <= 0:
            progress.pending = req  # answered once the catch-up budget allows
            progress.pending_deadline = self.now + 1
            return
        progress.pending = None
        records = None
        if has_data:
            max_bytes = (
                min(req.max_bytes, max(1, self._learner_budget)) if throttled else req.max_bytes
            )
            records = self.log.read(req.fetch_offset, max_bytes, self.log.log_end_offset)
            if records is not None and throttled:
                self._learner_budget -= records.size
        progress.known_hw = self.log.high_watermark
        if quiesce:
            if self.liveness is None:
                raise InvariantBroken("self.liveness is not None")
            progress.quiesced = True
            progress.incarnation = self.liveness.incarnation(follower)
        self._send(
            follower,
            FetchResponse(
                self.epoch,
                self.node_id,
                req.fetch_offset,
                self.log.high_watermark,
                self.log.log_start_offset,
                records=records,
                last_fetched_epoch=req.last_fetched_epoch,
                directories=self.admission.for_follower(req.directories_crc),
                memberships=self.history.for_follower(req.fetch_offset, req.membership_digest),
                quiesce=quiesce,
                read_round=self.reads.round,
            ),
        )

    def _complete_pending_fetches(self) -> None:
        """Parked fetches that new records answer (a new HW alone waits for the tick, but in
        a state machine's log, whose followers apply what commits)."""
        leo = self.log.log_end_offset
        hw = self.log.high_watermark if self.config.state_machine else -1
        for r, p in self.progress.items():
            if p.pending is not None and (
                p.pending.fetch_offset < leo or p.pending.high_watermark < hw
            ):
                self._answer_fetch(r, p.pending)

    def _on_fetch_snapshot_request(self, sender: int, req: FetchSnapshotRequest) -> None:
        if self.role is not Role.LEADER or req.epoch != self.epoch:
            error = FETCH_FENCED if req.epoch < self.epoch else FETCH_NOT_LEADER
            self._send(sender, snapshot_refusal(self.epoch, self.leader_id, req, error))
            return
        self.progress[sender].last_fetch_tick = self.now  # alive, and busy catching up
        answer = snapshot_answer(
            self.epoch, self.leader_id, req, self.snapshots, self.log.epochs, self.history
        )
        self._send(sender, answer)

    # -- the high-water mark --------------------------------------------------------------------

    def in_sync_replicas(self) -> set[int]:
        if self.role is not Role.LEADER:
            return set()
        lag = self.config.replica_lag_ticks
        return {self.node_id} | in_sync(self.progress, self.now, lag, self._counts)

    def _maybe_advance_high_watermark(self) -> None:
        if self.role is not Role.LEADER:
            return
        voters = self.voters
        match = {r: p.match_offset for r, p in self.progress.items() if r in voters}
        if self.node_id in voters:
            match[self.node_id] = self.log.effective_durable_end
        if self.config.hw_policy == "isr" and self.node_id in voters:
            candidate, _ = isr_offset(match, self.in_sync_replicas(), self.node_id)
        else:
            candidate = quorum_offset(list(match.values()))
        if (
            candidate <= self.epoch_start_offset
            and FAULT_COMMIT_OLD_EPOCH not in self.config.faults
        ):
            return  # Raft's rule: nothing commits by counting until our own epoch's entry does
        candidate = min(candidate, self.log.log_end_offset)
        if candidate > self.log.high_watermark:
            self.log.set_high_watermark(candidate)
            self._ready.high_watermark_changed = True
            if self.reads.needs_round and self._may_serve_reads():
                self._start_read_round()  # reads that waited for our own epoch's commit
            self._complete_pending_fetches()
            if self.node_id not in self.voters and self.history.current.offset < candidate:
                self._resign()

    # -- quiesced followers (quiescence.py) -----------------------------------------------------

    def _wake_progress(self, r: int, p: Progress) -> None:
        p.quiesced = False
        # It was caught up until now, and alive when the liveness last heard from its node:
        # check-quorum counts it from then, never from now (waking it is no news from it).
        p.begin_sent_tick = self.now
        p.last_caught_up_tick = self.now
        heard = self.liveness.heard_at(r) if self.liveness is not None else None
        if heard is not None:
            p.last_fetch_tick = max(p.last_fetch_tick, heard)
        self._send(r, BeginEpoch(self.epoch, self.node_id, self.reads.round))

    def _wake_quiesced(self) -> None:
        for r, p in self.progress.items():
            if p.quiesced:
                self._wake_progress(r, p)

    # -- linearizable reads (read_index.py) ------------------------------------------------------

    def _may_serve_reads(self) -> bool:
        """Everything this leader held when elected is committed: its HW now covers every write
        an earlier leader acknowledged (until then it may lag them)."""
        return self.log.high_watermark >= self.epoch_start_offset

    def _start_read_round(self) -> None:
        """A round for the reads waiting: every voter must hear of it and fetch again, so parked
        fetches are answered now and quiesced followers woken."""
        self.reads.start_round(self.now, self.log.high_watermark)
        for r, p in self.progress.items():
            if not self._counts(r):
                continue
            if p.quiesced:
                self._wake_progress(r, p)
            elif p.pending is not None:
                self._answer_fetch(r, p.pending)
        self._confirm_reads()

    def _confirm_reads(self) -> None:
        """Reads whose round a majority of voters echoed (the leader, if a voter, counts)."""
        if not self.reads.waiting:
            return
        echoes = [
            self.reads.round
            if v == self.node_id
            else (self.reads.echoed(v) if self._counts(v) else 0)
            for v in self.voters
        ]
        self._ready.reads.extend(self.reads.confirm(echoes))

    # -- the membership walk (membership.py) ----------------------------------------------------

    def _may_change_membership(self) -> bool:
        if FAULT_UNCOMMITTED_CHANGES in self.config.faults:
            return True
        hw = self.log.high_watermark
        return self.history.current.offset < hw and self.epoch_start_offset < hw

    def _changing_membership(self) -> bool:
        """A target the group is not at yet (the leader walks it there)."""
        if self.target is None:
            return False
        current = self.history.current
        return not (self.target == tuple(sorted(current.voters)) and not current.learners)

    def _maybe_change_membership(self) -> None:
        if self.role is not Role.LEADER or not self._changing_membership() or self.leaving:
            return  # no target, or there already (or handing over: the successor walks on)
        current = self.history.current
        if self.target is None:
            raise InvariantBroken("self.target is not None")
        lag = self.config.replica_lag_ticks

        def caught_up(n: int) -> bool:
            """In sync, and heard from just now (a long poll's age at most): a replica that
            crashed, or lost its disk, a moment ago must not count."""
            if n == self.node_id:
                return True
            p = self.progress.get(n)
            return (
                p is not None
                and self.now - p.last_caught_up_tick <= lag
                and self.now - p.last_fetch_tick <= self.config.fetch_retry_ticks
                and n not in self.observers
            )

        step = next_membership(
            current,
            self.target,
            caught_up,
            self.node_id,
            at_once=FAULT_UNCOMMITTED_CHANGES in self.config.faults,
        )
        if step is None:
            return
        if not self._may_change_membership():
            if self.log.log_end_offset == self.epoch_start_offset:
                # Elected with nothing uncommitted, so no entry of our epoch was written; a
                # change may follow only one that commits (as KRaft writes one every election).
                self.log.append_as_leader(self._leader_change_marker(), self.epoch)
                self._after_leader_append()
            return
        voters, learners = step
        if sum(1 for v in voters if caught_up(v)) < majority(len(voters)):
            # etcd's strict reconfiguration check: never leave a membership whose majority is
            # not caught up now (a voter down, or a replaced disk not yet admitted), or the
            # group may be unable to elect anyone until that voter is back.
            return
        proposal = Membership(self.log.log_end_offset, voters, learners)
        info = self.log.append_as_leader(proposal.control_batch(), self.epoch)
        invariant(info.first_offset == proposal.offset, "info.first_offset == proposal.offset")
        self.history.append(proposal)
        self._persist_state()
        self._on_membership_changed()
        self._after_leader_append()

    def _on_membership_changed(self) -> None:
        """Leader: follow the members it now has (new ones hear of its epoch at once)."""
        if self.role is not Role.LEADER:
            return
        members = set(self.history.current.members)
        for gone in [r for r in self.progress if r not in members]:
            del self.progress[gone]
            self.observers.pop(gone, None)
        for new in sorted(members - set(self.progress) - {self.node_id}):
            # Caught up only once it has fetched what we hold now (not by its first fetch).
            self.progress[new] = Progress(
                last_fetch_tick=self.now,
                begin_sent_tick=self.now,
                leo_at_last_fetch=self.log.log_end_offset,
            )
            self._send(new, BeginEpoch(self.epoch, self.node_id))
        # Fewer voters may make a majority of the echoes already heard, and no fetch may come
        # to count them again (shrunk to the leader alone: simulator seed 3601's read waited
        # for ever).
        self._confirm_reads()

    # -- handing over ---------------------------------------------------------------------------

    def _resign(self, successor: int | None = None) -> None:
        """Hand over (our own removal is committed, or a voter asked): to successor, or to the
        most caught-up remaining voter."""
        voters = [v for v in self.voters if v != self.node_id]
        if successor is None:
            successor = max(voters, key=lambda v: (self.progress[v].match_offset, -v))
        self._become_follower(self.epoch, NO_LEADER)
        for v in voters:
            self._send(v, Resign(self.epoch, self.node_id, successor))

    def _successors(self) -> list[int]:
        """The voters that may take over from this leader: in sync, and their node alive as far
        as the liveness knows (a node that stopped a moment ago may still look in sync)."""
        lag = self.config.replica_lag_ticks
        return sorted(
            v
            for v in in_sync(self.progress, self.now, lag, self._counts)
            if alive(self.liveness, v)
        )

    def _maybe_hand_over(self) -> None:
        """Leaving (its node stops): resign in favour of an in-sync voter that holds everything
        this leader holds, once every write it took is committed and durable here. Never in the
        step that moved the HW: the driver releases the acks that HW owes first (a leadership
        that ends fails every ack still owed), and the next tick resigns. Of several ready
        voters the epoch picks one, so a node's leaderships spread over the others."""
        if not self.leaving or self.role is not Role.LEADER:
            return
        end = self.log.log_end_offset
        if (
            self.log.high_watermark < end
            or self.log.effective_durable_end < end
            or self._ready.high_watermark_changed
        ):
            return
        ready = [v for v in self._successors() if self.progress[v].match_offset >= end]
        if ready:
            self._resign(successor=ready[self.epoch % len(ready)])
            self.handed_over_tick = self.now

    @property
    def handing_over(self) -> bool:
        """A hand-over (Replica.hand_over) is under way: this replica leads and has an in-sync
        voter to hand to, or resigned and no new leader is known yet, for at most an election
        timeout (a successor that did not take over by then is not coming: it stopped too,
        say; the group's own election timers take it from there)."""
        if not self.leaving:
            return False
        if self.role is Role.LEADER:
            return bool(self._successors())
        if self.leader_id != NO_LEADER or self.handed_over_tick is None:
            return False
        return self.now - self.handed_over_tick < self.config.election_timeout_ticks

    def _on_transfer_leadership(self, sender: int, msg: TransferLeadership) -> None:
        """A voter that holds everything we hold may take over; one that does not yet asks
        again (the operator's command waits and retries)."""
        if (
            self.role is not Role.LEADER
            or msg.epoch != self.epoch
            or sender not in self.voters
            or self.progress[sender].match_offset < self.log.log_end_offset
        ):
            return
        self._resign(successor=sender)
