"""One partition on a node: the IO under the partition driver.

The order of the Ready loop and the cleaner's decisions live in replication/driver.py (the
simulator runs the same class); this host is the driver's effects here: the quorum-state file,
the peer transport, the flush threads, the producers waiting for acks and the readers waiting
for the high-water mark.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import random
import time
import zlib
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from tidelog.config import TopicConfig
from tidelog.errors import NotLeader, StorageFull, TidelogError, Timeout
from tidelog.invariant import InvariantBroken
from tidelog.logs import event
from tidelog.node.config import NodeConfig
from tidelog.node.flusher import Flusher
from tidelog.node.metrics import Counters, Histogram
from tidelog.node.state_machine import Machine, StateMachineDriver
from tidelog.node.status import CachedLowWatermark, FlushFigures, PartitionStatus
from tidelog.record.validation import BatchRules
from tidelog.replication.clock import TickSource
from tidelog.replication.driver import PartitionDriver
from tidelog.replication.liveness import LivenessView
from tidelog.replication.low_watermark import LowWatermark
from tidelog.replication.messages import Message
from tidelog.replication.read_index import lease_ticks
from tidelog.replication.replica import (
    QuorumState,
    Ready,
    Replica,
    ReplicaConfig,
    Role,
)
from tidelog.storage.checkpoint import read_checkpoint, write_checkpoint
from tidelog.storage.compaction import (
    CompactionPlan,
    apply_compaction,
    plan_compaction,
    snapshot_inputs,
)
from tidelog.storage.log import FlushJob, SegmentedLog
from tidelog.storage.quorum_journal import QuorumJournal
from tidelog.storage.scrub import InvalidBatch, scrub_segment
from tidelog.storage.segment import LogSegment
from tidelog.storage.snapshot import SnapshotStore

log = logging.getLogger(__name__)

QUORUM_STATE_FILE = "quorum-state"

SendFn = Callable[[int, str, Message], None]


class PartitionHost:
    def __init__(
        self,
        topic: str,
        partition: int,
        voters: tuple[int, ...],
        config: TopicConfig,
        node_config: NodeConfig,
        directory: Path,
        flusher: Flusher,
        send: SendFn,
        on_high_watermark: Callable[[PartitionHost], None] | None = None,
        machine: Machine | None = None,
        on_roll: Callable[[PartitionHost], None] | None = None,
        on_invalidate: Callable[[PartitionHost, str, str], None] | None = None,
        directory_id: str = "",
        known_directories: Mapping[int, str] | None = None,
        topic_id: int = -1,
        counters: Counters | None = None,
        fsync_seconds: Histogram | None = None,
        clock: TickSource | None = None,
        on_leader_known: Callable[[PartitionHost], None] = lambda host: None,
        liveness: LivenessView | None = None,
        journal: QuorumJournal | None = None,
    ) -> None:
        self._on_leader_known = on_leader_known
        self.topic = topic
        self.topic_id = topic_id  # which incarnation of the topic's name (-1: the metadata log)
        self.partition = partition
        self.group = f"{topic}/{partition}"
        self.config = config
        self.directory = directory
        self._flusher = flusher
        self._send = send
        self._on_high_watermark = on_high_watermark
        self._on_roll = on_roll
        self._on_invalidate = on_invalidate
        self._counters = counters if counters is not None else Counters()
        self._fsync_seconds = fsync_seconds if fsync_seconds is not None else Histogram()
        # The quorum state is written on a flush thread (persist): meanwhile messages and
        # group commits wait here, in order.
        self._state_writing = False
        self._journal = journal
        self.journal_key = f"{topic_id}:{topic}/{partition}"  # (a recreated topic has a new id)
        self._journal_writes = 0
        self._state_file_writes = 0
        self._state_to_write: QuorumState | None = None
        self._held_messages: list[tuple[int, Message]] = []
        self._flush_held = False
        self.log = SegmentedLog(directory, config)
        self.log.on_retired = self._segments_deleted
        # Batches no reader can read, found by the scrubber (what was in the log when it
        # opened), compaction or the state machine; reported in status, skipped by readers.
        self.invalid_batches: dict[int, InvalidBatch] = {}
        self.recovery = self.log.recovery
        self._node_config = node_config
        self.state_machine, self.replica, self.driver = self._replication(
            voters, machine, directory_id, known_directories, clock, liveness
        )
        if self.state_machine is not None:
            self.state_machine.catch_up()
        self.tick_at: int | None = None  # the node's clock tick it next acts at (core.py)
        # (leader, epoch) as last told to the node (its metadata answers are cached on them)
        self.known_leader = (self.replica.leader_id, self.replica.epoch)
        self.flushing = False
        self.flush_error: TidelogError | None = None
        self.flush_count = 0
        self.flush_seconds = 0.0
        self.flush_seconds_max = 0.0
        self.flushed_records = 0
        self.compactions = 0
        self.compaction_ratio = 1.0  # the last compaction's bytes after / bytes before
        # The LWM as last decided here, by the cleaner's pass or for a status (cleaner.py).
        self.low_watermark_cache: CachedLowWatermark | None = None
        self.compacting = False
        self._waiters: list[asyncio.Future[None]] = []
        self._checkpointed_hw = self.log.high_watermark
        self.scrubbed_to = self.log.log_start_offset
        self.scrub_end = self.log.log_end_offset
        self.scrubbing = False

    def _replication(
        self,
        voters: tuple[int, ...],
        machine: Machine | None,
        directory_id: str,
        known_directories: Mapping[int, str] | None,
        clock: TickSource | None,
        liveness: LivenessView | None,
    ) -> tuple[StateMachineDriver | None, Replica, PartitionDriver[asyncio.Future[None]]]:
        """The replication core over this host's log: the state machine (table topics and the
        metadata log), the replica, and the driver that carries out the replica's outputs with
        this host as its effects."""
        replica_config = self._replica_config(voters, machine is not None, directory_id)
        seed = zlib.crc32(f"{self._node_config.node_id}/{self.group}".encode())
        state_machine: StateMachineDriver | None = None
        if machine is not None:
            state_machine = StateMachineDriver(
                self.group,
                self.log,
                SnapshotStore(self.directory, self.config.snapshot_retain),
                machine,
                self.config.snapshot_entries,
                seed,
                on_invalid=self.report_invalid,
            )
        replica = Replica(
            replica_config,
            self.log,
            self._load_quorum_state(),
            random.Random(seed),
            state_machine,
            known_directories,
            clock,
            liveness,
        )
        return state_machine, replica, PartitionDriver(replica, self.log, self, state_machine)

    def _replica_config(
        self, voters: tuple[int, ...], state_machine: bool, directory_id: str
    ) -> ReplicaConfig:
        """The replica's timing in this node's ticks, and the topic's rules."""
        nc = self._node_config
        return self._topic_rules(
            ReplicaConfig(
                node_id=nc.node_id,
                voters=voters,
                election_timeout_ticks=nc.ticks(nc.election_timeout_ms),
                election_jitter_ticks=nc.ticks(nc.election_jitter_ms),
                fetch_max_wait_ticks=nc.ticks(nc.replica_fetch_wait_max_ms),
                fetch_retry_ticks=nc.ticks(nc.replica_fetch_wait_max_ms)
                + nc.ticks(nc.election_timeout_ms) // 2,
                check_quorum_ticks=nc.ticks(nc.election_timeout_ms) * 3 // 2,
                fetch_max_bytes=nc.replica_fetch_max_bytes,
                state_machine=state_machine,
                directory_id=directory_id,
            ),
            self.config,
        )

    # -- the driver -----------------------------------------------------------------------------

    def _load_quorum_state(self) -> QuorumState:
        """From the node's journal, or from the replica's own file: the one of the later epoch
        (the file is what older versions wrote, and what a restore sets)."""
        data = read_checkpoint(self.directory / QUORUM_STATE_FILE) or {}
        journaled = self._journal.get(self.journal_key) if self._journal is not None else None
        if journaled is not None and int(journaled.get("epoch", 0)) >= int(data.get("epoch", 0)):
            data = journaled
        return QuorumState(
            int(data.get("epoch", 0)),
            int(data.get("voted_for", -1)),
            str(data.get("directories", "")),
            str(data.get("memberships", "")),
        )

    def process_ready(self) -> None:
        self.driver.process_ready()

    def step(self, sender: int, message: Message, directory: str = "") -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s: from %d: %s", self.group, sender, type(message).__name__)
        error = self.driver.step(sender, message, directory)
        if error is not None:
            log.error(
                "%s: handling %s from %d failed: %s",
                self.group,
                type(message).__name__,
                sender,
                error,
            )

    def tick(self) -> None:
        """Do what the clock makes due (ReplicaGroups.tick_loop; a host made without the node's
        clock, in a test, advances its own by one tick)."""
        self.driver.tick()

    # -- the driver's effects -------------------------------------------------------------------

    def persist(self, state: QuorumState) -> None:
        """Make the quorum state durable before any message leaves or the log is flushed. The
        write runs on a flush thread, and until it is done this replica's messages and group
        commits wait, in order (send, start_flush): the loop is not held by fsyncs. On a node,
        the states go to the node's journal (storage/quorum_journal.py), where the states of
        every replica written meanwhile share one fsync: a node that votes in thousands of
        elections at once (a peer died) syncs a handful of times, not thousands."""
        self._state_writing = True
        if self._journal is not None:
            self._journal_writes += 1
            self._journal.write(self.journal_key, dataclasses.asdict(state), self._journal_written)
            return
        self._state_to_write = state
        if self._state_file_writes == 0:
            self._write_state_file()

    def _write_state_file(self) -> None:
        state, self._state_to_write = self._state_to_write, None
        if state is None:
            raise InvariantBroken("state is not None")
        self._state_file_writes = 1
        path = self.directory / QUORUM_STATE_FILE
        data = dataclasses.asdict(state)
        self._flusher.submit(lambda: write_checkpoint(path, data), self._state_file_written)

    def _state_file_written(self, error: BaseException | None) -> None:
        self._state_file_writes = 0
        if error is None and self._state_to_write is not None:
            self._write_state_file()  # a newer state came meanwhile: its messages wait for it
            return
        self._state_written(error)

    def _journal_written(self, error: BaseException | None) -> None:
        self._journal_writes -= 1
        if error is None and self._journal_writes > 0:
            return  # a newer state is on its way: the messages wait for it (batches are ordered)
        self._state_written(error)

    def _state_written(self, error: BaseException | None) -> None:
        if self.closed and not self._state_writing:
            return  # stopped after an earlier failure
        self._state_writing = False
        if error is not None:
            # Not durable: nothing that depends on it may leave. The node stops (fail-stop,
            # as for any write it cannot make).
            self._held_messages.clear()
            event(
                log,
                logging.ERROR,
                "quorum_state_write_failed",
                f"{self.group}: cannot write its quorum state, the replica stops: {error}",
                topic=self.topic,
                partition=self.partition,
                error=str(error),
            )
            self._stop("its quorum state cannot be written")
            return
        held, self._held_messages = self._held_messages, []
        for to, message in held:
            self._send(to, self.group, message)
        if self._flush_held:
            self._flush_held = False
            self.start_flush()

    def send(self, to: int, message: Message) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s: to %d: %s", self.group, to, type(message).__name__)
        if self._state_writing:
            self._held_messages.append((to, message))
            return
        self._send(to, self.group, message)

    def acknowledge(
        self, acked: list[asyncio.Future[None]], failed: list[asyncio.Future[None]]
    ) -> None:
        for future in acked:
            if not future.done():
                future.set_result(None)
        if failed:
            error = NotLeader(f"{self.group}: leadership changed", leader_hint=self.leader_hint)
            self._fail(failed, error)

    @staticmethod
    def _fail(futures: list[asyncio.Future[None]], error: TidelogError) -> None:
        for future in futures:
            if not future.done():
                future.set_exception(error)

    def committed(self) -> None:
        if self._on_high_watermark is not None:
            self._on_high_watermark(self)

    def wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for future in waiters:
            if not future.done():
                future.set_result(None)

    def rolled(self) -> None:
        if self._on_roll is not None:
            self._on_roll(self)

    def invalidate_cursor(self, name: str, reason: str) -> None:
        if self._on_invalidate is not None:
            self._on_invalidate(self, name, reason)

    def _segments_deleted(self, bases: list[int], freed: int) -> None:
        """Segments below the log start went: by the cleaner's pass on the leader, or as a
        follower followed its leader's log start."""
        self._counters.inc("tidelog_segments_deleted_total", len(bases))
        self._counters.inc("tidelog_segments_deleted_bytes_total", freed)
        start = self.log.log_start_offset
        event(
            log,
            logging.INFO,
            "segments_deleted",
            f"{self.group}: deleted {len(bases)} segment(s) below log start {start}: "
            + ", ".join(f"{b:020d}" for b in bases),
            topic=self.topic,
            partition=self.partition,
            segments=len(bases),
            bytes=freed,
            log_start_offset=start,
        )

    def handled(self, ready: Ready) -> None:
        """After every step of the driver (each tick too): only a change is logged."""
        replica = self.replica
        known = (replica.leader_id, replica.epoch)
        if known != self.known_leader:
            self.known_leader = known
            self._on_leader_known(self)
        if not (ready.role_changed or ready.lost_leadership or ready.truncated):
            return
        replica = self.replica
        facts = {"topic": self.topic, "partition": self.partition, "epoch": replica.epoch}
        if ready.role_changed and replica.role is Role.LEADER:
            self._counters.inc("tidelog_leader_elections_won_total")
            event(
                log,
                logging.INFO,
                "leader_elected",
                f"{self.group}: leader in epoch {replica.epoch}",
                **facts,
            )
        elif ready.lost_leadership:
            event(
                log,
                logging.INFO,
                "leader_lost",
                f"{self.group}: no longer leader (epoch {replica.epoch}, leader {replica.leader_id})",
                **facts,
            )
        if ready.truncated:
            end = self.log.log_end_offset
            event(
                log,
                logging.WARNING,
                "log_truncated",
                f"{self.group}: log cut back to {end} to agree with leader {replica.leader_id}",
                log_end_offset=end,
                leader=replica.leader_id,
                **facts,
            )

    def _topic_rules(self, base: ReplicaConfig, config: TopicConfig) -> ReplicaConfig:
        """The replica's settings that come from the topic's config."""
        nc = self._node_config
        return dataclasses.replace(
            base,
            replica_lag_ticks=nc.ticks(config.replica_lag_time_max_ms),
            hw_policy=config.hw_policy,
            min_insync_replicas=config.min_insync_replicas,
            replica_max_lag_ticks=nc.ticks(config.replica_max_lag_ms),
        )

    def reconfigure(self, config: TopicConfig) -> None:
        """The topic's config changed (topics alter): applied from now on by the log (rolls,
        flushes), the replica (hw.policy, lag limits), producers' batch rules and the cleaner
        (retention, cursor caps) at its next pass."""
        if config == self.config:
            return
        self.config = config
        self.log.config = config
        self.replica.config = self._topic_rules(self.replica.config, config)
        self.__dict__.pop("batch_rules", None)
        log.info("%s: config now %s", self.group, config.overrides())

    @functools.cached_property
    def batch_rules(self) -> BatchRules:
        """What producers may append here. Compacted and table topics need keys: a record without
        one could never be read back by key."""
        c = self.config
        return BatchRules(
            max_batch_bytes=c.max_message_bytes,
            require_keys="compact" in c.cleanup_policy or self.state_machine is not None,
            timestamp_before_max_ms=c.message_timestamp_before_max_ms,
            timestamp_after_max_ms=c.message_timestamp_after_max_ms,
        )

    def snapshot_offset(self) -> int | None:
        """The newest durable snapshot's offset, for state-machine logs (None: a stream)."""
        return self.state_machine.snapshot_offset if self.state_machine is not None else None

    def after_cleaning(self) -> None:
        """Compaction after a cleaner pass, for cleanup.policy=compact (or compact,delete).
        Every replica compacts its own committed, closed segments (offsets never change); the
        reading and rewriting happen on a worker thread, the swap back here."""
        if "compact" not in self.config.cleanup_policy or self.compacting or self.closed:
            return
        inputs = snapshot_inputs(self.log)
        if not inputs[0]:
            return
        self.compacting = True
        now_ms = int(time.time() * 1000)
        loop = asyncio.get_running_loop()
        pinned = list(inputs[1])  # (every segment: the plan reads them all for the latest keys)
        for seg in pinned:
            seg.pin()  # read on the worker thread: their files stay open until it is done
        future = loop.run_in_executor(None, plan_compaction, self.log, inputs, now_ms)
        future.add_done_callback(lambda f: self._compaction_planned(f, pinned))

    def _compaction_planned(
        self, future: asyncio.Future[CompactionPlan], pinned: list[LogSegment]
    ) -> None:
        self.compacting = False
        for seg in pinned:
            seg.unpin()
        if self.closed:
            return
        try:
            plan = future.result()
        except (OSError, TidelogError) as exc:
            log.warning("%s: compaction pass abandoned: %s", self.group, exc)
            return
        for batch in plan.report.invalid_batches:
            self.report_invalid(batch)
        report = apply_compaction(self.log, plan)
        if report.segments_rewritten:
            self.compactions += 1
            if report.bytes_before:
                self.compaction_ratio = report.bytes_after / report.bytes_before
            counters = self._counters
            counters.inc("tidelog_compaction_bytes_before_total", report.bytes_before)
            counters.inc("tidelog_compaction_bytes_after_total", report.bytes_after)
            counters.inc("tidelog_compaction_records_removed_total", report.records_removed)
            counters.inc(
                "tidelog_compaction_aborted_records_removed_total", report.aborted_records_removed
            )
            counters.inc("tidelog_compaction_markers_removed_total", report.markers_removed)
            counters.inc("tidelog_compaction_empty_batches_kept_total", report.empty_batches_kept)
            log.info(
                "%s: compacted %d segment(s): %d records removed (%d tombstones, %d aborted), "
                "%d markers removed, %d emptied batches kept for their producers, %d -> %d bytes",
                self.group,
                report.segments_rewritten,
                report.records_removed,
                report.tombstones_removed,
                report.aborted_records_removed,
                report.markers_removed,
                report.empty_batches_kept,
                report.bytes_before,
                report.bytes_after,
            )

    # -- scrubbing what was in the log at open ----------------------------------------------------

    @property
    def scrub_pending(self) -> bool:
        return not self.scrubbing and not self.closed and self.scrubbed_to < self.scrub_end

    def scrub_step(self) -> None:
        """Check the next segment of what the log held when it opened, on a worker thread."""
        self.scrubbed_to = max(self.scrubbed_to, self.log.log_start_offset)
        segment = next((s for s in self.log.segments if s.next_offset > self.scrubbed_to), None)
        if segment is None or segment.base_offset >= self.scrub_end:
            self.scrubbed_to = self.scrub_end
            return
        self.scrubbing = True
        loop = asyncio.get_running_loop()
        segment.pin()
        future = loop.run_in_executor(None, scrub_segment, segment, self.scrub_end)

        def scrubbed(f: asyncio.Future[tuple[list[InvalidBatch], int]]) -> None:
            segment.unpin()
            self._scrubbed(f, segment.next_offset)

        future.add_done_callback(scrubbed)

    def _scrubbed(
        self, future: asyncio.Future[tuple[list[InvalidBatch], int]], segment_end: int
    ) -> None:
        self.scrubbing = False
        try:
            found, checked = future.result()
        except (OSError, TidelogError) as exc:  # deleted or compacted meanwhile: move on
            log.debug("%s: scrub step abandoned: %s", self.group, exc)
            checked, found = segment_end, []
        for batch in found:
            self.report_invalid(batch)
        self.scrubbed_to = max(self.scrubbed_to, checked, min(segment_end, self.scrub_end))

    def report_invalid(self, batch: InvalidBatch) -> None:
        if batch.base_offset not in self.invalid_batches:
            log.error(
                "%s: batch at offsets %d..%d cannot be read (%s: %s); readers that skip invalid "
                "batches pass over it",
                self.group,
                batch.base_offset,
                batch.last_offset,
                batch.error,
                batch.reason,
            )
        self.invalid_batches[batch.base_offset] = batch

    def invalid_batches_present(self) -> list[dict[str, object]]:
        start, end = self.log.log_start_offset, self.log.log_end_offset
        return [
            b.to_dict()
            for base, b in sorted(self.invalid_batches.items())
            if b.last_offset >= start and base < end
        ]

    @property
    def leader_hint(self) -> int | None:
        leader = self.replica.leader_id
        return leader if leader >= 0 else None

    # -- group commit ---------------------------------------------------------------------------

    def start_flush(self) -> None:
        if self._state_writing:
            self._flush_held = True  # what the log holds may be of an epoch not durable yet
            return
        if self.flushing or self.closed or not self.log.flush_due():
            return
        job = self.log.begin_flush()
        if job is None:
            return
        self.flushing = True
        self._flusher.submit(job.run, lambda error: self._flush_done(job, error))

    def _flush_done(self, job: FlushJob, exc: BaseException | None) -> None:
        self.flushing = False
        if self.closed:
            return
        if exc is not None:
            error = exc if isinstance(exc, TidelogError) else StorageFull(str(exc))
            event(
                log,
                logging.ERROR,
                "storage_full" if isinstance(error, StorageFull) else "flush_failed",
                f"{self.group}: flush failed: {error}",
                topic=self.topic,
                partition=self.partition,
                error=str(error),
            )
            self.flush_error = error
            self._fail(self.driver.owed.fail_durable(), error)
            return
        self.flush_error = None
        self.flush_count += 1
        self.flush_seconds += job.seconds
        self.flush_seconds_max = max(self.flush_seconds_max, job.seconds)
        self._fsync_seconds.observe(job.seconds)
        self.flushed_records += max(0, job.target - self.log.durable_end_offset)
        self.log.complete_flush(job)
        self.driver.flushed()

    async def wait_idle(self) -> None:
        while self.flushing or self.compacting or self._state_writing:
            await asyncio.sleep(0.001)

    # -- waiting for watermarks -----------------------------------------------------------------

    def wait_for_ack(self, target: int, acks: int, timeout_s: float) -> Awaitable[None]:
        """Until offset target is, for acks=1, durable on this leader; for acks=all, committed
        (below the HW). The wait is registered at once, when this is called, with the epoch
        this replica leads: a leadership lost before the caller first awaits still fails it,
        and nothing but this leadership's own progress releases it (a follower's HW passing
        the offset says nothing of a batch its leadership appended: the offset may hold another
        leader's batch by then: replication/acks.py)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        try:
            if self.driver.owe(target, acks == 1, future):
                future.set_result(None)
        except NotLeader:
            raise NotLeader(f"{self.group}: not the leader", leader_hint=self.leader_hint) from None
        return self._awaited(future, target, acks, timeout_s)

    async def _awaited(
        self, future: asyncio.Future[None], target: int, acks: int, timeout_s: float
    ) -> None:
        try:
            await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            raise Timeout(
                f"{self.group}: offset {target} not {'committed' if acks != 1 else 'durable'} "
                f"within {timeout_s:.1f}s",
                offset=target,
            ) from None

    async def read_index(self, timeout_s: float, lease: bool = False) -> int:
        """A linearizable read's index (replication/read_index.py): once a majority confirmed
        this leadership after the call, the HW it had then, and the state machine (if any)
        applied up to it. With lease, the leader's lease may confirm it at once. NotLeader when
        this replica does not lead, or stops leading before a majority confirms it (a leader
        cut off steps down within check-quorum); Timeout if neither happens in time."""
        future: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()

        def answer(index: int | None) -> None:
            if not future.done():
                future.set_result(index)

        ticks = lease_ticks(self.replica.config.election_timeout_ticks) if lease else 0
        try:
            self.driver.read(answer, ticks)
            index = await asyncio.wait_for(future, timeout_s)
        except NotLeader:
            raise NotLeader(f"{self.group}: not the leader", leader_hint=self.leader_hint) from None
        except TimeoutError:
            raise Timeout(
                f"{self.group}: no majority confirmed this leader within {timeout_s:.1f}s"
            ) from None
        if index is None:
            raise NotLeader(
                f"{self.group}: the leadership ended before a majority confirmed the read",
                leader_hint=self.leader_hint,
            )
        machine = self.state_machine
        deadline = time.monotonic() + timeout_s
        while machine is not None and machine.machine.applied_offset < index:
            # (The driver applies what commits before it answers reads: this rarely waits.)
            if time.monotonic() >= deadline:
                raise Timeout(f"{self.group}: state not applied up to {index} in time")
            await self.wait_for_change(deadline - time.monotonic())
        return index

    async def wait_for_change(self, timeout_s: float) -> None:
        """Until the HW, the role or the log's contents change, or timeout."""
        if timeout_s <= 0:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        try:
            await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            pass
        finally:
            if future in self._waiters:
                self._waiters.remove(future)

    def aborted_transactions(self, start: int, end: int) -> list[list[int]]:
        """[producer id, first offset] of each aborted transaction with a batch in [start, end)
        (what a read_committed answer carries)."""
        return [
            [t.producer_id, t.first_offset]
            for t in self.log.transactions.aborted_transactions(start, end)
        ]

    # -- lifecycle ------------------------------------------------------------------------------

    def checkpoint(self) -> None:
        """Persist the HW now and then (as Kafka's replication-offset-checkpoint does)."""
        if self.log.high_watermark != self._checkpointed_hw:
            self.log.write_state_checkpoint()
            self._checkpointed_hw = self.log.high_watermark

    def status(
        self,
        low_watermark: LowWatermark | None = None,
        log_start_offset: int = -1,
        archive: Mapping[str, object] | None = None,
    ) -> PartitionStatus:
        return PartitionStatus(
            topic=self.topic,
            partition=self.partition,
            replica=self.replica.status(),
            size_bytes=self.log.size_bytes,
            segment_count=self.log.segment_count,
            durable_end_offset=self.log.durable_end_offset,
            flushes=FlushFigures(
                self.compactions,
                self.flush_count,
                self.flush_seconds,
                self.flush_seconds_max,
                self.flushed_records,
            ),
            invalid_batches=self.invalid_batches_present(),
            low_watermark=low_watermark,
            log_start_offset=log_start_offset,
            archive=archive,
        )

    @property
    def closed(self) -> bool:
        return self.driver.stopped

    def _stop(self, why: str) -> None:
        """No more ticks, messages or flushes; every producer still waiting fails, every
        long-polling reader wakes."""
        self.driver.stopped = True
        self._fail(self.driver.owed.fail_all(), NotLeader(f"{self.group}: {why}"))
        self.driver.fail_reads()
        self.wake()

    async def abandon(self) -> None:
        """Stop for good without writing anything: the replica is being deleted."""
        self._stop("replica deleted")
        await self.wait_idle()
        if self._journal is not None:
            self._journal.write(self.journal_key, None, lambda error: None)
        self.log.abandon()

    async def close(self) -> None:
        await self.wait_idle()
        self._stop("node shutting down")
        self.log.close()
