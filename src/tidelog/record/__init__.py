"""The record-batch codec: pure bytes, no IO. Kafka's RecordBatch v2 layout."""

from tidelog.record.batch import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    ProducerRecord,
    Record,
    build_batch,
    decode_records,
    iter_headers,
    read_header,
    stamp,
    validate,
)
from tidelog.record.stream import BatchStream

__all__ = [
    "HEADER_SIZE",
    "LOG_OVERHEAD",
    "BatchHeader",
    "BatchStream",
    "ProducerRecord",
    "Record",
    "build_batch",
    "decode_records",
    "iter_headers",
    "read_header",
    "stamp",
    "validate",
]
