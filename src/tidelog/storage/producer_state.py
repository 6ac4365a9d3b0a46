"""Idempotent producers (Kafka's producer state, simplified): per producer id, the highest
(producer epoch, base sequence) in the log. A batch that is not above it is a replay and is
not appended again; this is what makes a retried or replayed write harmless.

The state is derived from batch headers only (no record is decoded), on every replica alike,
so a new leader deduplicates exactly as the old one did. It is rebuilt from the log when the
log opens or is truncated. An entry not written for producer.id.expiration.ms is forgotten (as
Kafka's are), so that every client being an idempotent producer costs no memory forever.
"""

from __future__ import annotations

import collections
from collections.abc import Container, Iterable
from typing import NamedTuple

from tidelog.record.batch import SEQUENCE_MAX, BatchHeader


class ProducerEntry(NamedTuple):
    epoch: int
    sequence: int  # base sequence of the newest batch
    base_offset: int
    last_offset: int
    last_write_ms: int = 0  # this replica's clock when it appended (or loaded) the batch
    crc: int = -1  # the batch's CRC-32C (-1: not known, as after a restart from a checkpoint)

    @property
    def last_sequence(self) -> int:
        """The sequence of the newest batch's last record (a batch's offsets and sequences
        advance together)."""
        return (self.sequence + self.last_offset - self.base_offset) & SEQUENCE_MAX


RECENT_BATCHES = 5  # per producer, as Kafka keeps: a replay of one of them gets its own offsets


class ProducerState:
    def __init__(self) -> None:
        self.producers: dict[int, ProducerEntry] = {}
        self.recent: dict[int, collections.deque[ProducerEntry]] = {}

    def is_duplicate(self, header: BatchHeader) -> ProducerEntry | None:
        """The entry that makes this batch a replay (the replayed batch itself if it is one
        of the producer's last few, else its newest), or None if it is new. A control batch
        (a transaction marker) has no sequence and is never a replay of a data batch."""
        if header.producer_id < 0 or header.is_control:
            return None
        entry = self.producers.get(header.producer_id)
        if entry is None:
            return None
        if (header.producer_epoch, header.base_sequence) > (entry.epoch, entry.sequence):
            return None
        for recent in self.recent.get(header.producer_id, ()):
            if (recent.epoch, recent.sequence) == (header.producer_epoch, header.base_sequence):
                return recent
        return entry

    @staticmethod
    def maybe_reused(header: BatchHeader, original: ProducerEntry) -> bool:
        """Whether a "replay" of one of the producer's recent batches may hold other records
        than the batch that wrote those sequences (a producer reusing sequence numbers, whose
        records would be dropped as duplicates yet acknowledged: a real client lost
        acknowledged records so). A retry sends the same bytes (the same CRC); a replay that
        encoded the same records again (a retried Spark task) has other timestamps, so a CRC
        that differs only says: compare the records."""
        return (
            (original.epoch, original.sequence) == (header.producer_epoch, header.base_sequence)
            and original.crc >= 0
            and (
                original.crc != header.crc
                or original.last_offset - original.base_offset != header.last_offset_delta
            )
        )

    def gap(self, header: BatchHeader, last: tuple[int, int] | None = None) -> int | None:
        """For a new batch (not a replay): the sequence it should have started at, if it
        leaves a gap after the producer's newest batch in the same epoch (Kafka's
        OUT_OF_ORDER_SEQUENCE_NUMBER), else None. A new epoch may start anywhere. `last` is
        (epoch, last sequence) of a batch earlier in the same request, if there was one."""
        if header.producer_id < 0 or header.base_sequence < 0:
            return None
        if last is None:
            entry = self.producers.get(header.producer_id)
            if entry is None:
                return None
            last = (entry.epoch, entry.last_sequence)
        epoch, last_sequence = last
        expected = (last_sequence + 1) & SEQUENCE_MAX  # sequences wrap past Kafka's int32
        if header.producer_epoch == epoch and header.base_sequence != expected:
            return expected
        return None

    def record(self, header: BatchHeader, now_ms: int = 0) -> None:
        if header.producer_id < 0:
            return
        entry = self.producers.get(header.producer_id)
        if entry is None or (header.producer_epoch, header.base_sequence) > (
            entry.epoch,
            entry.sequence,
        ):
            entry = ProducerEntry(
                header.producer_epoch,
                header.base_sequence,
                header.base_offset,
                header.last_offset,
                now_ms,
                header.crc,
            )
            self.producers[header.producer_id] = entry
            recent = self.recent.setdefault(
                header.producer_id, collections.deque(maxlen=RECENT_BATCHES)
            )
            recent.append(entry)

    def rebuild(self, headers: Iterable[BatchHeader], now_ms: int = 0) -> None:
        self.producers.clear()
        self.recent.clear()
        for header in headers:
            self.record(header, now_ms)

    def expire(self, now_ms: int, expiration_ms: int, keep: Container[int] = frozenset()) -> int:
        """Forget producers not written for expiration_ms, except those in keep (a producer
        with a transaction open in the log: its marker is still to come, as Kafka keeps it);
        returns how many."""
        cutoff = now_ms - expiration_ms
        stale = [
            pid for pid, e in self.producers.items() if e.last_write_ms < cutoff and pid not in keep
        ]
        for pid in stale:
            del self.producers[pid]
            self.recent.pop(pid, None)
        return len(stale)
