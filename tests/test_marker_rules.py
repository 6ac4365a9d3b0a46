"""Which operator's marker (Kafka's WriteTxnMarkers) a partition leader writes
(node/ops/producers.py, marker_refusal): only one that agrees with the transaction coordinator.
Each rule in turn, against the coordinator's state as this node's metadata has it; the whole
path runs against a real cluster in test_kafka_txn_admin.py."""

from __future__ import annotations

import pytest

from tidelog.errors import InvalidTxnState, ProducerFenced
from tidelog.node.ops.producers import marker_refusal
from tidelog.protocol import api
from tidelog.replication.metadata_transactions import Transaction, TxnState
from tidelog.storage.transactions import OpenTransaction

PRODUCER = 7
MAX_TIMEOUT_MS = 900_000
OPENED = OpenTransaction(PRODUCER, 3, first_offset=40, opened_ms=0, batches=[(40, 41)])


def txn(state: TxnState, partitions: dict[str, list[int]] | None = None) -> Transaction:
    held = {"t": [0]} if partitions is None else partitions
    return Transaction("etl-1", PRODUCER, 3, state, 60_000, partitions=held)


def marker(commit: bool, epoch: int = 3) -> api.ProducersRequest:
    return api.ProducersRequest(
        "write_marker", "t", 0, producer_id=PRODUCER, producer_epoch=epoch, commit=commit
    )


def refusal(
    coordinator: Transaction | None, commit: bool, open_ms: int = MAX_TIMEOUT_MS, epoch: int = 3
) -> Exception | None:
    return marker_refusal(
        coordinator, OPENED, marker(commit, epoch), "t/0", open_ms, MAX_TIMEOUT_MS
    )


@pytest.mark.parametrize("commit", [False, True])
def test_a_transaction_the_coordinator_holds_open_is_ended_there(commit: bool) -> None:
    assert isinstance(refusal(txn(TxnState.ONGOING), commit), InvalidTxnState)


def test_a_decided_transaction_takes_only_the_coordinators_decision() -> None:
    assert refusal(txn(TxnState.PREPARE_ABORT), commit=False) is None
    assert refusal(txn(TxnState.PREPARE_COMMIT), commit=True) is None
    assert refusal(txn(TxnState.PREPARE_COMMIT), commit=True, open_ms=0) is None
    for state, commit in ((TxnState.PREPARE_ABORT, True), (TxnState.PREPARE_COMMIT, False)):
        found = refusal(txn(state), commit)
        assert isinstance(found, InvalidTxnState) and state.value in found.message


@pytest.mark.parametrize(
    "coordinator",
    [
        None,  # the transactional id was forgotten
        txn(TxnState.COMPLETE_ABORT),  # completed without this partition's marker
        txn(TxnState.COMPLETE_COMMIT),
        txn(TxnState.ONGOING, {"t": [1]}),  # a later transaction, not holding this partition
        txn(TxnState.PREPARE_COMMIT, {"other": [0]}),
    ],
)
def test_a_hanging_transaction_takes_only_an_abort_once_old_enough(
    coordinator: Transaction | None,
) -> None:
    assert isinstance(refusal(coordinator, commit=True), InvalidTxnState)
    young = refusal(coordinator, commit=False, open_ms=MAX_TIMEOUT_MS - 1)
    assert isinstance(young, InvalidTxnState) and "transaction.max.timeout.ms" in young.message
    assert refusal(coordinator, commit=False) is None


def test_an_older_epoch_is_fenced() -> None:
    assert isinstance(refusal(None, commit=False, epoch=2), ProducerFenced)
    assert isinstance(refusal(txn(TxnState.PREPARE_ABORT), commit=False, epoch=2), ProducerFenced)
    assert refusal(None, commit=False, epoch=4) is None  # a newer one ends it, as Kafka's does
