"""The transaction coordinator's request rules (KIP-98, KIP-447, KIP-664), for both listeners.

The coordinator is the metadata log's leader. Each op checks a request against the
transactional id's state (replication/metadata_transactions.py) and proposes the command that
changes it; node/transaction_coordinator.py writes the markers once a decision is committed.
tidelog's client sends these as `TransactionRequest`s, and kafka/transactions.py translates
Kafka's requests into the same ones, so one set of rules serves both. Every op needs feature
level 3 (`transactions`): before it, TransactionsNotEnabled.

    init            the id's producer id and a new epoch (fences every older one)
    add_partitions  partitions join the transaction
    add_offsets     a Kafka group's or a tidelog cursor's offsets will commit with it
    commit_offsets  the offsets, pending until the transaction ends (applied iff it commits)
    end             the decision: its commit point
    describe, list  what the coordinator knows
    abort           an operator ends a hanging transaction at a new epoch (KIP-664)

The door (`NodeCore.handle`, node/access.py) has already authorized the transactional id
(`transaction_scope`); what depends on more than the id (the topics of add_partitions and
commit_offsets, a group, a cursor's owner, which ids a list shows) is checked here.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tidelog.acls import Resource
from tidelog.errors import (
    ConcurrentTransactions,
    InvalidRequest,
    InvalidTransactionTimeout,
    InvalidTxnState,
    NotLeader,
    ProducerFenced,
    UnknownTransactionalId,
)
from tidelog.features import TRANSACTIONS_LEVEL, require_transactions
from tidelog.node.access import Access, Operation, Principal
from tidelog.node.metadata_log import MetadataLog
from tidelog.node.ops.base import MetadataOps
from tidelog.protocol import api
from tidelog.protocol.api import TXN_INVALID_OFFSET as INVALID_OFFSET
from tidelog.protocol.api import TXN_NOT_AUTHORIZED as NOT_AUTHORIZED
from tidelog.protocol.api import TXN_UNKNOWN_PARTITION as UNKNOWN_PARTITION
from tidelog.replication.metadata_commands import (
    TxnAddGroup,
    TxnAddPartitions,
    TxnEnd,
    TxnInit,
    TxnOffsets,
)
from tidelog.replication.metadata_transactions import Transaction, TxnState, past_timeout

PROPOSE_TIMEOUT_S = 30.0

# Who moves a transactional id to a newer epoch: what a fenced producer is told, since the
# epoch alone does not say whether it was a successor or a timeout.
FENCED_BY = (
    "a newer holder of the id, `tidelog transactions abort`, or the coordinator aborting a "
    "transaction open past its transaction.timeout.ms"
)

Refused = dict[str, dict[str, str]]


def wall_ms() -> int:
    return int(time.time() * 1000)


def transaction_scope(req: api.TransactionRequest) -> tuple[Operation, Resource, str]:
    """What the door checks: write on the transactional id to use it (init, add, commit,
    end), read on it to describe it, cluster admin to abort another's transaction; a list
    shows only the ids one may describe."""
    if req.op == "list":
        return Operation.DESCRIBE, Resource.cluster(), ""
    if req.op == "abort":
        return Operation.ALTER, Resource.cluster(), ""
    if not req.transactional_id:
        raise InvalidRequest(f"transaction {req.op}: no transactional id", field="transactional_id")
    resource = Resource.transactional_id(req.transactional_id)
    if req.op == "describe":
        return Operation.DESCRIBE_TRANSACTION, resource, ""
    return Operation.TRANSACTION, resource, ""


class TransactionOps(MetadataOps):
    """The transaction coordinator's requests on one node (served on the metadata leader)."""

    def __init__(
        self,
        metadata_log: MetadataLog,
        access: Access,
        finalized_level: Callable[[], int],
        max_timeout_ms: Callable[[], int],
        check_cursor_owner: Callable[[Principal, api.CursorRequest], object],
    ) -> None:
        self.metadata_log = metadata_log
        self.access = access
        self.finalized_level = finalized_level
        self.max_timeout_ms = max_timeout_ms  # the node's transaction.max.timeout.ms
        self.check_cursor_owner = check_cursor_owner  # CursorOps.as_principal
        # Per transactional id: its inits one at a time, and how many wait (the entry goes with
        # the last, so that ids used once cost nothing).
        self._init_locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}

    def handle(
        self, principal: Principal, req: api.TransactionRequest
    ) -> Awaitable[api.TransactionResponse]:
        """The op's answer (the door authorized the request already)."""
        ops: dict[str, Callable[[Principal, api.TransactionRequest], Awaitable[Any]]] = {
            "init": self.init,
            "add_partitions": self.add_partitions,
            "add_offsets": self.add_offsets,
            "commit_offsets": self.commit_offsets,
            "end": self.end,
            "describe": self.describe,
            "list": self.list_transactions,
            "abort": self.abort,
        }
        op = ops.get(req.op)
        if op is None:
            raise InvalidRequest(
                f"transaction op must be one of {', '.join(api.TRANSACTION_OPS)}, got {req.op!r}",
                field="op",
            )
        return op(principal, req)

    def without_principal(self, req: Any, payload: bytes) -> Any:
        """The handler table's entry: a transaction request is always handled with its
        principal (`handle`), since what it may touch depends on who asks."""
        raise InvalidRequest("a transaction request needs its principal")

    # -- common checks ------------------------------------------------------------------------

    def enabled(self) -> None:
        require_transactions(self.finalized_level())

    def coordinator(self) -> None:
        """Transactions enabled, and this node the coordinator."""
        self.enabled()
        if not self.metadata_log.is_leader:
            raise NotLeader(
                "not the transaction coordinator", leader_hint=self.metadata_log.leader_id
            )

    def txn(self, transactional_id: str) -> Transaction | None:
        return self.metadata.transactions.get(transactional_id)

    def current(self, req: api.TransactionRequest) -> Transaction:
        """The id's transaction, if the request's producer id and epoch are its current ones."""
        transactional_id, epoch = req.transactional_id, req.producer_epoch
        txn = self.txn(transactional_id)
        if txn is None or txn.producer_id != req.producer_id:
            raise UnknownTransactionalId(
                f"transactional id {transactional_id!r} does not have producer id "
                f"{req.producer_id}",
                transactional_id=transactional_id,
            )
        if epoch < txn.epoch:
            raise ProducerFenced(
                f"transactional id {transactional_id!r}: epoch {epoch} is fenced by {txn.epoch} "
                f"({FENCED_BY})",
                transactional_id=transactional_id,
                producer_id=txn.producer_id,
                epoch=epoch,
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

    def check_applied(self, before: Transaction) -> None:
        """The command changed nothing if the id moved on meanwhile (fenced, or ended)."""
        after = self.txn(before.transactional_id)
        if after is None or (after.producer_id, after.epoch) != (before.producer_id, before.epoch):
            raise ProducerFenced(
                f"transactional id {before.transactional_id!r} was fenced meanwhile",
                transactional_id=before.transactional_id,
            )
        if after.state is not TxnState.ONGOING:
            raise InvalidTxnState(
                f"transactional id {before.transactional_id!r} is {after.state.value}",
                transactional_id=before.transactional_id,
            )

    def answer(self, transactional_id: str) -> api.TransactionResponse:
        txn = self.txn(transactional_id)
        return api.TransactionResponse(transaction=txn.to_wire() if txn is not None else {})

    # -- init ---------------------------------------------------------------------------------

    async def init(self, principal: Principal, req: api.TransactionRequest) -> Any:
        self.coordinator()
        transactional_id = req.transactional_id
        if not 1 <= req.timeout_ms <= self.max_timeout_ms():
            raise InvalidTransactionTimeout(
                f"transaction timeout {req.timeout_ms} ms is not within 1 and the node's "
                f"transaction.max.timeout.ms, {self.max_timeout_ms()}",
                timeout_ms=req.timeout_ms,
            )
        lock, users = self._init_locks.setdefault(transactional_id, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                await self._init(principal, req)
        finally:
            users[0] -= 1
            if not users[0]:
                del self._init_locks[transactional_id]
        return self.answer(transactional_id)

    async def _init(self, principal: Principal, req: api.TransactionRequest) -> None:
        transactional_id = req.transactional_id
        txn = self.txn(transactional_id)
        expected = (req.producer_id, req.producer_epoch)
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
        command = TxnInit(transactional_id, fresh, seen, req.timeout_ms, principal.name, wall_ms())
        await self.propose_metadata(command, PROPOSE_TIMEOUT_S)
        after = self.txn(transactional_id)
        if after is None or (after.epoch == seen and txn is not None):
            raise ConcurrentTransactions(f"transactional id {transactional_id!r}: ask again")
        if after.state.prepared:
            # The old epoch's open transaction is being aborted: the producer asks again.
            raise ConcurrentTransactions(
                f"transactional id {transactional_id!r}: aborting the open transaction of "
                "the fenced epoch"
            )

    # -- add_partitions, add_offsets ----------------------------------------------------------

    async def add_partitions(self, principal: Principal, req: api.TransactionRequest) -> Any:
        self.coordinator()
        txn = self.current(req)
        self.may_add(txn)
        refused = self._partitions_refused(principal, req.partitions)
        if refused:
            return api.TransactionResponse(refused=refused)
        if txn.state is not TxnState.ONGOING or any(
            not txn.holds(t, p) for t, ps in req.partitions.items() for p in ps
        ):
            command = TxnAddPartitions(
                req.transactional_id, txn.producer_id, txn.epoch, req.partitions, wall_ms()
            )
            await self.propose_metadata(command, PROPOSE_TIMEOUT_S)
            self.check_applied(txn)
        return api.TransactionResponse()

    def _partitions_refused(self, principal: Principal, asked: dict[str, list[int]]) -> Refused:
        """The partitions the principal may not write or that do not exist."""
        refused: Refused = {}
        for topic, partitions in asked.items():
            meta = self.metadata.topics.get(topic)
            allowed = self.access.allows(principal, Operation.WRITE, Resource.topic(topic))
            for p in partitions:
                if not allowed:
                    refused.setdefault(topic, {})[str(p)] = NOT_AUTHORIZED
                elif meta is None or not 0 <= p < meta.partitions:
                    refused.setdefault(topic, {})[str(p)] = UNKNOWN_PARTITION
        return refused

    def _offsets_owner(self, principal: Principal, req: api.TransactionRequest) -> str:
        """Whose offsets: a Kafka group (read on the group) or a tidelog cursor (its owner's,
        or shared as cursors are: node/ops/cursors.py); the name the transaction holds."""
        if bool(req.group) == bool(req.cursor):
            raise InvalidRequest(
                "offsets of a transaction: name a group or a cursor", field="group"
            )
        if req.group:
            self.access.authorize(principal, Operation.GROUP, Resource.group(req.group))
            return req.group
        self.check_cursor_owner(principal, api.CursorRequest("commit", req.cursor))
        return req.cursor

    async def add_offsets(self, principal: Principal, req: api.TransactionRequest) -> Any:
        self.coordinator()
        group = self._offsets_owner(principal, req)
        txn = self.current(req)
        self.may_add(txn)
        if txn.state is not TxnState.ONGOING or group not in txn.groups:
            command = TxnAddGroup(
                req.transactional_id, txn.producer_id, txn.epoch, group, wall_ms()
            )
            await self.propose_metadata(command, PROPOSE_TIMEOUT_S)
            self.check_applied(txn)
        return api.TransactionResponse()

    # -- commit_offsets -----------------------------------------------------------------------

    async def commit_offsets(self, principal: Principal, req: api.TransactionRequest) -> Any:
        self.coordinator()
        group = self._offsets_owner(principal, req)
        txn = self.current(req)
        if txn.state is not TxnState.ONGOING or group not in txn.groups:
            raise InvalidTxnState(
                f"transactional id {req.transactional_id!r} has not added {group!r} "
                "(add_offsets, AddOffsetsToTxn) to an ongoing transaction",
                transactional_id=req.transactional_id,
            )
        refused: Refused = {}
        pending = self._pending(principal, req, refused)
        if pending:
            command = TxnOffsets(
                req.transactional_id, txn.producer_id, txn.epoch, group, pending, wall_ms()
            )
            await self.propose_metadata(command, PROPOSE_TIMEOUT_S)
            self.check_applied(txn)
        return api.TransactionResponse(refused=refused)

    def _pending(
        self, principal: Principal, req: api.TransactionRequest, refused: Refused
    ) -> dict[str, dict[str, Any]]:
        """The offsets by the cursor that keeps them on each topic; a topic the principal may
        not read, or that does not exist, is marked refused and left out."""
        pending: dict[str, dict[str, Any]] = {}
        for topic, asked in req.offsets.items():
            try:
                positions = {int(p): int(o) for p, o in asked.items()}
            except ValueError:
                positions = {}
                refused[topic] = dict.fromkeys(asked, UNKNOWN_PARTITION)
                continue
            meta = self.metadata.topics.get(topic)
            reason = ""
            if not self.access.allows(principal, Operation.READ, Resource.topic(topic)):
                reason = NOT_AUTHORIZED
            elif meta is None or any(not 0 <= p < meta.partitions for p in positions):
                reason = UNKNOWN_PARTITION
            elif any(o < 0 for o in positions.values()):
                reason = INVALID_OFFSET
            if reason:
                refused[topic] = dict.fromkeys(asked, reason)
                continue
            name = req.cursor or req.cursors.get(topic, req.group)
            if req.cursor:
                cursor = self.metadata.cursors.get(req.cursor)
                if cursor is not None and cursor.live and cursor.topic != topic:
                    raise InvalidRequest(
                        f"cursor {req.cursor!r} follows {cursor.topic!r}, not {topic!r}",
                        field="offsets",
                    )
            pending[name] = {"topic": topic, "positions": positions}
        return pending

    # -- end, abort ---------------------------------------------------------------------------

    async def end(self, principal: Principal, req: api.TransactionRequest) -> Any:
        self.coordinator()
        txn = self.current(req)
        if txn.state is TxnState.ONGOING:
            # The state is applied in place: what it was is taken before the proposal.
            epoch, at_ms = txn.epoch, wall_ms()
            late = req.commit and past_timeout(txn, at_ms)
            command = TxnEnd(req.transactional_id, txn.producer_id, epoch, req.commit, False, at_ms)
            await self.propose_metadata(command, PROPOSE_TIMEOUT_S)
            after = self.txn(req.transactional_id)
            if after is None or after.prepared_offset < 0 or after.epoch != epoch:
                raise ProducerFenced(
                    f"transactional id {req.transactional_id!r} "
                    + (
                        f"passed its transaction.timeout.ms ({txn.timeout_ms} ms) and was aborted"
                        if late
                        else "was fenced meanwhile"
                    ),
                    transactional_id=req.transactional_id,
                )
            txn = after
        check_outcome(txn, req.commit)
        return self.answer(req.transactional_id)

    async def abort(self, principal: Principal, req: api.TransactionRequest) -> Any:
        """KIP-664's abort of a hanging transaction: at a new epoch, as the coordinator aborts
        one past its timeout, so its producer is fenced and the markers go to every partition
        it added (the LSO moves on once they are committed)."""
        self.coordinator()
        transactional_id = req.transactional_id
        txn = self.txn(transactional_id)
        if txn is None:
            raise UnknownTransactionalId(
                f"no transactional id {transactional_id!r}", transactional_id=transactional_id
            )
        if txn.state is TxnState.ONGOING:
            command = TxnEnd(transactional_id, txn.producer_id, txn.epoch, False, True, wall_ms())
            await self.propose_metadata(command, PROPOSE_TIMEOUT_S)
        elif txn.state is not TxnState.PREPARE_ABORT:
            raise InvalidTxnState(
                f"transactional id {transactional_id!r} has no open transaction to abort: it "
                f"is {txn.state.value}",
                transactional_id=transactional_id,
            )
        return self.answer(transactional_id)

    # -- describe, list -----------------------------------------------------------------------

    async def describe(self, principal: Principal, req: api.TransactionRequest) -> Any:
        self.coordinator()
        if self.txn(req.transactional_id) is None:
            raise UnknownTransactionalId(
                f"no transactional id {req.transactional_id!r}",
                transactional_id=req.transactional_id,
            )
        return self.answer(req.transactional_id)

    async def list_transactions(self, principal: Principal, req: api.TransactionRequest) -> Any:
        """The transactions this node coordinates (a node that coordinates none answers an
        empty list, as for Kafka's ListGroups: admin clients ask every broker; unless
        leader_only, which says NotLeader instead)."""
        known = {s.value for s in TxnState}
        wanted = set(req.states)
        if req.leader_only:
            self.coordinator()
        listed = []
        if self.metadata_log.is_leader and self.finalized_level() >= TRANSACTIONS_LEVEL:
            now = wall_ms()
            for name, txn in sorted(self.metadata.transactions.by_id.items()):
                if (
                    (wanted and txn.state.value not in wanted)
                    or (req.producer_ids and txn.producer_id not in req.producer_ids)
                    or (
                        req.min_age_ms >= 0
                        and (not txn.started_ms or now - txn.started_ms < req.min_age_ms)
                    )
                    or not self.access.allows(
                        principal, Operation.DESCRIBE_TRANSACTION, Resource.transactional_id(name)
                    )
                ):
                    continue
                listed.append(txn.to_wire())
        return api.TransactionResponse(transactions=listed, unknown_states=sorted(wanted - known))


def check_outcome(txn: Transaction, commit: bool) -> None:
    """An end (or its retry) agrees with the decision recorded."""
    committed = (TxnState.PREPARE_COMMIT, TxnState.COMPLETE_COMMIT)
    aborted = (TxnState.PREPARE_ABORT, TxnState.COMPLETE_ABORT)
    if txn.state in (committed if commit else aborted):
        return
    what = "commit" if commit else "abort"
    raise InvalidTxnState(
        f"transactional id {txn.transactional_id!r} cannot {what}: it is {txn.state.value}",
        transactional_id=txn.transactional_id,
    )
