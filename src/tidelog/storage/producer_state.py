"""Idempotent producers (Kafka's producer state, simplified): per producer id, the highest
(producer epoch, base sequence) in the log. A batch that is not above it is a replay and is
not appended again; this is what makes a retried or replayed write harmless.

The state is derived from batch headers only (no record is decoded), on every replica alike,
so a new leader deduplicates exactly as the old one did. It is rebuilt from the log when the
log opens or is truncated. An entry not written for producer.id.expiration.ms is forgotten (as
Kafka's are), so that every client being an idempotent producer costs no memory forever.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from tidelog.record.batch import BatchHeader


class ProducerEntry(NamedTuple):
    epoch: int
    sequence: int  # base sequence of the newest batch
    base_offset: int
    last_offset: int
    last_write_ms: int = 0  # this replica's clock when it appended (or loaded) the batch


class ProducerState:
    def __init__(self) -> None:
        self.producers: dict[int, ProducerEntry] = {}

    def is_duplicate(self, header: BatchHeader) -> ProducerEntry | None:
        """The entry that makes this batch a replay, or None if it is new."""
        if header.producer_id < 0:
            return None
        entry = self.producers.get(header.producer_id)
        if entry is None:
            return None
        if (header.producer_epoch, header.base_sequence) <= (entry.epoch, entry.sequence):
            return entry
        return None

    def record(self, header: BatchHeader, now_ms: int = 0) -> None:
        if header.producer_id < 0:
            return
        entry = self.producers.get(header.producer_id)
        if entry is None or (header.producer_epoch, header.base_sequence) > (
            entry.epoch,
            entry.sequence,
        ):
            self.producers[header.producer_id] = ProducerEntry(
                header.producer_epoch,
                header.base_sequence,
                header.base_offset,
                header.last_offset,
                now_ms,
            )

    def rebuild(self, headers: Iterable[BatchHeader], now_ms: int = 0) -> None:
        self.producers.clear()
        for header in headers:
            self.record(header, now_ms)

    def expire(self, now_ms: int, expiration_ms: int) -> int:
        """Forget producers not written for expiration_ms; returns how many."""
        cutoff = now_ms - expiration_ms
        stale = [pid for pid, e in self.producers.items() if e.last_write_ms < cutoff]
        for pid in stale:
            del self.producers[pid]
        return len(stale)
