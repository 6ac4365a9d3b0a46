"""Incremental batch framing: bytes arrive in any chunking, whole validated batches come out."""

from __future__ import annotations

from tidelog.errors import CorruptRecord
from tidelog.record.batch import HEADER_SIZE, BatchHeader, peek_size, validate


class BatchStream:
    """Feed bytes with receive_data(); take whole batches with next_batch().

    The size prefix is trusted only up to batch_bytes_max, so a garbage length cannot make us
    buffer without bound.
    """

    def __init__(self, batch_bytes_max: int) -> None:
        self._buf = bytearray()
        self._batch_bytes_max = batch_bytes_max

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        self._buf.extend(data)

    @property
    def pending_bytes(self) -> int:
        return len(self._buf)

    def next_batch(self) -> tuple[BatchHeader, bytes] | None:
        size = peek_size(self._buf)
        if size is None:
            return None
        if size < HEADER_SIZE or size > self._batch_bytes_max:
            raise CorruptRecord(
                f"batch size {size} outside [{HEADER_SIZE}, {self._batch_bytes_max}]"
            )
        if len(self._buf) < size:
            return None
        header = validate(self._buf, 0)
        batch = bytes(self._buf[:size])
        del self._buf[:size]
        return header, batch
