"""A linearizability checker for key-value histories (Wing & Gong's search with Lowe's memo, the
algorithm Knossos and Porcupine run), used by the simulator and by the real-process tests.

A history is what clients saw: each operation's call and return times on one clock, and what it
wrote or read. It is linearizable when every operation can be given one instant inside its
interval such that, in that order, every read returns the last value written before it. Keys are
independent registers, so each key is checked alone (Herlihy & Wing's locality): that keeps the
search small enough for histories of many thousands of operations.

What a client could not learn is stated, not guessed:
  - a write without an answer (a timeout, a lost connection) may have happened or not: its
    interval runs to the end of time, so the search may place it anywhere after its call,
    including after everything else, which is the same as never;
  - a read without an answer tells nothing and is dropped;
  - a write refused with a definite error (NotLeader before anything was appended) is left out
    by the caller.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

READ: Literal["read"] = "read"
WRITE: Literal["write"] = "write"
ABSENT = None  # a read of a key nobody wrote yet


@dataclass(frozen=True)
class Operation:
    """One client operation on one key. `value` is what a write wrote, or what a read returned
    (ABSENT for no value). `ret` is None when the client never learned the outcome."""

    client: int
    key: Hashable
    kind: Literal["read", "write"]
    value: Hashable | None
    call: float
    ret: float | None

    def describe(self) -> str:
        end = "?" if self.ret is None else f"{self.ret:.6f}"
        verb = "wrote" if self.kind == WRITE else "read"
        return f"client {self.client} {verb} {self.key}={self.value!r} in [{self.call:.6f}, {end}]"


@dataclass
class KeyVerdict:
    key: Hashable
    operations: int
    linearizable: bool
    # On failure: the operations of the longest order the search could build, and those it
    # could not place after it (the smallest window the search proves impossible).
    longest_order: list[Operation] = field(default_factory=list)
    unplaced: list[Operation] = field(default_factory=list)
    stale_reads: list[str] = field(default_factory=list)


@dataclass
class Verdict:
    """The whole history's answer: linearizable only when every key is."""

    keys: list[KeyVerdict]

    @property
    def linearizable(self) -> bool:
        return all(k.linearizable for k in self.keys)

    @property
    def failures(self) -> list[KeyVerdict]:
        return [k for k in self.keys if not k.linearizable]

    def explain(self, limit: int = 3) -> str:
        if self.linearizable:
            return f"linearizable: {sum(k.operations for k in self.keys)} operations"
        lines: list[str] = []
        for k in self.failures[:limit]:
            lines.append(f"key {k.key!r}: not linearizable ({k.operations} operations)")
            lines.extend(f"  stale read: {s}" for s in k.stale_reads[:limit])
            tail = k.longest_order[-3:]
            if tail:
                lines.append("  the longest order found ends with:")
                lines.extend(f"    {op.describe()}" for op in tail)
            lines.append("  and then none of these fits:")
            lines.extend(f"    {op.describe()}" for op in k.unplaced[:6])
        more = len(self.failures) - limit
        if more > 0:
            lines.append(f"... and {more} more keys")
        return "\n".join(lines)


def check(history: Iterable[Operation]) -> Verdict:
    """Check a history; keys are checked one by one."""
    by_key: dict[Hashable, list[Operation]] = defaultdict(list)
    for op in history:
        if op.kind == READ and op.ret is None:
            continue  # an unanswered read tells nothing
        by_key[op.key].append(op)
    return Verdict([check_register(key, ops) for key, ops in sorted_keys(by_key)])


def sorted_keys(
    by_key: dict[Hashable, list[Operation]],
) -> list[tuple[Hashable, list[Operation]]]:
    return sorted(by_key.items(), key=lambda item: repr(item[0]))


