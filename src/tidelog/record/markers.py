"""Transaction markers: the control batch that ends a producer's transaction in one partition
(Kafka's end-transaction marker, KIP-98), byte for byte as Kafka writes it, so every Kafka
client's read_committed consumer understands tidelog's logs.

A marker is a batch with both the control and the transactional attribute bits, the
transaction's producer id and epoch, no sequence, and one record:

    key    int16 version (0), int16 type (0 = ABORT, 1 = COMMIT)
    value  int16 version (0), int32 coordinator epoch

Every batch of the producer in that partition since its previous marker belongs to the
transaction the marker ends. Markers are written only by the log (the transaction coordinator
asks a partition's leader to append one); a producer's batch with the control bit is refused
(record/validation.py).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from tidelog.errors import CorruptRecord
from tidelog.record.batch import (
    NO_SEQUENCE,
    BatchHeader,
    ProducerRecord,
    build_batch,
    decode_records,
)

ABORT = 0
COMMIT = 1
CONTROL_VERSION = 0
_KEY = struct.Struct(">hh")
_VALUE = struct.Struct(">hi")


class Marker(NamedTuple):
    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int
    offset: int  # where the marker sits in the log (-1 before it is appended)


def marker_key(commit: bool) -> bytes:
    return _KEY.pack(CONTROL_VERSION, COMMIT if commit else ABORT)


def build_marker(
    producer_id: int,
    producer_epoch: int,
    *,
    commit: bool,
    coordinator_epoch: int,
    now_ms: int | None = None,
) -> bytes:
    """The control batch that commits or aborts the producer's open transaction."""
    record = ProducerRecord(marker_key(commit), _VALUE.pack(CONTROL_VERSION, coordinator_epoch))
    return build_batch(
        [record],
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=NO_SEQUENCE,
        now_ms=now_ms,
        control=True,
        transactional=True,
    )


def is_marker(header: BatchHeader) -> bool:
    return header.is_control and header.is_transactional


def read_marker(
    batch: bytes | bytearray | memoryview, header: BatchHeader, pos: int = 0
) -> Marker | None:
    """The marker the batch at pos is, or None for any other batch (data, or a control batch
    of another kind such as a leader change). Decodes the one control record only."""
    if not is_marker(header):
        return None
    records = decode_records(batch, pos)
    if len(records) != 1 or records[0].key is None or len(records[0].key) != _KEY.size:
        raise CorruptRecord(f"transaction marker at offset {header.base_offset} is malformed")
    version, kind = _KEY.unpack(records[0].key)
    if version != CONTROL_VERSION or kind not in (ABORT, COMMIT):
        raise CorruptRecord(
            f"transaction marker at offset {header.base_offset}: unknown control key "
            f"version {version} type {kind}"
        )
    coordinator_epoch = -1
    value = records[0].value
    if value is not None and len(value) >= _VALUE.size:
        coordinator_epoch = _VALUE.unpack_from(value)[1]
    return Marker(
        header.producer_id,
        header.producer_epoch,
        kind == COMMIT,
        coordinator_epoch,
        header.base_offset,
    )
