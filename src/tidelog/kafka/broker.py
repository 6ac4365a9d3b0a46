"""Kafka's requests as the node core's operations.

Every request a Kafka client sends becomes one or more of tidelog's typed requests
(protocol/api.py) passed to `NodeCore.handle` with the connection's principal, so the Kafka port
passes the same authorization and the same validation as tidelog's own protocol; nothing here
touches a log directly. Answers are plain mappings that `codec.build` fits to the version asked.

Where Kafka and tidelog differ:
- A consumer group's committed offsets are the cursor named after the group on each topic
  (`<group>`, or `<group>:<topic>` when the group's name is already a cursor on another
  topic): they hold the low-water mark as every tidelog cursor does, within
  cursor.max.lag.bytes and cursor.max.idle.ms. Committed metadata strings are not kept.
- The group coordinator and the controller are the metadata log's leader.
- The transaction coordinator is the metadata log's leader too: kafka/transactions.py turns
  its Kafka APIs into the core's TransactionRequests (node/ops/transactions.py has the rules);
  transactions need feature level 3, and are refused with UNSUPPORTED_VERSION before it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NamedTuple

from tidelog.acls import Resource
from tidelog.errors import (
    CursorInvalidated,
    InvalidRequest,
    NetworkError,
    NotAuthorized,
    NotLeader,
    ProducerFenced,
    TidelogError,
    TopicAlreadyExists,
    UnknownTopicOrPartition,
)
from tidelog.features import TRANSACTIONS_LEVEL
from tidelog.kafka import errors as kerr
from tidelog.kafka.codec import KafkaRequest, api_version_list, millis
from tidelog.kafka.errors import kafka_code
from tidelog.kafka.groups import GroupCoordinator, GroupError
from tidelog.kafka.routing import Routing
from tidelog.kafka.transactions import TRANSACTION_APIS, KafkaTransactions, pending_offsets
from tidelog.node.access import Operation, Principal
from tidelog.node.cluster_view import CursorRecord
from tidelog.node.core import NodeCore
from tidelog.protocol import api
from tidelog.protocol.api import ApiKey
from tidelog.record import decode_records
from tidelog.replication.metadata import CURSOR_NAME, default_replication_factor
from tidelog.replication.metadata_commands import GroupRecord

log = logging.getLogger(__name__)

EARLIEST = -2
EARLIEST_LOCAL = -4  # KIP-405: the first offset on the leader's disk (the archive holds below)
LATEST = -1
CONFIG_SOURCE_TOPIC = 1  # DYNAMIC_TOPIC_CONFIG
CONFIG_SOURCE_DEFAULT = 5  # DEFAULT_CONFIG
TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4
NO_AUTHORIZED_OPERATIONS = -(2**31)
FETCH_WAIT_MAX_MS = 30_000
ADMIN_TIMEOUT_S = 30.0
FORWARDED = {
    api.CreateTopicRequest: ApiKey.CREATE_TOPIC,
    api.DeleteTopicRequest: ApiKey.DELETE_TOPIC,
    api.AlterTopicRequest: ApiKey.ALTER_TOPIC,
    api.CreatePartitionsRequest: ApiKey.CREATE_PARTITIONS,
}

Answer = Mapping[str, Any] | None
Handler = Callable[[Principal, KafkaRequest], Awaitable[Answer]]


class PartitionFetch(NamedTuple):
    """One partition of a Kafka fetch."""

    topic: str
    partition: int
    offset: int
    max_bytes: int
    leader_epoch: int  # current_leader_epoch (Fetch 9+, KIP-320); -1: the client names none


Wanted = list[PartitionFetch]


def refuse(
    entry: dict[str, Any], error: TidelogError, not_leader: int = kerr.NOT_LEADER_OR_FOLLOWER
) -> None:
    """Mark one entry of an answer with the error's Kafka code and message."""
    entry["error_code"] = kafka_code(error, not_leader)
    entry["error_message"] = error.message[:1000]


def resource_entry(resource: Any) -> dict[str, Any]:
    """One resource's entry in a configs answer, before its outcome."""
    return {
        "error_code": kerr.NONE,
        "error_message": None,
        "resource_type": resource.resource_type,
        "resource_name": resource.resource_name,
    }


def topic_uuid(cluster_id: str, name: str, topic_id: int) -> uuid.UUID:
    """A topic's Kafka id: stable for this incarnation of the name in this cluster."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"tidelog:{cluster_id}/{name}/{topic_id}")


def group_cursor(cursors: Mapping[str, CursorRecord], group: str, topic: str) -> str:
    """The cursor that keeps a group's offsets on a topic."""
    own = cursors.get(group)
    if own is not None and own.topic == topic:
        return group
    qualified = f"{group}:{topic}"
    if qualified in cursors or own is not None:
        return qualified
    return group


def group_cursors(cursors: Mapping[str, CursorRecord], group: str) -> list[CursorRecord]:
    """Every cursor that keeps a group's offsets."""
    found = []
    for cursor in cursors.values():
        if cursor.name == group or cursor.name == f"{group}:{cursor.topic}":
            found.append(cursor)
    return sorted(found, key=lambda c: c.topic)


# Kafka requests the core does not authorize, by api key: consumer-group membership
# (JoinGroup, Heartbeat, LeaveGroup, SyncGroup, ListGroups; DescribeGroups answers per group)
# and InitProducerId. FindCoordinator is open: it names a node, as Metadata does.
# What the core does not see, authorized here: membership of a group (JoinGroup, Heartbeat,
# LeaveGroup, SyncGroup) needs read on the group; a producer id, write on some topic.
GROUP_MEMBERSHIP = frozenset({11, 12, 13, 14})
PRODUCER_ID_API = 22


class NotControllerHere(TidelogError):
    """Internal: an admin request this node may not forward (see KafkaBroker._admin)."""


