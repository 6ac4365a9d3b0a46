"""The transactional workload (SimParams.transactions): producers that write transactional
batches through whichever node leads, wait for every batch's acks=all, then end the
transaction with a marker, as a coordinator would (commit or abort, decided once; the marker
is retried until it is committed). Some transactions stay open a while first, and one whose
batch failed is aborted. Beside them, read_committed readers read below the LSO of any live
replica and drop what the answer's aborted transactions name, as a Kafka client does
(record/read_committed.py); what they are handed goes to the transaction checker
(checkers/transactions.py).

Each transaction is one producer id (a producer's epoch and sequences start afresh), so a
lost batch shows as a sequence gap the leader refuses, and the transaction aborts."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from tidelog.errors import TidelogError
from tidelog.record.batch import ProducerRecord, build_batch, decode_records, iter_headers
from tidelog.record.markers import build_marker
from tidelog.record.read_committed import committed_batches
from tidelog.testing.sim.checkers.derived_state import check_node_transactions
from tidelog.testing.sim.checkers.transactions import ReadSession, TransactionAnomalies
from tidelog.testing.sim.cluster import Cluster
from tidelog.testing.sim.nodes import SimNode, Waiter

OPEN_MAX = 3  # transactions open at once
START_RATE = 0.05  # chance per tick that a producer begins one
WRITE_RATE = 0.3  # chance per tick that an open transaction writes its next batch
COMMIT_SHARE = 0.7
LINGER_SHARE = 0.2  # transactions left open a while after their last batch
ACK_PATIENCE_TICKS = 300  # a batch unanswered this long: the producer gives up (and aborts)
READERS = 2
FIRST_PRODUCER_ID = 1000
DELETE_RECORDS_RATE = 0.01  # chance per tick of an operator's delete-records (--delete-records)


@dataclass
class Transaction:
    producer_id: int
    planned: int  # batches it writes
    linger: int  # ticks it stays open after its last batch is answered
    written: int = 0
    sequence: int = 0
    pending: set[int] = field(default_factory=set)  # ids of waiters not answered yet
    failed: bool = False
    last_write: int = 0
    answered_at: int = -1
    commit: bool | None = None  # the decision, once made
    marker: Waiter | None = None  # the marker's wait, while one is in flight
    ended: bool = False


@dataclass
class Reader:
    reader: int
    position: int | None = None
    session: ReadSession | None = None


@dataclass
class Counts:
    committed: int = 0
    aborted: int = 0
    markers: int = 0
    reads: int = 0
    records_read: int = 0
    dropped_batches: int = 0  # batches of aborted transactions read_committed readers dropped
    deletes: int = 0  # delete-records that moved a leader's log start (--delete-records)


class TransactionalClients:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.open: list[Transaction] = []
        self.next_producer = FIRST_PRODUCER_ID
        # id(waiter) -> (its transaction, a marker?, the waiter: kept, so the id stays its own)
        self.waiting: dict[int, tuple[Transaction, bool, Waiter]] = {}
        self.readers = [Reader(i) for i in range(READERS)]
        self.counts = Counts()
        self._deletes: random.Random | None = None  # made at the first tick (the params)

    @property
    def checker(self) -> TransactionAnomalies:
        return self.cluster.checkers.transactions

    # -- producers ----------------------------------------------------------------------------

    def act(self) -> None:
        rng = self.cluster.rng
        if len(self.open) < OPEN_MAX and rng.random() < START_RATE:
            linger = rng.randint(50, 400) if rng.random() < LINGER_SHARE else 0
            self.open.append(Transaction(self.next_producer, rng.randint(1, 4), linger))
            self.next_producer += 1
        for txn in list(self.open):
            self._step(txn)
        self.open = [t for t in self.open if not t.ended]
        for reader in self.readers:
            if rng.random() < self.cluster.params.read_rate:
                self._read(reader)
        params = self.cluster.params
        if params.delete_records:
            if self._deletes is None:  # (its own stream: the seed's draws stay as they were)
                self._deletes = random.Random(params.seed ^ 0xDE1E7E)
            if self._deletes.random() < DELETE_RECORDS_RATE:
                self._delete_records(self._deletes)

    def _delete_records(self, rng: random.Random) -> None:
        """An operator's delete-records at the leader, up to any offset below its HW (past an
        undecided transaction's first batches too, which the LWM never goes); then every
        replica's cleaner deletes what lies below its own log start, and each one's
        transaction state must still be what a scan of what it kept derives."""
        cluster = self.cluster
        up = [
            n
            for n in cluster.nodes.values()
            if n.alive and n.paused_until <= cluster.now and n.replica is not None
        ]
        leaders = [n for n in up if n.replica is not None and n.replica.is_leader]
        if leaders:
            node = rng.choice(leaders)
            log = node.log
            # Not past a live cursor, as the node refuses without --force.
            live = [c.position for c in cluster.cursors if not c.invalidated]
            top = min([log.high_watermark, *live])
            if top > log.log_start_offset and node.replica is not None:
                target = rng.randint(log.log_start_offset + 1, top)
                if node.replica.advance_log_start(target):
                    self.counts.deletes += 1
                    cluster.process_ready(node)
                    cluster.log_event(f"delete-records before {target} on {node.node_id}")
        for n in up:
            n.log.delete_segments_below_log_start()
            check_node_transactions(n, cluster.checkers.violations)

    def _step(self, txn: Transaction) -> None:
        cluster = self.cluster
        now = cluster.now
        if txn.commit is None:
            if txn.written < txn.planned and not txn.failed:
                if cluster.rng.random() < WRITE_RATE:
                    self._write(txn)
                return
            if txn.pending and now - txn.last_write < ACK_PATIENCE_TICKS:
                return
            if txn.pending:
                txn.failed = True
            if txn.answered_at < 0:
                txn.answered_at = now
            if now - txn.answered_at < txn.linger:
                return
            txn.commit = not txn.failed and cluster.rng.random() < COMMIT_SHARE
        if txn.marker is None:
            self._write_marker(txn)

    def _propose(self, batch: bytes, value: bytes) -> Waiter | None:
        return propose_transactional(self.cluster, self.cluster.rng, batch, value)

    def _owe(self, txn: Transaction, waiter: Waiter, marker: bool) -> None:
        self.waiting[id(waiter)] = (txn, marker, waiter)
        owe(self.cluster, waiter)

    def _write(self, txn: Transaction) -> None:
        count = self.cluster.rng.randint(1, 3)
        values = [b"t%d.%d" % (txn.producer_id, txn.sequence + i) for i in range(count)]
        batch = build_batch(
            [ProducerRecord(None, v) for v in values],
            producer_id=txn.producer_id,
            producer_epoch=0,
            base_sequence=txn.sequence,
            now_ms=self.cluster.now,
            transactional=True,
        )
        waiter = self._propose(batch, values[-1])
        if waiter is None:
            txn.failed = True  # refused (not the leader any more, or a sequence gap)
            return
        txn.written += 1
        txn.sequence += count
        txn.last_write = self.cluster.now
        txn.pending.add(id(waiter))
        self._owe(txn, waiter, marker=False)

    def _write_marker(self, txn: Transaction) -> None:
        commit = bool(txn.commit)
        batch = build_marker(
            txn.producer_id, 0, commit=commit, coordinator_epoch=0, now_ms=self.cluster.now
        )
        waiter = self._propose(batch, b"marker-%d" % txn.producer_id)
        if waiter is None:
            return  # no leader now: the next tick tries again
        txn.marker = waiter
        self.counts.markers += 1
        self._owe(txn, waiter, marker=True)

    def acknowledged(self, acked: list[Waiter], failed: list[Waiter]) -> None:
        for waiters, ok in ((acked, True), (failed, False)):
            for waiter in waiters:
                found = self.waiting.pop(id(waiter), None)
                if found is None:
                    continue
                txn, marker, _ = found
                if marker:
                    txn.marker = None
                    if ok:
                        txn.ended = True
                        if txn.commit:
                            self.counts.committed += 1
                        else:
                            self.counts.aborted += 1
                    continue
                txn.pending.discard(id(waiter))
                if not ok:
                    txn.failed = True

    # -- read_committed readers ---------------------------------------------------------------

    def _read(self, reader: Reader) -> None:
        read_committed(self.cluster, reader, self.counts)


def propose_transactional(
    cluster: Cluster, rng: random.Random, batch: bytes, value: bytes
) -> Waiter | None:
    """A transactional batch or marker proposed to one of the cluster's leaders (drawn from
    rng): its acks=all wait, or None if refused or nobody leads."""
    leaders = [
        n
        for n in cluster.nodes.values()
        if n.replica is not None and n.paused_until <= cluster.now and n.replica.is_leader
    ]
    node = rng.choice(leaders) if leaders else None
    if node is None or node.replica is None or node.driver is None:
        return None
    try:
        info = node.replica.propose(batch)
    except TidelogError:
        return None
    cluster.stats.proposed += 1
    cluster.process_ready(node)
    return Waiter(node.node_id, node.replica.epoch, info.last_offset, value, "all", True)


def owe(cluster: Cluster, waiter: Waiter) -> None:
    """The node's driver owes the waiter its acks=all answer (given at once if already due)."""
    node = cluster.nodes[waiter.node]
    if node.driver is not None and node.driver.owe(waiter.last_offset, False, waiter):
        cluster.acknowledge([waiter], [])


