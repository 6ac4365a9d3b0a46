"""The transaction coordinator's state, as the metadata log holds it (Kafka's transaction log,
KIP-98): per transactional id its producer id and epoch, the state of its transaction, the
partitions and groups it holds, the offsets it will commit, its timeout and start.

Pure: replication/metadata.py applies the commands (replication/metadata_commands.py's
transaction commands) through `apply_transaction`; the coordinator (node/transaction_coordinator
.py) and the Kafka listener read the state. The commit point of a transaction is the command
that prepares its commit (TxnEnd): the same command makes its pending offsets the groups'
committed cursors, so offsets are committed if and only if the output is.

    Empty --add--> Ongoing --end--> PrepareCommit / PrepareAbort --complete--> Complete*
      ^                                                                           |
      +------------------------------- add (a new transaction) -------------------+

InitProducerId on an Ongoing transaction prepares its abort at a new epoch (the old producer
is fenced); on a prepared one it changes nothing (the coordinator completes it first).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from tidelog.errors import (
    InvalidTxnState,
    ProducerFenced,
    TidelogError,
    UnknownTransactionalId,
)
from tidelog.replication.metadata_commands import (
    TransactionCommand,
    TxnAddGroup,
    TxnAddPartitions,
    TxnComplete,
    TxnEnd,
    TxnExpire,
    TxnInit,
    TxnOffsets,
)

EPOCH_MAX = 32_767  # Kafka's producer epoch is an int16


class TxnState(enum.Enum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"

    @property
    def prepared(self) -> bool:
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)

    @property
    def idle(self) -> bool:
        """No transaction open or being completed."""
        return self in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)

    @property
    def open(self) -> bool:
        """A transaction may begin (or go on) from this state."""
        return self in (
            TxnState.EMPTY,
            TxnState.ONGOING,
            TxnState.COMPLETE_COMMIT,
            TxnState.COMPLETE_ABORT,
        )


@dataclass
class Transaction:
    """One transactional id's coordinator state."""

    transactional_id: str
    producer_id: int
    epoch: int
    state: TxnState
    timeout_ms: int
    owner: str = ""  # the principal that last initialized it
    partitions: dict[str, list[int]] = field(default_factory=dict)  # topic -> partitions
    groups: list[str] = field(default_factory=list)
    # cursor -> {"topic", "positions": {partition: offset}}: TxnOffsetCommit's, until the end
    pending_offsets: dict[str, dict[str, Any]] = field(default_factory=dict)
    started_ms: int = 0  # when the current transaction began (0: none open)
    updated_ms: int = 0
    prepared_offset: int = -1  # the metadata offset of the decision being completed

    def holds(self, topic: str, partition: int) -> bool:
        return partition in self.partitions.get(topic, ())

    def to_wire(self) -> dict[str, Any]:
        return {
            "transactional_id": self.transactional_id,
            "producer_id": self.producer_id,
            "epoch": self.epoch,
            "state": self.state.value,
            "timeout_ms": self.timeout_ms,
            "owner": self.owner,
            "partitions": {t: list(ps) for t, ps in sorted(self.partitions.items())},
            "groups": list(self.groups),
            "pending_offsets": {
                name: {
                    "topic": entry["topic"],
                    "positions": {str(p): o for p, o in sorted(entry["positions"].items())},
                }
                for name, entry in sorted(self.pending_offsets.items())
            },
            "started_ms": self.started_ms,
            "updated_ms": self.updated_ms,
            "prepared_offset": self.prepared_offset,
        }

    @staticmethod
    def from_wire(data: dict[str, Any]) -> Transaction:
        return Transaction(
            transactional_id=str(data["transactional_id"]),
            producer_id=int(data["producer_id"]),
            epoch=int(data["epoch"]),
            state=TxnState(str(data["state"])),
            timeout_ms=int(data["timeout_ms"]),
            owner=str(data.get("owner", "")),
            partitions={str(t): [int(p) for p in ps] for t, ps in dict(data["partitions"]).items()},
            groups=[str(g) for g in data.get("groups", [])],
            pending_offsets={
                str(name): {
                    "topic": str(entry["topic"]),
                    "positions": {int(p): int(o) for p, o in dict(entry["positions"]).items()},
                }
                for name, entry in dict(data.get("pending_offsets", {})).items()
            },
            started_ms=int(data.get("started_ms", 0)),
            updated_ms=int(data.get("updated_ms", 0)),
            prepared_offset=int(data.get("prepared_offset", -1)),
        )