class _Entries:
    """The call and return events of one key's operations in time order, as a doubly linked list
    the search lifts operations out of and puts back into (Lowe's lift/unlift). Index 0 is the
    head; entry 2i+1 is operation i's call and 2i+2 its return."""

    def __init__(self, ops: Sequence[Operation]) -> None:
        events: list[tuple[float, int, int]] = []
        for i, op in enumerate(ops):
            # At equal times a call sorts before a return: two operations that touch are
            # concurrent, never ordered.
            events.append((op.call, 0, 2 * i + 1))
            events.append((math.inf if op.ret is None else op.ret, 1, 2 * i + 2))
        events.sort()
        size = 2 * len(ops) + 1
        self.next = [-1] * size
        self.prev = [-1] * size
        last = 0
        for _, _, entry in events:
            self.next[last] = entry
            self.prev[entry] = last
            last = entry

    def lift(self, call: int) -> None:
        for entry in (call, call + 1):
            before, after = self.prev[entry], self.next[entry]
            self.next[before] = after
            if after != -1:
                self.prev[after] = before

    def unlift(self, call: int) -> None:
        for entry in (call + 1, call):
            before, after = self.prev[entry], self.next[entry]
            self.next[before] = entry
            if after != -1:
                self.prev[after] = entry


def check_register(key: Hashable, ops: Sequence[Operation]) -> KeyVerdict:
    """Is this one key's history linearizable as a register that starts ABSENT?"""
    entries = _Entries(ops)
    state: Hashable | None = ABSENT
    linearized = 0
    seen: set[tuple[int, Hashable | None]] = set()
    stack: list[tuple[int, Hashable | None]] = []  # (call entry, state before it)
    longest: list[int] = []
    entry = entries.next[0]
    while entries.next[0] != -1:
        if entry % 2 == 1:  # a call: try to place the operation here
            op = ops[entry // 2]
            if op.kind == WRITE or op.value == state:
                after = op.value if op.kind == WRITE else state
                bits = linearized | (1 << (entry // 2))
                if (bits, after) not in seen:
                    seen.add((bits, after))
                    stack.append((entry, state))
                    state, linearized = after, bits
                    entries.lift(entry)
                    entry = entries.next[0]
                    continue
            entry = entries.next[entry]
        else:  # a return reached: something called earlier must move, or nothing fits
            if len(stack) > len(longest):
                longest = [call for call, _ in stack]
            if not stack:
                return _failure(key, ops, longest)
            entry, state = stack.pop()
            linearized &= ~(1 << (entry // 2))
            entries.unlift(entry)
            entry = entries.next[entry]
    return KeyVerdict(key, len(ops), True)


def _failure(key: Hashable, ops: Sequence[Operation], longest: list[int]) -> KeyVerdict:
    order = [ops[call // 2] for call in longest]
    placed = {call // 2 for call in longest}
    # What could not follow the longest order: the operations not in it that had been called
    # before the first of them that had to return.
    rest = [op for i, op in enumerate(ops) if i not in placed]
    first_return = min((op.ret for op in rest if op.ret is not None), default=math.inf)
    unplaced = sorted((op for op in rest if op.call <= first_return), key=lambda op: op.call)
    return KeyVerdict(key, len(ops), False, order, unplaced, stale_reads(ops))


def stale_reads(ops: Sequence[Operation]) -> list[str]:
    """Plain-words witnesses of the commonest failure: a read that returned a value already
    overwritten before the read began (the overwriting write acknowledged before the read's
    call, and itself called after the read value's write had returned). With unique values
    this alone proves the history is not linearizable."""
    writes = {op.value: op for op in ops if op.kind == WRITE}
    found: list[str] = []
    for read in ops:
        if read.kind != READ:
            continue
        source = writes.get(read.value) if read.value is not ABSENT else None
        if read.value is not ABSENT and source is None:
            found.append(f"{read.describe()}: nobody wrote that value")
            continue
        source_end = -math.inf if source is None else source.ret
        if source_end is None:
            continue  # the value's write never returned: nothing is known to follow it
        for newer in writes.values():
            if (
                newer is not source
                and newer.ret is not None
                and newer.call > source_end
                and newer.ret < read.call
            ):
                found.append(
                    f"{read.describe()}, but {newer.describe()} had overwritten it before the "
                    "read began"
                )
                break
    return found
