"""The transaction coordinator's process (Kafka's TransactionMarkerChannelManager and its
timeout check), and a partition leader's side of markers.

The coordinator is the metadata log's leader; the transactions' state is the metadata log's
(replication/metadata_transactions.py). While it leads, every CHECK_EVERY_S:
- every *prepared* transaction (its decision committed) has its marker asked of the leader of
  each of its partitions (TXN_MARKERS, sent to every replica: only the leader acts); a
  partition's leader answers TXN_MARKERS_DONE once the marker is committed there (acks=all).
  Asks are re-sent every RESEND_S until answered, so a lost message, a partition leader's
  change or this coordinator's (a new metadata leader resumes every prepared transaction from
  the log) only delays it. Once every partition answered, TxnComplete is proposed;
- every Ongoing transaction open longer than its timeout is aborted at a new epoch (TxnEnd
  with bump), which fences its producer;
- every transactional id with nothing open, unused for transactional.id.expiration.ms, is
  forgotten (TxnExpire), as Kafka's are.

A partition leader appends a marker only when its own replica of the metadata log says the
transaction is prepared with that decision (it waits briefly for its replica to apply it), and
only for a producer its log knows (one that never wrote there has nothing to end). A marker
asked again (a re-send, a duplicate) while this leader's append of it is in flight or done is
answered without a second append; a new leader may append it once more, which is harmless:
while the decision is not complete no batch of the producer can be appended in between (a
transactional batch needs its transaction Ongoing), and a marker with nothing before it ends
an empty transaction.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from tidelog.errors import TidelogError
from tidelog.features import TRANSACTIONS_LEVEL
from tidelog.node.background import BackgroundTasks
from tidelog.node.metadata_log import MetadataLog
from tidelog.node.metrics import Counters
from tidelog.node.partition import PartitionHost
from tidelog.node.transport import PeerSender
from tidelog.protocol import api
from tidelog.protocol.api import ApiKey
from tidelog.record.markers import build_marker
from tidelog.replication.metadata_commands import TxnComplete, TxnEnd, TxnExpire
from tidelog.replication.metadata_transactions import Transaction, TxnState, expired

log = logging.getLogger(__name__)

CHECK_EVERY_S = 0.05
RESEND_S = 1.0
APPLY_WAIT_S = 2.0  # a partition leader waits this long for its metadata to show the decision
MARKER_ACK_TIMEOUT_S = 30.0

Partition = tuple[str, int]


def wall_ms() -> int:
    return int(time.time() * 1000)


class MarkerJob:
    """One prepared transaction's markers still to be confirmed, by partition."""

    def __init__(self, txn: Transaction, pending: set[Partition]) -> None:
        self.txn_id = txn.transactional_id
        self.producer_id = txn.producer_id
        self.epoch = txn.epoch
        self.commit = txn.state is TxnState.PREPARE_COMMIT
        self.prepared_offset = txn.prepared_offset
        self.pending = pending
        self.sent_at = -RESEND_S

    def request(self, coordinator_epoch: int, partitions: list[Partition]) -> dict[str, Any]:
        return {
            "transactional_id": self.txn_id,
            "producer_id": self.producer_id,
            "producer_epoch": self.epoch,
            "commit": self.commit,
            "prepared_offset": self.prepared_offset,
            "coordinator_epoch": coordinator_epoch,
            "partitions": [[t, p] for t, p in sorted(partitions)],
        }


