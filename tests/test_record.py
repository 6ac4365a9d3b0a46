"""The record-batch codec: round trips, interoperability with an independent Kafka codec
(aiokafka's), incremental framing, and fuzzing."""

from __future__ import annotations

import struct

import pytest
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.errors import CorruptRecord, RecordTooLarge
from tidelog.record import (
    HEADER_SIZE,
    BatchStream,
    ProducerRecord,
    build_batch,
    decode_records,
    iter_headers,
    read_header,
    stamp,
    validate,
)
from tidelog.record.batch import (
    COMPRESSION_GZIP,
    CONTROL_BIT,
    decode_records_py,
    empty_batch,
)
from tidelog.record.columns import batch_items, decode_columns, decode_columns_py
from tidelog.record.compression import CODEC_NAMES
from tidelog.record.read_committed import committed_batches
from tidelog.record.varint import decode_varint, encode_varint

maybe_bytes = st.none() | st.binary(max_size=300)
header_st = st.tuples(st.text(max_size=20), maybe_bytes)
record_st = st.builds(
    ProducerRecord,
    key=maybe_bytes,
    value=maybe_bytes,
    headers=st.lists(header_st, max_size=3).map(tuple),
    timestamp=st.integers(min_value=0, max_value=2**41),
)
records_st = st.lists(record_st, min_size=1, max_size=20)
CODECS = sorted(CODEC_NAMES)  # none, gzip, snappy, lz4, zstd


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_varint_round_trip(value: int) -> None:
    out = bytearray()
    encode_varint(value, out)
    assert decode_varint(bytes(out), 0) == (value, len(out))


@given(records_st, st.integers(min_value=0, max_value=2**40), st.sampled_from(CODECS))
def test_round_trip(records: list[ProducerRecord], base: int, compression: int) -> None:
    batch = build_batch(records, base_offset=base, compression=compression)
    header = validate(batch)
    assert header.base_offset == base
    assert header.records_count == len(records)
    assert header.compression == compression
    decoded = decode_records(batch)
    assert [r.offset for r in decoded] == list(range(base, base + len(records)))
    for rec, want in zip(decoded, records, strict=True):
        assert (rec.key, rec.value, rec.headers, rec.timestamp) == (
            want.key,
            want.value,
            want.headers,
            want.timestamp,
        )
    assert header.max_timestamp == max(r.timestamp for r in records if r.timestamp is not None)


@given(
    records_st,
    st.integers(min_value=0, max_value=2**40),
    st.integers(min_value=0, max_value=2**31 - 1),
)
def test_stamping_keeps_the_crc_valid(records: list[ProducerRecord], base: int, epoch: int) -> None:
    buf = bytearray(build_batch(records))
    stamp(buf, 0, base, epoch)
    header = validate(buf)
    assert (header.base_offset, header.partition_leader_epoch) == (base, epoch)


@given(records_st, st.sampled_from(CODECS))
def test_aiokafka_reads_our_batches(records: list[ProducerRecord], compression: int) -> None:
    batch = build_batch(records, base_offset=42, compression=compression)
    theirs = DefaultRecordBatch(batch)
    assert theirs.validate_crc()
    assert theirs.base_offset == 42
    got = [(r.offset, r.key, r.value, tuple(r.headers), r.timestamp) for r in theirs]
    want = [(42 + i, r.key, r.value, tuple(r.headers), r.timestamp) for i, r in enumerate(records)]
    assert got == want


@given(records_st, st.sampled_from(CODECS))
def test_we_read_aiokafka_batches(records: list[ProducerRecord], compression: int) -> None:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=0,
        producer_id=7,
        producer_epoch=1,
        base_sequence=100,
        batch_size=1 << 24,
    )
    for i, r in enumerate(records):
        builder.append(i, timestamp=r.timestamp, key=r.key, value=r.value, headers=list(r.headers))
    batch = bytes(builder.build())
    header = validate(batch)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 1, 100)
    decoded = decode_records(batch)
    assert [(d.key, d.value, d.headers, d.timestamp) for d in decoded] == [
        (r.key, r.value, r.headers, r.timestamp) for r in records
    ]


@given(st.lists(records_st, min_size=1, max_size=5), st.data())
def test_stream_decoder_whole_and_one_byte_at_a_time(
    batches: list[list[ProducerRecord]], data: st.DataObject
) -> None:
    encoded = [build_batch(b, base_offset=i * 100) for i, b in enumerate(batches)]
    blob = b"".join(encoded)
    for chunking in ("whole", "bytes", "random"):
        stream = BatchStream(batch_bytes_max=1 << 24)
        out = []
        if chunking == "whole":
            pieces = [blob]
        elif chunking == "bytes":
            pieces = [blob[i : i + 1] for i in range(len(blob))]
        else:
            cuts = sorted(data.draw(st.lists(st.integers(0, len(blob)), max_size=10)))
            pieces = [blob[a:b] for a, b in zip([0, *cuts], [*cuts, len(blob)], strict=True)]
        for piece in pieces:
            stream.receive_data(piece)
            while (item := stream.next_batch()) is not None:
                out.append(item[1])
        assert out == encoded
        assert stream.pending_bytes == 0


