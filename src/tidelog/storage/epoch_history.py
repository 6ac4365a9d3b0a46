"""Leader epoch history (Kafka's leader-epoch-checkpoint, KIP-101): (epoch, start offset) pairs.

It answers the questions divergence truncation asks ("where does epoch E end in this log?") and
an election asks ("what is the epoch of this log's last entry?"). Entries only grow at the end
while appending; truncation trims the end, cleaning the start.

The first entry is the epoch of the entry just below the log start, moved up to that offset
(log start - 1): the log's *prefix epoch*, as a Raft snapshot keeps its last included term and
KRaft an empty log answers with its snapshot's epoch. A log whose entries are all gone (its
start moved to its end, or it started over at a leader's log start) still knows the epoch of
its last entry. Without it such a log claimed epoch -1 and granted its vote to a candidate
missing everything it had committed (simulator seeds 402349 and 300028).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import NamedTuple

from tidelog.invariant import invariant


class EpochEntry(NamedTuple):
    epoch: int
    start_offset: int


class EpochHistory:
    def __init__(
        self,
        entries: list[EpochEntry] | None = None,
        on_change: Callable[[list[EpochEntry]], None] | None = None,
    ) -> None:
        self.entries: list[EpochEntry] = list(entries or [])
        self._on_change = on_change
        for a, b in zip(self.entries, self.entries[1:], strict=False):
            invariant(
                a.epoch < b.epoch and a.start_offset <= b.start_offset,
                "a.epoch < b.epoch and a.start_offset <= b.start_offset",
            )

    @property
    def latest_epoch(self) -> int:
        return self.entries[-1].epoch if self.entries else -1

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that epoch begins at start_offset (called before its first batch is written)."""
        if epoch < 0 or epoch <= self.latest_epoch:
            return
        invariant(
            not self.entries or start_offset >= self.entries[-1].start_offset,
            "not self.entries or start_offset >= self.entries[-1].start_offset",
        )
        # An earlier epoch that started at this very offset has no entries left: replace it.
        while self.entries and self.entries[-1].start_offset == start_offset:
            self.entries.pop()
        self.entries.append(EpochEntry(epoch, start_offset))
        self._changed()

    def epoch_at(self, offset: int) -> int:
        """Epoch of the batch holding offset (-1 before the first entry)."""
        i = bisect.bisect_right([e.start_offset for e in self.entries], offset) - 1
        return self.entries[i].epoch if i >= 0 else -1

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(largest epoch <= epoch that we know, its exclusive end offset), KIP-279 semantics.

        When every epoch we hold is newer than the one asked about, (-1, the offset where our
        first epoch starts): nothing from there on can be shared. With no epochs at all,
        (-1, log_end_offset).
        """
        if not self.entries:
            return -1, log_end_offset
        if epoch >= self.latest_epoch:
            return self.latest_epoch, log_end_offset
        for i in range(len(self.entries) - 1, -1, -1):
            if self.entries[i].epoch <= epoch:
                return self.entries[i].epoch, self.entries[i + 1].start_offset
        return -1, self.entries[0].start_offset

    def truncate_from_end(self, end_offset: int) -> None:
        """Drop epochs that start at or after end_offset (the log was truncated there)."""
        before = len(self.entries)
        while self.entries and self.entries[-1].start_offset >= end_offset:
            self.entries.pop()
        if len(self.entries) != before:
            self._changed()

    def truncate_from_start(self, start_offset: int) -> None:
        """The log now begins at start_offset: keep the epoch of the entry below it (the
        prefix epoch, moved up to start_offset - 1) and every later one."""
        below = start_offset - 1
        i = bisect.bisect_right([e.start_offset for e in self.entries], below) - 1
        if i < 0 or (i == 0 and self.entries[0].start_offset == below):
            return  # nothing below the start, or only the prefix epoch already
        covering = self.entries[i]
        dropped = i > 0
        self.entries = [EpochEntry(covering.epoch, below), *self.entries[i + 1 :]]
        if dropped:
            # Only a dropped epoch is worth an fsync: a stale start offset for the first one is
            # corrected by truncate_from_start(log start) when the log opens.
            self._changed()

    def start_at(self, start_offset: int, prefix_epoch: int) -> None:
        """The log starts over, empty, at start_offset (a leader's log start or snapshot),
        whose entry below was of prefix_epoch there (-1: none, or not known)."""
        self.entries = []
        if prefix_epoch >= 0 and start_offset > 0:
            self.entries.append(EpochEntry(prefix_epoch, start_offset - 1))
        self._changed()

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(list(self.entries))
