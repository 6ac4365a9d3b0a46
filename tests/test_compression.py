"""Kafka's codecs as producers write them: snappy (raw, and Java's xerial framing), lz4 frames,
zstd frames and gzip, read by tidelog and by independent Kafka codecs, and bounded when they
inflate (a compression bomb is RecordTooLarge, garbage is CorruptRecord)."""

from __future__ import annotations

import cramjam
import pytest
from kafka.record.default_records import DefaultRecordBatch as KafkaPythonBatch
from kafka.record.default_records import (
    DefaultRecordBatchBuilder as KafkaPythonBuilder,
)

from invalid_batches import with_body
from tidelog.errors import CorruptRecord, RecordTooLarge
from tidelog.record import ProducerRecord, build_batch, decode_records
from tidelog.record.batch import read_header
from tidelog.record.compression import (
    CODEC_NAMES,
    GZIP,
    LZ4,
    SNAPPY,
    XERIAL_MAGIC,
    ZSTD,
    compress,
    decompress,
)
from tidelog.record.validation import BatchRules, validate_produced

RECORDS = [ProducerRecord(b"k%d" % i, b"value-%d" % i * 20, (("h", b"%d" % i),)) for i in range(50)]
NOW = 1_700_000_000_000


@pytest.mark.parametrize("codec", sorted(CODEC_NAMES))
def test_kafka_python_and_tidelog_read_each_others_batches(codec: int) -> None:
    ours = build_batch(RECORDS, compression=codec, now_ms=NOW)
    theirs = list(KafkaPythonBatch(ours))
    assert [(r.key, r.value, list(r.headers)) for r in theirs] == [
        (r.key, r.value, list(r.headers)) for r in RECORDS
    ]
    builder = KafkaPythonBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 24,
    )
    for i, r in enumerate(RECORDS):
        builder.append(i, timestamp=NOW, key=r.key, value=r.value, headers=list(r.headers))
    batch = bytes(builder.build())
    assert read_header(batch).compression == codec
    validate_produced(batch, BatchRules(max_batch_bytes=1 << 20), NOW)
    assert [(d.key, d.value, d.headers) for d in decode_records(batch)] == [
        (r.key, r.value, r.headers) for r in RECORDS
    ]


def test_snappy_is_read_raw_and_in_xerial_framing() -> None:
    data = b"abc" * 50_000  # two xerial blocks and more
    framed = compress(SNAPPY, data)
    assert framed.startswith(XERIAL_MAGIC)
    assert decompress(SNAPPY, framed, len(data)) == data
    assert decompress(SNAPPY, bytes(cramjam.snappy.compress_raw(data)), len(data)) == data


def with_payload(codec: int, payload: bytes) -> bytes:
    """A valid batch header around another record section (lengths and CRC fixed)."""
    return with_body(
        build_batch([ProducerRecord(None, b"x")], compression=codec, now_ms=NOW), payload
    )


@pytest.mark.parametrize("codec", [GZIP, SNAPPY, LZ4, ZSTD])
def test_a_compression_bomb_is_refused_before_it_is_inflated_whole(codec: int) -> None:
    bomb = compress(codec, bytes(10 * 1024 * 1024))
    assert len(bomb) < 600 * 1024
    with pytest.raises(RecordTooLarge) as caught:
        validate_produced(with_payload(codec, bomb), BatchRules(max_batch_bytes=1 << 20), NOW)
    assert caught.value.details["rule"] == "inflated_size"
    with pytest.raises(RecordTooLarge):
        decompress(codec, bomb, 1 << 20)


@pytest.mark.parametrize("codec", [GZIP, SNAPPY, LZ4, ZSTD])
def test_garbage_and_cut_short_data_are_corrupt(codec: int) -> None:
    good = compress(codec, b"hello world" * 1000)
    for bad in (b"\x00garbage\xff" * 10, good[: len(good) // 2]):
        with pytest.raises(CorruptRecord) as caught:
            validate_produced(with_payload(codec, bad), BatchRules(max_batch_bytes=1 << 20), NOW)
        assert caught.value.details["rule"] == "compression"
