"""Kafka's transaction APIs (KIP-98, KIP-447, KIP-664), translated into the coordinator's
requests of tidelog's protocol.

The rules are the node's (node/ops/transactions.py), which tidelog's own client reaches too:
each handler here turns a Kafka request into `api.TransactionRequest`s passed through the core's
door (`NodeCore.handle`, which authorizes them), and the answer or error into Kafka's fields and
codes. The transaction coordinator is the metadata log's leader, as the group coordinator is.
Every request needs feature level 3 (`transactions`): before it, UNSUPPORTED_VERSION, which
clients report as a broker without transactions.

    InitProducerId (transactional)  init: the id's producer id and a new epoch
    AddPartitionsToTxn v0-3         add_partitions (v4+ is KIP-890's broker-to-broker
                                    verification, which tidelog does inside)
    AddOffsetsToTxn                 add_offsets: a group's offsets will commit with it
    TxnOffsetCommit                 commit_offsets, once this node as the group coordinator
                                    found the member at its generation (KIP-447)
    EndTxn                          end: the decision, its commit point
    DescribeTransactions, ListTransactions
    DescribeProducers v0            a partition leader's producers (node/ops/producers.py)
    WriteTxnMarkers v1              an operator's marker for a hanging transaction, written
                                    only where it agrees with the coordinator (ibid.)
"""

from __future__ import annotations

import datetime
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from tidelog.acls import Resource
from tidelog.errors import (
    InvalidTransactionTimeout,
    ProducerFenced,
    TidelogError,
    UnknownTransactionalId,
)
from tidelog.features import require_transactions
from tidelog.kafka import errors as kerr
from tidelog.kafka.codec import KafkaRequest, millis
from tidelog.kafka.errors import kafka_code
from tidelog.kafka.groups import GroupError
from tidelog.node.access import Operation, Principal
from tidelog.node.cluster_view import ClusterView, CursorRecord
from tidelog.protocol import api
from tidelog.replication.metadata_transactions import Transaction, TxnState

# AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, WriteTxnMarkers, TxnOffsetCommit,
# DescribeTransactions, ListTransactions: listed by ApiVersions only from feature level 3.
# (DescribeProducers is not: idempotent producers have no feature level.)
TRANSACTION_APIS = frozenset({24, 25, 26, 27, 28, 65, 66})
OPERATION_NOT_ATTEMPTED = 55
# Why the coordinator refused a partition (protocol/api.py), as Kafka's codes.
REFUSED_CODES = {
    api.TXN_NOT_AUTHORIZED: kerr.TOPIC_AUTHORIZATION_FAILED,
    api.TXN_UNKNOWN_PARTITION: kerr.UNKNOWN_TOPIC_OR_PARTITION,
    api.TXN_INVALID_OFFSET: kerr.INVALID_REQUEST,
}

Answer = dict[str, Any]
Call = Callable[[Principal, api.TransactionRequest], Awaitable[api.TransactionResponse]]
AskLeader = Callable[[Principal, api.ProducersRequest], Awaitable[api.ProducersResponse]]


