"""Record batches held in memory, with the offset (or, for a snapshot chunk, the byte position) of
their first byte: what the in-memory log reads, what arrives over the wire, and a snapshot chunk.
One type for storage, protocol and replication; a file's range is storage's FileSlice."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BytesSlice:
    """Batches held in memory (the in-memory log, or records that arrived over the wire)."""

    data: bytes
    first_offset: int

    @property
    def size(self) -> int:
        return len(self.data)

    def read(self) -> bytes:
        return self.data
