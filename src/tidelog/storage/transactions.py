"""The transactions of one partition, derived from its log (docs/design.md, "Transactions and
the last stable offset"): which producers have a transaction open, which ended with a marker
not yet known committed, and every aborted transaction a read_committed reader must drop.

Like producer state, it is derived on every replica alike, from batch headers plus the one
record of each marker (record/markers.py): a data batch with the transactional bit opens its
producer's transaction (or extends the one open), and the producer's next marker ends it. No
IO here: the logs feed it (`observe` per appended batch, `rebuild` from a scan), and it is
rebuilt when a log opens uncleanly or is truncated.

The aborted list is kept in marker order, so a reader's `aborted_transactions(start, end)` is
a bisection plus the few entries whose marker lies at or past its start, and deleting
segments below the log start drops what they ended (`drop_below`), as compaction does for an
aborted transaction it removed (`forget_aborted`).

Every replica must agree on the LSO, whether it appended a transaction's batches, copied them
or scanned them after an unclean restart. A scan sees only the segments left, so when deleting
segments takes an undecided transaction's first batch, its first offset becomes the first of
its batches still in the log (or, with none left, the transaction is not in this partition at
all): the offsets of an undecided transaction's batches are kept for that.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Any, NamedTuple

from tidelog.record.batch import BatchHeader
from tidelog.record.markers import Marker


class OpenTransaction(NamedTuple):
    producer_id: int
    producer_epoch: int
    first_offset: int
    opened_ms: int  # this replica's clock when it appended (or rebuilt) the first batch


class EndedTransaction(NamedTuple):
    """A transaction whose marker is in the log; unstable until the marker is below the HW."""

    producer_id: int
    producer_epoch: int
    first_offset: int
    marker_offset: int
    commit: bool
    opened_ms: int


class AbortedTransaction(NamedTuple):
    """What a read_committed reader drops: the producer's batches from first_offset up to its
    ABORT marker at marker_offset (Kafka's AbortedTxn, with the marker as its last offset)."""

    producer_id: int
    first_offset: int
    marker_offset: int


class TransactionState:
    def __init__(self) -> None:
        self.open: dict[int, OpenTransaction] = {}
        self.ended: list[EndedTransaction] = []  # marker order; pruned as the HW passes them
        self.aborted: list[AbortedTransaction] = []  # marker order
        self._aborted_ends: list[int] = []  # marker offsets of self.aborted, for bisection
        # base offsets of each undecided transaction's batches: by producer while open, by
        # (producer, marker offset) once ended, until its marker is below the HW
        self._open_batches: dict[int, list[int]] = {}
        self._ended_batches: dict[tuple[int, int], list[int]] = {}

    # -- feeding ------------------------------------------------------------------------------

    def observe(self, header: BatchHeader, marker: Marker | None, now_ms: int) -> None:
        """One appended batch, in offset order; marker: what the batch says if it is one."""
        if marker is not None:
            self._end(marker, now_ms)
        elif header.is_transactional and header.producer_id >= 0 and not header.is_control:
            pid = header.producer_id
            if pid in self.open:
                self._open_batches.setdefault(pid, []).append(header.base_offset)
            else:
                self.open[pid] = OpenTransaction(
                    pid, header.producer_epoch, header.base_offset, now_ms
                )
                self._open_batches[pid] = [header.base_offset]

    def _end(self, marker: Marker, now_ms: int) -> None:
        opened = self.open.pop(marker.producer_id, None)
        batches = self._open_batches.pop(marker.producer_id, None)
        if opened is None:
            return  # a marker of a transaction with nothing in this partition
        self._ended_batches[(opened.producer_id, marker.offset)] = batches or [opened.first_offset]
        self.ended.append(
            EndedTransaction(
                opened.producer_id,
                marker.producer_epoch,
                opened.first_offset,
                marker.offset,
                marker.commit,
                opened.opened_ms,
            )
        )
        if not marker.commit:
            self.aborted.append(
                AbortedTransaction(opened.producer_id, opened.first_offset, marker.offset)
            )
            self._aborted_ends.append(marker.offset)

    def rebuild(
        self, batches: Iterable[tuple[BatchHeader, Marker | None]], high_watermark: int, now_ms: int
    ) -> None:
        self.clear()
        for header, marker in batches:
            self.observe(header, marker, now_ms)
        self.settle(high_watermark)

    def clear(self) -> None:
        self.open.clear()
        self.ended.clear()
        self.aborted.clear()
        self._aborted_ends.clear()
        self._open_batches.clear()
        self._ended_batches.clear()

    def settle(self, high_watermark: int) -> None:
        """Forget ended transactions whose marker is below the HW: they are stable for good
        (the HW only moves back by a truncation or a restart, which rebuild)."""
        if self.ended and self.ended[0].marker_offset < high_watermark:
            self.ended = [t for t in self.ended if t.marker_offset >= high_watermark]
            self._ended_batches = {
                k: b for k, b in self._ended_batches.items() if k[1] >= high_watermark
            }

    def drop_below(self, offset: int) -> None:
        """Segments below offset were deleted: forget the aborted transactions they ended,
        and start each undecided transaction at its first batch left (module docstring)."""
        n = bisect.bisect_left(self._aborted_ends, offset)
        if n:
            del self.aborted[:n], self._aborted_ends[:n]
        for pid, opened in list(self.open.items()):
            if opened.first_offset < offset:
                left = _from(self._open_batches.pop(pid, []), offset)
                if left:
                    self._open_batches[pid] = left
                    self.open[pid] = opened._replace(first_offset=left[0])
                else:
                    del self.open[pid]
        if any(t.first_offset < offset for t in self.ended):
            kept: list[EndedTransaction] = []
            for ended in self.ended:
                key = (ended.producer_id, ended.marker_offset)
                if ended.first_offset >= offset:
                    kept.append(ended)
                elif left := _from(self._ended_batches.pop(key, []), offset):
                    self._ended_batches[key] = left
                    kept.append(ended._replace(first_offset=left[0]))
            self.ended = kept
        # (An aborted entry keeps its first offset: no read reaches below the first segment,
        # so where a reader starts dropping the producer's batches there changes nothing.)

    def forget_aborted(self, cleaned: Iterable[AbortedTransaction]) -> None:
        """Compaction removed every batch of these aborted transactions (storage/compaction.py):
        nothing is left for a reader to drop, and a scan of the log no longer finds them (their
        marker ends nothing), so they are forgotten here too, as a rebuild would."""
        gone = {(t.producer_id, t.marker_offset) for t in cleaned}
        if not gone:
            return
        self.aborted = [t for t in self.aborted if (t.producer_id, t.marker_offset) not in gone]
        self._aborted_ends = [t.marker_offset for t in self.aborted]

    def narrow_aborted(self, narrowed: Iterable[tuple[AbortedTransaction, int]]) -> None:
        """Compaction removed all but one batch of these aborted transactions (their
        producer's newest, kept empty): each now starts at that batch, as a rebuild finds."""
        starts = {(t.producer_id, t.marker_offset): first for t, first in narrowed}
        if not starts:
            return
        self.aborted = [
            t._replace(first_offset=starts.get((t.producer_id, t.marker_offset), t.first_offset))
            for t in self.aborted
        ]

    # -- asking -------------------------------------------------------------------------------

    def unstable(self, high_watermark: int) -> list[OpenTransaction | EndedTransaction]:
        """Every transaction whose marker is not below high_watermark: the open ones and those
        ended at or above it, oldest first offset first."""
        found: list[OpenTransaction | EndedTransaction] = list(self.open.values())
        found.extend(t for t in self.ended if t.marker_offset >= high_watermark)
        return sorted(found, key=lambda t: t.first_offset)

    def first_unstable_offset(self, high_watermark: int) -> int | None:
        """The first offset of the earliest transaction whose marker is not below
        high_watermark (None: every transaction is decided below it)."""
        first = min((t.first_offset for t in self.open.values()), default=None)
        for t in self.ended:
            if t.marker_offset >= high_watermark and (first is None or t.first_offset < first):
                first = t.first_offset
        return first

    def stable_offset(self, high_watermark: int, log_start_offset: int) -> int:
        """The LSO's rule (replication/last_stable_offset.py says why): the HW, or the first
        offset of the earliest undecided transaction below it, never below the log start."""
        first = self.first_unstable_offset(high_watermark)
        if first is None or first >= high_watermark:
            return high_watermark
        return max(first, log_start_offset)

    def aborted_transactions(self, start: int, end: int) -> list[AbortedTransaction]:
        """The aborted transactions with a batch in [start, end): those whose marker is at or
        past start and whose first offset is below end."""
        i = bisect.bisect_left(self._aborted_ends, start)
        return [t for t in self.aborted[i:] if t.first_offset < end]

    # -- persisting (the clean-shutdown checkpoint) -------------------------------------------

    def to_checkpoint(self) -> dict[str, Any]:
        return {
            "open": [[t.producer_id, t.producer_epoch, t.first_offset] for t in self.open.values()],
            "ended": [
                [t.producer_id, t.producer_epoch, t.first_offset, t.marker_offset, int(t.commit)]
                for t in self.ended
            ],
            "aborted": [list(t) for t in self.aborted],
            # (a key older versions ignore: they start a transaction at its first offset)
            "open_batches": {str(pid): list(b) for pid, b in self._open_batches.items()},
            "ended_batches": [[pid, m, list(b)] for (pid, m), b in self._ended_batches.items()],
        }

    def load_checkpoint(self, data: dict[str, Any], now_ms: int) -> None:
        self.clear()
        open_batches = data.get("open_batches", {})
        for pid, epoch, first in data.get("open", []):
            self.open[int(pid)] = OpenTransaction(int(pid), int(epoch), int(first), now_ms)
            self._open_batches[int(pid)] = [int(o) for o in open_batches.get(str(pid), [first])]
        ended_batches = {(int(p), int(m)): b for p, m, b in data.get("ended_batches", [])}
        for pid, epoch, first, marker, commit in data.get("ended", []):
            self.ended.append(
                EndedTransaction(
                    int(pid), int(epoch), int(first), int(marker), bool(commit), now_ms
                )
            )
            batches = ended_batches.get((int(pid), int(marker)), [first])
            self._ended_batches[(int(pid), int(marker))] = [int(o) for o in batches]
        for pid, first, marker in data.get("aborted", []):
            self.aborted.append(AbortedTransaction(int(pid), int(first), int(marker)))
            self._aborted_ends.append(int(marker))


def _from(offsets: list[int], start: int) -> list[int]:
    """The offsets at or past start (offsets ascending)."""
    return offsets[bisect.bisect_left(offsets, start) :]