class KafkaTransactions:
    """The transaction coordinator's Kafka face on one node."""

    def __init__(
        self,
        view: ClusterView,
        call: Call,
        authorize: Callable[[Principal, Any], object],
        authorize_access: Callable[[Principal, Operation, Resource], None],
        check_group_member: Callable[[str, str, int], None],
        group_cursor: Callable[[Mapping[str, CursorRecord], str, str], str],
        ask_leader: AskLeader,
    ) -> None:
        self.view = view
        self.call = call  # through the core's door (NodeCore.handle)
        self.authorize = authorize  # the door's check alone (NodeCore.authorize)
        self.authorize_access = authorize_access  # Access.authorize
        self.check_group_member = check_group_member  # group, member, generation: GroupError
        self.group_cursor = group_cursor
        self.ask_leader = ask_leader  # a ProducersRequest, through the core's door

    def enabled(self) -> None:
        require_transactions(self.view.finalized_level)

    @staticmethod
    def code(error: TidelogError) -> int:
        return kafka_code(error, not_leader=kerr.NOT_COORDINATOR)

    # -- InitProducerId -----------------------------------------------------------------------

    async def init_producer_id(self, principal: Principal, req: KafkaRequest) -> Answer:
        body = req.body
        answer: Answer = {"error_code": kerr.NONE, "producer_id": -1, "producer_epoch": -1}
        request = api.TransactionRequest(
            "init",
            str(body.transactional_id),
            producer_id=int(getattr(body, "producer_id", -1)),
            producer_epoch=int(getattr(body, "producer_epoch", -1)),
            timeout_ms=millis(body.transaction_timeout),
        )
        try:
            self.enabled()  # before the id's ACL, as Kafka's broker without transactions says
            txn = (await self.call(principal, request)).transaction
            answer["producer_id"], answer["producer_epoch"] = txn["producer_id"], txn["epoch"]
        except InvalidTransactionTimeout:
            answer["error_code"] = kerr.INVALID_TRANSACTION_TIMEOUT
        except TidelogError as exc:
            answer["error_code"] = self.code(exc)
        return answer

    # -- AddPartitionsToTxn, AddOffsetsToTxn ---------------------------------------------------

    async def add_partitions(self, principal: Principal, req: KafkaRequest) -> Answer:
        body = req.body
        asked = {t.name: [int(p) for p in t.partitions] for t in body.v3_and_below_topics}
        codes = {t: dict.fromkeys(ps, kerr.NONE) for t, ps in asked.items()}
        request = api.TransactionRequest(
            "add_partitions",
            str(body.v3_and_below_transactional_id),
            int(body.v3_and_below_producer_id),
            int(body.v3_and_below_producer_epoch),
            partitions=asked,
        )
        try:
            self.enabled()
            refused = (await self.call(principal, request)).refused
            if refused:
                for topic, partitions in codes.items():
                    for p in partitions:
                        reason = refused.get(topic, {}).get(str(p), "")
                        code = REFUSED_CODES.get(reason, kerr.UNKNOWN_SERVER_ERROR)
                        partitions[p] = code if reason else OPERATION_NOT_ATTEMPTED
        except TidelogError as exc:
            code = self.code(exc)
            codes = {t: dict.fromkeys(ps, code) for t, ps in asked.items()}
        return {
            "throttle_time": 0,
            "results_by_topic_v3_and_below": [
                {
                    "name": t,
                    "results_by_partition": [
                        {"partition_index": p, "partition_error_code": c} for p, c in ps.items()
                    ],
                }
                for t, ps in codes.items()
            ],
        }

    async def add_offsets(self, principal: Principal, req: KafkaRequest) -> Answer:
        body = req.body
        request = api.TransactionRequest(
            "add_offsets",
            str(body.transactional_id),
            int(body.producer_id),
            int(body.producer_epoch),
            group=str(body.group_id),
        )
        return await self._error_code_only(principal, request)

    async def _error_code_only(
        self, principal: Principal, request: api.TransactionRequest
    ) -> Answer:
        """The answer of AddOffsetsToTxn and EndTxn: one error code, nothing else."""
        try:
            self.enabled()
            await self.call(principal, request)
            return {"throttle_time": 0, "error_code": kerr.NONE}
        except TidelogError as exc:
            return {"throttle_time": 0, "error_code": self.code(exc)}

    # -- TxnOffsetCommit ------------------------------------------------------------------------

    async def txn_offset_commit(self, principal: Principal, req: KafkaRequest) -> Answer:
        body = req.body
        group = str(body.group_id)
        asked = {
            t.name: {str(int(p.partition_index)): int(p.committed_offset) for p in t.partitions}
            for t in body.topics
        }
        codes = {t: dict.fromkeys((int(p) for p in ps), kerr.NONE) for t, ps in asked.items()}
        cursors = self.view.cursors
        request = api.TransactionRequest(
            "commit_offsets",
            str(body.transactional_id),
            int(body.producer_id),
            int(body.producer_epoch),
            group=group,
            offsets=asked,
            cursors={t: self.group_cursor(cursors, group, t) for t in asked},
        )
        try:
            # The group's member is checked here, as its coordinator, after what the door and
            # the group's ACL say and before the coordinator takes the offsets.
            self.enabled()
            self.authorize(principal, request)
            self.authorize_group(principal, group)
            self._check_member(body)
            refused = (await self.call(principal, request)).refused
            for topic, partitions in refused.items():
                for p, reason in partitions.items():
                    codes[topic][int(p)] = REFUSED_CODES.get(reason, kerr.UNKNOWN_SERVER_ERROR)
        except GroupError as exc:
            codes = {t: dict.fromkeys(ps, exc.code) for t, ps in codes.items()}
        except TidelogError as exc:
            code = self.code(exc)
            codes = {t: dict.fromkeys(ps, code) for t, ps in codes.items()}
        return {
            "throttle_time": 0,
            "topics": [
                {
                    "name": t,
                    "partitions": [{"partition_index": p, "error_code": c} for p, c in ps.items()],
                }
                for t, ps in codes.items()
            ],
        }

    def authorize_group(self, principal: Principal, group: str) -> None:
        """Read on the group, before its membership is looked at (the coordinator checks it
        again with the offsets)."""
        self.authorize_access(principal, Operation.GROUP, Resource.group(group))

    def _check_member(self, body: Any) -> None:
        """KIP-447: a member of the group at its generation (v3+ carries them; -1 and no
        member: a producer outside the group, as Kafka allows)."""
        generation = int(getattr(body, "generation_id", -1))
        member = str(getattr(body, "member_id", "") or "")
        if generation >= 0 or member:
            self.check_group_member(str(body.group_id), member, generation)

    # -- EndTxn ---------------------------------------------------------------------------------

    async def end_txn(self, principal: Principal, req: KafkaRequest) -> Answer:
        body = req.body
        request = api.TransactionRequest(
            "end",
            str(body.transactional_id),
            int(body.producer_id),
            int(body.producer_epoch),
            commit=bool(body.committed),
        )
        return await self._error_code_only(principal, request)

    # -- DescribeTransactions, ListTransactions (KIP-664) -----------------------------------------

    async def describe(self, principal: Principal, req: KafkaRequest) -> Answer:
        states = []
        for transactional_id in req.body.transactional_ids:
            entry: Answer = {"error_code": kerr.NONE, "transactional_id": transactional_id}
            try:
                self.enabled()
                request = api.TransactionRequest("describe", transactional_id)
                entry.update(described((await self.call(principal, request)).transaction))
            except UnknownTransactionalId:
                entry["error_code"] = kerr.TRANSACTIONAL_ID_NOT_FOUND
            except TidelogError as exc:
                entry["error_code"] = self.code(exc)
            # An entry refused carries the schema's default, 0, as Kafka's does; a transaction
            # with nothing open says -1 (described()), as Kafka's coordinator does.
            entry.setdefault("transaction_start_time", start_time(0))
            entry.setdefault("transaction_state", "")
            states.append(entry)
        return {"throttle_time": 0, "transaction_states": states}

    async def list(self, principal: Principal, req: KafkaRequest) -> Answer:
        """The transactions this node coordinates (a node that coordinates none answers an
        empty list, as for ListGroups: admin clients ask every broker)."""
        body = req.body
        request = api.TransactionRequest(
            "list",
            states=[str(s) for s in body.state_filters or ()],
            producer_ids=[int(p) for p in body.producer_id_filters or ()],
            min_age_ms=int(getattr(body, "duration_filter", -1)),
        )
        response = await self.call(principal, request)
        return {
            "throttle_time": 0,
            "error_code": kerr.NONE,
            "unknown_state_filters": response.unknown_states,
            "transaction_states": [
                {
                    "transactional_id": txn["transactional_id"],
                    "producer_id": txn["producer_id"],
                    "transaction_state": txn["state"],
                }
                for txn in response.transactions
            ],
        }

    # -- DescribeProducers, WriteTxnMarkers (KIP-664) --------------------------------------------

    async def describe_producers(self, principal: Principal, req: KafkaRequest) -> Answer:
        """Each partition's producers, from its leader (this node: a client asks each
        partition's leader, as Kafka's admin does)."""
        topics = []
        for topic in req.body.topics:
            partitions = []
            for p in topic.partition_indexes:
                entry: Answer = {"partition_index": int(p), "error_code": kerr.NONE}
                request = api.ProducersRequest("describe", str(topic.name), int(p))
                try:
                    found = await self.ask_leader(principal, request)
                    entry["active_producers"] = [producer_state(s) for s in found.producers]
                except TidelogError as exc:
                    entry["error_code"] = kafka_code(exc)
                    entry["error_message"] = exc.message[:1000]
                partitions.append(entry)
            topics.append({"name": topic.name, "partitions": partitions})
        return {"throttle_time": 0, "topics": topics}

    async def write_txn_markers(self, principal: Principal, req: KafkaRequest) -> Answer:
        """An operator's markers (kafka-transactions.sh abort), each partition on its leader
        (this node). Kafka's CLUSTER_ACTION is tidelog's cluster admin."""
        markers = []
        for marker in req.body.markers:
            topics = []
            for topic in marker.topics:
                partitions = []
                for p in topic.partition_indexes:
                    request = api.ProducersRequest(
                        "write_marker",
                        str(topic.name),
                        int(p),
                        producer_id=int(marker.producer_id),
                        producer_epoch=int(marker.producer_epoch),
                        commit=bool(marker.transaction_result),
                        coordinator_epoch=int(marker.coordinator_epoch),
                    )
                    code = kerr.NONE
                    try:
                        await self.ask_leader(principal, request)
                    except ProducerFenced:
                        code = kerr.INVALID_PRODUCER_EPOCH  # a partition leader's word
                    except TidelogError as exc:
                        code = kafka_code(exc)
                    partitions.append({"partition_index": int(p), "error_code": code})
                topics.append({"name": topic.name, "partitions": partitions})
            markers.append({"producer_id": int(marker.producer_id), "topics": topics})
        return {"markers": markers}


