"""Transaction markers as Kafka writes them (record/markers.py)."""

from __future__ import annotations

import pytest

from tidelog.errors import CorruptRecord
from tidelog.record.batch import ProducerRecord, build_batch, read_header
from tidelog.record.markers import build_marker, is_marker, read_marker


@pytest.mark.parametrize("commit", [True, False])
def test_a_marker_reads_back_as_written(commit: bool) -> None:
    batch = build_marker(4001, 7, commit=commit, coordinator_epoch=12, now_ms=1_000)
    header = read_header(batch)
    assert is_marker(header) and header.is_control and header.is_transactional
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (4001, 7, -1)
    # Kafka's bytes: attributes 0x30, key = int16 0 then int16 type, value = int16 0, int32 epoch
    assert header.attributes == 0x30
    marker = read_marker(batch, header)
    assert marker is not None
    assert (marker.producer_id, marker.producer_epoch, marker.commit) == (4001, 7, commit)
    assert marker.coordinator_epoch == 12


def test_other_batches_are_not_markers() -> None:
    data = build_batch([ProducerRecord(b"k", b"v")], transactional=True, producer_id=1)
    assert read_header(data).is_transactional and read_marker(data, read_header(data)) is None
    leader_change = build_batch([ProducerRecord(b"\x00\x00\x00\x02", b"{}")], control=True)
    assert read_marker(leader_change, read_header(leader_change)) is None


def test_a_marker_with_an_unknown_type_is_named() -> None:
    bad = build_batch(
        [ProducerRecord(b"\x00\x00\x00\x09", b"\x00\x00\x00\x00\x00\x01")],
        control=True,
        transactional=True,
        producer_id=3,
    )
    with pytest.raises(CorruptRecord, match="unknown control key"):
        read_marker(bad, read_header(bad))
