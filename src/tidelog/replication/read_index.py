"""Linearizable reads on the leader: ReadIndex (Raft thesis §6.4, etcd's read_only.go) in
pull-based terms, and the lease that lets a leader skip its round trip.

A leader may answer a read from its state only if, at some instant inside the read's interval,
no other leader had acknowledged a write it lacks. ReadIndex makes sure of it:

  1. The leader serves no read before an offset of its own epoch has committed: until then its
     HW may lag writes the previous leader acknowledged (KRaft's epoch start offset).
  2. The read takes the HW as its read index and waits for a confirmation round that started
     after it was registered.
  3. The round is confirmed when a majority of voters (the leader among them) has shown that it
     still follows this leader *after* the round started. In a pull protocol a fetch that merely
     arrives after the round started proves nothing (it may have been sent before, and its
     sender may have voted for someone else since). So every answer the leader sends carries
     its current round, a follower echoes the last round it heard in its next fetch, and only
     an echo of round k counts for round k: it was sent after the follower received something
     sent after round k began.
  4. Once confirmed, the read is answered from a state applied up to its read index.

Many reads share one round: every read registered while no round covers it joins the next, so a
read costs at most one fetch round trip however many wait (etcd batches the same way).

The lease (etcd's ReadOnlyLeaseBased) answers from the HW without a round while the last
confirmed round started less than `lease_ticks` ago. It is safe only because a voter that echoed
that round refuses to help elect another leader for an election timeout after it last heard
from this one, and only if clocks run at rates within the margin between the lease and the
election timeout. It is never carried across an epoch: a new leader starts without one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from tidelog.invariant import invariant
from tidelog.replication.quorum import quorum_offset

# The lease is shorter than the election timeout by this share of it: it stays safe while the
# clocks of any two nodes run at rates that differ by less (docs/design.md).
LEASE_CLOCK_MARGIN = 0.2


def lease_ticks(election_timeout_ticks: int) -> int:
    return max(1, int(election_timeout_ticks * (1 - LEASE_CLOCK_MARGIN)))


@dataclass(frozen=True, slots=True)
class ConfirmedRead:
    """A read the leader may answer once its state is applied up to read_index."""

    context: int
    read_index: int


class ReadIndex:
    """One leadership's reads: the rounds started, the echoes heard, the reads waiting."""

    def __init__(self) -> None:
        self.round = 0  # the last round started in this leadership
        self.confirmed_round = 0  # the last round a majority echoed
        self._echoed: dict[int, int] = {}  # voter -> the last round it echoed
        self._started_tick: dict[int, int] = {}  # round -> tick it started (for the lease)
        self._lease_from: int | None = None  # start tick of the last confirmed round
        self._unassigned: list[int] = []  # reads waiting for a round (or an own-epoch commit)
        self._rounds: deque[tuple[int, int, list[int]]] = deque()  # (round, read index, reads)

    @property
    def waiting(self) -> bool:
        """Reads registered and not yet confirmed."""
        return bool(self._unassigned or self._rounds)

    @property
    def needs_round(self) -> bool:
        return bool(self._unassigned)

    def request(self, context: int) -> None:
        self._unassigned.append(context)

    def start_round(self, now: int, read_index: int) -> int:
        """Give every read registered so far the HW now as its read index and a new round;
        returns the round (the leader then makes its followers hear of it)."""
        invariant(bool(self._unassigned), "a round starts only for reads that wait for one")
        if self._rounds:
            invariant(read_index >= self._rounds[-1][1], "a read index never goes back")
        self.round += 1
        self._started_tick[self.round] = now
        self._rounds.append((self.round, read_index, self._unassigned))
        self._unassigned = []
        return self.round

    def echo(self, voter: int, round_: int) -> None:
        """A voter's fetch in this epoch echoed the last round it heard of."""
        # (A round this leadership never started is no echo of it: ignored, not trusted.)
        if self._echoed.get(voter, 0) < round_ <= self.round:
            self._echoed[voter] = round_

    def confirm(self, echoes: Sequence[int]) -> list[ConfirmedRead]:
        """The reads whose round a majority of voters has now echoed. `echoes` holds one entry
        per voter: the leader's own is its last round (it counts for every round it started),
        a voter that does not count (an observer) gives 0."""
        confirmed = quorum_offset(echoes) if echoes else self.round
        if confirmed <= self.confirmed_round:
            return []
        self.confirmed_round = confirmed
        self._lease_from = self._started_tick[confirmed]
        for r in [r for r in self._started_tick if r <= confirmed]:
            del self._started_tick[r]
        out: list[ConfirmedRead] = []
        while self._rounds and self._rounds[0][0] <= confirmed:
            _, read_index, contexts = self._rounds.popleft()
            out.extend(ConfirmedRead(c, read_index) for c in contexts)
        return out

    def echoed(self, voter: int) -> int:
        return self._echoed.get(voter, 0)

    def lease_valid(self, now: int, lease_ticks: int) -> bool:
        """A confirmed round started less than lease_ticks ago (see the module's docstring)."""
        return self._lease_from is not None and now - self._lease_from < lease_ticks

    def abandon(self) -> list[int]:
        """The leadership ended: every read still waiting, to fail with NotLeader (the replica
        starts its next leadership with a new ReadIndex)."""
        contexts = [c for _, _, cs in self._rounds for c in cs] + self._unassigned
        self._rounds.clear()
        self._unassigned = []
        self._lease_from = None
        return contexts
