"""The transaction coordinator's state in the metadata log (replication/metadata_transactions.py):
what each command does to a transactional id, fencing by epoch, offsets committed if and only
if the transaction commits, a partition leader's verification of a transactional batch, and the
state's place in the metadata snapshot (version 2 of its format)."""

from __future__ import annotations

import json

import pytest

from tidelog import formats
from tidelog.errors import (
    InvalidTxnState,
    ProducerFenced,
    UnknownTransactionalId,
    UnsupportedFormatVersion,
)
from tidelog.replication.metadata import MetadataState
from tidelog.replication.metadata_commands import (
    CreateCursor,
    CreateTopic,
    InvalidateCursor,
    MetadataCommand,
    TxnAddGroup,
    TxnAddPartitions,
    TxnComplete,
    TxnEnd,
    TxnExpire,
    TxnInit,
    TxnOffsets,
)
from tidelog.replication.metadata_transactions import (
    EPOCH_MAX,
    Transaction,
    TxnState,
    expired,
    verify_transactional_batch,
)

PID = 41


class Log:
    """A metadata state and the offsets its commands commit at."""

    def __init__(self) -> None:
        self.state = MetadataState()
        self.offset = 0

    def apply(self, command: MetadataCommand) -> int:
        at = self.offset
        self.state.apply(at, command)
        self.offset += 1
        return at

    def txn(self, name: str = "tx") -> Transaction:
        found = self.state.transactions.get(name)
        assert found is not None
        return found


def started() -> Log:
    log = Log()
    log.apply(CreateTopic("out", "stream", {}, [[1], [1], [1]]))
    log.apply(CreateTopic("in", "stream", {}, [[1], [1]]))
    log.apply(TxnInit("tx", PID, -1, 60_000, "app", 10))
    return log


def test_init_allocates_then_bumps_the_epoch_fencing_the_older_one() -> None:
    log = started()
    txn = log.txn()
    assert (txn.producer_id, txn.epoch, txn.state) == (PID, 0, TxnState.EMPTY)
    log.apply(TxnInit("tx", 99, 0, 30_000, "app", 20))  # a second producer, same id
    assert (log.txn().producer_id, log.txn().epoch, log.txn().timeout_ms) == (PID, 1, 30_000)
    # A command of the fenced epoch changes nothing.
    log.apply(TxnAddPartitions("tx", PID, 0, {"out": [0]}, 30))
    assert log.txn().state is TxnState.EMPTY and not log.txn().partitions
    # Two inits that saw the same epoch bump once: the second changes nothing.
    log.apply(TxnInit("tx", 99, 0, 30_000, "app", 40))
    assert log.txn().epoch == 1


def test_an_init_aborts_the_open_transaction_of_the_older_epoch_first() -> None:
    log = started()
    log.apply(TxnAddPartitions("tx", PID, 0, {"out": [0, 2]}, 30))
    at = log.apply(TxnInit("tx", 99, 0, 60_000, "app", 40))
    txn = log.txn()
    assert (txn.state, txn.epoch, txn.prepared_offset) == (TxnState.PREPARE_ABORT, 1, at)
    assert txn.partitions == {"out": [0, 2]}  # the markers still to write, at epoch 1
    log.apply(TxnInit("tx", 99, 1, 60_000, "app", 50))  # asked again while being completed
    assert log.txn().state is TxnState.PREPARE_ABORT
    log.apply(TxnComplete("tx", PID, 1, at, 60))
    assert log.txn().state is TxnState.COMPLETE_ABORT
    log.apply(TxnInit("tx", 99, 1, 60_000, "app", 70))
    assert (log.txn().state, log.txn().epoch) == (TxnState.EMPTY, 2)


def test_the_epoch_rolls_over_to_a_fresh_producer_id_before_int16_ends() -> None:
    log = started()
    log.txn().epoch = EPOCH_MAX - 1
    log.apply(TxnInit("tx", 99, EPOCH_MAX - 1, 60_000, "app", 20))
    assert (log.txn().producer_id, log.txn().epoch) == (99, 0)
    assert log.state.transactions.of_producer(99) is log.txn()
    assert log.state.transactions.of_producer(PID) is None


def transaction_with_offsets(log: Log) -> None:
    log.apply(TxnAddPartitions("tx", PID, 0, {"out": [1]}, 30))
    log.apply(TxnAddGroup("tx", PID, 0, "g", 31))
    offsets = {"g": {"topic": "in", "positions": {0: 7, 1: 3}}}
    log.apply(TxnOffsets("tx", PID, 0, "g", offsets, 32))


def test_offsets_are_committed_in_the_command_that_commits_and_never_on_abort() -> None:
    log = started()
    transaction_with_offsets(log)
    assert "g" not in log.state.cursors, "pending until the decision"
    at = log.apply(TxnEnd("tx", PID, 0, True, False, 40))
    assert log.txn().state is TxnState.PREPARE_COMMIT and log.txn().prepared_offset == at
    assert log.state.cursors["g"].positions == {0: 7, 1: 3}
    assert log.state.cursors["g"].owner == "app"
    log.apply(TxnComplete("tx", PID, 0, at - 1, 50))  # another decision's: nothing
    assert log.txn().state is TxnState.PREPARE_COMMIT
    log.apply(TxnComplete("tx", PID, 0, at, 50))
    assert log.txn().state is TxnState.COMPLETE_COMMIT and not log.txn().pending_offsets

    aborted = started()
    transaction_with_offsets(aborted)
    aborted.apply(TxnEnd("tx", PID, 0, False, False, 40))
    assert aborted.txn().state is TxnState.PREPARE_ABORT
    assert "g" not in aborted.state.cursors


