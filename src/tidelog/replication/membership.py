"""Who belongs to a replica group: its voters and its learners, changed one step at a time
through the group's own log (Raft's single-server changes, KRaft's KIP-853, etcd's learners).

A membership change is an entry of the group's log (a control batch), and takes effect on every
replica as soon as that replica's log holds it, committed or not: a replica always uses the
newest membership in its log. That is only safe if two memberships in use at once always share
a majority, so a leader appends a change only when
    - the previous change is committed (below the HW), and
    - an entry of its own epoch is committed (otherwise a change it appends can be overwritten
      by one a deposed leader appended: the bug in Raft's original single-server rule, fixed by
      Ongaro in 2015 and by etcd and KRaft alike), and
    - the change adds or removes at most one voter (learners never vote, so any number of them
      may come or go at once).
The history of entries is durable with the replica's quorum state, cut back when the log is
truncated, and carried to a follower that starts over at the leader's log start or snapshot.

The leader walks a group towards a target set of voters (from the cluster's metadata): new
members join as learners, each is promoted once it has caught up, then the leaving ones are
removed, one voter per step.
"""

from __future__ import annotations

import functools
import json
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tidelog.invariant import invariant
from tidelog.record.batch import ProducerRecord, build_batch

MEMBERSHIP_CONTROL_KEY = b"\x00\x00\x00\x06"  # Kafka's control record type 6 (KRaft voters)
INITIAL = -1  # the offset of the membership a group was created with (before any entry)


@dataclass(frozen=True, slots=True)
class Membership:
    offset: int  # the entry's offset in the group's log; INITIAL: the group's first members
    voters: tuple[int, ...]
    learners: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        invariant(not set(self.voters) & set(self.learners), "a learner is not a voter")

    @property
    def members(self) -> tuple[int, ...]:
        return self.voters + self.learners

    @property
    def digest(self) -> int:
        """Which membership this is, in a fetch (never 0, the digest of none)."""
        return _digest(self.offset, self.voters, self.learners)

    def to_wire(self) -> list[object]:
        return [self.offset, list(self.voters), list(self.learners)]

    @staticmethod
    def from_wire(data: list[object]) -> Membership:
        offset, voters, learners = data
        return Membership(
            int(offset),  # type: ignore[call-overload]
            tuple(int(v) for v in voters),  # type: ignore[attr-defined]
            tuple(int(v) for v in learners),  # type: ignore[attr-defined]
        )

    def control_batch(self) -> bytes:
        """The log entry that makes this the group's membership."""
        value = {"voters": list(self.voters), "learners": list(self.learners)}
        record = ProducerRecord(MEMBERSHIP_CONTROL_KEY, json.dumps(value).encode())
        return build_batch([record], control=True, now_ms=0)


@functools.lru_cache(maxsize=256)
def _digest(offset: int, voters: tuple[int, ...], learners: tuple[int, ...]) -> int:
    return zlib.crc32(repr((offset, voters, learners)).encode()) or 1


def encode_memberships(entries: Iterable[Membership]) -> str:
    return json.dumps([m.to_wire() for m in entries], separators=(",", ":"))


def decode_memberships(text: str) -> list[Membership]:
    return [Membership.from_wire(item) for item in json.loads(text)] if text else []


