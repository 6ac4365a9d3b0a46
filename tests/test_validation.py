"""Batch validation (record/validation.py): every invalid kind is refused with its named error and
rule; every batch a producer builds passes; whatever passes decodes; the compiled scan and the
pure-Python reference agree on every input."""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from invalid_batches import INVALID, Invalid, fix_crc, good, now_ms
from tidelog.errors import CorruptRecord, InvalidRecord, RecordTooLarge, TidelogError
from tidelog.record.batch import (
    COMPRESSION_GZIP,
    COMPRESSION_NONE,
    HEADER_SIZE,
    ProducerRecord,
    build_batch,
    decode_records,
    empty_batch,
    read_header,
    validate,
)
from tidelog.record.validation import (
    COMPILED_SCANNER,
    SCAN_OK,
    BatchRules,
    _scan_records_py,
    check_readable,
    inflate,
    validate_produced,
)
from tidelog.storage.scrub import check_batch

RULES = BatchRules(8 * 1024 * 1024, timestamp_after_max_ms=3_600_000)
KEYED = BatchRules(8 * 1024 * 1024, require_keys=True, timestamp_after_max_ms=3_600_000)


@pytest.mark.parametrize("case", INVALID, ids=lambda c: c.name)
def test_every_invalid_kind_is_refused_with_its_named_error_and_rule(case: Invalid) -> None:
    batch = case.make()
    read_header(batch)  # the CRC is right: only the content is wrong
    with pytest.raises(case.error) as caught:
        validate_produced(batch, KEYED, now_ms())
    assert type(caught.value) is case.error
    assert caught.value.details["rule"] == case.rule
    assert "batch 0" in caught.value.message
    if case.only_keyed:
        validate_produced(batch, RULES, now_ms())  # a stream topic takes records without keys


def test_an_invalid_batch_anywhere_in_a_request_refuses_the_whole_request() -> None:
    bad = INVALID[0].make()
    with pytest.raises(InvalidRecord) as caught:
        validate_produced(good() + good() + bad, RULES, now_ms())
    assert caught.value.details["batch"] == 2


def test_limits_are_the_topics() -> None:
    big = good(1) + build_batch([ProducerRecord(b"k", b"x" * 5000, (), now_ms())])
    with pytest.raises(RecordTooLarge):
        validate_produced(big, BatchRules(4096), now_ms())
    old = good(1, ts=now_ms() - 10 * 86_400_000)
    validate_produced(old, RULES, now_ms())  # before.max.ms is unbounded by default
    with pytest.raises(InvalidRecord, match=r"message\.timestamp\.before\.max\.ms"):
        validate_produced(old, BatchRules(1 << 20, timestamp_before_max_ms=86_400_000), now_ms())
    with pytest.raises(InvalidRecord, match="negative timestamp"):
        validate_produced(good(1, ts=-5), RULES, now_ms())
    # -1 lifts the future bound too
    validate_produced(good(1, ts=now_ms() + 10**9), BatchRules(1 << 20), now_ms())


def test_a_gzip_batch_that_inflates_within_the_bound_passes() -> None:
    records = [ProducerRecord(b"k%d" % i, b"x" * 2000, (("h", b"v"),), now_ms()) for i in range(50)]
    batch = build_batch(records, compression=COMPRESSION_GZIP)
    found = validate_produced(batch, KEYED, now_ms())
    assert [h.records_count for _, h in found.headers] == [50]
    with pytest.raises(RecordTooLarge):
        validate_produced(batch, BatchRules(12_800), now_ms())  # 4 x 12.5 KiB < 100 KiB inflated
    truncated = bytearray(batch)
    del truncated[-9:]
    struct.pack_into(">i", truncated, 8, len(truncated) - 12)
    with pytest.raises(CorruptRecord, match="gzip"):
        validate_produced(fix_crc(truncated), KEYED, now_ms())


record_strategy = st.builds(
    ProducerRecord,
    st.one_of(st.none(), st.binary(max_size=300)),
    st.one_of(st.none(), st.binary(max_size=3000)),
    st.lists(
        st.tuples(st.text(max_size=20), st.one_of(st.none(), st.binary(max_size=40))), max_size=3
    ).map(tuple),
    st.integers(min_value=0, max_value=2**41),
)


@given(
    st.lists(record_strategy, min_size=1, max_size=40),
    st.sampled_from([COMPRESSION_NONE, COMPRESSION_GZIP]),
)
def test_every_batch_a_producer_builds_passes(
    records: list[ProducerRecord], compression: int
) -> None:
    batch = build_batch(records, compression=compression)
    found = validate_produced(batch, BatchRules(64 * 1024 * 1024), now_ms())
    assert len(found.headers) == 1