def test_committed_offsets_move_a_live_cursor_and_replace_an_invalidated_one() -> None:
    log = started()
    log.apply(CreateCursor("g", "in", {0: 1}, False, "app", 5))
    transaction_with_offsets(log)
    log.apply(TxnEnd("tx", PID, 0, True, False, 40))
    assert log.state.cursors["g"].positions == {0: 7, 1: 3}
    log.apply(TxnComplete("tx", PID, 0, log.txn().prepared_offset, 50))
    log.apply(InvalidateCursor("g", "too far behind", 60))
    transaction_with_offsets(log)
    log.apply(TxnEnd("tx", PID, 0, True, False, 70))
    assert log.state.cursors["g"].live and log.state.cursors["g"].positions == {0: 7, 1: 3}


def test_a_timeout_abort_bumps_the_epoch_and_fences_the_producer() -> None:
    log = started()
    log.apply(TxnAddPartitions("tx", PID, 0, {"out": [0]}, 30))
    log.apply(TxnEnd("tx", PID, 0, False, True, 90_000))
    assert (log.txn().state, log.txn().epoch) == (TxnState.PREPARE_ABORT, 1)
    refusal = verify_transactional_batch(log.state.transactions, "tx", PID, 0, "out", 0)
    assert isinstance(refusal, ProducerFenced)


def test_a_commit_past_the_timeout_is_the_timeout_abort_instead() -> None:
    """Decided after transaction.timeout.ms (60 s from its first partition, at 30 ms), a
    commit fences its producer and aborts, as the coordinator's timeout abort would have."""
    log = started()
    log.apply(TxnAddPartitions("tx", PID, 0, {"out": [0]}, 30))
    log.apply(TxnEnd("tx", PID, 0, True, False, 60_030))  # at the timeout: still commits
    assert log.txn().state is TxnState.PREPARE_COMMIT
    late = started()
    late.apply(TxnAddPartitions("tx", PID, 0, {"out": [0]}, 30))
    late.apply(TxnEnd("tx", PID, 0, True, False, 60_031))
    assert (late.txn().state, late.txn().epoch) == (TxnState.PREPARE_ABORT, 1)


def test_a_partition_leader_appends_only_what_an_ongoing_transaction_holds() -> None:
    log = started()
    txns = log.state.transactions
    assert isinstance(verify_transactional_batch(txns, "tx", PID, 0, "out", 0), InvalidTxnState)
    log.apply(TxnAddPartitions("tx", PID, 0, {"out": [0]}, 30))
    assert verify_transactional_batch(txns, "tx", PID, 0, "out", 0) is None
    assert isinstance(verify_transactional_batch(txns, "tx", PID, 0, "out", 1), InvalidTxnState)
    assert isinstance(verify_transactional_batch(txns, "tx", PID, 1, "out", 0), InvalidTxnState)
    # Another producer id, another transactional id, or none: not this transaction's batch.
    assert isinstance(
        verify_transactional_batch(txns, "tx", 12345, 0, "out", 0), UnknownTransactionalId
    )
    assert isinstance(
        verify_transactional_batch(txns, "other", PID, 0, "out", 0), UnknownTransactionalId
    )
    assert isinstance(verify_transactional_batch(txns, "", PID, 0, "out", 0), InvalidTxnState)
    log.apply(TxnEnd("tx", PID, 0, True, False, 40))
    refusal = verify_transactional_batch(txns, "tx", PID, 0, "out", 0)
    assert isinstance(refusal, InvalidTxnState), "a batch after the decision is refused"


def test_the_snapshot_holds_the_transactions_as_version_2() -> None:
    log = started()
    transaction_with_offsets(log)
    snapshot = json.loads(json.dumps(log.state.to_snapshot()))
    assert snapshot["v"] == 2
    again = MetadataState.from_snapshot(snapshot)
    assert again.transactions.to_wire() == log.state.transactions.to_wire()
    assert again.transactions.of_producer(PID) is not None
    # Without transactions, below level 3, the snapshot is version 1, as before.
    assert "v" not in MetadataState().to_snapshot()
    try:
        formats.set_write_level(3)
        assert MetadataState().to_snapshot()["v"] == 2
    finally:
        formats._WriteLevel.level = 1
    with pytest.raises(UnsupportedFormatVersion):
        MetadataState.from_snapshot({**snapshot, "v": 3})


def test_an_idle_transactional_id_expires_and_an_open_one_does_not() -> None:
    log = started()
    log.apply(TxnAddPartitions("tx", PID, 0, {"out": [0]}, 30))
    assert not expired(log.txn(), 10**12, 1000), "an open transaction never expires"
    log.apply(TxnExpire("tx", PID, 0, 40))
    assert log.state.transactions.get("tx") is not None
    at = log.apply(TxnEnd("tx", PID, 0, False, False, 50))
    log.apply(TxnComplete("tx", PID, 0, at, 60))
    assert not expired(log.txn(), 1000, 1000) and expired(log.txn(), 1061, 1000)
    log.apply(TxnExpire("tx", PID, 0, 2000))
    assert log.state.transactions.get("tx") is None
    assert log.state.transactions.of_producer(PID) is None
