"""Transactions as read_committed readers see them (Jepsen's transaction anomalies, as they show
in one partition). Every read_committed read is noted: its range [start, end) and the records
it handed over. Checked as they come: no record seen twice (within a reader's session, or one
value at two offsets). Checked at the end, when every marker the run committed is known, over
every range read, against the committed log (the commit history):
  - aborted read: a record of an aborted transaction, or of one not decided (no marker
    committed), was handed over
  - a committed transaction seen partly: some of its records in the range were handed over,
    others not
  - a committed record lost: a committed record (a committed transaction's, or one written
    outside any transaction) in the range was not handed over
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tidelog.record.batch import read_header
from tidelog.record.markers import read_marker
from tidelog.testing.sim.checkers.commits import CommitHistory
from tidelog.testing.sim.failure import Violations

PLAIN = "plain"  # written outside any transaction
COMMITTED = "committed"
ABORTED = "aborted"


@dataclass
class ReadSession:
    """One reader's reads from one start on, each range following the last."""

    reader: int
    ranges: list[tuple[int, int]] = field(default_factory=list)
    seen: dict[int, bytes | None] = field(default_factory=dict)  # offset -> value


@dataclass(frozen=True)
class Fate:
    kind: str  # PLAIN, COMMITTED, ABORTED; a transactional record with no fate is undecided
    producer_id: int = -1
    first_offset: int = -1  # the transaction's


class TransactionAnomalies:
    def __init__(self, history: CommitHistory, violations: Violations) -> None:
        self.history = history
        self.violations = violations
        self.sessions: list[ReadSession] = []
        self.offset_of: dict[bytes, int] = {}  # every value read_committed handed over

    def new_session(self, reader: int) -> ReadSession:
        session = ReadSession(reader)
        self.sessions.append(session)
        return session

    def read(
        self,
        session: ReadSession,
        start: int,
        end: int,
        records: list[tuple[int, bytes | None]],
        where: str,
    ) -> None:
        session.ranges.append((start, end))
        for offset, value in records:
            if offset in session.seen:
                self.violations.fail(
                    f"transactions: reader {session.reader} saw offset {offset} twice "
                    f"(read_committed from {where})"
                )
            session.seen[offset] = value
            if value is None:
                continue
            known = self.offset_of.setdefault(value, offset)
            if known != offset:
                self.violations.fail(
                    f"transactions: record {value.decode()} seen twice, at offsets {known} "
                    f"and {offset} (read_committed from {where})"
                )

    # -- at the end ---------------------------------------------------------------------------

    def fates(self) -> tuple[dict[int, Fate], set[int]]:
        """Each committed record's fate, and every offset the commit history holds."""
        fates: dict[int, Fate] = {}
        covered: set[int] = set()
        open_records: dict[int, list[int]] = {}
        for base in sorted(self.history.committed):
            batch = self.history.committed[base]
            header = read_header(batch)
            offsets = range(header.base_offset, header.last_offset + 1)
            covered.update(offsets)
            marker = read_marker(batch, header)
            if marker is not None:
                ended = open_records.pop(header.producer_id, [])
                fate = Fate(
                    COMMITTED if marker.commit else ABORTED,
                    header.producer_id,
                    ended[0] if ended else -1,
                )
                for offset in ended:
                    fates[offset] = fate
            elif header.is_control:
                continue
            elif header.is_transactional:
                open_records.setdefault(header.producer_id, []).extend(offsets)
            else:
                for offset in offsets:
                    fates[offset] = Fate(PLAIN)
        return fates, covered

    def check_final(self) -> None:
        fates, covered = self.fates()
        for session in self.sessions:
            for start, end in session.ranges:
                if not all(o in covered for o in range(start, end)):
                    continue  # a range the history cannot judge
                self._check_range(session, start, end, fates)

    def _check_range(
        self, session: ReadSession, start: int, end: int, fates: dict[int, Fate]
    ) -> None:
        who = f"read_committed reader {session.reader} (range {start}..{end - 1})"
        for offset in range(start, end):
            fate = fates.get(offset)
            seen = offset in session.seen
            if seen and (fate is None or fate.kind == ABORTED):
                what = "an aborted transaction's" if fate is not None else "an undecided"
                self.violations.fail(
                    f"transactions: aborted read: {who} was handed offset {offset}, "
                    f"{what} record"
                    + (f" (producer {fate.producer_id})" if fate is not None else "")
                )
            if seen or fate is None or fate.kind == ABORTED:
                continue
            # A committed record in the range that was not handed over.
            if fate.kind == COMMITTED and any(
                fates.get(o) == fate and o in session.seen for o in range(start, end)
            ):
                self.violations.fail(
                    f"transactions: committed transaction of producer {fate.producer_id} "
                    f"(from offset {fate.first_offset}) seen partly by {who}: offset {offset} "
                    "missing"
                )
            self.violations.fail(
                f"transactions: committed record lost: {who} was not handed offset {offset}"
            )