def scan_both(
    data: bytes, count: int, base_ts: int, keys: bool, last_delta: int
) -> tuple[object, object]:
    assert COMPILED_SCANNER is not None, "the compiled scan was not built (make setup builds it)"
    return (
        COMPILED_SCANNER(data, count, base_ts, keys, last_delta),
        _scan_records_py(data, count, base_ts, keys, last_delta),
    )


@settings(max_examples=1500)
@given(
    st.lists(record_strategy, min_size=1, max_size=8),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=6),
    st.integers(-3, 3),
    st.integers(-2, 4),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.booleans(),
)
@pytest.mark.slow
def test_the_compiled_scan_and_the_reference_agree(
    records: list[ProducerRecord],
    flips: list[tuple[int, int]],
    count_skew: int,
    delta_skew: int,
    base_ts: int,
    keys: bool,
) -> None:
    """Differential fuzzing: mutated record sections, wrong counts and offset deltas, extreme
    base timestamps."""
    batch = build_batch(records)
    body = bytearray(batch[HEADER_SIZE:])
    for position, value in flips:
        if body:
            body[position % len(body)] = value
    count = max(0, len(records) + count_skew)
    last_delta = len(records) - 1 + delta_skew
    compiled, reference = scan_both(bytes(body), count, base_ts, keys, last_delta)
    assert compiled == reference


@settings(max_examples=800)
@given(st.binary(max_size=400), st.integers(0, 50), st.booleans(), st.integers(-1, 60))
def test_the_scans_agree_on_random_bytes(
    data: bytes, count: int, keys: bool, last_delta: int
) -> None:
    compiled, reference = scan_both(data, count, 0, keys, last_delta)
    assert compiled == reference


def test_the_scans_agree_on_edge_varints_and_utf8() -> None:
    rng = random.Random(7)
    pieces = [
        b"\x80\x80\x80\x80\x10",  # a 5-byte varint past 32 bits
        b"\xff\xff\xff\xff\x0f",
        b"\xed\xa0\x80",  # a UTF-8 surrogate
        b"\xf4\x90\x80\x80",  # above U+10FFFF
        b"\xc0\xaf",  # an overlong
        b"\xe0\x80\xaf",
        b"\xf0\x8f\xbf\xbf",
        "é€😀".encode(),
    ]
    for _ in range(3000):
        data = b"".join(
            rng.choice(pieces) if rng.random() < 0.3 else bytes([rng.randrange(256)])
            for _ in range(rng.randrange(1, 30))
        )
        for count in (1, 2):
            compiled, reference = scan_both(data, count, 0, False, 5)
            assert compiled == reference, data


@settings(max_examples=1000)
@given(
    st.lists(record_strategy, min_size=1, max_size=6),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
)
@pytest.mark.slow
def test_whatever_passes_validation_decodes(
    records: list[ProducerRecord], flips: list[tuple[int, int]]
) -> None:
    """The validator is at least as strict as every reader: a mutated batch it lets through
    (CRC fixed, as a buggy producer would) decodes to exactly records_count records."""
    batch = bytearray(build_batch(records, now_ms=now_ms()))
    for position, value in flips:
        at = HEADER_SIZE + position % (len(batch) - HEADER_SIZE)
        batch[at] = value
    data = fix_crc(batch)
    try:
        found = validate_produced(data, BatchRules(1 << 26), now_ms())
    except TidelogError:
        return
    header = found.headers[0][1]
    decoded = decode_records(data)
    assert len(decoded) == header.records_count
    assert [r.offset - header.base_offset for r in decoded] == list(range(header.records_count))
    assert max(r.timestamp for r in decoded) == header.max_timestamp
    assert len(inflate(data, 0, header, 0, 1 << 26)) == len(data) - HEADER_SIZE


def test_an_empty_batch_compaction_kept_is_readable_to_the_scrub_and_both_scans() -> None:
    """A producer's newest batch, emptied by compaction (record.batch.empty_batch), is a batch
    already in a log that every reader takes; only a producer may not send one."""
    batch = build_batch(
        [ProducerRecord(b"k", b"v", (), now_ms())] * 3,
        base_offset=10,
        producer_id=9,
        producer_epoch=0,
        base_sequence=0,
        compression=COMPRESSION_GZIP,
    )
    empty = empty_batch(read_header(batch))
    header = validate(empty)
    assert scan_both(b"", 0, header.base_timestamp, True, header.last_offset_delta) == (
        (SCAN_OK, 0, 0, 0),
        (SCAN_OK, 0, 0, 0),
    )
    check_readable(empty, 0, header, 0, 1 << 20, require_keys=True)
    assert check_batch(empty) is None
    with pytest.raises(InvalidRecord, match="at least one record"):
        validate_produced(empty, RULES, now_ms())