class MembershipHistory:
    """The membership in effect at the log start and every change after it, oldest first."""

    def __init__(self, entries: list[Membership]) -> None:
        invariant(entries, "a group always has a membership")
        self.entries = sorted(entries, key=lambda m: m.offset)

    @property
    def current(self) -> Membership:
        return self.entries[-1]

    def at(self, offset: int) -> Membership:
        """The membership in effect for the log below offset (its newest entry below it)."""
        found = self.entries[0]
        for m in self.entries:
            if m.offset < offset:
                found = m
        return found

    def since(self, offset: int) -> list[Membership]:
        return [m for m in self.entries if m.offset >= offset]

    def append(self, membership: Membership) -> None:
        invariant(
            membership.offset > self.current.offset, "membership.offset > self.current.offset"
        )
        self.entries.append(membership)

    def truncate(self, log_end: int) -> bool:
        """The log lost everything from log_end: so did its changes."""
        keep = [m for m in self.entries if m.offset < log_end] or self.entries[:1]
        changed = len(keep) != len(self.entries)
        self.entries = keep
        return changed

    def start_over(self, membership: Membership) -> None:
        """The log starts over (at a leader's log start or snapshot) with this in effect."""
        self.entries = [membership]

    def forget_below(self, log_start: int) -> bool:
        """Entries wholly below the log start are gone, except the one in effect at it: the
        HW is never below the log start, and the committed membership is the one in effect at
        the HW. (Keeping only from an entry at the log start itself lost that: a leader that
        removed itself at the log start then took its removal for committed, and stood no
        more, though the others lacked the change and needed it to lead: simulator seed 411.)"""
        base = self.at(log_start)
        keep = [m for m in self.entries if m.offset >= base.offset]
        changed = len(keep) != len(self.entries)
        self.entries = keep
        return changed

    def encode(self) -> str:
        return encode_memberships(self.entries)

    # -- between a leader and its followers -----------------------------------------------------

    def for_follower(self, fetch_offset: int, digest: int) -> str:
        """What a fetch answer carries (encoded): the changes a follower at fetch_offset does
        not hold yet (it keeps those its log then holds), and first the one in effect there if
        the follower's differs (its digest)."""
        entries = self.since(fetch_offset)
        base = self.at(fetch_offset)
        if base.digest != digest:
            entries.insert(0, base)
        return encode_memberships(entries) if entries else ""

    def adopt(self, encoded: str, fetch_offset: int, log_end: int) -> bool:
        """A follower takes what its leader's answer to a fetch at fetch_offset carries, once the
        answer's records are in its log (which now ends at log_end). True if it changed."""
        changed = False
        for m in decode_memberships(encoded):
            if m.offset < fetch_offset:
                # The leader's membership at the fetch offset, sent because ours differs. Our
                # logs match up to there, so ours is the one that is wrong: take it.
                if self.at(fetch_offset) != m:
                    self.start_over(m)
                    changed = True
            elif self.current.offset < m.offset < log_end:
                self.append(m)
                changed = True
        return changed

    def start_over_at(self, offset: int, encoded: str) -> None:
        """The log starts over at offset (a leader's log start or snapshot), with the membership
        the leader had there (encoded as it sent it; none sent: ours below offset)."""
        entries = decode_memberships(encoded)
        if entries:
            self.start_over(entries[0])
        else:
            self.truncate(offset)


def next_membership(
    current: Membership,
    target: tuple[int, ...],
    caught_up: Callable[[int], bool],
    leader: int,
    at_once: bool = False,
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The next step from current towards target voters, as (voters, learners), or None when
    there is none to take now. Members are added before any is removed, so the group never has
    fewer copies than it had or will have; the leader is removed last (it steps down once that
    change commits). at_once (a deliberately broken rule, for tests only) moves every voter
    that is ready in one step."""
    voters, learners = list(current.voters), list(current.learners)
    missing = [n for n in target if n not in voters and n not in learners]
    if missing:
        return tuple(voters), tuple(learners + missing)
    ready = [n for n in learners if n in target and caught_up(n)]
    if ready:
        promoted = ready if at_once else ready[:1]
        return tuple(voters + promoted), tuple(n for n in learners if n not in promoted)
    if any(n in target for n in learners):
        return None  # a learner is still catching up
    if learners:
        return tuple(voters), ()
    leaving = [n for n in voters if n not in target]
    if leaving:
        # The ones out of sync first (what they would take away is not there), the leader last.
        leaving.sort(key=lambda n: (n == leader, caught_up(n)))
        gone = leaving if at_once else leaving[:1]
        return tuple(n for n in voters if n not in gone), ()
    return None
