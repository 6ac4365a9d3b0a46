"""ReadIndex's bookkeeping alone: rounds, echoes, the majority, batching and the lease. The
replica's use of it (own-epoch commit first, echoes carried by fetches, NotLeader on a lost
leadership) is tested through the replica and the simulator's linearizability checker."""

from __future__ import annotations

from tidelog.replication.read_index import ConfirmedRead, ReadIndex

VOTERS = (1, 2, 3)


def echoes(reads: ReadIndex, voters: tuple[int, ...] = VOTERS, leader: int = 1) -> list[int]:
    return [reads.round if v == leader else reads.echoed(v) for v in voters]


def test_a_round_needs_a_majority_echo() -> None:
    reads = ReadIndex()
    reads.request(10)
    assert reads.start_round(now=5, read_index=42) == 1
    assert reads.confirm(echoes(reads)) == []  # the leader alone is no majority of three
    reads.echo(2, 0)  # an echo of no round (a fetch sent before it heard of round 1)
    assert reads.confirm(echoes(reads)) == []
    reads.echo(2, 1)
    assert reads.confirm(echoes(reads)) == [ConfirmedRead(10, 42)]
    assert not reads.waiting


def test_a_single_voter_confirms_at_once() -> None:
    reads = ReadIndex()
    reads.request(1)
    reads.start_round(0, 7)
    assert reads.confirm(echoes(reads, (1,))) == [ConfirmedRead(1, 7)]


def test_reads_share_a_round_and_later_ones_wait_for_the_next() -> None:
    reads = ReadIndex()
    for context in range(100):
        reads.request(context)
    reads.start_round(0, 10)
    reads.request(100)  # registered after round 1 began: round 1 proves nothing for it
    assert reads.needs_round
    reads.start_round(1, 11)
    reads.echo(3, 1)
    confirmed = reads.confirm(echoes(reads))
    assert [c.context for c in confirmed] == list(range(100))
    assert {c.read_index for c in confirmed} == {10}
    assert reads.waiting
    reads.echo(2, 2)
    assert reads.confirm(echoes(reads)) == [ConfirmedRead(100, 11)]


def test_echoes_of_five_voters() -> None:
    reads = ReadIndex()
    reads.request(1)
    reads.start_round(0, 3)
    reads.echo(2, 1)
    assert reads.confirm(echoes(reads, (1, 2, 3, 4, 5))) == []
    reads.echo(5, 1)
    assert reads.confirm(echoes(reads, (1, 2, 3, 4, 5))) == [ConfirmedRead(1, 3)]


def test_the_lease_runs_from_the_confirmed_round_start() -> None:
    reads = ReadIndex()
    assert not reads.lease_valid(0, 100)  # a new leader has none
    reads.request(1)
    reads.start_round(now=50, read_index=0)
    reads.echo(2, 1)
    reads.confirm(echoes(reads))
    assert reads.lease_valid(149, 100)
    assert not reads.lease_valid(150, 100)


def test_abandon_returns_every_waiting_read() -> None:
    reads = ReadIndex()
    reads.request(1)
    reads.start_round(0, 0)
    reads.request(2)
    assert sorted(reads.abandon()) == [1, 2]
    assert not reads.waiting
