"""Snapshots kept in memory, for the simulator: the same file format and the same answers as
SnapshotStore. A snapshot written whole is durable at once (the file store fsyncs it before
write() returns); chunks received from a leader are not, and a crash loses them. The epoch of a
version 1 snapshot is kept beside it, as the file store keeps it in `<offset>.epoch`.

It writes the newest snapshot version unless told otherwise: the simulator runs a cluster whose
upgrade is finalized (its seeds replay as they always did)."""

from __future__ import annotations

from pathlib import Path

from tidelog.errors import CorruptRecord
from tidelog.formats import FORMATS
from tidelog.storage.snapshot import (
    SnapshotMeta,
    decode_snapshot,
    encode_snapshot,
    snapshot_epoch,
    snapshot_version,
)


class MemorySnapshotStore:
    def __init__(self, retain: int, version: int = FORMATS["snapshot"].reads[1]) -> None:
        self.retain = max(1, retain)
        self.version = version
        self._files: dict[int, bytes] = {}
        self._partial: dict[int, bytearray] = {}
        self._epochs: dict[int, int] = {}  # beside version 1 snapshots

    def _meta(self, offset: int, data: bytes) -> SnapshotMeta:
        name = f"{offset:020d}.snapshot"
        epoch = snapshot_epoch(data, offset, name)
        if snapshot_version(data, name) == 1:
            epoch = self._epochs.get(offset, -1)
        return SnapshotMeta(offset, len(data), Path(name), epoch)

    @property
    def largest(self) -> int:
        """The size of the largest snapshot held, header included."""
        return max((len(d) for d in self._files.values()), default=0)

    def latest(self) -> SnapshotMeta | None:
        if not self._files:
            return None
        offset = max(self._files)
        return self._meta(offset, self._files[offset])

    def write(
        self, offset: int, payload: bytes, epoch: int = -1, version: int | None = None
    ) -> SnapshotMeta:
        self._epochs[offset] = epoch
        self._files[offset] = encode_snapshot(
            offset, payload, epoch, self.version if version is None else version
        )
        self._prune()
        return self._meta(offset, self._files[offset])

    def _prune(self) -> None:
        for offset in sorted(self._files)[: -self.retain]:
            del self._files[offset]
        for offset in [o for o in self._epochs if o not in self._files]:
            del self._epochs[offset]

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

    def finish(self, offset: int, epoch: int = -1) -> SnapshotMeta:
        data = bytes(self._partial.pop(offset, b""))
        decode_snapshot(data, offset, f"{offset:020d}.snapshot.partial")
        self._epochs[offset] = epoch
        self._files[offset] = data
        self._prune()
        return self._meta(offset, data)

    def crash(self) -> None:
        self._partial.clear()
