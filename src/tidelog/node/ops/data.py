"""Records in and out of the partitions this node hosts: produce (acknowledged by the acks
registry once the HW passes it), fetch (below the HW, or from the archive below the local log
start), list offsets, delete records, and table reads."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tidelog.errors import (
    ArchiveLost,
    CursorInvalidated,
    DuplicateSequence,
    FencedLeaderEpoch,
    InvalidRequest,
    NotLeader,
    OffsetOutOfRange,
    ProducerFenced,
    StorageFull,
    TidelogError,
    TransactionsNotEnabled,
    UnknownLeaderEpoch,
    UnknownTopicOrPartition,
    from_wire,
)
from tidelog.features import TRANSACTIONS_LEVEL
from tidelog.logs import event
from tidelog.node.archiver import Archiver
from tidelog.node.cleaner import Cleaner, wall_ms
from tidelog.node.config import NodeConfig
from tidelog.node.metadata_log import MetadataLog
from tidelog.node.metrics import Counters
from tidelog.node.ops.base import ConfiguredOps
from tidelog.node.partition import PartitionHost
from tidelog.node.state_machine import TableMachine
from tidelog.protocol import api
from tidelog.protocol.api import CONSISTENCIES, LEASE, SERIALIZABLE
from tidelog.record.slices import BytesSlice
from tidelog.record.validation import ValidatedBatches, validate_produced
from tidelog.replication.metadata import (
    METADATA_TOPIC,
)
from tidelog.replication.metadata_transactions import verify_transactional_batch

log = logging.getLogger(__name__)

STORAGE_FULL_LOG_EVERY_S = 10.0  # a refused produce is logged at most this often
REQUEST_TIMEOUT_MS_MAX = 300_000
# A read waits this long at most for a majority to confirm its leader. A leader cut off steps
# down within check-quorum and answers NotLeader well before; this bounds anything else.
READ_CONFIRM_TIMEOUT_S = 10.0
# A transactional batch waits this long at most for this node's metadata to show its
# transaction holding the partition (node/ops/data.py, DataOps._append_once_verified).
TRANSACTION_VERIFY_WAIT_S = 1.0


class DataOps(ConfiguredOps):
    def __init__(
        self,
        node_id: int,
        metadata_log: MetadataLog,
        hosts: dict[str, PartitionHost],
        cleaner: Cleaner,
        archiver: Archiver | None,
        counters: Counters,
        stored_bytes: Callable[[], int],
        config: Callable[[], NodeConfig],
    ) -> None:
        self.node_id = node_id
        self.metadata_log = metadata_log
        self.hosts = hosts  # the node's replica groups (shared)
        self.cleaner = cleaner
        self.archiver = archiver
        self.counters = counters
        self.stored_bytes = stored_bytes  # every replica's segments on this node
        self._config = config
        self._lost_read_logged: dict[str, float] = {}
        self._storage_bytes = 0
        self._storage_checked = 0.0
        self._storage_full_logged = -STORAGE_FULL_LOG_EVERY_S

    def host(self, topic: str, partition: int) -> PartitionHost:
        host = self.hosts.get(f"{topic}/{partition}")
        if host is not None and topic != METADATA_TOPIC:
            return host
        if topic not in self.metadata.topics:
            self.metadata_log.require_current(f"topic {topic!r}", partition_request=True)
        meta = self.metadata.topic(topic)
        if not 0 <= partition < meta.partitions:
            raise UnknownTopicOrPartition(
                f"topic {topic!r} has partitions 0..{meta.partitions - 1}, not {partition}",
                topic=topic,
                partition=partition,
            )
        raise NotLeader(
            f"node {self.node_id} holds no replica of {topic}/{partition}",
            leader_hint=meta.assignments[partition][0],
        )

    def leader(self, topic: str, partition: int) -> PartitionHost:
        host = self.host(topic, partition)
        if not host.replica.is_leader:
            raise NotLeader(
                f"node {self.node_id} is not the leader of {host.group}",
                leader_hint=host.leader_hint,
            )
        return host

    @staticmethod
    def timeout_s(timeout_ms: int) -> float:
        if not 0 <= timeout_ms <= REQUEST_TIMEOUT_MS_MAX:
            raise InvalidRequest(f"timeout_ms must be in [0, {REQUEST_TIMEOUT_MS_MAX}]")
        return timeout_ms / 1000

    def produce(self, req: api.ProduceRequest, payload: bytes) -> Awaitable[Any] | None:
        if req.acks not in (api.ACKS_NONE, api.ACKS_LEADER, api.ACKS_ALL):
            raise InvalidRequest(f"acks must be 0, 1 or -1 (all), got {req.acks}")
        timeout_s = self.timeout_s(req.timeout_ms)
        host = self.leader(req.topic, req.partition)
        if req.acks == api.ACKS_ALL:
            host.replica.check_min_insync(host.config.min_insync_replicas)
        if host.flush_error is not None and host.log.needs_flush:
            raise host.flush_error
        self.check_storage_space()
        if self.archiver is not None:
            self.archiver.check_produce(host)
        try:
            batches = validate_produced(payload, host.batch_rules, wall_ms())
        except TidelogError as exc:
            self.counters.inc("tidelog_batches_refused_total", rule=str(exc.details.get("rule")))
            raise
        if any(h.is_transactional for _, h in batches.headers):
            refusal = self._transaction_refusal(req, batches)
            if refusal is not None:
                return self._append_once_verified(host, req, batches, timeout_s, refusal)
        return self._append(host, req, batches, len(payload), timeout_s)

    def _transaction_refusal(
        self, req: api.ProduceRequest, batches: ValidatedBatches
    ) -> TidelogError | None:
        """Why this node's metadata does not let the payload's transactional batches in (None:
        it does). Before feature level 3 transactions are refused outright."""
        if self.metadata.finalized_level < TRANSACTIONS_LEVEL:
            return TransactionsNotEnabled(
                f"transactional batches need feature level {TRANSACTIONS_LEVEL} (transactions); "
                f"the cluster is at {self.metadata.finalized_level}",
                level=self.metadata.finalized_level,
            )
        for _, header in batches.headers:
            if header.is_transactional:
                refusal = verify_transactional_batch(
                    self.metadata.transactions,
                    req.transactional_id,
                    header.producer_id,
                    header.producer_epoch,
                    req.topic,
                    req.partition,
                )
                if refusal is not None:
                    return refusal
        return None

    async def _append_once_verified(
        self,
        host: PartitionHost,
        req: api.ProduceRequest,
        batches: ValidatedBatches,
        timeout_s: float,
        refusal: TidelogError,
    ) -> Any:
        """A transactional batch this node's metadata does not let in yet: its replica of the
        metadata log may lag the coordinator's (AddPartitionsToTxn was answered once committed
        there), so it waits for that briefly before refusing. A fenced epoch is final."""
        deadline = time.monotonic() + TRANSACTION_VERIFY_WAIT_S
        while not isinstance(refusal, ProducerFenced | TransactionsNotEnabled):
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.01)
            found = self._transaction_refusal(req, batches)
            if found is None:
                pending = self._append(host, req, batches, len(batches.data), timeout_s)
                return await pending if pending is not None else None
            refusal = found
        raise refusal

    def _append(
        self,
        host: PartitionHost,
        req: api.ProduceRequest,
        batches: ValidatedBatches,
        size: int,
        timeout_s: float,
    ) -> Awaitable[Any] | None:
        # Appended before any await: pipelined requests on a connection keep their order.
        try:
            info = host.replica.propose(batches)
        except DuplicateSequence as exc:
            # A replay of batches already in the log: answer as for the original, once the
            # original is as durable as acks asks (a retry must not learn of success sooner).
            return self.acknowledge(
                host,
                req,
                int(exc.details["base_offset"]),
                int(exc.details["last_offset"]),
                timeout_s,
                duplicate=True,
            )
        self._storage_bytes += size  # between recounts, count what we wrote
        try:
            host.process_ready()
            return self.acknowledge(host, req, info.first_offset, info.last_offset, timeout_s)
        except TidelogError as exc:  # the batch is in the log already: its fate is unknown
            raise from_wire({**exc.to_wire(), "appended": True}) from exc

    def acknowledge(
        self,
        host: PartitionHost,
        req: api.ProduceRequest,
        base: int,
        last: int,
        timeout_s: float,
        duplicate: bool = False,
    ) -> Awaitable[Any] | None:
        if req.acks == api.ACKS_NONE:
            return None
        # Registered now, before anything else runs: a leadership lost from here on fails it.
        pending = host.wait_for_ack(last, req.acks, timeout_s)

        async def acknowledged() -> api.ProduceResponse:
            try:
                await pending
            except TidelogError as exc:
                # The batch is in this replica's log already: whether it survives is unknown.
                # (A copy: the same error object may be raised to other requests.)
                raise from_wire({**exc.to_wire(), "appended": True}) from exc
            return api.ProduceResponse(
                base, last, host.log.high_watermark, host.log.log_start_offset, duplicate
            )

        return acknowledged()

    def check_storage_space(self) -> None:
        """storage.max.bytes: refuse writes (not reads, commits or cleaning) when it is passed,
        as etcd's NOSPACE alarm does; writes resume by themselves once cleaning frees space."""
        limit = self.config.storage_max_bytes
        if limit < 0:
            return
        now = time.monotonic()
        if now - self._storage_checked > 0.05:
            self._storage_bytes = self.stored_bytes()
            self._storage_checked = now
        if self._storage_bytes >= limit:
            if now - self._storage_full_logged > STORAGE_FULL_LOG_EVERY_S:
                self._storage_full_logged = now
                event(
                    log,
                    logging.WARNING,
                    "storage_full",
                    f"node {self.node_id}: produce refused: {self._storage_bytes} bytes stored, "
                    f"storage.max.bytes is {limit}",
                    stored_bytes=self._storage_bytes,
                    limit_bytes=limit,
                )
            raise StorageFull(
                f"node {self.node_id} stores {self._storage_bytes} bytes, storage.max.bytes is {limit}",
                stored_bytes=self._storage_bytes,
                limit_bytes=limit,
            )

    def check_cursor(self, name: str, topic: str, partition: int) -> None:
        if name not in self.metadata.cursors:
            self.metadata_log.require_current(f"cursor {name!r}", partition_request=True)
        cursor = self.metadata.cursor(name)
        if not cursor.live:
            host = self.hosts.get(f"{topic}/{partition}")
            raise CursorInvalidated(
                f"cursor {name!r} was invalidated: {cursor.invalidated}",
                log_start=host.log.log_start_offset if host is not None else 0,
                reason=cursor.invalidated,
                cursor=name,
            )

    async def fetch(self, req: api.FetchRequest, payload: bytes) -> Any:
        if req.max_bytes < 1 or req.min_bytes < 0:
            raise InvalidRequest("max_bytes must be >= 1 and min_bytes >= 0")
        committed = check_isolation_level(req.isolation_level)
        if req.cursor:
            self.check_cursor(req.cursor, req.topic, req.partition)
        wait_s = self.timeout_s(req.max_wait_ms)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        confirmed = False  # (consistent: a majority confirmed the leadership once, up front)
        while True:
            host = self.host(req.topic, req.partition)
            replica = host.replica
            if not replica.is_leader and not req.replica_read:
                raise NotLeader(
                    f"node {self.node_id} is not the leader of {host.group}",
                    leader_hint=host.leader_hint,
                )
            self.check_leader_epoch(host, req.leader_epoch)
            if req.consistent and not confirmed:
                await self.confirm_leadership(host)
                confirmed = True
                continue  # (the host, and what it holds, may have changed meanwhile)
            hlog = host.log
            hw = hlog.high_watermark
            limit = (
                hlog.log_end_offset
                if replica.is_leader
                else max(hlog.log_end_offset, replica.leader_high_watermark)
            )
            if (
                req.offset < hlog.log_start_offset
                and self.archiver is not None
                and host.config.remote_storage_enable
            ):
                # Below the local log start: the archive serves it, on any replica.
                max_bytes = min(req.max_bytes, self.config.fetch_max_bytes)
                archived = await self.read_archive(host, req.offset, max_bytes, committed)
                if archived is not None:
                    return archived
            if req.offset < hlog.log_start_offset or req.offset > limit:
                start = self.log_start_offset(host)
                self.refuse_lost_range(host, req.offset, start, hw)
                raise OffsetOutOfRange(
                    f"offset {req.offset} is outside [{start}, {limit}] of {host.group}",
                    log_start=start,
                    high_watermark=hw,
                )
            # A client chooses max_bytes; the node bounds what one answer may hold in memory.
            max_bytes = min(req.max_bytes, self.config.fetch_max_bytes)
            lso = replica.last_stable_offset()
            end = lso if committed else hw
            records = hlog.read(req.offset, max_bytes, end) if req.offset < end else None
            remaining = deadline - loop.time()
            if (records is not None and records.size >= req.min_bytes) or remaining <= 0:
                answer = self.fetch_answer(host, hw, lso)
                if committed and records is not None:
                    answer = dataclasses.replace(
                        answer, aborted_transactions=host.aborted_transactions(req.offset, end)
                    )
                return answer, records
            await host.wait_for_change(remaining)

    async def read_archive(
        self, host: PartitionHost, offset: int, max_bytes: int, committed: bool
    ) -> tuple[api.FetchResponse, BytesSlice] | None:
        """A fetch's answer out of the archive (below the local log start); None if it does not
        hold offset. read_committed: with the aborted transactions its manifest entry names
        (every archived object is below the LSO, so nothing in it is undecided)."""
        if self.archiver is None:
            return None
        hw = host.log.high_watermark
        if not committed:
            data = await self.archiver.read(host, offset, max_bytes)
            return (self.fetch_answer(host, hw), BytesSlice(data, offset)) if data else None
        found = await self.archiver.read_committed(host, offset, max_bytes)
        if found is None or not found[0]:
            return None
        data, aborted = found
        answer = dataclasses.replace(self.fetch_answer(host, hw), aborted_transactions=aborted)
        return answer, BytesSlice(data, offset)

    def refuse_lost_range(self, host: PartitionHost, offset: int, start: int, hw: int) -> None:
        """A read of what the archive's store lost is refused by name (ArchiveLost), never
        passed off as retention's doing."""
        if self.archiver is None or not host.config.remote_storage_enable:
            return
        lost = self.archiver.lost_range(host, offset)
        if lost is None:
            return
        if self._lost_read_logged.get(host.group, -1e9) < time.monotonic() - 10:
            self._lost_read_logged[host.group] = time.monotonic()
            log.warning(
                "%s: a reader asked for offset %d, in [%d, %d), which the archive %s lost",
                host.group,
                offset,
                *lost,
                self.archiver.url,
            )
        raise ArchiveLost(
            f"offset {offset} of {host.group} is in [{lost[0]}, {lost[1]}), which the archive "
            f"{self.archiver.url} lost; the log now starts at {start}",
            log_start=start,
            high_watermark=hw,
            lost_start=lost[0],
            lost_end=lost[1],
        )

    def fetch_answer(self, host: PartitionHost, hw: int, lso: int = -1) -> api.FetchResponse:
        return api.FetchResponse(
            hw,
            self.log_start_offset(host),
            host.log.log_end_offset,
            host.replica.epoch,
            self.node_id,
            host.replica.is_leader,
            host.log.log_start_offset,
            lso if lso >= 0 else host.replica.last_stable_offset(),
        )

    def log_start_offset(self, host: PartitionHost) -> int:
        """The whole log's first offset: the archive's when it holds what is below the local
        log start, else the local log start."""
        if self.archiver is None or not host.config.remote_storage_enable:
            return host.log.log_start_offset
        return self.archiver.log_start_offset(host)

    async def list_offsets(
        self, req: api.ListOffsetsRequest, payload: bytes
    ) -> api.ListOffsetsResponse:
        host = self.host(req.topic, req.partition)
        if not host.replica.is_leader and not req.replica_read:
            raise NotLeader(f"not the leader of {host.group}", leader_hint=host.leader_hint)
        self.check_leader_epoch(host, req.leader_epoch)
        if req.consistent:
            await self.confirm_leadership(host)
            host = self.host(req.topic, req.partition)
        hlog = host.log
        hw = hlog.high_watermark
        lso = host.replica.last_stable_offset()
        # read_committed: the end a reader may reach is the LSO (Kafka's ListOffsets too).
        end = lso if check_isolation_level(req.isolation_level) else hw
        start = self.log_start_offset(host)
        if req.spec == "earliest":
            offset = start
        elif req.spec == "earliest-local":
            offset = hlog.log_start_offset
        elif req.spec == "latest":
            offset = end
        elif req.spec == "timestamp":
            found = hlog.offset_for_timestamp(req.timestamp_ms)
            offset = end if found is None or found >= end else found
        else:
            raise InvalidRequest(
                f"spec must be earliest, earliest-local, latest or timestamp, not {req.spec!r}"
            )
        return api.ListOffsetsResponse(offset, start, hw, hlog.log_start_offset, lso)

    async def delete_records(
        self, req: api.DeleteRecordsRequest, payload: bytes
    ) -> api.DeleteRecordsResponse:
        """Kafka's DeleteRecords: move the log start forward (never past the HW). A live cursor
        that still needs the range stops it, unless force, which invalidates that cursor."""
        host = self.leader(req.topic, req.partition)
        hw = host.log.high_watermark
        target = hw if req.before_offset == -1 else req.before_offset
        if not 0 <= target <= hw:
            raise OffsetOutOfRange(
                f"delete-records before {target}: must be in [0, HW {hw}] (-1 means the HW)",
                log_start=host.log.log_start_offset,
                high_watermark=hw,
            )
        in_the_way = [
            c
            for c in self.metadata.cursors.values()
            if c.live
            and c.topic == req.topic
            and c.positions.get(req.partition, target) < target
            and host.config.cursors_hold
        ]
        if in_the_way and not req.force:
            names = ", ".join(f"{c.name} at {c.positions[req.partition]}" for c in in_the_way)
            raise InvalidRequest(
                f"live cursors still need offsets below {target}: {names}; "
                "use --force to invalidate them",
                cursors=[c.name for c in in_the_way],
            )
        for cursor in in_the_way:
            reason = f"delete-records --force before offset {target} on {host.group}"
            event(
                log,
                logging.WARNING,
                "cursor_invalidated",
                f"cursor {cursor.name} invalidated: {reason}",
                cursor=cursor.name,
                reason=reason,
            )
            await self.cleaner.invalidate_now(cursor.name, reason)
        host = self.leader(req.topic, req.partition)
        host.replica.advance_log_start(target)
        host.process_ready()
        self.cleaner.delete_below_log_start(host)
        log.info(
            "%s: delete-records moved the log start to %d", host.group, host.log.log_start_offset
        )
        return api.DeleteRecordsResponse(host.log.log_start_offset, [c.name for c in in_the_way])

    async def table(self, req: api.TableRequest, payload: bytes) -> api.TableResponse:
        """A table topic's committed state: get one key or scan, from the applied state machine,
        as current as req.consistency asks (docs/design.md, "Reads that are current")."""
        consistency = SERIALIZABLE if req.replica_read else req.consistency
        if consistency not in CONSISTENCIES:
            raise InvalidRequest(
                f"consistency must be one of {', '.join(CONSISTENCIES)}, not {consistency!r}"
            )
        host = self.host(req.topic, req.partition)
        machine = host.state_machine.machine if host.state_machine is not None else None
        if not isinstance(machine, TableMachine):
            raise InvalidRequest(
                f"topic {req.topic!r} is not a table (create it with --kind table)"
            )
        if consistency != SERIALIZABLE:
            await self.confirm_leadership(host, lease=consistency == LEASE)
        try:
            key = base64.b64decode(req.key, validate=True)
            after = base64.b64decode(req.after, validate=True) if req.after else None
        except ValueError as exc:
            raise InvalidRequest(f"table keys travel base64-encoded: {exc}") from exc
        state = machine.state
        if req.op == "get":
            value = state.get(key)
            entries = [[req.key, base64.b64encode(value).decode()]] if value is not None else []
        elif req.op == "scan":
            limit = max(1, min(req.limit, 100_000))
            entries = [
                [base64.b64encode(k).decode(), base64.b64encode(v).decode()]
                for k, v in state.scan(after, limit)
            ]
        else:
            raise InvalidRequest(f"table op must be get or scan, not {req.op!r}")
        return api.TableResponse(
            entries,
            bool(entries),
            state.applied_offset,
            host.log.high_watermark,
            consistency,
            self.node_id,
            host.replica.is_leader,
        )

    async def confirm_leadership(self, host: PartitionHost, lease: bool = False) -> int:
        """ReadIndex (replication/read_index.py): NotLeader unless a majority confirms, after
        this call, that this replica still leads; then its state covers every write any leader
        acknowledged before the call. Returns the read index."""
        return await host.read_index(READ_CONFIRM_TIMEOUT_S, lease)

    @staticmethod
    def check_leader_epoch(host: PartitionHost, leader_epoch: int) -> None:
        """KIP-320: a request that names the leader epoch its client knows."""
        if leader_epoch < 0:
            return
        epoch = host.replica.epoch
        if leader_epoch < epoch:
            raise FencedLeaderEpoch(
                f"{host.group}: the request's leader epoch {leader_epoch} is older than this "
                f"replica's {epoch}: refresh the metadata",
                leader_epoch=epoch,
                leader_hint=host.leader_hint,
            )
        if leader_epoch > epoch:
            raise UnknownLeaderEpoch(
                f"{host.group}: the request's leader epoch {leader_epoch} is newer than this "
                f"replica's {epoch}: it has not heard of that leader yet",
                leader_epoch=epoch,
            )


def check_isolation_level(level: str) -> bool:
    """True for read_committed; InvalidRequest for a level that is neither."""
    if level not in api.ISOLATION_LEVELS:
        raise InvalidRequest(
            f"isolation_level must be {' or '.join(api.ISOLATION_LEVELS)}, not {level!r}",
            field="isolation_level",
        )
    return level == api.READ_COMMITTED
