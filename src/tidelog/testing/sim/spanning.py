"""The clients of transactions that span partitions (SimParams.transaction_partitions):
transactional producers that write each transaction to two or three partitions (every one of
them at least once, in a random order, through whichever node leads it, each batch waiting
for its acks=all), then hand the coordinator their decision (coordinator.py: commit, or abort;
a transaction whose batch failed aborts), some after lingering open a while; and
read_committed readers that read the partitions in turn, each below the LSO of any live
replica of it, and at the end read every partition up to its leader's LSO. What they read goes
to each partition's transaction checker and, across partitions, to checkers/atomicity.py.

Each transaction is one producer id, with a sequence of its own in each partition (as Kafka's
are per partition)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from tidelog.invariant import InvariantBroken
from tidelog.record.batch import ProducerRecord, build_batch
from tidelog.testing.sim.checkers.atomicity import AckedRecord
from tidelog.testing.sim.cluster import Cluster
from tidelog.testing.sim.coordinator import Coordinator
from tidelog.testing.sim.nodes import Waiter
from tidelog.testing.sim.transactions import (
    ACK_PATIENCE_TICKS,
    COMMIT_SHARE,
    FIRST_PRODUCER_ID,
    LINGER_SHARE,
    OPEN_MAX,
    READERS,
    START_RATE,
    WRITE_RATE,
    Counts,
    Reader,
    owe,
    propose_transactional,
    read_committed,
)

DRAIN_READS_MAX = 100_000  # reads one reader may take to reach a partition's LSO at the end


@dataclass
class SpanningTransaction:
    producer_id: int
    partitions: tuple[int, ...]
    plan: list[int]  # the partition of each batch, in order
    linger: int  # ticks it stays open after its last batch is answered
    written: int = 0
    sequences: dict[int, int] = field(default_factory=dict)  # partition -> next sequence
    pending: set[int] = field(default_factory=set)  # ids of waiters not answered yet
    failed: bool = False
    last_write: int = 0  # when it began, until its first write
    answered_at: int = -1
    ended: bool = False


class SpanningProducers:
    def __init__(
        self, partitions: Sequence[Cluster], rng: random.Random, coordinator: Coordinator
    ) -> None:
        self.partitions = partitions
        self.rng = rng
        self.coordinator = coordinator
        self.open: list[SpanningTransaction] = []
        self.next_producer = FIRST_PRODUCER_ID
        # id(waiter) -> (its transaction, its partition, the waiter: kept, so the id stays its own)
        self.waiting: dict[int, tuple[SpanningTransaction, int, Waiter]] = {}
        self.acked: list[AckedRecord] = []

    @property
    def now(self) -> int:
        return self.partitions[0].now

    def act(self) -> None:
        rng = self.rng
        if len(self.open) < OPEN_MAX and rng.random() < START_RATE:
            self._begin()
        for txn in self.open:
            self._step(txn)
        self.open = [t for t in self.open if not t.ended]

    def _begin(self) -> None:
        rng = self.rng
        count = rng.randint(2, min(3, len(self.partitions)))
        partitions = tuple(sorted(rng.sample(range(len(self.partitions)), count)))
        plan = list(partitions) + [rng.choice(partitions) for _ in range(rng.randint(0, 3))]
        rng.shuffle(plan)
        linger = rng.randint(50, 400) if rng.random() < LINGER_SHARE else 0
        self.open.append(
            SpanningTransaction(self.next_producer, partitions, plan, linger, last_write=self.now)
        )
        self.next_producer += 1

    def _step(self, txn: SpanningTransaction) -> None:
        now = self.now
        if txn.written < len(txn.plan) and not txn.failed:
            if self.rng.random() < WRITE_RATE:
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
        self._end(txn, not txn.failed and self.rng.random() < COMMIT_SHARE)

    def _end(self, txn: SpanningTransaction, commit: bool) -> None:
        self.coordinator.decide(txn.producer_id, commit, txn.partitions)
        txn.ended = True

    def abort_open(self) -> None:
        """The producers are gone: the coordinator aborts what they left open (as it does a
        transaction past its timeout)."""
        for txn in self.open:
            self._end(txn, False)
        self.open = []

    def _write(self, txn: SpanningTransaction) -> None:
        partition = txn.plan[txn.written]
        cluster = self.partitions[partition]
        if not any(n.paused_until <= self.now for n in cluster.leading()):
            # Nobody leads that partition now: tried again later, up to the producer's patience.
            txn.failed = self.now - txn.last_write >= ACK_PATIENCE_TICKS
            return
        sequence = txn.sequences.get(partition, 0)
        count = self.rng.randint(1, 3)
        values = [b"t%d.p%d.%d" % (txn.producer_id, partition, sequence + i) for i in range(count)]
        batch = build_batch(
            [ProducerRecord(None, v) for v in values],
            producer_id=txn.producer_id,
            producer_epoch=0,
            base_sequence=sequence,
            now_ms=self.now,
            transactional=True,
        )
        waiter = propose_transactional(cluster, self.rng, batch, values[-1])
        if waiter is None:
            txn.failed = True  # refused (not the leader any more, or a sequence gap)
            return
        txn.written += 1
        txn.sequences[partition] = sequence + count
        txn.last_write = self.now
        txn.pending.add(id(waiter))
        self.waiting[id(waiter)] = (txn, partition, waiter)
        owe(cluster, waiter)

    def acknowledged(self, acked: list[Waiter], failed: list[Waiter]) -> None:
        for waiters, ok in ((acked, True), (failed, False)):
            for waiter in waiters:
                found = self.waiting.pop(id(waiter), None)
                if found is None:
                    continue
                txn, partition, _ = found
                txn.pending.discard(id(waiter))
                if ok:
                    self.acked.append(
                        AckedRecord(partition, txn.producer_id, waiter.value, waiter.last_offset)
                    )
                else:
                    txn.failed = True


class SpanningReaders:
    """read_committed readers of every partition: reader i is reader i in each partition's
    transaction checker."""

    def __init__(self, partitions: Sequence[Cluster], rng: random.Random) -> None:
        self.partitions = partitions
        self.rng = rng
        self.readers = [[Reader(i) for _ in partitions] for i in range(READERS)]
        self.counts = Counts()

    def act(self) -> None:
        read_rate = self.partitions[0].params.read_rate
        for per_partition in self.readers:
            if self.rng.random() < read_rate:
                partition = self.rng.randrange(len(self.partitions))
                read_committed(self.partitions[partition], per_partition[partition], self.counts)

    def drain(self) -> list[int]:
        """Every reader reads every partition from its leader up to its LSO: the LSOs."""
        lsos = []
        for partition, cluster in enumerate(self.partitions):
            leader = cluster.leading()[0]
            if leader.replica is None:
                raise InvariantBroken("leader.replica is not None")
            lso = leader.replica.last_stable_offset()
            for per_partition in self.readers:
                reader = per_partition[partition]
                for _ in range(DRAIN_READS_MAX):
                    if reader.position is not None and reader.position >= lso:
                        break
                    read_committed(cluster, reader, self.counts, leader)
            lsos.append(lso)
        return lsos