class TransactionCoordinator:
    def __init__(
        self,
        node_id: int,
        metadata_log: MetadataLog,
        hosts: dict[str, PartitionHost],
        send_to_peer: PeerSender,
        finalized_level: Callable[[], int],
        background: BackgroundTasks,
        counters: Counters,
        expiration_ms: Callable[[], int],
    ) -> None:
        self.node_id = node_id
        self.metadata_log = metadata_log
        self.hosts = hosts
        self.send_to_peer = send_to_peer
        self.finalized_level = finalized_level
        self.background = background
        self.counters = counters
        self.expiration_ms = expiration_ms  # transactional.id.expiration.ms
        self.jobs: dict[tuple[str, int], MarkerJob] = {}  # (transactional id, prepared offset)
        # This node's marker appends as a partition leader: (group, transactional id, prepared
        # offset) -> the append's wait, so that an ask repeated meanwhile appends nothing more.
        self._appending: dict[tuple[str, str, int], asyncio.Future[bool]] = {}

    @property
    def leads(self) -> bool:
        return (
            self.metadata_log.opened
            and self.metadata_log.is_leader
            and self.finalized_level() >= TRANSACTIONS_LEVEL
        )

    async def run(self) -> None:
        while True:
            await asyncio.sleep(CHECK_EVERY_S)
            try:
                self.check()
            except TidelogError as exc:
                log.warning("transaction coordinator: %s", exc)

    def check(self) -> None:
        if not self.leads:
            self.jobs.clear()
            return
        state = self.metadata_log.state
        now_ms = wall_ms()
        prepared = set()
        for txn in list(state.transactions.by_id.values()):
            if txn.state.prepared:
                key = (txn.transactional_id, txn.prepared_offset)
                prepared.add(key)
                if key not in self.jobs:
                    self.jobs[key] = MarkerJob(txn, self._partitions_of(txn))
            elif expired(txn, now_ms, self.expiration_ms()):
                self.metadata_log.propose_in_background(
                    f"expiry of transactional id {txn.transactional_id}",
                    TxnExpire(txn.transactional_id, txn.producer_id, txn.epoch, now_ms),
                )
            elif txn.state is TxnState.ONGOING and now_ms - txn.started_ms > txn.timeout_ms:
                command = TxnEnd(
                    txn.transactional_id, txn.producer_id, txn.epoch, False, True, now_ms
                )
                what = f"abort of transactional id {txn.transactional_id} past its timeout"
                if what not in self.metadata_log.proposing:
                    self.counters.inc("tidelog_transactions_timed_out_total")
                self.metadata_log.propose_in_background(what, command)
        for key in [k for k in self.jobs if k not in prepared]:
            del self.jobs[key]  # completed (or superseded)
        for job in self.jobs.values():
            self._advance(job)

    def _partitions_of(self, txn: Transaction) -> set[Partition]:
        return {(t, p) for t, ps in txn.partitions.items() for p in ps}

    def _advance(self, job: MarkerJob) -> None:
        topics = self.metadata_log.state.topics
        # A partition of a topic deleted since has no marker to write.
        job.pending = {(t, p) for t, p in job.pending if t in topics and p < topics[t].partitions}
        if not job.pending:
            command = TxnComplete(
                job.txn_id, job.producer_id, job.epoch, job.prepared_offset, wall_ms()
            )
            self.metadata_log.propose_in_background(
                f"transactional id {job.txn_id}: every marker written", command
            )
            return
        now = time.monotonic()
        if now - job.sent_at < RESEND_S:
            return
        job.sent_at = now
        by_node: dict[int, list[Partition]] = {}
        for topic, partition in job.pending:
            for node in topics[topic].hosts(partition):
                by_node.setdefault(node, []).append((topic, partition))
        coordinator_epoch = self.metadata_log.host.replica.epoch
        for node, partitions in by_node.items():
            request = job.request(coordinator_epoch, partitions)
            if node == self.node_id:
                self.on_markers(request, self.node_id)
            else:
                self.send_to_peer(node, ApiKey.TXN_MARKERS, request, None)

    # -- the coordinator hears back ---------------------------------------------------------------

    def on_markers_done(self, header: dict[str, Any], sender: int) -> None:
        key = (str(header.get("transactional_id", "")), int(header.get("prepared_offset", -1)))
        job = self.jobs.get(key)
        if job is None:
            return
        for topic, partition in header.get("partitions", []):
            job.pending.discard((str(topic), int(partition)))
        if not job.pending and self.leads:
            self._advance(job)

    # -- a partition leader's side ----------------------------------------------------------------

    def on_markers(self, header: dict[str, Any], sender: int) -> None:
        """The coordinator asks for markers in partitions, some of which this node may lead."""
        for topic, partition in header.get("partitions", []):
            host = self.hosts.get(f"{topic}/{int(partition)}")
            if host is not None and host.replica.is_leader:
                self.background.start(self._write_marker(host, header, sender))

    async def _write_marker(self, host: PartitionHost, header: dict[str, Any], sender: int) -> None:
        txn_id = str(header["transactional_id"])
        prepared_offset = int(header["prepared_offset"])
        key = (host.group, txn_id, prepared_offset)
        pending = self._appending.get(key)
        try:
            if pending is None:
                pending = asyncio.ensure_future(self._append(host, header))
                self._appending[key] = pending
            done = await asyncio.shield(pending)
        except TidelogError as exc:
            log.info("%s: marker of %s not written yet: %s", host.group, txn_id, exc)
            self._appending.pop(key, None)
            return
        if not done:
            self._appending.pop(key, None)
            return
        answer = {
            "transactional_id": txn_id,
            "prepared_offset": prepared_offset,
            "partitions": [[host.topic, host.partition]],
        }
        if sender == self.node_id:
            self.on_markers_done(answer, sender)
        else:
            self.send_to_peer(sender, ApiKey.TXN_MARKERS_DONE, answer, None)
        if len(self._appending) > 10_000:
            self._appending.clear()  # what is done is answered; a later ask appends anew

    async def _append(self, host: PartitionHost, header: dict[str, Any]) -> bool:
        """Append and commit the marker, if this leader's metadata says it is due. True once
        there is nothing more to do here (written, or not needed)."""
        prepared_offset = int(header["prepared_offset"])
        if not await self.metadata_log.applied_past(prepared_offset, APPLY_WAIT_S):
            return False  # asked again later
        txn = self.metadata_log.state.transactions.get(str(header["transactional_id"]))
        producer_id, epoch = int(header["producer_id"]), int(header["producer_epoch"])
        if (
            txn is None
            or not txn.state.prepared
            or txn.prepared_offset != prepared_offset
            or (txn.producer_id, txn.epoch) != (producer_id, epoch)
        ):
            return True  # completed (every marker confirmed) or superseded
        if producer_id not in host.log.transactions.open:
            # Nothing of it open here: it never wrote here, or its marker is already in
            # (a re-ask after a lost answer must not write a second one).
            return True
        await self.append_marker(
            host,
            producer_id,
            epoch,
            commit=bool(header["commit"]),
            coordinator_epoch=int(header.get("coordinator_epoch", -1)),
        )
        return True

    async def append_marker(
        self,
        host: PartitionHost,
        producer_id: int,
        epoch: int,
        *,
        commit: bool,
        coordinator_epoch: int,
    ) -> int:
        """Append a marker in a partition this node leads and wait until it is committed
        (acks=all); its offset. The one way a marker enters a log: the coordinator's asks
        (above) and an operator's WriteTxnMarkers (node/ops/producers.py) both come here. The
        append happens before the first await, so a caller's checks just before it still hold
        when the marker lands."""
        marker = build_marker(
            producer_id, epoch, commit=commit, coordinator_epoch=coordinator_epoch
        )
        info = host.replica.propose(marker)
        host.process_ready()
        await host.wait_for_ack(info.last_offset, api.ACKS_ALL, MARKER_ACK_TIMEOUT_S)
        self.counters.inc(
            "tidelog_transaction_markers_total", marker="commit" if commit else "abort"
        )
        return int(info.last_offset)
