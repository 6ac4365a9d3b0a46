"""The transaction checker (tests/txn_anomalies.py) finds each anomaly by name in a history
made to have it, and nothing in a clean one: it can fail. No cluster: histories are built by
hand, as the Kafka clients of tests/test_jepsen_transactions.py would record them."""

from __future__ import annotations

from txn_anomalies import (
    ABORT_MARKER,
    ABORTED,
    ABORTED_READ,
    ANOMALIES,
    COMMIT_MARKER,
    COMMITTED,
    DUPLICATE,
    FILTER_MISMATCH,
    G0,
    LOST_COMMITTED,
    NON_ATOMIC,
    OFFSETS_WITHOUT_OUTPUT,
    OUTPUT_WITHOUT_OFFSETS,
    UNKNOWN,
    History,
    LogBatch,
    PartitionLog,
    Source,
    Txn,
    check,
    committed_view,
    failures,
    kafka_consumer_view,
    markers_in,
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


# -- the node's read_committed filter against the raw log ---------------------------------------

LOG = ("log", 0)


def data(producer_id: int, *records: tuple[int, bytes], transactional: bool = True) -> LogBatch:
    return LogBatch(producer_id, transactional, None, records, records[-1][0] + 1)


def marker(producer_id: int, offset: int, commit: bool) -> LogBatch:
    return LogBatch(producer_id, True, COMMIT_MARKER if commit else ABORT_MARKER, (), offset + 1)


def raw_log() -> PartitionLog:
    """Producer 1 commits 0-1 (its marker at 4), producer 2 aborts 2 (marker at 3) and then
    commits 8 (marker at 9), a plain record at 5, producer 3's transaction open from 6, another
    plain record at 7: a read_committed reader gets 0, 1 and 5 and stops at the LSO, 6."""
    return PartitionLog(
        [
            data(1, (0, b"p1-a"), (1, b"p1-b")),
            data(2, (2, b"p2-aborted")),
            marker(2, 3, commit=False),
            marker(1, 4, commit=True),
            data(-1, (5, b"plain"), transactional=False),
            data(3, (6, b"p3-open")),
            data(-1, (7, b"plain-2"), transactional=False),
            data(2, (8, b"p2-later")),
            marker(2, 9, commit=True),
        ],
        high_watermark=10,
    )


COMMITTED_VIEW = [(0, b"p1-a"), (1, b"p1-b"), (5, b"plain")]


def logged(**reads: list[tuple[int, bytes]]) -> History:
    h = History()
    h.logs = {LOG: raw_log()}
    h.committed_reads = {how: {LOG: got} for how, got in reads.items()}
    return h


def test_the_committed_view_of_a_raw_log() -> None:
    assert committed_view(raw_log()) == (COMMITTED_VIEW, 6)
    assert markers_in(logged()) == {COMMIT_MARKER: 2, ABORT_MARKER: 1}
    decided = raw_log()
    decided.batches.insert(7, marker(3, 7, commit=True))  # (its offset is beside the point)
    expected = [*COMMITTED_VIEW, (6, b"p3-open"), (7, b"plain-2"), (8, b"p2-later")]
    assert committed_view(decided) == (expected, 10)


def test_reads_that_match_the_raw_log_are_no_anomaly() -> None:
    found = check(logged(kafka=COMMITTED_VIEW, tidelog=list(COMMITTED_VIEW)))
    assert not any(found.values()), found


def test_a_read_unlike_the_raw_log_is_a_filter_mismatch() -> None:
    aborted = sorted([*COMMITTED_VIEW, (2, b"p2-aborted")])
    only(check(logged(kafka=aborted, tidelog=COMMITTED_VIEW)), FILTER_MISMATCH)
    past_the_lso = [*COMMITTED_VIEW, (7, b"plain-2")]
    assert "beyond" in check(logged(kafka=past_the_lso))[FILTER_MISMATCH][0]
    short = COMMITTED_VIEW[:2]
    assert "not handed (5, b'plain')" in check(logged(tidelog=short))[FILTER_MISMATCH][0]
    h = logged(kafka=COMMITTED_VIEW)
    h.committed_reads["tidelog"] = {}
    assert check(h)[FILTER_MISMATCH] == ["tidelog did not read ('log', 0)"]


def test_a_kafka_consumer_drops_only_what_the_answer_lists_as_aborted() -> None:
    batches = raw_log().batches[:5]  # a Fetch answer up to the LSO
    assert kafka_consumer_view(batches, [(2, 2)]) == COMMITTED_VIEW
    # An answer that leaves the aborted transaction out of its list: the consumer hands it
    # out, and the check says so.
    forgot = kafka_consumer_view(batches, [])
    assert (2, b"p2-aborted") in forgot
    only(check(logged(kafka=forgot)), FILTER_MISMATCH)
    # Producer 2's next transaction, after its abort marker, is not dropped.
    later = raw_log().batches
    assert (8, b"p2-later") in kafka_consumer_view(later, [(2, 2)])
