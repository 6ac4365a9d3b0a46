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
or scanned them after an unclean restart; and replicas cut their segments at different offsets,
so what lies below the log start differs between them. An undecided transaction therefore holds
the LSO from its first batch that reaches past the log start (never below the log start), and
not at all when none of its batches does: a rule of what lies above the log start, which every
replica holds alike. For that each undecided transaction keeps its batches' (base, next)
offsets (one pair per batch, not per record). Its `first_offset` stays its first batch's, as
Kafka reports it (DescribeProducers, the LWM's hold).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable
from typing import Any, NamedTuple

from tidelog.record.batch import BatchHeader
from tidelog.record.markers import Marker


class OpenTransaction(NamedTuple):
    producer_id: int
    producer_epoch: int
    first_offset: int
    opened_ms: int  # this replica's clock when it appended (or rebuilt) the first batch
    # (base, next) offsets of its batches still in the log (module docstring)
    batches: list[tuple[int, int]]


class EndedTransaction(NamedTuple):
    """A transaction whose marker is in the log; unstable until the marker is below the HW."""

    producer_id: int
    producer_epoch: int
    first_offset: int
    marker_offset: int
    commit: bool
    opened_ms: int
    batches: list[tuple[int, int]]  # as OpenTransaction's, until the marker is below the HW


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

    # -- feeding ------------------------------------------------------------------------------

    def observe(self, header: BatchHeader, marker: Marker | None, now_ms: int) -> None:
        """One appended batch, in offset order; marker: what the batch says if it is one."""
        if marker is not None:
            self._end(marker, now_ms)
        elif header.is_transactional and header.producer_id >= 0 and not header.is_control:
            pid = header.producer_id
            span = (header.base_offset, header.next_offset)
            opened = self.open.get(pid)
            if opened is not None:
                opened.batches.append(span)
            else:
                self.open[pid] = OpenTransaction(
                    pid, header.producer_epoch, header.base_offset, now_ms, [span]
                )

    def _end(self, marker: Marker, now_ms: int) -> None:
        opened = self.open.pop(marker.producer_id, None)
        if opened is None:
            return  # a marker of a transaction with nothing in this partition
        self.ended.append(
            EndedTransaction(
                opened.producer_id,
                marker.producer_epoch,
                opened.first_offset,
                marker.offset,
                marker.commit,
                opened.opened_ms,
                opened.batches,
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

    def settle(self, high_watermark: int) -> None:
        """Forget ended transactions whose marker is below the HW: they are stable for good
        (the HW only moves back by a truncation or a restart, which rebuild)."""
        if self.ended and self.ended[0].marker_offset < high_watermark:
            self.ended = [t for t in self.ended if t.marker_offset >= high_watermark]

    def drop_below(self, offset: int) -> None:
        """Segments below offset were deleted: forget the aborted transactions they ended, and
        the undecided transactions' batches they held."""
        n = bisect.bisect_left(self._aborted_ends, offset)
        if n:
            del self.aborted[:n], self._aborted_ends[:n]
        for batches in self._undecided_batches():
            if batches and batches[0][1] <= offset:
                del batches[: bisect.bisect_right(batches, offset, key=_next_offset)]

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

    def holding_from(self, high_watermark: int, log_start_offset: int) -> list[tuple[int, int]]:
        """(producer, where it holds the LSO from) of each transaction whose marker is not
        below high_watermark and that has a batch reaching past the log start (module
        docstring), in producer order."""
        found = []
        for t in self.unstable(high_watermark):
            start = _holds_from(t.batches, log_start_offset)
            if start is not None:
                found.append((t.producer_id, start))
        return sorted(found)

    def stable_offset(self, high_watermark: int, log_start_offset: int) -> int:
        """The LSO's rule (replication/last_stable_offset.py says why): the HW, or where the
        earliest undecided transaction holds it from, never below the log start."""
        held = self.holding_from(high_watermark, log_start_offset)
        first = min((start for _, start in held), default=high_watermark)
        return min(high_watermark, first)

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
            # (keys older versions ignore; without them this version scans the log instead)
            "open_batch_spans": {
                str(t.producer_id): [list(b) for b in t.batches] for t in self.open.values()
            },
            "ended_batch_spans": [
                [t.producer_id, t.marker_offset, [list(b) for b in t.batches]] for t in self.ended
            ],
        }

    def checkpoint_entries(self) -> int:
        """How many entries to_checkpoint would write (the caller bounds the file's size)."""
        spans = sum(len(b) for b in self._undecided_batches())
        return len(self.open) + len(self.ended) + len(self.aborted) + spans

    def _undecided_batches(self) -> list[list[tuple[int, int]]]:
        return [t.batches for t in self.open.values()] + [t.batches for t in self.ended]

    def load_checkpoint(self, data: dict[str, Any], now_ms: int) -> None:
        """ValueError (the caller scans the log instead) for a checkpoint that lacks an
        undecided transaction's batches (an older version's) or does not hold together."""
        self.clear()
        open_spans = data.get("open_batch_spans", {})
        ended_spans = {(int(p), int(m)): spans for p, m, spans in data.get("ended_batch_spans", [])}
        for pid, epoch, first in data.get("open", []):
            spans = _spans(open_spans.get(str(pid)))
            self.open[int(pid)] = OpenTransaction(int(pid), int(epoch), int(first), now_ms, spans)
        for pid, epoch, first, marker, commit in data.get("ended", []):
            spans = _spans(ended_spans.get((int(pid), int(marker))))
            self.ended.append(
                EndedTransaction(
                    int(pid), int(epoch), int(first), int(marker), bool(commit), now_ms, spans
                )
            )
        for pid, first, marker in data.get("aborted", []):
            self.aborted.append(AbortedTransaction(int(pid), int(first), int(marker)))
            self._aborted_ends.append(int(marker))


def _next_offset(span: tuple[int, int]) -> int:
    return span[1]


def _holds_from(batches: list[tuple[int, int]], log_start_offset: int) -> int | None:
    """Where a transaction with these batches holds the LSO from: its first batch reaching past
    the log start, never below the log start; None if no batch does."""
    i = bisect.bisect_right(batches, log_start_offset, key=_next_offset)
    return max(batches[i][0], log_start_offset) if i < len(batches) else None


def _spans(raw: Any) -> list[tuple[int, int]]:
    if raw is None:
        raise ValueError("an undecided transaction without its batches (an older checkpoint)")
    spans = [(int(base), int(end)) for base, end in raw]
    if any(b >= e for b, e in spans) or any(a[1] > b[0] for a, b in itertools.pairwise(spans)):
        raise ValueError("an undecided transaction's batches out of order")
    return spans