def test_a_flipped_bit_anywhere_after_the_crc_is_caught() -> None:
    batch = build_batch([ProducerRecord(b"key", b"value" * 20)])
    for i in range(17, len(batch)):
        damaged = bytearray(batch)
        damaged[i] ^= 0x10
        with pytest.raises(CorruptRecord):
            validate(damaged)


def test_limits_and_layout_checks() -> None:
    batch = build_batch([ProducerRecord(None, b"x" * 1000)])
    with pytest.raises(RecordTooLarge):
        validate(batch, max_batch_bytes=500)
    with pytest.raises(CorruptRecord):
        validate(batch[:-1])
    with pytest.raises(CorruptRecord):
        validate(batch[:30])
    wrong_magic = bytearray(batch)
    wrong_magic[16] = 1
    with pytest.raises(CorruptRecord, match="magic"):
        validate(wrong_magic)
    short = bytearray(batch)
    struct.pack_into(">i", short, 8, 10)
    with pytest.raises(CorruptRecord):
        validate(short)
    assert read_header(batch).size_bytes == len(batch)


def test_control_batches_are_marked() -> None:
    batch = build_batch([ProducerRecord(b"\x00\x00\x00\x02", b"{}")], control=True)
    assert validate(batch).attributes & CONTROL_BIT


@settings(max_examples=3000)
@given(st.binary(min_size=0, max_size=400))
def test_fuzz_batch_decoders_fail_only_with_named_errors(blob: bytes) -> None:
    try:
        for pos, _ in iter_headers(blob):
            decode_records(blob, pos)
    except (CorruptRecord, RecordTooLarge):
        pass
    stream = BatchStream(batch_bytes_max=4096)
    stream.receive_data(blob)
    try:
        while stream.next_batch() is not None:
            pass
    except CorruptRecord:
        pass


@pytest.mark.slow
@settings(max_examples=2000)
@given(records_st, st.data())
def test_fuzz_mutated_valid_batches(records: list[ProducerRecord], data: st.DataObject) -> None:
    batch = bytearray(build_batch(records))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(batch) - 1))
        batch[i] = data.draw(st.integers(0, 255))
    try:
        header = validate(batch)
    except (CorruptRecord, RecordTooLarge):
        return
    # Only bytes outside the CRC (base offset, epoch) or a lucky collision get here.
    assert header.size_bytes == len(batch)
    try:
        decode_records(batch)
    except CorruptRecord:
        pass


def test_header_size() -> None:
    assert HEADER_SIZE == 61


def test_an_empty_batch_keeps_its_header_and_every_reader_takes_it() -> None:
    """What compaction leaves of a producer's newest batch (record.batch.empty_batch): the
    header alone, CRC valid, that every decoder, Kafka's codec and read_committed take."""
    records = [ProducerRecord(b"k", b"v" * 50, (), 1_000), ProducerRecord(b"j", None, (), 2_000)]
    original = build_batch(
        records,
        base_offset=100,
        producer_id=9,
        producer_epoch=3,
        base_sequence=7,
        compression=COMPRESSION_GZIP,
        transactional=True,
    )
    stamped = bytearray(original)
    stamp(stamped, 0, 100, 4)
    before = read_header(stamped)
    empty = empty_batch(before)
    header = validate(empty)
    assert len(empty) == HEADER_SIZE and header.records_count == 0
    assert header._replace(batch_length=0, crc=0, attributes=0, records_count=0) == before._replace(
        batch_length=0, crc=0, attributes=0, records_count=0
    )
    assert header.is_transactional and not header.is_control and header.compression == 0
    assert decode_records(empty) == []
    assert decode_records_py(b"", 0, 100, header.base_timestamp, header.last_offset_delta) == []
    theirs = DefaultRecordBatch(empty)
    assert theirs.validate_crc() and list(theirs) == []
    assert (theirs.base_offset, theirs.next_offset) == (100, 102)
    # Among other batches, as a fetch answers: columns (the Spark reader's) and read_committed.
    after = build_batch([ProducerRecord(b"x", b"y", (), 3_000)], base_offset=102)
    payload = empty + after
    items = [item for _, item in batch_items(payload)]
    for decode in (decode_columns, decode_columns_py):
        columns = decode(items, True)
        assert columns.rows == 1 and columns.last_offset() == 102
    batches = list(iter_headers(payload))
    assert committed_batches(payload, batches, [(9, 100)]) == (batches[1],)
    assert committed_batches(payload, batches, []) == tuple(batches)
    stream = BatchStream(batch_bytes_max=1 << 20)
    stream.receive_data(payload)
    assert stream.next_batch() == (header, empty)
