"""Kafka's transaction APIs (KIP-98, KIP-447, KIP-664) over the metadata log's transactions.

The transaction coordinator is the metadata log's leader, as the group coordinator is: these
handlers check a request against the transactional id's state (replication/
metadata_transactions.py), as the core's view shows it, and propose the command that changes
it; node/transaction_coordinator.py writes the markers once a decision is committed. Every
request needs feature level 3 (`transactions`): before it, UNSUPPORTED_VERSION, which clients
report as a broker without transactions.

    InitProducerId (transactional)  the id's producer id and a new epoch (fences older ones)
    AddPartitionsToTxn v0-3         partitions join the transaction (v4+ is KIP-890's
                                    broker-to-broker verification, which tidelog does inside)
    AddOffsetsToTxn                 a group's offsets will commit with it
    TxnOffsetCommit                 the offsets, pending until the transaction ends
    EndTxn                          the decision: its commit point
    DescribeTransactions, ListTransactions
"""

from __future__ import annotations

import asyncio
import datetime
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from tidelog.acls import Resource
from tidelog.errors import (
    ConcurrentTransactions,
    InvalidTxnState,
    NotLeader,
    ProducerFenced,
    TidelogError,
    TransactionsNotEnabled,
    UnknownTransactionalId,
)
from tidelog.features import TRANSACTIONS_LEVEL
from tidelog.kafka import errors as kerr
from tidelog.kafka.codec import KafkaRequest, millis
from tidelog.kafka.errors import kafka_code
from tidelog.kafka.groups import GroupError
from tidelog.node.access import Operation, Principal
from tidelog.node.cluster_view import ClusterView, CursorRecord
from tidelog.replication.metadata_commands import (
    MetadataCommand,
    TxnAddGroup,
    TxnAddPartitions,
    TxnEnd,
    TxnInit,
    TxnOffsets,
)
from tidelog.replication.metadata_transactions import Transaction, TxnState

PROPOSE_TIMEOUT_S = 30.0
# AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit, DescribeTransactions,
# ListTransactions: listed by ApiVersions only from feature level 3.
TRANSACTION_APIS = frozenset({24, 25, 26, 28, 65, 66})
OPERATION_NOT_ATTEMPTED = 55

Answer = dict[str, Any]


def wall_ms() -> int:
    return int(time.time() * 1000)


