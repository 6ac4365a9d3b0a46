"""A partition leader's producers, for operators (KIP-664): what each producer has written and
whether it has a transaction open there (Kafka's DescribeProducers), and the marker an operator
writes to end a hanging transaction (Kafka's WriteTxnMarkers, as `kafka-transactions.sh
abort` sends it).

    describe      the partition's producers (storage/producer_state.py) and their open
                  transactions (storage/transactions.py), on its leader
    write_marker  an ABORT or COMMIT marker for one producer's open transaction

A marker is the transaction coordinator's to write (node/transaction_coordinator.py); an
operator's may only agree with it. For the producer's open transaction here, this node's replica
of the metadata log says (replication/metadata_transactions.py):
- the coordinator holds it Ongoing with this partition: refused (InvalidTxnState); it is ended
  by its producer (EndTxn) or by `tidelog transactions abort`, at the coordinator;
- the coordinator decided it (PrepareCommit, PrepareAbort) with this partition: the same
  decision is answered as done, since the coordinator is writing that very marker (it asks
  until the leader confirms); the other one is refused;
- otherwise the coordinator does not track it: it hangs (its marker was never written), and
  only an ABORT may end it, once it has been open longer than transaction.max.timeout.ms.
  That bound is what makes the verdict safe on a replica of the metadata log that may lag the
  coordinator: no transaction stays Ongoing past its timeout (the coordinator aborts it), so a
  transaction open here that long is one the coordinator ended or will abort.
An older epoch than the open transaction's is fenced (ProducerFenced), and a producer with no
transaction open here has nothing to end (nothing is written).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tidelog.acls import Resource
from tidelog.errors import InvalidRequest, InvalidTxnState, ProducerFenced
from tidelog.features import require_transactions
from tidelog.node.access import Operation
from tidelog.node.metadata_log import MetadataLog
from tidelog.node.ops.base import MetadataOps
from tidelog.node.partition import PartitionHost
from tidelog.node.transaction_coordinator import TransactionCoordinator
from tidelog.protocol import api
from tidelog.record.batch import NO_SEQUENCE
from tidelog.replication.metadata_transactions import Transaction, TxnState
from tidelog.storage.transactions import OpenTransaction


def wall_ms() -> int:
    return int(time.time() * 1000)


def producers_scope(req: api.ProducersRequest) -> tuple[Operation, Resource, str]:
    """What the door checks: read on the topic to describe its producers (Kafka's READ), cluster
    admin to write a marker (Kafka's CLUSTER_ACTION, which only brokers hold there)."""
    if req.op == "write_marker":
        return Operation.ALTER, Resource.cluster(), ""
    return Operation.READ, Resource.topic(req.topic), ""


class ProducerOps(MetadataOps):
    """DescribeProducers and WriteTxnMarkers on one node (served by each partition's leader)."""

    def __init__(
        self,
        node_id: int,
        metadata_log: MetadataLog,
        leader: Callable[[str, int], PartitionHost],
        coordinator: TransactionCoordinator,
        max_timeout_ms: Callable[[], int],
    ) -> None:
        self.node_id = node_id
        self.metadata_log = metadata_log
        self.leader = leader  # DataOps.leader: UnknownTopicOrPartition, NotLeader
        self.coordinator = coordinator  # its append_marker is the one way a marker is written
        self.max_timeout_ms = max_timeout_ms  # the node's transaction.max.timeout.ms

    async def producers(self, req: api.ProducersRequest, payload: bytes) -> api.ProducersResponse:
        if req.op == "describe":
            return self.describe(req)
        if req.op == "write_marker":
            return await self.write_marker(req)
        raise InvalidRequest(
            f"producers op must be one of {', '.join(api.PRODUCERS_OPS)}, got {req.op!r}",
            field="op",
        )

    # -- describe -------------------------------------------------------------------------------

    def describe(self, req: api.ProducersRequest) -> api.ProducersResponse:
        """Every producer the partition's state keeps, and every producer with a transaction
        open there (one whose idempotence entry has expired still holds the LSO back: it is
        what an operator is looking for)."""
        host = self.leader(req.topic, req.partition)
        opened = host.log.transactions.open
        found: dict[int, dict[str, Any]] = {}
        for producer_id, entry in host.log.producers.producers.items():
            found[producer_id] = {
                "producer_id": producer_id,
                "producer_epoch": entry.epoch,
                # A marker is the producer's newest batch after its transaction ends: no
                # sequence of its own.
                "last_sequence": entry.last_sequence if entry.sequence != NO_SEQUENCE else -1,
                "last_timestamp_ms": entry.last_write_ms,
                "coordinator_epoch": -1,
                "txn_start_offset": -1,
            }
        for producer_id, txn in opened.items():
            described = found.setdefault(
                producer_id,
                {
                    "producer_id": producer_id,
                    "producer_epoch": txn.producer_epoch,
                    "last_sequence": -1,
                    "last_timestamp_ms": txn.opened_ms,
                    "coordinator_epoch": -1,
                },
            )
            described["txn_start_offset"] = txn.first_offset
        return api.ProducersResponse(
            producers=[found[p] for p in sorted(found)], node_id=self.node_id
        )

    # -- write_marker ---------------------------------------------------------------------------

    async def write_marker(self, req: api.ProducersRequest) -> api.ProducersResponse:
        require_transactions(self.metadata.finalized_level, "transaction markers")
        host = self.leader(req.topic, req.partition)
        opened = host.log.transactions.open.get(req.producer_id)
        if opened is None:
            return api.ProducersResponse(node_id=self.node_id)  # nothing open: nothing to end
        txn = self.metadata.transactions.of_producer(req.producer_id)
        refusal = marker_refusal(
            txn, opened, req, host.group, wall_ms() - opened.opened_ms, self.max_timeout_ms()
        )
        if refusal is not None:
            raise refusal
        if txn is not None and txn.state.prepared and txn.holds(req.topic, req.partition):
            # The coordinator's own decision: it is writing this marker (asked until done).
            return api.ProducersResponse(node_id=self.node_id)
        # Checked and appended in one step (append_marker appends before its first await).
        offset = await self.coordinator.append_marker(
            host,
            req.producer_id,
            req.producer_epoch,
            commit=False,
            coordinator_epoch=req.coordinator_epoch,
        )
        return api.ProducersResponse(marker_offset=offset, node_id=self.node_id)


def marker_refusal(
    txn: Transaction | None,
    opened: OpenTransaction,
    req: api.ProducersRequest,
    where: str,
    open_ms: int,
    max_timeout_ms: int,
) -> InvalidTxnState | ProducerFenced | None:
    """Why an operator's marker may not end this open transaction (None: it may); the rules
    are in the module's docstring."""
    what = "COMMIT" if req.commit else "ABORT"
    who = f"producer {req.producer_id}"
    if req.producer_epoch < opened.producer_epoch:
        return ProducerFenced(
            f"{where}: {who} has a transaction open at epoch {opened.producer_epoch}; a marker "
            f"at epoch {req.producer_epoch} is fenced",
            producer_id=req.producer_id,
            epoch=req.producer_epoch,
        )
    if txn is not None and txn.holds(req.topic, req.partition):
        if txn.state is TxnState.ONGOING:
            return InvalidTxnState(
                f"{where}: the coordinator holds {who}'s transaction (transactional id "
                f"{txn.transactional_id!r}) open: it is ended there (EndTxn, or tidelog "
                "transactions abort), not by a marker",
                transactional_id=txn.transactional_id,
                producer_id=req.producer_id,
            )
        if txn.state.prepared and (txn.state is TxnState.PREPARE_COMMIT) != req.commit:
            return InvalidTxnState(
                f"{where}: the coordinator decided {txn.state.value} for {who}'s transaction "
                f"(transactional id {txn.transactional_id!r}); a {what} marker would "
                "contradict it",
                transactional_id=txn.transactional_id,
                producer_id=req.producer_id,
            )
        if txn.state.prepared:
            return None
    if req.commit:
        return InvalidTxnState(
            f"{where}: the coordinator does not track {who}'s open transaction as one it "
            "decided to commit: only an ABORT marker may end it",
            producer_id=req.producer_id,
        )
    if open_ms < max_timeout_ms:
        return InvalidTxnState(
            f"{where}: {who}'s transaction has been open {open_ms} ms, less than "
            f"transaction.max.timeout.ms ({max_timeout_ms}): its coordinator may still hold "
            "it; ask again once it is older",
            producer_id=req.producer_id,
        )
    return None