class Transactions:
    """Every transactional id's transaction, and which id each producer id belongs to."""

    def __init__(self) -> None:
        self.by_id: dict[str, Transaction] = {}
        self.by_producer: dict[int, str] = {}

    def get(self, transactional_id: str) -> Transaction | None:
        return self.by_id.get(transactional_id)

    def of_producer(self, producer_id: int) -> Transaction | None:
        """The transaction a transactional producer id belongs to (None: no transactional
        id has it)."""
        name = self.by_producer.get(producer_id)
        txn = self.by_id.get(name) if name is not None else None
        return txn if txn is not None and txn.producer_id == producer_id else None

    def put(self, txn: Transaction) -> None:
        old = self.by_id.get(txn.transactional_id)
        if old is not None and old.producer_id != txn.producer_id:
            self.by_producer.pop(old.producer_id, None)
        self.by_id[txn.transactional_id] = txn
        self.by_producer[txn.producer_id] = txn.transactional_id

    def prepared(self) -> list[Transaction]:
        return [t for t in self.by_id.values() if t.state.prepared]

    def to_wire(self) -> list[dict[str, Any]]:
        return [t.to_wire() for _, t in sorted(self.by_id.items())]

    @staticmethod
    def from_wire(data: list[Any]) -> Transactions:
        found = Transactions()
        for entry in data:
            found.put(Transaction.from_wire(dict(entry)))
        return found


def _current(txns: Transactions, command: TransactionCommand) -> Transaction | None:
    """The transaction a command names, if its producer id and epoch are still the id's."""
    txn = txns.get(command.transactional_id)
    if txn is None or txn.producer_id != command.producer_id or txn.epoch != command.producer_epoch:
        return None
    return txn


def _begin(txn: Transaction, at_ms: int) -> None:
    """A new transaction starts from an open state (nothing held yet)."""
    if txn.state is not TxnState.ONGOING:
        txn.state = TxnState.ONGOING
        txn.partitions = {}
        txn.groups = []
        txn.pending_offsets = {}
        txn.started_ms = at_ms
        txn.prepared_offset = -1


def apply_init(txns: Transactions, offset: int, command: TxnInit) -> None:
    txn = txns.get(command.transactional_id)
    if txn is None:
        txns.put(
            Transaction(
                command.transactional_id,
                command.producer_id,
                0,
                TxnState.EMPTY,
                command.timeout_ms,
                command.owner,
                updated_ms=command.at_ms,
            )
        )
        return
    if txn.state.prepared or txn.epoch != command.producer_epoch:
        return  # being completed, or another init won the race: the producer asks again
    txn.timeout_ms = command.timeout_ms
    txn.owner = command.owner
    txn.updated_ms = command.at_ms
    if txn.state is TxnState.ONGOING:
        # The old epoch's transaction is aborted first, at a new epoch that fences it.
        txn.epoch += 1
        txn.state = TxnState.PREPARE_ABORT
        txn.pending_offsets = {}
        txn.prepared_offset = offset
        return
    if txn.epoch >= EPOCH_MAX - 1:  # keep one epoch for a timeout's abort
        txns.by_producer.pop(txn.producer_id, None)
        txn.producer_id, txn.epoch = command.producer_id, 0
        txns.put(txn)
    else:
        txn.epoch += 1
    txn.state = TxnState.EMPTY
    txn.partitions, txn.groups, txn.pending_offsets = {}, [], {}
    txn.started_ms, txn.prepared_offset = 0, -1


def apply_add_partitions(txns: Transactions, offset: int, command: TxnAddPartitions) -> None:
    txn = _current(txns, command)
    if txn is None or not txn.state.open:
        return
    _begin(txn, command.at_ms)
    for topic, partitions in command.partitions.items():
        txn.partitions[topic] = sorted(set(txn.partitions.get(topic, [])) | set(partitions))
    txn.updated_ms = command.at_ms


def apply_add_group(txns: Transactions, offset: int, command: TxnAddGroup) -> None:
    txn = _current(txns, command)
    if txn is None or not txn.state.open:
        return
    _begin(txn, command.at_ms)
    if command.group not in txn.groups:
        txn.groups.append(command.group)
    txn.updated_ms = command.at_ms


