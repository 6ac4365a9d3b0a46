"""The transaction checker (tests/txn_anomalies.py) finds each anomaly by name in a history
made to have it, and nothing in a clean one: it can fail. No cluster: histories are built by
hand, as the Kafka clients of tests/test_jepsen_transactions.py would record them."""

from __future__ import annotations

from txn_anomalies import (
    ABORTED,
    ABORTED_READ,
    ANOMALIES,
    COMMITTED,
    DUPLICATE,
    G0,
    LOST_COMMITTED,
    NON_ATOMIC,
    OFFSETS_WITHOUT_OUTPUT,
    OUTPUT_WITHOUT_OFFSETS,
    UNKNOWN,
    History,
    Source,
    Txn,
    check,
    failures,
)

A, B = ("data", 0), ("data", 1)
IN, OUT = ("in", 0), ("out", 0)


def clean() -> History:
    """Two committed transactions over two partitions, one aborted, and a consume-transform-
    produce group that committed input offset 2 with the outputs of inputs 0 and 1."""
    h = History()
    h.txns = [
        Txn("t1", COMMITTED, [(A, b"t1-a"), (B, b"t1-b")]),
        Txn("t2", COMMITTED, [(A, b"t2-a"), (B, b"t2-b")]),
        Txn("t3", ABORTED, [(A, b"t3-a"), (B, b"t3-b")]),
        Txn("c1", COMMITTED, [(OUT, b"o0"), (OUT, b"o1")]),
    ]
    h.final = {
        A: [(0, b"t1-a"), (1, b"t2-a")],  # t3's records (2, 3 with its marker) are skipped
        B: [(0, b"t1-b"), (1, b"t2-b")],
        OUT: [(0, b"o0"), (1, b"o1")],
    }
    h.sources = {b"o0": Source("g", "in", 0, 0), b"o1": Source("g", "in", 0, 1)}
    h.group_offsets = {"g": {IN: 2}}
    h.inputs = {IN: [0, 1, 3]}  # offset 2 is a control record's
    h.read("r1", A, 0, b"t1-a")
    h.read("r1", B, 0, b"t1-b")
    h.read("r1", A, 1, b"t2-a")
    return h


def only(found: dict[str, list[str]], name: str) -> None:
    assert found[name], f"{name} not found"
    others = {n: v for n, v in found.items() if v and n != name}
    assert not others, others


def test_a_clean_history_has_no_anomaly() -> None:
    found = check(clean())
    assert set(found) == set(ANOMALIES)
    assert not any(found.values()), found
    assert failures(found) == {}


def test_an_aborted_read_is_found() -> None:
    h = clean()
    h.read("r2", A, 2, b"t3-a")
    only(check(h), ABORTED_READ)
    h = clean()
    h.final[B].append((2, b"t3-b"))  # the final read holds an aborted transaction's record
    assert check(h)[ABORTED_READ]


def test_a_read_of_what_never_committed_is_an_aborted_read() -> None:
    h = clean()
    h.txns.append(Txn("t4", UNKNOWN, [(A, b"t4-a")]))
    h.read("r2", A, 4, b"t4-a")  # handed over, yet the transaction is nowhere at the end
    only(check(h), ABORTED_READ)


def test_non_atomic_visibility_is_found() -> None:
    h = clean()
    h.txns.append(Txn("t4", UNKNOWN, [(A, b"t4-a"), (B, b"t4-b")]))
    h.final[A].append((4, b"t4-a"))  # b"t4-b" never appears
    only(check(h), NON_ATOMIC)


def test_a_fractured_read_is_non_atomic_visibility() -> None:
    h = clean()
    h.read("r2", A, 1, b"t2-a")  # handed t2 in partition A,
    h.read("r2", B, 0, b"t1-b")  # read B past t2's record at offset 1 without being handed it
    h.read("r2", B, 2, b"x")  # (not a transaction's: judged by nothing)
    only(check(h), NON_ATOMIC)


def test_duplicates_are_found() -> None:
    h = clean()
    h.final[A].append((5, b"t1-a"))
    only(check(h), DUPLICATE)
    h = clean()
    h.read("r1", A, 7, b"t1-a")
    only(check(h), DUPLICATE)


def test_a_lost_committed_record_is_found() -> None:
    h = clean()
    h.final[B] = [(1, b"t2-b")]  # t1 committed, its record in B is gone
    only(check(h), LOST_COMMITTED)


def test_offsets_committed_without_their_output_are_found() -> None:
    h = clean()
    h.group_offsets["g"][IN] = 4  # input 3's output never committed
    only(check(h), OFFSETS_WITHOUT_OUTPUT)


def test_output_without_its_offsets_is_found() -> None:
    h = clean()
    h.group_offsets["g"][IN] = 1  # input 1's output is there, the offset says it is not
    only(check(h), OUTPUT_WITHOUT_OFFSETS)


def test_output_made_twice_is_a_duplicate() -> None:
    h = clean()
    h.txns.append(Txn("c2", COMMITTED, [(OUT, b"o1-again")]))
    h.final[OUT].append((3, b"o1-again"))
    h.sources[b"o1-again"] = Source("g", "in", 0, 1)
    only(check(h), DUPLICATE)


def test_a_write_cycle_is_found_and_is_no_failure() -> None:
    h = clean()
    h.final[B] = [(0, b"t2-b"), (1, b"t1-b")]  # t1 before t2 in A, after it in B
    found = check(h)
    assert found[G0] and "t1" in found[G0][0] and "t2" in found[G0][0]
    assert failures(found) == {}, "Kafka's transactions allow G0: counted, not failed"
