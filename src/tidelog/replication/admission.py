"""Replaced disks: which data directory of each voter a replica group admitted, and the observers
a leader watches catch up (KIP-853; the rules and the wire form are in directories.py).

A voter that presents a directory the group has not admitted is an observer. It may fetch from
the leader, in the leader's epoch, and take the leader's word, but its votes and notices do not
count, and it counts toward neither the HW nor the ISR. The leader admits its new directory once
it holds, durably, everything the leader held when it came back.

Invariants:
    a new directory of a known voter is admitted only by the leader after the catch-up above
    (others take its word: its map in fetch answers, or a vote message that says so) or by an
    operator accepting loss (admit_unclean); a voter this group never recorded is admitted on
    first sight, and an elected leader admits its own
    every change of the admitted map is persisted (the replica's quorum state) before any
    message leaves, so no replica counts toward the HW before its directory is recorded
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tidelog.replication.directories import (
    decode_directories,
    directories_digest,
    encode_directories,
)
from tidelog.replication.messages import (
    BeginEpoch,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    Message,
    VoteRequest,
    VoteResponse,
)
from tidelog.replication.progress import Progress


class Admission:
    """One replica's admitted directories (durable) and, while it leads, its observers."""

    def __init__(
        self,
        node_id: int,
        own_directory: str,
        encoded: str,
        known: Mapping[int, str],
        persist: Callable[[], None],
    ) -> None:
        self.node_id = node_id
        self.own_directory = own_directory  # "": not tracked (as in old tests)
        self.directories = decode_directories(encoded)
        self.encoded = encode_directories(self.directories)
        self.crc = directories_digest(self.encoded)
        # The node's first-seen peer directories (from the peer handshake) stand in for voters
        # this group never recorded.
        self.known: Mapping[int, str] = known
        self.observers: dict[int, tuple[str, int]] = {}  # leader: node -> (directory, target)
        self.replaced: dict[int, str] = {}  # voters seen with a directory not admitted here
        self._persist = persist  # the replica's quorum state: durable before any message

    def encode(self) -> str:
        """The map's wire form (kept, with its CRC, for fetches), as the quorum state holds it."""
        self.encoded = encode_directories(self.directories)
        self.crc = directories_digest(self.encoded)
        return self.encoded

    # -- this replica's own directory -----------------------------------------------------------

    def _own_admitted(self) -> str | None:
        return self.directories.get(self.node_id) or self.known.get(self.node_id)

    @property
    def is_observer(self) -> bool:
        """The leader admitted another directory for this replica: it lost its disk, and
        catches up without voting until the leader admits this one."""
        admitted = self._own_admitted()
        return bool(self.own_directory) and admitted not in (None, self.own_directory)

    @property
    def is_admitted(self) -> bool:
        """A leader's map (or the cluster's format) names this replica's own directory. Only
        a leader admits a new directory, after it caught up; so a replica that says so in its
        vote requests can be believed by a voter whose map is older."""
        return bool(self.own_directory) and self._own_admitted() == self.own_directory

    # -- what a sender may say ------------------------------------------------------------------

    def admitted(self, node: int, directory: str) -> bool:
        if not directory:
            return True
        admitted = self.directories.get(node)
        if admitted is None:
            first_seen = self.known.get(node)
            if first_seen is None or first_seen == directory:
                self.directories[node] = directory  # first sight: recorded before it counts
                self._persist()
                return True
        elif admitted == directory:
            return True
        self.replaced[node] = directory
        return False

    def observer_may(self, sender: int, message: Message, leading_epoch: int | None) -> bool:
        """What a replica whose directory is not admitted may still do: fetch from the leader
        (as an observer) in the leader's own epoch (leading_epoch: ours, if we lead). Its votes
        and notices do not count; a vote it asks for is refused, without moving our epoch."""
        if isinstance(message, FetchRequest | FetchSnapshotRequest):
            return message.epoch == leading_epoch
        if isinstance(message, VoteRequest | VoteResponse) and message.admitted:
            # Admitted by a leader whose word has not reached us yet: take it now.
            self.directories[sender] = self.replaced.pop(sender)
            self._persist()
            return True
        if isinstance(message, BeginEpoch | FetchResponse | FetchSnapshotResponse):
            # A leader's authority is its epoch, won from voters that admitted it: follow it,
            # and take its word on which directories are admitted.
            return message.leader == sender
        return False

    # -- changes of the map ---------------------------------------------------------------------

    def admit_unclean(self, presented: Mapping[int, str], voters: tuple[int, ...]) -> list[int]:
        """An operator accepted loss (an unclean election): the directories voters present now
        (seen in this group, else on the peer channel) and this replica's own are admitted
        without catching up. Returns the voters whose admitted directory changed."""
        merged = {n: d for n, d in presented.items() if n in voters and d}
        merged.update(self.replaced)
        if self.own_directory:
            merged[self.node_id] = self.own_directory
        changed = sorted(n for n, d in merged.items() if self.directories.get(n) != d)
        self.directories.update(merged)
        self.replaced = {}
        self.observers = {}
        if changed:
            self._persist()
        return changed

    def adopt(self, encoded: str) -> None:
        """The leader's admitted directories replace ours (it decides who is a replica)."""
        theirs = {**self.directories, **decode_directories(encoded)}
        if theirs != self.directories:
            self.directories = theirs
            self.replaced = {n: d for n, d in self.replaced.items() if theirs.get(n) != d}
            self._persist()

    def lead(self) -> None:
        """This replica was elected by voters that admitted it: its own entry makes its map the
        one its followers hold, so the map stops riding in every fetch answer."""
        self.observers = {}
        own = self.own_directory
        if own and self.directories.get(self.node_id) != own:
            self.directories[self.node_id] = own
            self._persist()

    # -- the leader's observers -----------------------------------------------------------------

    def track(self, sender: int, directory: str, log_end_offset: int, progress: Progress) -> None:
        """A voter with an unadmitted directory fetches. It must hold everything this leader
        holds now (its log end, which holds everything ever committed) to be admitted; until
        then it counts for nothing."""
        current = self.observers.get(sender)
        if current is None or current[0] != directory:
            self.observers[sender] = (directory, log_end_offset)
            progress.match_offset = 0
            progress.last_caught_up_tick = -(10**12)

    def maybe_admit(self, sender: int, durable: int) -> bool:
        """An observer's fetch reports what it holds durably: True if that admits it."""
        directory, target = self.observers[sender]
        if durable < target:
            return False
        del self.observers[sender]
        self.replaced.pop(sender, None)
        self.directories[sender] = directory
        self._persist()
        return True

    def for_follower(self, directories_crc: int) -> str:
        """The admitted map, if the follower's differs (it sent the CRC of its own)."""
        if not self.own_directory or self.crc == directories_crc:
            return ""
        return self.encoded
