"""Transactions across partitions as read_committed readers see them (with
SimParams.transaction_partitions), checked at the end, once every reader has read every
partition up to its leader's LSO, over what each reader was handed in each partition
(checkers/transactions.py's sessions, which judge each partition alone) against each
partition's commit history and the coordinator's decisions:
  - atomic visibility: a reader handed a record of a transaction in one partition was handed
    every record of it in every other partition whose range it read; and none of them stays
    out of reach, below a partition's final LSO that never passes them (a transaction left
    open there: its marker never came)
  - no aborted read across partitions: a record handed over belongs to a transaction the
    coordinator decided to commit (a partition whose marker says commit while the coordinator
    decided abort shows its records as committed)
  - no committed record lost across leader changes: every transactional batch whose acks=all
    answer came is in its partition's committed log, at the offset the answer named
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tidelog.record.batch import read_header
from tidelog.testing.sim.checkers.commits import CommitHistory
from tidelog.testing.sim.checkers.transactions import ReadSession
from tidelog.testing.sim.failure import Violations


@dataclass
class PartitionView:
    """One partition at the end: its committed log, its readers' sessions, its final LSO."""

    history: CommitHistory
    sessions: list[ReadSession]
    lso: int
    # producer id -> the offsets of its transactional records (derived from history)
    records: dict[int, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for base in sorted(self.history.committed):
            header = read_header(self.history.committed[base])
            if header.is_transactional and not header.is_control:
                offsets = range(header.base_offset, header.last_offset + 1)
                self.records.setdefault(header.producer_id, []).extend(offsets)

    def producer_at(self) -> dict[int, int]:
        return {o: pid for pid, offsets in self.records.items() for o in offsets}


@dataclass
class ReaderView:
    """What one reader read of one partition: the offsets its ranges covered, those it got."""

    covered: set[int] = field(default_factory=set)
    seen: set[int] = field(default_factory=set)

    @staticmethod
    def of(sessions: Iterable[ReadSession]) -> ReaderView:
        view = ReaderView()
        for session in sessions:
            for start, end in session.ranges:
                view.covered.update(range(start, end))
            view.seen.update(session.seen)
        return view


@dataclass(frozen=True)
class AckedRecord:
    partition: int
    producer_id: int
    value: bytes
    last_offset: int


class CrossPartitionAtomicity:
    def __init__(self, violations: Violations) -> None:
        self.violations = violations

    def check_final(
        self,
        partitions: list[PartitionView],
        decisions: Mapping[int, bool],
        acked: Iterable[AckedRecord],
    ) -> None:
        """decisions: producer id -> commit? (the coordinator's, for every decided one)."""
        self._check_acked(partitions, acked)
        owners = [p.producer_at() for p in partitions]
        readers = sorted({s.reader for p in partitions for s in p.sessions})
        for reader in readers:
            views = [ReaderView.of(s for s in p.sessions if s.reader == reader) for p in partitions]
            first_seen: dict[int, int] = {}  # producer id -> a partition it was seen in
            for partition, view in enumerate(views):
                for offset in sorted(view.seen):
                    producer = owners[partition].get(offset)
                    if producer is not None:
                        first_seen.setdefault(producer, partition)
            for producer, partition in sorted(first_seen.items()):
                self._check_visible(reader, producer, partition, decisions, partitions, views)

    def _check_visible(
        self,
        reader: int,
        producer: int,
        seen_in: int,
        decisions: Mapping[int, bool],
        partitions: list[PartitionView],
        views: list[ReaderView],
    ) -> None:
        who = f"read_committed reader {reader}"
        if not decisions.get(producer, False):
            decided = "abort" if producer in decisions else "nothing"
            self.violations.fail(
                f"transactions across partitions: aborted read: {who} was handed records of "
                f"producer {producer} in partition {seen_in}, but the coordinator decided "
                f"{decided}"
            )
        for partition, view in enumerate(views):
            offsets = partitions[partition].records.get(producer, [])
            missing = [o for o in offsets if o not in view.seen]
            if not missing:
                continue
            lso = partitions[partition].lso
            if all(o in view.covered for o in offsets):
                self.violations.fail(
                    f"transactions across partitions: committed transaction of producer "
                    f"{producer} seen partly: {who} was handed its records in partition "
                    f"{seen_in} but not offsets {missing} of partition {partition}, which it "
                    "read past"
                )
            if min(missing) >= lso:
                self.violations.fail(
                    f"transactions across partitions: committed transaction of producer "
                    f"{producer} seen partly: {who} was handed its records in partition "
                    f"{seen_in}, but partition {partition}'s LSO stays at {lso}, below its "
                    f"records there (offsets {missing}): they never become visible"
                )
            # Otherwise the log start passed them before this reader got there: gone by design.

    def _check_acked(self, partitions: list[PartitionView], acked: Iterable[AckedRecord]) -> None:
        spans = [
            sorted((read_header(b).last_offset, b) for b in p.history.committed.values())
            for p in partitions
        ]
        for record in acked:
            span = spans[record.partition]
            at = bisect.bisect_left(span, (record.last_offset, b""))
            batch = span[at][1] if at < len(span) else None
            if batch is not None and read_header(batch).base_offset > record.last_offset:
                batch = None
            if batch is None or record.value not in batch:
                self.violations.fail(
                    f"transactions across partitions: committed record lost: producer "
                    f"{record.producer_id}'s batch acknowledged (acks=all) at offset "
                    f"{record.last_offset} of partition {record.partition} "
                    + ("is not in its committed log" if batch is None else "was replaced")
                )