class KafkaBroker:
    """One node's Kafka face: request handlers over the node core. Requests go through the
    core's door (`NodeCore.handle`); what the broker reads of the cluster, it reads from the
    core's read-only view (node/cluster_view.py)."""

    def __init__(self, core: NodeCore, advertised: tuple[str, int]) -> None:
        self.core = core
        self.view = core.view
        self.routing = Routing(core.view, core.asker, advertised)
        self.groups = GroupCoordinator(self._keep_group)
        self._coordinator_epoch = -1
        self._names_by_id: tuple[int, dict[Any, str]] = (-1, {})
        self.transactions = KafkaTransactions(
            core.view,
            self._call,
            core.authorize,
            core.access.authorize,
            self._check_group_member,
            group_cursor,
            self._call,
        )
        self.handlers: dict[int, Handler] = {
            0: self.produce,
            1: self.fetch,
            2: self.list_offsets,
            3: self.metadata,
            8: self.offset_commit,
            9: self.offset_fetch,
            10: self.find_coordinator,
            11: self.join_group,
            12: self.heartbeat,
            13: self.leave_group,
            14: self.sync_group,
            15: self.describe_groups,
            16: self.list_groups,
            18: self.api_versions,
            19: self.create_topics,
            20: self.delete_topics,
            21: self.delete_records,
            22: self.init_producer_id,
            23: self.offset_for_leader_epoch,
            24: self.transactions.add_partitions,
            25: self.transactions.add_offsets,
            26: self.transactions.end_txn,
            27: self.transactions.write_txn_markers,
            28: self.transactions.txn_offset_commit,
            32: self.describe_configs,
            33: self.alter_configs,
            37: self.create_partitions,
            42: self.delete_groups,
            44: self.incremental_alter_configs,
            60: self.describe_cluster,
            61: self.transactions.describe_producers,
            65: self.transactions.describe,
            66: self.transactions.list,
        }

    def start(self) -> None:
        self.groups.start()

    def close(self) -> None:
        self.groups.close()
        self.routing.close()

    async def handle(self, principal: Principal, request: KafkaRequest) -> Answer:
        # What the core does not see (groups' membership, producer ids) is authorized here;
        # everything else is, by the core, as it is for tidelog's protocol.
        self.core.require_started()
        if request.api_key in GROUP_MEMBERSHIP:
            group = Resource.group(str(request.body.group_id))
            self.core.access.authorize(principal, Operation.GROUP, group)
        elif request.api_key == PRODUCER_ID_API:
            self.core.access.authorize(principal, Operation.PRODUCER_ID, Resource.cluster())
        return await self.handlers[request.api_key](principal, request)

    def _may_use_group(self, principal: Principal, group_id: str) -> bool:
        return self.core.access.allows(principal, Operation.GROUP, Resource.group(group_id))

    async def _call(self, principal: Principal, request: Any, payload: bytes = b"") -> Any:
        result = self.core.handle(principal, request, payload)
        if isinstance(result, Awaitable):
            result = await result
        return result

    async def _admin(self, principal: Principal, request: Any) -> None:
        """An admin change, made by the metadata leader: here if this node leads the metadata
        log, else forwarded to it (as a KRaft broker forwards to its controller: clients may
        send admin requests to any node). Waits out an election of the metadata leader."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ADMIN_TIMEOUT_S
        while True:
            leader = self.metadata_leader
            try:
                if leader == self.core.node_id or leader < 0:
                    await self._call(principal, request)
                elif self.core.access.enforced:
                    # A forwarded request would reach the leader as this node, not as the
                    # principal: the client is sent to the controller (NOT_CONTROLLER) instead.
                    self.core.authorize(principal, request)
                    raise NotControllerHere(f"node {leader} is the controller")
                else:
                    self.core.authorize(principal, request)  # here, before it leaves
                    key = FORWARDED[type(request)]
                    await self.routing.ask(leader, key, request, timeout_s=ADMIN_TIMEOUT_S)
                return
            except NotControllerHere as exc:
                raise NotLeader(exc.message, leader_hint=leader) from None
            except (NotLeader, NetworkError):
                if loop.time() > deadline:
                    raise
                await asyncio.sleep(0.1)

    # -- cluster ------------------------------------------------------------------------------

    async def api_versions(self, principal: Principal, req: KafkaRequest) -> Answer:
        """What is served; the transaction APIs only once the cluster is at feature level 3
        (as a KRaft broker lists what its finalized metadata.version allows), so that clients
        say at once that the cluster does not support transactions."""
        served = api_version_list()
        if self.view.finalized_level < TRANSACTIONS_LEVEL:
            served = [a for a in served if a["api_key"] not in TRANSACTION_APIS]
        return {"error_code": kerr.NONE, "api_keys": served, "throttle_time_ms": 0}

    @property
    def metadata_leader(self) -> int:
        return self.view.metadata_leader

    @property
    def controller(self) -> int:
        """The node admin requests go to: the metadata leader, or while none is known this
        node (a KRaft broker names some broker too; a client told NOT_CONTROLLER asks again,
        where one told "no controller" may wait minutes before it refreshes)."""
        leader = self.metadata_leader
        return leader if leader >= 0 else self.core.node_id

    async def _brokers(self) -> list[dict[str, Any]]:
        addresses = await self.routing.kafka_addresses()
        return [
            {"node_id": n, "broker_id": n, "host": h, "port": p, "rack": None}
            for n, (h, p) in sorted(addresses.items())
        ]

    async def metadata(self, principal: Principal, req: KafkaRequest) -> Answer:
        body = req.body
        existing = self.view.topics
        requested = getattr(body, "topics", None)
        if requested is None or (req.api_version == 0 and not requested):
            names = sorted(existing)
        else:
            names = [t.name for t in requested if t.name is not None]
        allow_create = bool(getattr(body, "allow_auto_topic_creation", True))
        missing = [n for n in names if n not in existing]
        # A node behind on the metadata log may lack a topic that exists: it neither creates
        # it (that fails, and is logged as a failure) nor calls it unknown (below).
        behind = bool(missing) and bool(self.view.metadata_behind())
        if missing and allow_create and requested is not None and not behind:
            await self._auto_create(principal, missing)
        await self.routing.refresh_leaders([n for n in names if n in existing])
        brokers = await self._brokers()
        known = {b["node_id"] for b in brokers}
        topics = [self._topic_metadata(name, known, behind) for name in names]
        return {
            "throttle_time_ms": 0,
            "brokers": brokers,
            "cluster_id": self.view.cluster_id or None,
            "controller_id": self.controller,
            "topics": topics,
            "cluster_authorized_operations": NO_AUTHORIZED_OPERATIONS,
        }

    def _topic_metadata(self, name: str, brokers: set[int], behind: bool) -> dict[str, Any]:
        meta = self.view.topics.get(name)
        if meta is None:
            return {
                # LEADER_NOT_AVAILABLE: retriable, as Kafka answers a topic being created
                "error_code": kerr.LEADER_NOT_AVAILABLE
                if behind
                else kerr.UNKNOWN_TOPIC_OR_PARTITION,
                "name": name,
                "topic_id": uuid.UUID(int=0),
                "is_internal": False,
                "partitions": [],
                "topic_authorized_operations": NO_AUTHORIZED_OPERATIONS,
            }
        partitions = []
        for p in range(meta.partitions):
            leader, epoch = self.routing.leader(name, p)
            replicas = list(meta.assignments[p])
            in_sync = self.view.in_sync_replicas(name, p)  # where this node leads it
            isr = list(in_sync) if in_sync is not None else replicas
            available = leader >= 0 and leader in brokers
            partitions.append(
                {
                    "error_code": kerr.NONE if available else kerr.LEADER_NOT_AVAILABLE,
                    "partition_index": p,
                    "leader_id": leader if available else -1,
                    "leader_epoch": epoch,  # KIP-320: what clients send back (-1: unknown)
                    "replica_nodes": replicas,
                    "isr_nodes": isr,
                    "offline_replicas": [],
                }
            )
        return {
            "error_code": kerr.NONE,
            "name": name,
            "topic_id": topic_uuid(self.view.cluster_id, name, meta.topic_id),
            "is_internal": False,
            "partitions": partitions,
            "topic_authorized_operations": NO_AUTHORIZED_OPERATIONS,
        }

    async def _auto_create(self, principal: Principal, names: list[str]) -> None:
        """auto.create.topics.enable, as Kafka's default: a topic a producer or consumer names
        is created with one partition and min(3, nodes) replicas, on the metadata leader."""
        for name in names:
            try:
                await self._admin(principal, api.CreateTopicRequest(name, 1))
                log.info("kafka: topic %s created on first use", name)
            except TidelogError as exc:
                log.info("kafka: topic %s not created on first use: %s", name, exc)

    async def describe_cluster(self, principal: Principal, req: KafkaRequest) -> Answer:
        return {
            "throttle_time_ms": 0,
            "error_code": kerr.NONE,
            "endpoint_type": 1,
            "cluster_id": self.view.cluster_id,
            "controller_id": self.controller,
            "brokers": await self._brokers(),
            "cluster_authorized_operations": NO_AUTHORIZED_OPERATIONS,
        }

    # -- produce -----------------------------------------------------------------------------------

    async def produce(self, principal: Principal, req: KafkaRequest) -> Answer:
        body = req.body
        acks, timeout_ms = int(body.acks), millis(body.timeout)
        pending: list[tuple[str, int, Any]] = []
        for topic in body.topic_data:
            for part in topic.partition_data:
                pending.append((topic.name, part.index, part.records))
        transactional_id = str(body.transactional_id or "")
        outcomes: list[Any] = await asyncio.gather(
            *(
                self._produce_one(principal, t, p, r, acks, timeout_ms, transactional_id)
                for t, p, r in pending
            )
        )
        if acks == 0:
            return None
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (topic, p, _), outcome in zip(pending, outcomes, strict=True):
            entry: dict[str, Any] = {
                "index": p,
                "error_code": kerr.NONE,
                "base_offset": -1,
                "log_append_time_ms": -1,
                "log_start_offset": -1,
                "record_errors": [],
                "error_message": None,
            }
            if isinstance(outcome, TidelogError):
                code = kafka_code(outcome)
                if isinstance(outcome, ProducerFenced):
                    code = kerr.INVALID_PRODUCER_EPOCH  # a partition leader's word, as Kafka's
                entry["error_code"] = code
                entry["error_message"] = outcome.message[:1000]
            elif outcome is not None:
                entry["base_offset"] = outcome.base_offset
                entry["log_start_offset"] = outcome.log_start_offset
            by_topic.setdefault(topic, []).append(entry)
        return {
            "responses": [{"name": t, "partition_responses": ps} for t, ps in by_topic.items()],
            "throttle_time_ms": 0,
        }

    async def _produce_one(
        self,
        principal: Principal,
        topic: str,
        partition: int,
        records: bytes | None,
        acks: int,
        timeout_ms: int,
        transactional_id: str = "",
    ) -> Any:
        try:
            if not records:
                raise InvalidRequest("a produce request with no records")
            request = api.ProduceRequest(
                topic,
                partition,
                acks,
                min(timeout_ms, 300_000),
                transactional_id=transactional_id,
            )
            return await self._call(principal, request, records)
        except TidelogError as exc:
            log.info(
                "kafka: produce to %s/%d from %s: %s", topic, partition, principal.address, exc
            )
            return exc

    async def init_producer_id(self, principal: Principal, req: KafkaRequest) -> Answer:
        """An idempotent producer's id: drawn at random from 63 bits, as tidelog's own client
        draws its ids (the partition leaders keep each id's sequence state; KIP-360's epoch
        bump is answered with a fresh id, which the producer takes as it takes a new epoch)."""
        if req.body.transactional_id is not None:
            return {"throttle_time": 0, **await self.transactions.init_producer_id(principal, req)}
        return {
            "throttle_time_ms": 0,
            "error_code": kerr.NONE,
            "producer_id": random.SystemRandom().getrandbits(62) + 1,
            "producer_epoch": 0,
        }

    # -- fetch -------------------------------------------------------------------------------------

    async def fetch(self, principal: Principal, req: KafkaRequest) -> Answer:
        """Kafka's fetch over the core's per-partition fetch: answer at once when min_bytes
        are there (or an error), else wait for the first partition with news, up to max_wait."""
        body = req.body
        wanted, ids, unknown = self._fetch_partitions(req)
        max_wait_ms = min(max(millis(body.max_wait), 0), FETCH_WAIT_MAX_MS)
        replica_read = req.api_version >= 11  # KIP-392: a follower serves what it has committed
        isolation = isolation_of(req)
        max_bytes = int(body.max_bytes)
        results = await self._fetch_round(principal, wanted, max_bytes, replica_read, isolation)
        size = sum(len(r[1] or b"") for r in results if not isinstance(r, TidelogError))
        errors = any(isinstance(r, TidelogError) for r in results)
        if not errors and size < max(int(body.min_bytes), 1) and max_wait_ms > 0 and wanted:
            await self._wait_for_news(principal, wanted, max_wait_ms, replica_read, isolation)
            results = await self._fetch_round(principal, wanted, max_bytes, replica_read, isolation)
        responses = fetched_topics(wanted, results, ids, self.routing.leader)
        responses.extend(unknown_topic_ids(unknown))
        return {
            "throttle_time_ms": 0,
            "error_code": kerr.NONE,
            "session_id": 0,  # no incremental fetch session: every fetch names its partitions
            "responses": responses,
            "node_endpoints": await self._leader_endpoints(responses),
        }

    async def _leader_endpoints(self, responses: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The Kafka addresses of the leaders a fetch answer names in current_leader (Fetch
        16+, KIP-951), so that the client goes to the new leader without asking Metadata."""
        named = {
            part["current_leader"]["leader_id"]
            for topic in responses
            for part in topic["partitions"]
            if "current_leader" in part
        }
        if not named:
            return []
        addresses = await self.routing.kafka_addresses()
        return [
            {"node_id": n, "host": addresses[n][0], "port": addresses[n][1], "rack": None}
            for n in sorted(named)
            if n in addresses
        ]

    def _fetch_partitions(self, req: KafkaRequest) -> tuple[Wanted, dict[str, Any], list[Any]]:
        """The partitions a fetch asks for, by topic name; the ids of the topics it named by
        id (Fetch 13+, KIP-516), and those topics whose id is unknown (UNKNOWN_TOPIC_ID)."""
        by_id = req.api_version >= 13
        names = self._topic_names_by_id() if by_id else {}
        ids: dict[str, Any] = {}
        unknown: list[Any] = []
        wanted: Wanted = []
        for topic in req.body.topics:
            name = names.get(topic.topic_id, "") if by_id else topic.topic
            if by_id:
                if not name:
                    unknown.append(topic)
                    continue
                ids[name] = topic.topic_id
            wanted.extend(
                PartitionFetch(
                    name,
                    part.partition,
                    int(part.fetch_offset),
                    int(part.partition_max_bytes),
                    int(getattr(part, "current_leader_epoch", -1)),  # (Fetch 9+)
                )
                for part in topic.partitions
            )
        return wanted, ids, unknown

    async def _wait_for_news(
        self,
        principal: Principal,
        wanted: Wanted,
        max_wait_ms: int,
        replica_read: bool,
        isolation: str,
    ) -> None:
        """Until the first of the partitions has records past its fetch offset (below the LSO
        for read_committed: a long poll on each), or max_wait_ms."""
        waits = [
            asyncio.ensure_future(
                self._call(
                    principal,
                    api.FetchRequest(
                        w.topic,
                        w.partition,
                        w.offset,
                        1,
                        max_wait_ms,
                        1,
                        replica_read,
                        leader_epoch=w.leader_epoch,  # a fenced partition answers at once
                        isolation_level=isolation,
                    ),
                )
            )
            for w in wanted
        ]
        try:
            await asyncio.wait(
                waits, timeout=max_wait_ms / 1000, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    def _topic_names_by_id(self) -> dict[Any, str]:
        """Kafka topic ids (uuids, as Metadata gives them) to names, made once per metadata."""
        view = self.view
        if self._names_by_id[0] != view.applied_offset:
            cluster_id = view.cluster_id
            self._names_by_id = (
                view.applied_offset,
                {
                    topic_uuid(cluster_id, name, meta.topic_id): name
                    for name, meta in view.topics.items()
                },
            )
        return self._names_by_id[1]

    async def _fetch_round(
        self,
        principal: Principal,
        wanted: Wanted,
        max_bytes: int,
        replica_read: bool,
        isolation: str = api.READ_UNCOMMITTED,
    ) -> list[Any]:
        """One pass over the partitions without waiting, within the response's byte budget
        (the first partition's first batch comes whole even if larger, as in Kafka)."""
        out: list[Any] = []
        budget = max(max_bytes, 1)
        for topic, p, offset, partition_max, leader_epoch in wanted:
            if budget <= 0:
                out.append((None, b""))
                continue
            request = api.FetchRequest(
                topic,
                p,
                offset,
                max(1, min(partition_max, budget)),
                0,
                0,
                replica_read,
                leader_epoch=leader_epoch,
                isolation_level=isolation,
            )
            try:
                response, payload = await self._call(principal, request)
            except TidelogError as exc:
                out.append(exc)
                continue
            data = payload.read() if payload is not None else b""
            budget -= len(data)
            out.append((response, data))
        return [
            (_empty_fetch(self, t, p), b"")
            if not isinstance(r, TidelogError) and r[0] is None
            else r
            for (t, p, *_), r in zip(wanted, out, strict=True)
        ]

    async def list_offsets(self, principal: Principal, req: KafkaRequest) -> Answer:
        isolation = isolation_of(req)  # read_committed: "latest" is the LSO (ListOffsets 2+)
        topics = []
        for topic in req.body.topics:
            partitions = []
            for part in topic.partitions:
                ts = int(part.timestamp)
                spec = {
                    EARLIEST: "earliest",
                    LATEST: "latest",
                    EARLIEST_LOCAL: "earliest-local",
                }.get(ts, "timestamp")
                entry: dict[str, Any] = {
                    "partition_index": part.partition_index,
                    "error_code": kerr.NONE,
                    "timestamp": -1,
                    "offset": -1,
                    "leader_epoch": -1,
                }
                if ts < EARLIEST and ts != EARLIEST_LOCAL:
                    entry["error_code"] = kerr.UNSUPPORTED_VERSION  # max-timestamp (-3) and others
                else:
                    try:
                        found = await self._call(
                            principal,
                            api.ListOffsetsRequest(
                                topic.name,
                                part.partition_index,
                                spec,
                                ts,
                                leader_epoch=int(getattr(part, "current_leader_epoch", -1)),
                                isolation_level=isolation,
                            ),
                        )
                        entry["offset"] = found.offset
                        visible_end = (
                            found.last_stable_offset
                            if isolation == api.READ_COMMITTED and found.last_stable_offset >= 0
                            else found.high_watermark
                        )
                        if spec == "timestamp" and found.offset >= visible_end:
                            entry["offset"] = -1  # no committed record that late, as Kafka says
                        elif spec == "timestamp":
                            entry["timestamp"] = await self._timestamp_at(
                                principal, topic.name, part.partition_index, found.offset, ts
                            )
                        _, epoch = self.routing.leader(topic.name, part.partition_index)
                        entry["leader_epoch"] = epoch
                    except TidelogError as exc:
                        entry["error_code"] = kafka_code(exc)
                partitions.append(entry)
            topics.append({"name": topic.name, "partitions": partitions})
        return {"throttle_time_ms": 0, "topics": topics}

    async def offset_for_leader_epoch(self, principal: Principal, req: KafkaRequest) -> Answer:
        """Where the leader's log ends each epoch asked about (KIP-320): a consumer that learns
        of a new leader checks that its position is not past the end of the epoch it read it
        in (a truncated log). Answered by the leader only, fenced by current_leader_epoch."""
        topics = []
        for topic in req.body.topics:
            partitions = []
            for part in topic.partitions:
                entry: dict[str, Any] = {
                    "partition": part.partition,
                    "error_code": kerr.NONE,
                    "leader_epoch": -1,
                    "end_offset": -1,
                }
                try:
                    entry["leader_epoch"], entry["end_offset"] = await self._epoch_end(
                        principal,
                        topic.topic,
                        part.partition,
                        int(part.current_leader_epoch),
                        int(part.leader_epoch),
                    )
                except TidelogError as exc:
                    entry["error_code"] = kafka_code(exc)
                partitions.append(entry)
            topics.append({"topic": topic.topic, "partitions": partitions})
        return {"throttle_time_ms": 0, "topics": topics}

    async def _epoch_end(
        self, principal: Principal, topic: str, partition: int, current_epoch: int, epoch: int
    ) -> tuple[int, int]:
        """(epoch, end offset) for OffsetForLeaderEpoch. The core's ListOffsets authorizes the
        read, refuses a node that does not lead the partition and fences current_epoch; the
        epoch's end is then read from this node's log."""
        await self._call(
            principal, api.ListOffsetsRequest(topic, partition, leader_epoch=current_epoch)
        )
        found = self.view.epoch_end_offset(topic, partition, epoch)
        if found is None:
            raise NotLeader(f"node {self.core.node_id} no longer holds {topic}/{partition}")
        known, end = found
        # An epoch older than every one the log still holds (retention removed them) ends
        # where the log's first one starts, as Kafka answers: never "undefined", which makes
        # a consumer reset its position by auto.offset.reset.
        return (known if known >= 0 else epoch), end

    async def _timestamp_at(
        self, principal: Principal, topic: str, partition: int, offset: int, asked: int
    ) -> int:
        """The timestamp of the record at offset (ListOffsets answers the one it found)."""
        request = api.FetchRequest(topic, partition, offset, 1, 0, 0, True)
        try:
            _, payload = await self._call(principal, request)
            records = decode_records(payload.read()) if payload is not None else []
        except TidelogError:
            return asked
        return next((r.timestamp for r in records if r.offset == offset), asked)

    async def delete_records(self, principal: Principal, req: KafkaRequest) -> Answer:
        topics = []
        for topic in req.body.topics:
            partitions = []
            for part in topic.partitions:
                entry: dict[str, Any] = {
                    "partition_index": part.partition_index,
                    "low_watermark": -1,
                    "error_code": kerr.NONE,
                }
                try:
                    done = await self._call(
                        principal,
                        api.DeleteRecordsRequest(
                            topic.name, part.partition_index, int(part.offset)
                        ),
                    )
                    entry["low_watermark"] = done.log_start_offset
                except TidelogError as exc:
                    entry["error_code"] = kafka_code(exc)
                partitions.append(entry)
            topics.append({"name": topic.name, "partitions": partitions})
        return {"throttle_time_ms": 0, "topics": topics}

    # -- admin -------------------------------------------------------------------------------------

    async def create_topics(self, principal: Principal, req: KafkaRequest) -> Answer:
        body = req.body
        results = []
        for topic in body.topics:
            partitions = int(topic.num_partitions)
            factor = int(topic.replication_factor)
            partitions = 1 if partitions == -1 else partitions
            if factor == -1:
                factor = default_replication_factor(list(self.view.placeable_nodes()))
            configs = {c.name: c.value for c in topic.configs if c.value is not None}
            entry: dict[str, Any] = {
                "name": topic.name,
                "topic_id": uuid.UUID(int=0),
                "error_code": kerr.NONE,
                "error_message": None,
                "num_partitions": partitions,
                "replication_factor": factor,
                "configs": [],
            }
            try:
                if topic.assignments:
                    raise InvalidRequest(
                        "explicit replica assignments are not taken here: tidelog places "
                        "replicas itself (move them with `tidelog partitions reassign`)"
                    )
                if getattr(body, "validate_only", False):
                    if topic.name in self.view.topics:
                        raise TopicAlreadyExists(
                            f"topic {topic.name!r} already exists", topic=topic.name
                        )
                else:
                    await self._admin(
                        principal, api.CreateTopicRequest(topic.name, partitions, factor, configs)
                    )
                    meta = self.view.topics.get(topic.name)
                    if meta is not None:
                        entry["topic_id"] = topic_uuid(
                            self.view.cluster_id, topic.name, meta.topic_id
                        )
            except TidelogError as exc:
                refuse(entry, exc, kerr.NOT_CONTROLLER)
                entry["num_partitions"] = entry["replication_factor"] = -1
            results.append(entry)
        return {"throttle_time_ms": 0, "topics": results}

    async def delete_topics(self, principal: Principal, req: KafkaRequest) -> Answer:
        body = req.body
        names = [t.name for t in body.topics] if req.api_version >= 6 else list(body.topic_names)
        results = []
        for name in names:
            entry: dict[str, Any] = {
                "name": name,
                "topic_id": uuid.UUID(int=0),
                "error_code": kerr.NONE,
                "error_message": None,
            }
            try:
                if name is None:
                    raise UnknownTopicOrPartition("topics are deleted by name here")
                await self._admin(principal, api.DeleteTopicRequest(name))
            except TidelogError as exc:
                refuse(entry, exc, kerr.NOT_CONTROLLER)
            results.append(entry)
        return {"throttle_time_ms": 0, "responses": results}

    async def create_partitions(self, principal: Principal, req: KafkaRequest) -> Answer:
        results = []
        for topic in req.body.topics:
            entry: dict[str, Any] = {
                "name": topic.name,
                "error_code": kerr.NONE,
                "error_message": None,
            }
            try:
                if topic.assignments:
                    raise InvalidRequest("explicit replica assignments are not taken here")
                if not req.body.validate_only:
                    await self._admin(
                        principal, api.CreatePartitionsRequest(topic.name, int(topic.count))
                    )
            except TidelogError as exc:
                refuse(entry, exc, kerr.NOT_CONTROLLER)
                if entry["error_code"] == kerr.INVALID_REQUEST:
                    entry["error_code"] = kerr.INVALID_PARTITIONS
            results.append(entry)
        return {"throttle_time_ms": 0, "results": results}

    async def describe_configs(self, principal: Principal, req: KafkaRequest) -> Answer:
        results = []
        for resource in req.body.resources:
            entry = {**resource_entry(resource), "configs": []}
            keys = resource.configuration_keys
            if resource.resource_type == TOPIC_RESOURCE:
                try:
                    await self._call(principal, api.MetadataRequest([resource.resource_name]))
                    meta = self.view.topic(resource.resource_name)
                    effective = self.view.config.topic_defaults.with_overrides(meta.configs)
                    for name, value in sorted(effective.to_mapping().items()):
                        if keys is not None and name not in keys:
                            continue
                        entry["configs"].append(
                            {
                                "name": name,
                                "value": value,
                                "read_only": False,
                                "is_default": name not in meta.configs,
                                "config_source": (
                                    CONFIG_SOURCE_TOPIC
                                    if name in meta.configs
                                    else CONFIG_SOURCE_DEFAULT
                                ),
                                "is_sensitive": False,
                                "synonyms": [],
                                "config_type": 0,
                                "documentation": None,
                            }
                        )
                except TidelogError as exc:
                    refuse(entry, exc)
            elif resource.resource_type != BROKER_RESOURCE:
                entry["error_code"] = kerr.INVALID_REQUEST
                entry["error_message"] = "only topic and broker configs are described"
            results.append(entry)
        return {"throttle_time_ms": 0, "results": results}

    async def alter_configs(self, principal: Principal, req: KafkaRequest) -> Answer:
        """The older, whole-set AlterConfigs (kafkajs, kafka-python and confluent's
        alter_configs use it): a topic's configs become exactly those given; every override
        not named goes back to its default, as in Kafka."""

        def whole_set(resource: Any) -> tuple[dict[str, str], list[str]]:
            sets = {c.name: c.value or "" for c in resource.configs}
            meta = self.view.topic(resource.resource_name)
            return sets, sorted(set(meta.configs) - set(sets))

        return await self._alter_topics(principal, req, whole_set)

    async def incremental_alter_configs(self, principal: Principal, req: KafkaRequest) -> Answer:
        def changes(resource: Any) -> tuple[dict[str, str], list[str]]:
            if any(c.config_operation not in (0, 1) for c in resource.configs):
                raise InvalidRequest("APPEND and SUBTRACT apply to list configs: tidelog has none")
            sets = {c.name: c.value or "" for c in resource.configs if c.config_operation == 0}
            return sets, [c.name for c in resource.configs if c.config_operation == 1]

        return await self._alter_topics(principal, req, changes)

    async def _alter_topics(
        self,
        principal: Principal,
        req: KafkaRequest,
        changes: Callable[[Any], tuple[dict[str, str], list[str]]],
    ) -> Answer:
        """Each resource's (set, deleted) configs, as the metadata leader alters a topic; with
        validate_only, checked as it would be and changed nowhere."""
        responses = []
        for resource in req.body.resources:
            entry = resource_entry(resource)
            try:
                if resource.resource_type != TOPIC_RESOURCE:
                    raise InvalidRequest("only topic configs are altered here")
                sets, deletes = changes(resource)
                name = resource.resource_name
                if req.body.validate_only:
                    self.view.check_alter_topic(name, sets, deletes)
                else:
                    await self._admin(principal, api.AlterTopicRequest(name, sets, deletes))
            except TidelogError as exc:
                refuse(entry, exc, kerr.NOT_CONTROLLER)
            responses.append(entry)
        return {"throttle_time_ms": 0, "responses": responses}

    # -- groups ------------------------------------------------------------------------------------

    async def _coordinator(self) -> tuple[int, str, int] | None:
        leader = self.metadata_leader
        if leader < 0:
            return None
        address = (await self.routing.kafka_addresses()).get(leader)
        return (leader, *address) if address is not None else None

    async def find_coordinator(self, principal: Principal, req: KafkaRequest) -> Answer:
        body = req.body
        keys = list(body.coordinator_keys) if req.api_version >= 4 else [body.key]
        key_type = int(getattr(body, "key_type", 0))
        found = await self._coordinator()
        coordinators = []
        for key in keys:
            entry: dict[str, Any] = {
                "key": key,
                "node_id": -1,
                "host": "",
                "port": -1,
                "error_code": kerr.NONE,
                "error_message": None,
            }
            refused = self._transaction_coordinator_refused(principal, key_type, key)
            if refused is not None:
                entry["error_code"], entry["error_message"] = refused
            elif found is None:
                entry["error_code"] = kerr.COORDINATOR_NOT_AVAILABLE
            else:
                entry["node_id"], entry["host"], entry["port"] = found
            coordinators.append(entry)
        first = coordinators[0] if coordinators else {}
        return {"throttle_time_ms": 0, "coordinators": coordinators, **first}

    def _transaction_coordinator_refused(
        self, principal: Principal, key_type: int, key: str
    ) -> tuple[int, str] | None:
        """Why FindCoordinator may not name the coordinator of a key (None: it may): a group
        (key type 0) always may; a transactional id (1) needs transactions enabled and may be
        asked by who may describe it; other types do not exist here."""
        if key_type == 0:
            return None
        if key_type != 1:
            return kerr.INVALID_REQUEST, f"coordinator key type {key_type}"
        try:
            self.transactions.enabled()
            resource = Resource.transactional_id(key)
            self.core.access.authorize(principal, Operation.DESCRIBE_TRANSACTION, resource)
        except TidelogError as exc:
            return kafka_code(exc), exc.message[:1000]
        return None

    def _check_group_member(self, group_id: str, member_id: str, generation: int) -> None:
        """A member of the group at its generation (KIP-447's TxnOffsetCommit), asked of this
        node as the group coordinator."""
        self._check_coordinator()
        self.groups.check_member(group_id, member_id, generation)

    async def _keep_group(self, group_id: str, record: dict[str, Any] | None) -> None:
        command = GroupRecord(group_id, record)
        try:
            await self.core.propose_metadata(command, ADMIN_TIMEOUT_S)
        except NotLeader as exc:
            raise GroupError(kerr.NOT_COORDINATOR, str(exc)) from None
        except TidelogError as exc:
            raise GroupError(kafka_code(exc), str(exc)) from None

    def _check_coordinator(self) -> None:
        """Group requests are served by the metadata leader; a change of leader resets the
        membership this node held."""
        view = self.view
        if not view.is_metadata_leader:
            if self._coordinator_epoch >= 0:
                self.groups.reset()
                self._coordinator_epoch = -1
            raise GroupError(kerr.NOT_COORDINATOR, "not the group coordinator")
        if self._coordinator_epoch != view.metadata_epoch:
            self.groups.reset()
            self.groups.load(view.kafka_groups)
            self._coordinator_epoch = view.metadata_epoch

    async def join_group(self, principal: Principal, req: KafkaRequest) -> Answer:
        body = req.body
        try:
            self._check_group_id(body.group_id)
            self._check_coordinator()
            return await self.groups.join(
                body.group_id,
                body.member_id,
                getattr(body, "group_instance_id", None),
                req.client_id,
                principal.address.rpartition(":")[0],
                millis(body.session_timeout),
                millis(getattr(body, "rebalance_timeout", body.session_timeout)),
                body.protocol_type,
                [(p.name, bytes(p.metadata)) for p in body.protocols],
            )
        except GroupError as exc:
            return {
                "error_code": exc.code,
                "generation_id": -1,
                "protocol_name": None,
                "protocol_type": None,
                "leader": "",
                "member_id": body.member_id,
                "members": [],
                "throttle_time_ms": 0,
            }

    async def sync_group(self, principal: Principal, req: KafkaRequest) -> Answer:
        body = req.body
        try:
            self._check_coordinator()
            assignments = {a.member_id: bytes(a.assignment) for a in body.assignments}
            return await self.groups.sync(
                body.group_id, body.member_id, int(body.generation_id), assignments
            )
        except GroupError as exc:
            return {"error_code": exc.code, "assignment": b"", "throttle_time_ms": 0}

    async def heartbeat(self, principal: Principal, req: KafkaRequest) -> Answer:
        body = req.body
        try:
            self._check_coordinator()
            self.groups.heartbeat(body.group_id, body.member_id, int(body.generation_id))
            return {"error_code": kerr.NONE, "throttle_time_ms": 0}
        except GroupError as exc:
            return {"error_code": exc.code, "throttle_time_ms": 0}

    async def leave_group(self, principal: Principal, req: KafkaRequest) -> Answer:
        body = req.body
        try:
            self._check_coordinator()
        except GroupError as exc:
            return {"error_code": exc.code, "members": [], "throttle_time_ms": 0}
        if req.api_version >= 3:
            members = [(m.member_id, m.group_instance_id) for m in body.members]
        else:
            members = [(body.member_id, None)]
        answers = [
            {
                "member_id": member_id,
                "group_instance_id": instance,
                "error_code": self.groups.leave(body.group_id, member_id),
            }
            for member_id, instance in members
        ]
        return {"error_code": kerr.NONE, "members": answers, "throttle_time_ms": 0}

    async def describe_groups(self, principal: Principal, req: KafkaRequest) -> Answer:
        groups = []
        for group_id in req.body.groups:
            entry: dict[str, Any] = {
                "error_code": kerr.NONE,
                "authorized_operations": NO_AUTHORIZED_OPERATIONS,
            }
            try:
                self.core.access.authorize(principal, Operation.GROUP, Resource.group(group_id))
                self._check_coordinator()
                entry.update(self.groups.describe(group_id))
                if entry["group_state"] == "Dead" and group_cursors(self.view.cursors, group_id):
                    entry["group_state"] = "Empty"  # offsets kept, no member
                    entry["protocol_type"] = "consumer"
            except (GroupError, NotAuthorized) as exc:
                code = exc.code if isinstance(exc, GroupError) else kerr.kafka_code(exc)
                entry.update(
                    {"group_id": group_id, "error_code": code, "group_state": "", "members": []}
                )
            groups.append(entry)
        return {"throttle_time_ms": 0, "groups": groups}

    async def list_groups(self, principal: Principal, req: KafkaRequest) -> Answer:
        """The groups this node coordinates. Admin clients (kafkajs, Kafka's own) ask every
        broker and merge the lists, failing if any answers an error: a node that coordinates
        none answers an empty list, as a Kafka broker does."""
        try:
            self._check_coordinator()
        except GroupError:
            return {"error_code": kerr.NONE, "groups": [], "throttle_time_ms": 0}
        found: dict[str, dict[str, Any]] = {}
        for cursor in self.view.cursors.values():
            name = cursor.name
            if name.endswith(f":{cursor.topic}"):
                name = name[: -len(cursor.topic) - 1]
            found[name] = {"group_id": name, "protocol_type": "consumer", "group_state": "Empty"}
        for group_id, group in self.groups.groups.items():
            found[group_id] = {
                "group_id": group_id,
                "protocol_type": group.protocol_type or "consumer",
                "group_state": group.state.value,
            }
        states = set(getattr(req.body, "states_filter", ()) or ())
        groups = [
            g
            for name, g in sorted(found.items())
            if (not states or g["group_state"] in states) and self._may_use_group(principal, name)
        ]
        return {"error_code": kerr.NONE, "groups": groups, "throttle_time_ms": 0}

    async def delete_groups(self, principal: Principal, req: KafkaRequest) -> Answer:
        results = []
        for group_id in req.body.groups_names:
            entry: dict[str, Any] = {"group_id": group_id, "error_code": kerr.NONE}
            try:
                resource = Resource.group(group_id)
                self.core.access.authorize(principal, Operation.DELETE_GROUP, resource)
                self._check_coordinator()
                cursors = group_cursors(self.view.cursors, group_id)
                if not cursors and group_id not in self.groups.groups:
                    raise GroupError(kerr.GROUP_ID_NOT_FOUND, f"no group {group_id}")
                self.groups.delete(group_id)
                for cursor in cursors:
                    await self._call(principal, api.CursorRequest("delete", cursor.name))
            except GroupError as exc:
                entry["error_code"] = exc.code
            except TidelogError as exc:
                entry["error_code"] = kafka_code(exc, not_leader=kerr.NOT_COORDINATOR)
            results.append(entry)
        return {"throttle_time_ms": 0, "results": results}

    @staticmethod
    def _check_group_id(group_id: str) -> None:
        if not CURSOR_NAME.fullmatch(group_id):
            raise GroupError(
                kerr.INVALID_GROUP_ID,
                f"group id {group_id!r}: tidelog keeps a group's offsets in a cursor of that "
                "name (letters, digits, '.', '_', ':' and '-', at most 200)",
            )

    # -- offsets -----------------------------------------------------------------------------------

    async def offset_commit(self, principal: Principal, req: KafkaRequest) -> Answer:
        body = req.body
        code = kerr.NONE
        try:
            if not self._may_use_group(principal, body.group_id):
                raise GroupError(kerr.GROUP_AUTHORIZATION_FAILED, f"group {body.group_id}")
            self._check_group_id(body.group_id)
            self._check_coordinator()
            generation = int(
                getattr(body, "generation_id_or_member_epoch", getattr(body, "generation_id", -1))
            )
            group = self.groups.groups.get(body.group_id)
            if generation >= 0 or (group is not None and group.members):
                self.groups.check_member(body.group_id, body.member_id, generation)
        except GroupError as exc:
            code = exc.code
        topics = []
        for topic in body.topics:
            positions = {int(p.partition_index): int(p.committed_offset) for p in topic.partitions}
            topic_code = code
            if topic_code == kerr.NONE:
                try:
                    await self._commit(principal, body.group_id, topic.name, positions)
                except TidelogError as exc:
                    topic_code = kafka_code(exc, not_leader=kerr.NOT_COORDINATOR)
            topics.append(
                {
                    "name": topic.name,
                    "partitions": [
                        {"partition_index": p, "error_code": topic_code} for p in positions
                    ],
                }
            )
        return {"throttle_time_ms": 0, "topics": topics}

    async def _commit(
        self, principal: Principal, group: str, topic: str, positions: dict[int, int]
    ) -> None:
        """Commit into the group's cursor on the topic: created at the first commit with the
        partitions committed (the others hold nothing until they are); one that the cleaner
        invalidated is created again, as the group is reading again."""
        cursors = self.view.cursors
        name = group_cursor(cursors, group, topic)
        wire = {str(p): o for p, o in positions.items()}
        cursor = cursors.get(name)
        if cursor is not None and not cursor.live:
            log.info("kafka: group %s commits again: cursor %s is created anew", group, name)
            await self._call(principal, api.CursorRequest("delete", name))
            cursor = None
        if cursor is None:
            try:
                await self._call(
                    principal,
                    api.CursorRequest(
                        "create", name, topic, wire, partial=True, if_not_exists=True
                    ),
                )
                return
            except CursorInvalidated:
                pass
        await self._call(principal, api.CursorRequest("commit", name, topic, wire))

    async def offset_fetch(self, principal: Principal, req: KafkaRequest) -> Answer:
        """A group's committed offsets (its cursors); v8+ asks for several groups at once."""
        body = req.body
        stable = bool(getattr(body, "require_stable", False))  # KIP-447 (v7+)
        if req.api_version < 8:
            topics, code = self._group_offsets(principal, body.group_id, body.topics, stable)
            return {"throttle_time_ms": 0, "topics": topics, "error_code": code}
        groups = []
        for group in body.groups:
            topics, code = self._group_offsets(principal, group.group_id, group.topics, stable)
            groups.append({"group_id": group.group_id, "topics": topics, "error_code": code})
        return {"throttle_time_ms": 0, "groups": groups}

    def _group_offsets(
        self, principal: Principal, group_id: str, asked: Any, stable: bool = False
    ) -> tuple[list[dict[str, Any]], int]:
        """One group's offsets for the topics asked (None: every topic it has offsets on).
        stable (KIP-447's require_stable): a partition whose offset an open transaction will
        commit is UNSTABLE_OFFSET_COMMIT until it ends, so a consumer taking it over does not
        start from the offset before the transaction's."""
        if not self._may_use_group(principal, group_id):
            return [], kerr.GROUP_AUTHORIZATION_FAILED
        try:
            self._check_coordinator()
        except GroupError as exc:
            return [], exc.code
        cursors = self.view.cursors
        wanted: list[tuple[str, list[int] | None]]
        if asked is None:
            wanted = [(c.topic, None) for c in group_cursors(cursors, group_id)]
        else:
            wanted = [(t.name, list(t.partition_indexes)) for t in asked]
        topics = []
        for name, partitions in wanted:
            cursor = cursors.get(group_cursor(cursors, group_id, name))
            positions = cursor.positions if cursor is not None and cursor.topic == name else {}
            listed = sorted(positions) if partitions is None else partitions
            # A group's offsets are read on their topic, as its cursor's are.
            code = kerr.NONE
            unstable = pending_offsets(self.view.transactions, group_id, name) if stable else set()
            try:
                self.core.access.authorize(principal, Operation.READ, Resource.topic(name))
            except TidelogError as exc:
                if partitions is None:
                    continue  # all of a group's topics: those one may read
                code, positions = kerr.kafka_code(exc), {}
            topics.append(
                {
                    "name": name,
                    "partitions": [
                        {
                            "partition_index": p,
                            "committed_offset": positions.get(p, -1),
                            "committed_leader_epoch": -1,
                            "metadata": "",
                            "error_code": kerr.UNSTABLE_OFFSET_COMMIT if p in unstable else code,
                        }
                        for p in listed
                    ],
                }
            )
        return topics, kerr.NONE


def _empty_fetch(broker: KafkaBroker, topic: str, partition: int) -> api.FetchResponse:
    """What a partition the byte budget did not reach answers: nothing, with its marks."""
    offsets = broker.view.offsets(topic, partition)
    hw = offsets.high_watermark if offsets is not None else -1
    start = offsets.log_start_offset if offsets is not None else -1
    return api.FetchResponse(hw, start, hw, -1, broker.view.node_id)


def isolation_of(req: KafkaRequest) -> str:
    """A Fetch's (4+) or ListOffsets' (2+) isolation level: 1 is read_committed (below the
    LSO, aborted transactions listed), 0 (and older versions) read_uncommitted."""
    level = int(getattr(req.body, "isolation_level", 0) or 0)
    return api.READ_COMMITTED if level == 1 else api.READ_UNCOMMITTED


def fetched_topics(
    wanted: Wanted,
    results: list[Any],
    ids: dict[str, Any],
    leader: Callable[[str, int], tuple[int, int]],
) -> list[dict[str, Any]]:
    """A fetch answer's topics: each partition's records and marks, or its error's code. A
    partition refused because the client's leader is not the leader, or its leader epoch is
    older than this replica's, names the leader and epoch this node knows (current_leader,
    Fetch 12+: KIP-951), as Kafka's brokers do."""
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, p, *_), result in zip(wanted, results, strict=True):
        entry: dict[str, Any] = {
            "partition_index": p,
            "error_code": kerr.NONE,
            "high_watermark": -1,
            "last_stable_offset": -1,
            "log_start_offset": -1,
            "aborted_transactions": [],
            "preferred_read_replica": -1,
            "records": b"",
        }
        if isinstance(result, TidelogError):
            entry["error_code"] = kafka_code(result)
            if entry["error_code"] in (kerr.NOT_LEADER_OR_FOLLOWER, kerr.FENCED_LEADER_EPOCH):
                known, epoch = leader(topic, p)
                if known >= 0 and epoch >= 0:
                    entry["current_leader"] = {"leader_id": known, "leader_epoch": epoch}
            if "high_watermark" in result.details:
                entry["high_watermark"] = int(result.details["high_watermark"])
                entry["log_start_offset"] = int(result.details.get("log_start", -1))
        else:
            response, records = result
            entry["high_watermark"] = response.high_watermark
            lso = response.last_stable_offset
            entry["last_stable_offset"] = lso if lso >= 0 else response.high_watermark
            entry["log_start_offset"] = response.log_start_offset
            entry["aborted_transactions"] = [
                {"producer_id": producer_id, "first_offset": first_offset}
                for producer_id, first_offset in response.aborted_transactions
            ]
            entry["records"] = records or b""
        by_topic.setdefault(topic, []).append(entry)
    return [{"topic": t, "topic_id": ids.get(t), "partitions": ps} for t, ps in by_topic.items()]


def unknown_topic_ids(unknown: list[Any]) -> list[dict[str, Any]]:
    """A fetch answer's topics named by an id no topic has."""
    responses = []
    for topic in unknown:
        unknown_entries = [
            {
                "partition_index": part.partition,
                "error_code": kerr.UNKNOWN_TOPIC_ID,
                "high_watermark": -1,
                "last_stable_offset": -1,
                "log_start_offset": -1,
                "records": b"",
            }
            for part in topic.partitions
        ]
        responses.append({"topic_id": topic.topic_id, "partitions": unknown_entries})
    return responses