def apply_offsets(txns: Transactions, offset: int, command: TxnOffsets) -> None:
    txn = _current(txns, command)
    if txn is None or txn.state is not TxnState.ONGOING or command.group not in txn.groups:
        return
    for name, entry in command.offsets.items():
        pending = txn.pending_offsets.get(name)
        if pending is None or pending["topic"] != entry["topic"]:
            txn.pending_offsets[name] = {"topic": entry["topic"], "positions": {}}
        txn.pending_offsets[name]["positions"].update(entry["positions"])
    txn.updated_ms = command.at_ms


def apply_end(txns: Transactions, offset: int, command: TxnEnd) -> Transaction | None:
    """The decision; the transaction whose offsets are to be committed now (a commit), if any."""
    txn = _current(txns, command)
    if txn is None or txn.state is not TxnState.ONGOING:
        return None
    commit = command.commit and not past_timeout(txn, command.at_ms)
    if command.bump or commit != command.commit:
        txn.epoch += 1  # the coordinator's abort fences the producer
    txn.state = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
    txn.prepared_offset = offset
    txn.updated_ms = command.at_ms
    return txn if commit else None


def past_timeout(txn: Transaction, at_ms: int) -> bool:
    """A commit decided after transaction.timeout.ms is the coordinator's timeout abort
    instead, whichever came first to the log: no transaction ever commits past its timeout, so
    an operator's abort of one older than transaction.max.timeout.ms (node/ops/producers.py)
    cannot contradict a commit."""
    return txn.started_ms > 0 and at_ms - txn.started_ms > txn.timeout_ms


def apply_complete(txns: Transactions, offset: int, command: TxnComplete) -> None:
    txn = _current(txns, command)
    if txn is None or not txn.state.prepared or txn.prepared_offset != command.prepared_offset:
        return
    committed = txn.state is TxnState.PREPARE_COMMIT
    txn.state = TxnState.COMPLETE_COMMIT if committed else TxnState.COMPLETE_ABORT
    txn.partitions, txn.groups, txn.pending_offsets = {}, [], {}
    txn.started_ms = 0
    txn.updated_ms = command.at_ms


def apply_expire(txns: Transactions, offset: int, command: TxnExpire) -> None:
    txn = _current(txns, command)
    if txn is None or not txn.state.idle:
        return  # used again meanwhile
    del txns.by_id[txn.transactional_id]
    txns.by_producer.pop(txn.producer_id, None)


def expired(txn: Transaction, now_ms: int, expiration_ms: int) -> bool:
    """Whether a transactional id may be forgotten: nothing open, unused for expiration_ms."""
    return txn.state.idle and now_ms - txn.updated_ms > expiration_ms


def verify_transactional_batch(
    txns: Transactions,
    transactional_id: str,
    producer_id: int,
    epoch: int,
    topic: str,
    partition: int,
) -> TidelogError | None:
    """Why a partition leader may not append a transactional batch of this producer (None: it
    may): the batch's producer id must be its transactional id's, and that id's transaction
    Ongoing at this epoch and holding the partition (KIP-890's verification, which keeps a late
    batch from opening a transaction no coordinator will ever end); an older epoch is fenced."""
    txn = txns.get(transactional_id)
    if not transactional_id:
        return InvalidTxnState(
            f"a transactional batch of producer {producer_id} names no transactional id",
            producer_id=producer_id,
        )
    if txn is None or txn.producer_id != producer_id:
        return UnknownTransactionalId(
            f"transactional id {transactional_id!r} does not have producer id {producer_id}",
            transactional_id=transactional_id,
            producer_id=producer_id,
        )
    if epoch < txn.epoch:
        return ProducerFenced(
            f"producer {producer_id} epoch {epoch} is fenced: transactional id "
            f"{txn.transactional_id!r} is at epoch {txn.epoch}",
            transactional_id=txn.transactional_id,
            producer_id=producer_id,
            epoch=epoch,
        )
    if epoch > txn.epoch or txn.state is not TxnState.ONGOING or not txn.holds(topic, partition):
        return InvalidTxnState(
            f"transactional id {txn.transactional_id!r} (producer {producer_id} epoch "
            f"{txn.epoch}, {txn.state.value}) has not added {topic}/{partition} to a "
            "transaction at that epoch",
            transactional_id=txn.transactional_id,
            producer_id=producer_id,
            epoch=epoch,
        )
    return None
