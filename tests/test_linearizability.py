"""The linearizability checker against histories whose answer is known: hand-written ones (the
stale read of a deposed leader among them), histories produced by a real register with random
linearization points (always linearizable), and small random histories checked against a brute
force over every order."""

from __future__ import annotations

import itertools
import math
import random

from hypothesis import given
from hypothesis import strategies as st

from tidelog.testing.linearizability import ABSENT, READ, WRITE, Operation, check


def w(client: int, value: str, call: float, ret: float | None, key: str = "k") -> Operation:
    return Operation(client, key, WRITE, value, call, ret)


def r(client: int, value: str | None, call: float, ret: float | None, key: str = "k") -> Operation:
    return Operation(client, key, READ, value, call, ret)


def test_sequential_history_is_linearizable() -> None:
    verdict = check([w(1, "a", 0, 1), r(2, "a", 2, 3), w(1, "b", 4, 5), r(2, "b", 6, 7)])
    assert verdict.linearizable, verdict.explain()


def test_read_of_an_overwritten_value_is_not() -> None:
    """The deposed leader's answer: b was acknowledged before the read began, the read saw a."""
    verdict = check([w(1, "a", 0, 1), w(2, "b", 2, 3), r(3, "a", 4, 5)])
    assert not verdict.linearizable
    text = verdict.explain()
    assert "stale read" in text and "'b'" in text, text


def test_concurrent_write_may_be_seen_or_not() -> None:
    for seen in ("a", "b"):
        verdict = check([w(1, "a", 0, 1), w(2, "b", 2, 6), r(3, seen, 3, 4)])
        assert verdict.linearizable, verdict.explain()


def test_reads_may_not_go_back() -> None:
    """Two sequential reads during one write: once the new value is seen, the old is gone."""
    history = [w(1, "a", 0, 1), w(2, "b", 2, 10), r(3, "b", 3, 4), r(3, "a", 5, 6)]
    assert not check(history).linearizable


def test_unanswered_write_may_have_happened_or_not() -> None:
    taken = [w(1, "a", 0, 1), w(2, "b", 2, None), r(3, "b", 5, 6), r(3, "b", 7, 8)]
    assert check(taken).linearizable
    never = [w(1, "a", 0, 1), w(2, "b", 2, None), r(3, "a", 5, 6)]
    assert check(never).linearizable
    # ...but not both, in that order.
    flip = [w(1, "a", 0, 1), w(2, "b", 2, None), r(3, "b", 5, 6), r(3, "a", 7, 8)]
    assert not check(flip).linearizable


def test_unanswered_read_tells_nothing() -> None:
    assert check([w(1, "a", 0, 1), r(2, "zzz", 2, None)]).linearizable


def test_absent_before_any_write_and_not_after() -> None:
    assert check([r(1, ABSENT, 0, 1), w(2, "a", 2, 3)]).linearizable
    assert not check([w(2, "a", 0, 1), r(1, ABSENT, 2, 3)]).linearizable


def test_keys_are_independent() -> None:
    history = [w(1, "a", 0, 1, key="x"), w(1, "b", 2, 3, key="y"), r(2, "a", 4, 5, key="x")]
    assert check(history).linearizable
    bad = [*history, w(1, "c", 6, 7, key="y"), r(2, "b", 8, 9, key="y")]
    verdict = check(bad)
    assert [k.key for k in verdict.failures] == ["y"]


def test_value_nobody_wrote_is_named() -> None:
    verdict = check([w(1, "a", 0, 1), r(2, "ghost", 2, 3)])
    assert not verdict.linearizable
    assert "nobody wrote that value" in verdict.explain()


def test_long_concurrent_history_is_fast() -> None:
    """Thousands of operations from 8 clients on a few keys, produced by a real register."""
    history = register_history(random.Random(7), clients=8, per_client=400, keys=4)
    verdict = check(history)
    assert verdict.linearizable, verdict.explain()
    assert sum(k.operations for k in verdict.keys) == 3200


def register_history(
    rng: random.Random, clients: int, per_client: int, keys: int, lost: float = 0.05
) -> list[Operation]:
    """Operations of concurrent clients on a real register: each takes effect at a random
    instant inside its interval, so the history is linearizable by construction. Some writes
    lose their answer (taking effect or not)."""
    pending: list[tuple[float, Operation, bool]] = []
    counter = itertools.count()
    for client in range(clients):
        t = rng.random()
        for _ in range(per_client):
            call = t + rng.random()
            ret = call + rng.random() * 3
            at = rng.uniform(call, ret)
            key = f"k{rng.randrange(keys)}"
            if rng.random() < 0.5:
                value = f"v{next(counter)}"
                answered = rng.random() >= lost
                happens = answered or rng.random() < 0.5
                op = Operation(client, key, WRITE, value, call, ret if answered else None)
                pending.append((at if happens else math.inf, op, True))
            else:
                pending.append((at, Operation(client, key, READ, None, call, ret), False))
            t = ret
    state: dict[object, str | None] = {}
    history: list[Operation] = []
    for at, op, is_write in sorted(pending, key=lambda p: p[0]):
        if is_write:
            if at != math.inf:
                state[op.key] = str(op.value)
            history.append(op)
        else:
            history.append(Operation(op.client, op.key, READ, state.get(op.key), op.call, op.ret))
    return history


@given(st.integers(0, 2**32))
def test_register_histories_pass(seed: int) -> None:
    history = register_history(random.Random(seed), clients=3, per_client=6, keys=2)
    verdict = check(history)
    assert verdict.linearizable, verdict.explain()


def brute_force(ops: list[Operation]) -> bool:
    """Every order of the operations that respects real time: does one explain every read?
    Unanswered writes may be left out."""
    maybe = [i for i, op in enumerate(ops) if op.ret is None]
    for drop in range(len(maybe) + 1):
        for dropped in itertools.combinations(maybe, drop):
            kept = [op for i, op in enumerate(ops) if i not in dropped]
            for order in itertools.permutations(kept):
                if respects_time(order) and explains_reads(order):
                    return True
    return False


def respects_time(order: tuple[Operation, ...]) -> bool:
    return all(
        not (b.ret is not None and b.ret < a.call)
        for i, a in enumerate(order)
        for b in order[i + 1 :]
    )


def explains_reads(order: tuple[Operation, ...]) -> bool:
    state: dict[object, object] = {}
    for op in order:
        if op.kind == WRITE:
            state[op.key] = op.value
        elif state.get(op.key) != op.value:
            return False
    return True


small_op = st.tuples(
    st.sampled_from([READ, WRITE]),
    st.integers(0, 5),  # a read returns the value of this write (none if it is not a write)
    st.integers(0, 6),
    st.integers(0, 4),
    st.booleans(),
)


@given(st.lists(small_op, min_size=1, max_size=5))
def test_agrees_with_brute_force(raw: list[tuple[str, int, int, int, bool]]) -> None:
    written = {i: f"v{i}" for i, (kind, *_) in enumerate(raw) if kind == WRITE}
    ops: list[Operation] = []
    for i, (kind, pick, call, length, answered) in enumerate(raw):
        if kind == WRITE:
            ops.append(
                Operation(i, "k", WRITE, written[i], call, call + length if answered else None)
            )
        elif answered:
            ops.append(Operation(i, "k", READ, written.get(pick), call, call + length))
    assert check(ops).linearizable == brute_force(ops)
