"""The node's journal of quorum states (storage/quorum_journal.py): group commit, replay, a torn
tail cut, damage refused, compaction."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tidelog.errors import CorruptRecord
from tidelog.storage import quorum_journal
from tidelog.storage.quorum_journal import JOURNAL_FILE, QuorumJournal


class Inline:
    """Runs each submitted job at once (the node runs them on a flush thread); jobs submitted
    while one is held back wait, as on a node whose fsync is slow."""

    def __init__(self) -> None:
        self.held: list[tuple[Callable[[], None], Callable[[BaseException | None], None]]] = []
        self.hold = False
        self.jobs = 0

    def __call__(
        self, job: Callable[[], None], done: Callable[[BaseException | None], None]
    ) -> None:
        self.jobs += 1
        if self.hold:
            self.held.append((job, done))
            return
        job()
        done(None)

    def release(self) -> None:
        self.hold = False
        held, self.held = self.held, []
        for job, done in held:
            job()
            done(None)


def test_states_written_while_a_batch_syncs_share_the_next_fsync(tmp_path: Path) -> None:
    submit = Inline()
    journal = QuorumJournal(tmp_path, submit)
    acked: list[str] = []
    submit.hold = True
    journal.write("a", {"epoch": 1, "voted_for": 2}, lambda e: acked.append("a"))
    for i in range(100):  # all arrive while the first batch's fsync runs
        journal.write(f"p{i}", {"epoch": i, "voted_for": -1}, lambda e, i=i: acked.append(f"p{i}"))
    assert acked == [] and submit.jobs == 1
    submit.release()
    assert acked[0] == "a" and len(acked) == 101  # acknowledged in order, in two batches
    assert journal.batches == 2 and submit.jobs == 2
    journal.close()
    again = QuorumJournal(tmp_path, Inline())
    assert again.get("a") == {"epoch": 1, "voted_for": 2}
    assert again.get("p99") == {"epoch": 99, "voted_for": -1}


def test_the_last_state_wins_and_a_deleted_replica_is_forgotten(tmp_path: Path) -> None:
    journal = QuorumJournal(tmp_path, Inline())
    journal.write("a", {"epoch": 1}, lambda e: None)
    journal.write("a", {"epoch": 2}, lambda e: None)
    journal.write("b", {"epoch": 5}, lambda e: None)
    journal.write("b", None, lambda e: None)
    journal.close()
    again = QuorumJournal(tmp_path, Inline())
    assert again.get("a") == {"epoch": 2} and again.get("b") is None


def test_a_torn_last_record_is_cut_and_damage_before_the_end_is_refused(tmp_path: Path) -> None:
    journal = QuorumJournal(tmp_path, Inline())
    journal.write("a", {"epoch": 1}, lambda e: None)
    journal.write("b", {"epoch": 2}, lambda e: None)
    journal.close()
    path = tmp_path / JOURNAL_FILE
    whole = path.read_bytes()
    path.write_bytes(whole[:-3])  # the crash interrupted the last write
    again = QuorumJournal(tmp_path, Inline())
    assert again.get("a") == {"epoch": 1} and again.get("b") is None
    again.close()
    damaged = bytearray(whole)
    damaged[12] ^= 0xFF  # inside the first record, with a whole record after it
    path.write_bytes(bytes(damaged))
    with pytest.raises(CorruptRecord):
        QuorumJournal(tmp_path, Inline())


def test_a_journal_grown_past_four_times_its_live_states_is_rewritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(quorum_journal, "COMPACT_MIN_BYTES", 4096)
    journal = QuorumJournal(tmp_path, Inline())
    for epoch in range(2000):
        journal.write(f"p{epoch % 10}", {"epoch": epoch}, lambda e: None)
    size = (tmp_path / JOURNAL_FILE).stat().st_size
    assert size < 4 * 4096 + 4096, f"{size} bytes for 10 live states"
    journal.close()
    again = QuorumJournal(tmp_path, Inline())
    assert {k: v["epoch"] for k, v in again.states.items()} == {
        f"p{i}": 1990 + i for i in range(10)
    }
