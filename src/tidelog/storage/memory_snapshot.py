"""Snapshots kept in memory, for the simulator: the same file format and the same answers as
SnapshotStore. A snapshot written whole is durable at once (the file store fsyncs it before
write() returns); chunks received from a leader are not, and a crash loses them."""

from __future__ import annotations

from pathlib import Path

from tidelog.errors import CorruptRecord
from tidelog.storage.snapshot import (
    SnapshotMeta,
    decode_snapshot,
    encode_snapshot,
    snapshot_epoch,
)


class MemorySnapshotStore:
    def __init__(self, retain: int) -> None:
        self.retain = max(1, retain)
        self._files: dict[int, bytes] = {}
        self._partial: dict[int, bytearray] = {}

    @staticmethod
    def _meta(offset: int, data: bytes) -> SnapshotMeta:
        name = f"{offset:020d}.snapshot"
        return SnapshotMeta(offset, len(data), Path(name), snapshot_epoch(data, offset, name))

    @property
    def largest(self) -> int:
        """The size of the largest snapshot held, header included."""
        return max((len(d) for d in self._files.values()), default=0)

    def latest(self) -> SnapshotMeta | None:
        if not self._files:
            return None
        offset = max(self._files)
        return self._meta(offset, self._files[offset])

    def write(self, offset: int, payload: bytes, epoch: int = -1) -> SnapshotMeta:
        self._files[offset] = encode_snapshot(offset, payload, epoch)
        self._prune()
        return self._meta(offset, self._files[offset])

    def _prune(self) -> None:
        for offset in sorted(self._files)[: -self.retain]:
            del self._files[offset]

    def load(self, meta: SnapshotMeta) -> bytes:
        data = self._files.get(meta.offset)
        if data is None:
            raise CorruptRecord(f"snapshot {meta.path.name} is gone")
        return decode_snapshot(data, meta.offset, meta.path.name)

    def read_chunk(self, offset: int, position: int, max_bytes: int) -> bytes:
        return self._files[offset][position : position + max_bytes]

    def partial_size(self, offset: int) -> int:
        return len(self._partial.get(offset, b""))

    def write_chunk(self, offset: int, position: int, data: bytes) -> int:
        for other in [o for o in self._partial if o != offset]:
            del self._partial[other]  # an older transfer that will never finish
        partial = self._partial.setdefault(offset, bytearray())
        if position != len(partial):
            raise CorruptRecord(
                f"snapshot chunk at {position} does not continue {len(partial)} bytes"
            )
        partial += data
        return len(partial)

    def finish(self, offset: int) -> SnapshotMeta:
        data = bytes(self._partial.pop(offset, b""))
        decode_snapshot(data, offset, f"{offset:020d}.snapshot.partial")
        self._files[offset] = data
        self._prune()
        return self._meta(offset, data)

    def crash(self) -> None:
        self._partial.clear()