def read_committed(
    cluster: Cluster, reader: Reader, counts: Counts, node: SimNode | None = None
) -> None:
    """One read_committed read by reader, from node (or any live replica) below its LSO,
    handed to the transaction checker of the cluster (one partition's group)."""
    if node is None:
        live = [
            n
            for n in cluster.nodes.values()
            if n.alive and n.paused_until <= cluster.now and n.replica is not None
        ]
        if not live:
            return
        node = cluster.rng.choice(live)
    if node.replica is None:
        return
    log = node.log
    lso = node.replica.last_stable_offset()
    checker = cluster.checkers.transactions
    if reader.position is None or reader.position < log.log_start_offset:
        reader.position = log.log_start_offset  # (fell behind the log start: start over)
        reader.session = checker.new_session(reader.reader)
    position = reader.position
    if position >= lso:
        return
    chunk = log.read(position, cluster.rng.choice([1, 500, 1 << 20]), lso)
    if chunk is None or reader.session is None:
        return
    data = chunk.read()
    batches = list(iter_headers(data))
    hw = log.high_watermark
    for pos, header in batches:
        cluster.checkers.read(node, header, data[pos : pos + header.size_bytes], hw)
    end = min(batches[-1][1].next_offset, lso)
    aborted = [(t.producer_id, t.first_offset) for t in log.aborted_transactions(position, end)]
    kept = committed_batches(data, batches, aborted)
    counts.dropped_batches += sum(1 for _, h in batches if not h.is_control) - len(kept)
    records = [
        (rec.offset, rec.value)
        for pos, _ in kept
        for rec in decode_records(data, pos, position)
        if rec.offset < end
    ]
    counts.reads += 1
    counts.records_read += len(records)
    checker.read(reader.session, position, end, records, f"node {node.node_id}")
    reader.position = end