class KafkaTransactions:
    """The transaction coordinator's Kafka face on one node."""

    def __init__(
        self,
        view: ClusterView,
        authorize: Callable[[Principal, Operation, Resource], None],
        allows: Callable[[Principal, Operation, Resource], bool],
        propose: Callable[[MetadataCommand, float], Awaitable[int]],
        check_group_member: Callable[[str, str, int], None],
        group_cursor: Callable[[Mapping[str, CursorRecord], str, str], str],
        max_timeout_ms: Callable[[], int],
    ) -> None:
        self.view = view
        self.authorize = authorize
        self.allows = allows
        self.propose = propose
        self.check_group_member = check_group_member  # group, member, generation: GroupError
        self.group_cursor = group_cursor
        self.max_timeout_ms = max_timeout_ms  # the node's transaction.max.timeout.ms
        # Per transactional id: its InitProducerIds one at a time, and how many wait (the entry
        # goes with the last, so that ids used once cost nothing).
        self._init_locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}

    # -- common checks ------------------------------------------------------------------------

    def enabled(self) -> None:
        level = self.view.finalized_level
        if level < TRANSACTIONS_LEVEL:
            raise TransactionsNotEnabled(
                f"transactions need feature level {TRANSACTIONS_LEVEL}; the cluster is "
                f"finalized at {level} (tidelog features upgrade)",
                level=level,
            )

    def coordinator(self, principal: Principal, transactional_id: str) -> None:
        """Transactions enabled, this node the coordinator, principal allowed the id."""
        self.enabled()
        self.authorize(
            principal, Operation.TRANSACTION, Resource.transactional_id(transactional_id)
        )
        if not self.view.is_metadata_leader:
            raise NotLeader(
                "not the transaction coordinator", leader_hint=self.view.metadata_leader
            )

    def current(self, transactional_id: str, producer_id: int, epoch: int) -> Transaction:
        """The id's transaction, if the request's producer id and epoch are its current ones."""
        txn = self.view.transactions.get(transactional_id)
        if txn is None or txn.producer_id != producer_id:
            raise UnknownTransactionalId(
                f"transactional id {transactional_id!r} does not have producer id {producer_id}",
                transactional_id=transactional_id,
            )
        if epoch < txn.epoch:
            raise ProducerFenced(
                f"transactional id {transactional_id!r}: epoch {epoch} is fenced by {txn.epoch}",
                transactional_id=transactional_id,
            )
        if epoch > txn.epoch:
            raise InvalidTxnState(
                f"transactional id {transactional_id!r} is at epoch {txn.epoch}, not {epoch}",
                transactional_id=transactional_id,
            )
        return txn

    @staticmethod
    def may_add(txn: Transaction) -> None:
        if txn.state.prepared:
            raise ConcurrentTransactions(
                f"transactional id {txn.transactional_id!r}: its transaction is being completed"
            )

    @staticmethod
    def code(error: TidelogError) -> int:
        return kafka_code(error, not_leader=kerr.NOT_COORDINATOR)

    # -- InitProducerId -----------------------------------------------------------------------

    async def init_producer_id(self, principal: Principal, req: KafkaRequest) -> Answer:
        body = req.body
        transactional_id = str(body.transactional_id)
        answer: Answer = {"error_code": kerr.NONE, "producer_id": -1, "producer_epoch": -1}
        try:
            self.coordinator(principal, transactional_id)
            timeout_ms = millis(body.transaction_timeout)
            if not 1 <= timeout_ms <= self.max_timeout_ms():
                answer["error_code"] = kerr.INVALID_TRANSACTION_TIMEOUT
                return answer
            expected = (
                int(getattr(body, "producer_id", -1)),
                int(getattr(body, "producer_epoch", -1)),
            )
            lock, users = self._init_locks.setdefault(transactional_id, (asyncio.Lock(), [0]))
            users[0] += 1
            try:
                async with lock:
                    txn = await self._init(principal, transactional_id, timeout_ms, expected)
            finally:
                users[0] -= 1
                if not users[0]:
                    del self._init_locks[transactional_id]
            answer["producer_id"], answer["producer_epoch"] = txn.producer_id, txn.epoch
        except TidelogError as exc:
            answer["error_code"] = self.code(exc)
        return answer

    async def _init(
        self,
        principal: Principal,
        transactional_id: str,
        timeout_ms: int,
        expected: tuple[int, int],
    ) -> Transaction:
        txn = self.view.transactions.get(transactional_id)
        if txn is not None and expected[0] >= 0 and expected != (txn.producer_id, txn.epoch):
            # KIP-360: a producer that names its id and epoch resumes only if still current.
            raise ProducerFenced(
                f"transactional id {transactional_id!r} is at producer {txn.producer_id} epoch "
                f"{txn.epoch}, not {expected[0]} epoch {expected[1]}",
                transactional_id=transactional_id,
            )
        if txn is not None:
            self.may_add(txn)
        seen = txn.epoch if txn is not None else -1
        fresh = random.SystemRandom().getrandbits(62) + 1
        command = TxnInit(transactional_id, fresh, seen, timeout_ms, principal.name, wall_ms())
        await self.propose(command, PROPOSE_TIMEOUT_S)
        after = self.view.transactions.get(transactional_id)
        if after is None or (after.epoch == seen and txn is not None):
            raise ConcurrentTransactions(f"transactional id {transactional_id!r}: ask again")
        if after.state.prepared:
            # The old epoch's open transaction is being aborted: the producer asks again.
            raise ConcurrentTransactions(
                f"transactional id {transactional_id!r}: aborting the open transaction of "
                "the fenced epoch"
            )
        return after

    # -- AddPartitionsToTxn, AddOffsetsToTxn ---------------------------------------------------

    async def add_partitions(self, principal: Principal, req: KafkaRequest) -> Answer:
        body = req.body
        transactional_id = str(body.v3_and_below_transactional_id)
        asked = {t.name: [int(p) for p in t.partitions] for t in body.v3_and_below_topics}
        codes = {t: dict.fromkeys(ps, kerr.NONE) for t, ps in asked.items()}
        try:
            self.coordinator(principal, transactional_id)
            txn = self.current(
                transactional_id,
                int(body.v3_and_below_producer_id),
                int(body.v3_and_below_producer_epoch),
            )
            self.may_add(txn)
            if self._partition_errors(principal, codes):
                for partitions in codes.values():
                    for p, code in partitions.items():
                        if code == kerr.NONE:
                            partitions[p] = OPERATION_NOT_ATTEMPTED
            elif txn.state is not TxnState.ONGOING or any(
                not txn.holds(t, p) for t, ps in asked.items() for p in ps
            ):
                command = TxnAddPartitions(
                    transactional_id, txn.producer_id, txn.epoch, asked, wall_ms()
                )
                await self.propose(command, PROPOSE_TIMEOUT_S)
                self._check_applied(transactional_id, txn)
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

    def _partition_errors(self, principal: Principal, codes: dict[str, dict[int, int]]) -> bool:
        """Mark partitions the principal may not write or that do not exist; whether any."""
        failed = False
        for topic, partitions in codes.items():
            if not self.allows(principal, Operation.WRITE, Resource.topic(topic)):
                code = kerr.TOPIC_AUTHORIZATION_FAILED
            else:
                code = kerr.NONE
            meta = self.view.topics.get(topic)
            for p in partitions:
                if code == kerr.NONE and (meta is None or not 0 <= p < meta.partitions):
                    partitions[p] = kerr.UNKNOWN_TOPIC_OR_PARTITION
                    failed = True
                elif code != kerr.NONE:
                    partitions[p] = code
                    failed = True
        return failed

    def _check_applied(self, transactional_id: str, before: Transaction) -> None:
        """The command changed nothing if the id moved on meanwhile (fenced, or ended)."""
        after = self.view.transactions.get(transactional_id)
        if after is None or (after.producer_id, after.epoch) != (before.producer_id, before.epoch):
            raise ProducerFenced(
                f"transactional id {transactional_id!r} was fenced meanwhile",
                transactional_id=transactional_id,
            )
        if after.state is not TxnState.ONGOING:
            raise InvalidTxnState(
                f"transactional id {transactional_id!r} is {after.state.value}",
                transactional_id=transactional_id,
            )

    async def add_offsets(self, principal: Principal, req: KafkaRequest) -> Answer:
        body = req.body
        transactional_id, group = str(body.transactional_id), str(body.group_id)
        try:
            self.coordinator(principal, transactional_id)
            self.authorize(principal, Operation.GROUP, Resource.group(group))
            txn = self.current(transactional_id, int(body.producer_id), int(body.producer_epoch))
            self.may_add(txn)
            if txn.state is not TxnState.ONGOING or group not in txn.groups:
                command = TxnAddGroup(
                    transactional_id, txn.producer_id, txn.epoch, group, wall_ms()
                )
                await self.propose(command, PROPOSE_TIMEOUT_S)
                self._check_applied(transactional_id, txn)
            return {"throttle_time": 0, "error_code": kerr.NONE}
        except TidelogError as exc:
            return {"throttle_time": 0, "error_code": self.code(exc)}

    # -- TxnOffsetCommit ------------------------------------------------------------------------

    async def txn_offset_commit(self, principal: Principal, req: KafkaRequest) -> Answer:
        body = req.body
        transactional_id, group = str(body.transactional_id), str(body.group_id)
        asked = {
            t.name: {int(p.partition_index): int(p.committed_offset) for p in t.partitions}
            for t in body.topics
        }
        codes = {t: dict.fromkeys(ps, kerr.NONE) for t, ps in asked.items()}
        try:
            self.coordinator(principal, transactional_id)
            self.authorize(principal, Operation.GROUP, Resource.group(group))
            txn = self.current(transactional_id, int(body.producer_id), int(body.producer_epoch))
            if txn.state is not TxnState.ONGOING or group not in txn.groups:
                raise InvalidTxnState(
                    f"transactional id {transactional_id!r} has not added group {group!r} "
                    "(AddOffsetsToTxn) to an ongoing transaction",
                    transactional_id=transactional_id,
                )
            self._check_member(body)
            offsets = self._pending(principal, group, asked, codes)
            if offsets:
                command = TxnOffsets(
                    transactional_id, txn.producer_id, txn.epoch, group, offsets, wall_ms()
                )
                await self.propose(command, PROPOSE_TIMEOUT_S)
                self._check_applied(transactional_id, txn)
        except GroupError as exc:
            codes = {t: dict.fromkeys(ps, exc.code) for t, ps in asked.items()}
        except TidelogError as exc:
            code = self.code(exc)
            codes = {t: dict.fromkeys(ps, code) for t, ps in asked.items()}
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

    def _check_member(self, body: Any) -> None:
        """KIP-447: a member of the group at its generation (v3+ carries them; -1 and no
        member: a producer outside the group, as Kafka allows)."""
        generation = int(getattr(body, "generation_id", -1))
        member = str(getattr(body, "member_id", "") or "")
        if generation >= 0 or member:
            self.check_group_member(str(body.group_id), member, generation)

    def _pending(
        self,
        principal: Principal,
        group: str,
        asked: dict[str, dict[int, int]],
        codes: dict[str, dict[int, int]],
    ) -> dict[str, dict[str, Any]]:
        """The offsets by the cursor that keeps the group's offsets on each topic; a topic the
        principal may not read, or that does not exist, is marked so and left out."""
        pending: dict[str, dict[str, Any]] = {}
        cursors = self.view.cursors
        for topic, positions in asked.items():
            meta = self.view.topics.get(topic)
            code = kerr.NONE
            if not self.allows(principal, Operation.READ, Resource.topic(topic)):
                code = kerr.TOPIC_AUTHORIZATION_FAILED
            elif meta is None or any(not 0 <= p < meta.partitions for p in positions):
                code = kerr.UNKNOWN_TOPIC_OR_PARTITION
            elif any(o < 0 for o in positions.values()):
                code = kerr.INVALID_REQUEST
            if code != kerr.NONE:
                codes[topic] = dict.fromkeys(positions, code)
                continue
            name = self.group_cursor(cursors, group, topic)
            pending[name] = {"topic": topic, "positions": dict(positions)}
        return pending

    # -- EndTxn ---------------------------------------------------------------------------------

    async def end_txn(self, principal: Principal, req: KafkaRequest) -> Answer:
        body = req.body
        transactional_id, commit = str(body.transactional_id), bool(body.committed)
        try:
            self.coordinator(principal, transactional_id)
            txn = self.current(transactional_id, int(body.producer_id), int(body.producer_epoch))
            if txn.state is TxnState.ONGOING:
                command = TxnEnd(
                    transactional_id, txn.producer_id, txn.epoch, commit, False, wall_ms()
                )
                await self.propose(command, PROPOSE_TIMEOUT_S)
                after = self.view.transactions.get(transactional_id)
                if after is None or after.prepared_offset < 0 or after.epoch != txn.epoch:
                    raise ProducerFenced(
                        f"transactional id {transactional_id!r} was fenced meanwhile",
                        transactional_id=transactional_id,
                    )
                txn = after
            self._check_outcome(txn, commit)
            return {"throttle_time": 0, "error_code": kerr.NONE}
        except TidelogError as exc:
            return {"throttle_time": 0, "error_code": self.code(exc)}

    @staticmethod
    def _check_outcome(txn: Transaction, commit: bool) -> None:
        """An EndTxn (or its retry) agrees with the decision recorded."""
        committed = (TxnState.PREPARE_COMMIT, TxnState.COMPLETE_COMMIT)
        aborted = (TxnState.PREPARE_ABORT, TxnState.COMPLETE_ABORT)
        if txn.state in (committed if commit else aborted):
            return
        what = "commit" if commit else "abort"
        raise InvalidTxnState(
            f"transactional id {txn.transactional_id!r} cannot {what}: it is {txn.state.value}",
            transactional_id=txn.transactional_id,
        )

    # -- DescribeTransactions, ListTransactions (KIP-664) -----------------------------------------

    async def describe(self, principal: Principal, req: KafkaRequest) -> Answer:
        states = []
        for transactional_id in req.body.transactional_ids:
            entry: Answer = {"error_code": kerr.NONE, "transactional_id": transactional_id}
            try:
                self.enabled()
                resource = Resource.transactional_id(transactional_id)
                self.authorize(principal, Operation.DESCRIBE_TRANSACTION, resource)
                if not self.view.is_metadata_leader:
                    raise NotLeader("not the transaction coordinator")
                txn = self.view.transactions.get(transactional_id)
                if txn is None:
                    entry["error_code"] = kerr.TRANSACTIONAL_ID_NOT_FOUND
                else:
                    entry.update(described(txn))
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
        known = {s.value for s in TxnState}
        wanted = set(body.state_filters or ())
        producers = {int(p) for p in body.producer_id_filters or ()}
        min_age_ms = int(getattr(body, "duration_filter", -1))
        listed = []
        if self.view.is_metadata_leader and self.view.finalized_level >= TRANSACTIONS_LEVEL:
            now = wall_ms()
            for name, txn in sorted(self.view.transactions.items()):
                if (
                    (wanted and txn.state.value not in wanted)
                    or (producers and txn.producer_id not in producers)
                    or (
                        min_age_ms >= 0
                        and (not txn.started_ms or now - txn.started_ms < min_age_ms)
                    )
                    or not self.allows(
                        principal, Operation.DESCRIBE_TRANSACTION, Resource.transactional_id(name)
                    )
                ):
                    continue
                listed.append(
                    {
                        "transactional_id": name,
                        "producer_id": txn.producer_id,
                        "transaction_state": txn.state.value,
                    }
                )
        return {
            "throttle_time": 0,
            "error_code": kerr.NONE,
            "unknown_state_filters": sorted(wanted - known),
            "transaction_states": listed,
        }


def start_time(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)


def described(txn: Transaction) -> Answer:
    return {
        "transaction_state": txn.state.value,
        "transaction_timeout": txn.timeout_ms,
        "transaction_start_time": start_time(txn.started_ms if txn.started_ms else -1),
        "producer_id": txn.producer_id,
        "producer_epoch": txn.epoch,
        "topics": [
            {"topic": t, "partitions": list(ps)} for t, ps in sorted(txn.partitions.items())
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
