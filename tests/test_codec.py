"""The compiled record codec (_codec.c) against the pure-Python reference it replaces on the hot
paths: the same records, the same column buffers, the same refusals, over random batches with
nulls, headers, tombstones, compaction gaps, control batches and every compression codec."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidelog.errors import CorruptRecord
from tidelog.record import ProducerRecord, build_batch, decode_records, iter_headers
from tidelog.record import _codec as compiled
from tidelog.record.batch import (
    decode_records_py,
    encode_records_py,
    read_header,
    rebuild_batch,
    records_payload,
)
from tidelog.record.columns import (
    COMPILED,
    BinaryColumn,
    RecordColumns,
    batch_items,
    binary_values,
    decode_columns,
    decode_columns_py,
)
from tidelog.record.compression import CODEC_NAMES
from tidelog.record.validation import SCAN_OK, _scan_records_py

maybe_bytes = st.none() | st.binary(max_size=200)
header_st = st.tuples(st.text(max_size=12), maybe_bytes)
record_st = st.builds(
    ProducerRecord,
    key=maybe_bytes,
    value=maybe_bytes,  # None: a tombstone
    headers=st.lists(header_st, max_size=3).map(tuple),
    timestamp=st.none() | st.integers(min_value=0, max_value=2**45),
)
records_st = st.lists(record_st, min_size=1, max_size=30)
CODECS = sorted(CODEC_NAMES)


@st.composite
def batches_st(draw: st.DrawFn) -> bytes:
    """A buffer of 1-4 whole batches: some compressed, some control, some compacted."""
    out = bytearray()
    offset = draw(st.integers(min_value=0, max_value=2**40))
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        records = draw(records_st)
        batch = build_batch(
            records,
            base_offset=offset,
            compression=draw(st.sampled_from(CODECS)),
            control=draw(st.booleans()),
            now_ms=1_700_000_000_000,
        )
        if draw(st.booleans()) and len(records) > 1:
            # Compaction keeps a subset of records at their original offsets.
            decoded = decode_records(batch)
            keep = draw(st.lists(st.sampled_from(decoded), min_size=1, unique=True))
            batch = rebuild_batch(read_header(batch), sorted(keep, key=lambda r: r.offset))
        out += batch
        offset += len(records) + draw(st.integers(min_value=0, max_value=5))
    return bytes(out)


def test_the_compiled_codec_is_built() -> None:
    """The setup builds the extension (gcc is installed with it): CI must test the compiled
    path, not silently the fallback."""
    assert COMPILED is compiled
    assert compiled.__file__.endswith(".so")


def reference_records(buf: bytes, lo: int, hi: int, include_control: bool) -> list[tuple]:
    out = []
    for pos, header in iter_headers(buf):
        if header.is_control and not include_control:
            continue
        section = records_payload(memoryview(buf)[pos:], header)
        for rec in decode_records_py(
            section,
            header.records_count,
            header.base_offset,
            header.base_timestamp,
            header.last_offset_delta,
        ):
            if lo <= rec.offset < hi:
                out.append(tuple(rec))
    return out


def rows_of(columns: RecordColumns) -> list[tuple]:
    offsets = array("q", columns.offsets).tolist()
    timestamps = array("q", columns.timestamps).tolist()
    keys = binary_values(columns.keys, columns.rows)
    values = binary_values(columns.values, columns.rows)
    headers: list[tuple] = [()] * columns.rows
    if columns.headers is not None:
        bounds = array("i", columns.headers.list_offsets)
        n = bounds[-1]
        hkeys = binary_values(columns.headers.keys, n)
        hvalues = binary_values(columns.headers.values, n)
        headers = [
            tuple(
                (hkeys[j].decode(), hvalues[j])  # type: ignore[union-attr]
                for j in range(bounds[i], bounds[i + 1])
            )
            for i in range(columns.rows)
        ]
    return list(zip(offsets, timestamps, keys, values, headers, strict=True))


@pytest.mark.slow
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(batches_st(), st.data())
def test_compiled_and_reference_decoders_agree(buf: bytes, data: st.DataObject) -> None:
    first = read_header(buf).base_offset
    lo = data.draw(st.integers(min_value=first - 2, max_value=first + 40))
    hi = data.draw(st.integers(min_value=lo, max_value=first + 200))
    include_control = data.draw(st.booleans())
    want = reference_records(buf, lo, hi, include_control)

    # Records as objects (the consumer): compiled decode_records with its min_offset.
    got = []
    for pos, header in iter_headers(buf):
        if header.is_control and not include_control:
            continue
        got += [tuple(r) for r in decode_records(buf, pos, lo) if r.offset < hi]
    assert got == want

    # Columns (the Spark source), with and without headers, against the reference columns.
    items = [item for _, item in batch_items(buf, lo, hi, include_control=include_control)]
    for include_headers in (False, True):
        columns = decode_columns(items, include_headers)
        assert columns == decode_columns_py(items, include_headers)
        expected = want if include_headers else [(*r[:4], ()) for r in want]
        assert rows_of(columns) == expected
        if columns.keys.nulls == 0:
            assert columns.keys.validity is None


@settings(max_examples=300)
@given(records_st, st.integers(min_value=0, max_value=2**45))
def test_compiled_and_reference_encoders_agree(records: list[ProducerRecord], now: int) -> None:
    assert compiled.encode_records(records, now) == encode_records_py(records, now)


def test_encoder_refuses_what_is_not_a_record() -> None:
    with pytest.raises(TypeError):
        compiled.encode_records([ProducerRecord("text", b"v")], 0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        compiled.encode_records([ProducerRecord(b"k", b"v", ((1, b"x"),))], 0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        compiled.encode_records([object()], 0)  # type: ignore[list-item]
    with pytest.raises(OverflowError):
        compiled.encode_records(
            [ProducerRecord(b"", b"", (), -(2**63)), ProducerRecord(b"", b"", (), 2**63 - 1)], 0
        )


@pytest.mark.slow
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(records_st, st.data())
def test_mutated_sections_are_refused_alike(
    records: list[ProducerRecord], data: st.DataObject
) -> None:
    """Corrupt record sections: whatever the compiled decoder accepts, the reference accepts
    with the same records; whatever both the reference and the validator's strict scan accept,
    the compiled decoder accepts too. A refusal is always a CorruptRecord."""
    batch = build_batch(records, now_ms=1_700_000_000_000)
    header = read_header(batch)
    section = bytearray(records_payload(batch, header))
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        i = data.draw(st.integers(min_value=0, max_value=len(section) - 1))
        section[i] = data.draw(st.integers(min_value=0, max_value=255))
    if data.draw(st.booleans()):
        section = section[: data.draw(st.integers(min_value=0, max_value=len(section)))]
    args = (
        header.records_count,
        header.base_offset,
        header.base_timestamp,
        header.last_offset_delta,
    )
    try:
        ours = compiled.decode_records(bytes(section), *args, -(2**63), type(records[0]))
    except ValueError:
        ours = None
    try:
        reference = [tuple(r) for r in decode_records_py(bytes(section), *args)]
    except CorruptRecord:
        reference = None
    try:
        item = (bytes(section), *args, -(2**63), 2**63 - 1)
        columns = decode_columns([item], True)
    except CorruptRecord:
        columns = None
    if ours is not None:
        assert reference == [tuple(r) for r in ours]
        assert columns is not None and rows_of(columns) == [
            (o, t, k, v, h) for o, t, k, v, h in reference
        ]
    else:
        assert columns is None
        strict = _scan_records_py(
            bytes(section),
            header.records_count,
            header.base_timestamp,
            False,
            header.last_offset_delta,
        )
        assert reference is None or strict[0] != SCAN_OK


def test_empty_and_bounds() -> None:
    batch = build_batch([ProducerRecord(b"k", b"v")], base_offset=10)
    items = [item for _, item in batch_items(batch, 11)]
    assert items == []  # the batch lies wholly below the start
    columns = decode_columns([item for _, item in batch_items(batch, 0, 10)], True)
    assert columns.rows == 0 and columns.keys == BinaryColumn(b"\0\0\0\0", b"", None, 0)
    with pytest.raises(CorruptRecord, match="records cannot fit"):
        decode_columns([(b"", 5, 0, 0, 4, 0, 10)], False)


@settings(max_examples=50, suppress_health_check=[HealthCheck.too_slow])
@given(batches_st(), batches_st(), st.booleans())
def test_columns_of_several_decodes_concatenate(a: bytes, b: bytes, include_headers: bool) -> None:
    """What decode_columns does past GROUP_BYTES_MAX: decode in groups, then concat."""
    from tidelog.record.columns import concat

    items = [item for buf in (a, b) for _, item in batch_items(buf)]
    whole = decode_columns(items, include_headers)
    parts = [decode_columns(items[:1], include_headers), decode_columns(items[1:], include_headers)]
    assert concat(parts, include_headers) == whole