def producer_state(found: Mapping[str, Any]) -> Answer:
    """One producer as the leader answered it (api.ProducersResponse), in DescribeProducers'
    fields."""
    return {
        "producer_id": found["producer_id"],
        "producer_epoch": found["producer_epoch"],
        "last_sequence": found["last_sequence"],
        "last_timestamp": found["last_timestamp_ms"],
        "coordinator_epoch": found["coordinator_epoch"],
        "current_txn_start_offset": found["txn_start_offset"],
    }


def start_time(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)


def described(txn: Mapping[str, Any]) -> Answer:
    """A transaction as the coordinator answers it (Transaction.to_wire()), in Kafka's
    DescribeTransactions fields."""
    started = int(txn["started_ms"])
    return {
        "transaction_state": txn["state"],
        "transaction_timeout": txn["timeout_ms"],
        "transaction_start_time": start_time(started if started else -1),
        "producer_id": txn["producer_id"],
        "producer_epoch": txn["epoch"],
        "topics": [
            {"topic": t, "partitions": list(ps)} for t, ps in sorted(txn["partitions"].items())
        ],
    }


def pending_offsets(transactions: Mapping[str, Transaction], group: str, topic: str) -> set[int]:
    """The partitions of a topic whose offsets an open transaction will commit for a group."""
    found: set[int] = set()
    for txn in transactions.values():
        if txn.state is TxnState.ONGOING and group in txn.groups:
            for entry in txn.pending_offsets.values():
                if entry["topic"] == topic:
                    found.update(entry["positions"])
    return found
