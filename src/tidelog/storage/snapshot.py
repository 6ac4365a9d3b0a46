"""Snapshots of a state-machine log: the state after applying every record below an offset.

    snapshots/<20-digit offset>.snapshot
        8   magic "TLSNAP1\\n"
        8   offset            (the state includes every record < offset)
        4   CRC-32C of the payload
        8   payload length
        ..  payload           (the state machine's own encoding)

Written atomically (temp, fsync, rename, fsync dir); `snapshot.retain` newest are kept. A
follower receiving one from its leader writes chunks into `<offset>.snapshot.partial`, which
survives a dropped connection, so the transfer resumes where it stopped.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

import crc32c as _crc32c

from tidelog.errors import CorruptRecord
from tidelog.storage.durable import fsync_dir, translated, write_all, write_file

MAGIC = b"TLSNAP1\n"
HEADER = struct.Struct(">8sqIq")
SUFFIX = ".snapshot"
PARTIAL = ".snapshot.partial"


@dataclass(frozen=True)
class SnapshotMeta:
    offset: int
    size_bytes: int  # the whole file, header included
    path: Path


def encode_snapshot(offset: int, payload: bytes) -> bytes:
    return HEADER.pack(MAGIC, offset, _crc32c.crc32c(payload), len(payload)) + payload


def decode_snapshot(data: bytes, offset: int, name: str) -> bytes:
    """The payload of a snapshot file's bytes, checked against its header and CRC."""
    if len(data) < HEADER.size:
        raise CorruptRecord(f"snapshot {name} is cut short")
    magic, stored_offset, crc, length = HEADER.unpack_from(data)
    payload = data[HEADER.size :]
    if magic != MAGIC or stored_offset != offset or length != len(payload):
        raise CorruptRecord(f"snapshot {name} has a bad header")
    if _crc32c.crc32c(payload) != crc:
        raise CorruptRecord(f"snapshot {name} fails its CRC")
    return payload


class SnapshotStore:
    def __init__(self, directory: Path, retain: int) -> None:
        self.directory = directory / "snapshots"
        self.retain = max(1, retain)
        self.directory.mkdir(parents=True, exist_ok=True)
        for tmp in self.directory.glob("*.tmp"):
            tmp.unlink(missing_ok=True)

    def _path(self, offset: int) -> Path:
        return self.directory / f"{offset:020d}{SUFFIX}"

    def all(self) -> list[SnapshotMeta]:
        metas = []
        for path in self.directory.glob(f"*{SUFFIX}"):
            stem = path.name[: -len(SUFFIX)]
            if stem.isdigit():
                metas.append(SnapshotMeta(int(stem), path.stat().st_size, path))
        return sorted(metas, key=lambda m: m.offset)

    def latest(self) -> SnapshotMeta | None:
        """The newest snapshot that reads back whole (a damaged one is skipped)."""
        for meta in reversed(self.all()):
            try:
                self.load(meta)
                return meta
            except CorruptRecord:
                continue
        return None

    def write(self, offset: int, payload: bytes) -> SnapshotMeta:
        path = self._path(offset)
        data = encode_snapshot(offset, payload)
        write_file(path, data)
        self.prune()
        return SnapshotMeta(offset, len(data), path)

    def prune(self) -> None:
        for meta in self.all()[: -self.retain]:
            meta.path.unlink(missing_ok=True)

    def load(self, meta: SnapshotMeta) -> bytes:
        """The payload, checked against its header and CRC."""
        return decode_snapshot(meta.path.read_bytes(), meta.offset, meta.path.name)

    # -- transfer -------------------------------------------------------------------------------

    def read_chunk(self, offset: int, position: int, max_bytes: int) -> bytes:
        with open(self._path(offset), "rb") as f:
            f.seek(position)
            return f.read(max_bytes)

    def partial_size(self, offset: int) -> int:
        try:
            return (self.directory / f"{offset:020d}{PARTIAL}").stat().st_size
        except FileNotFoundError:
            return 0

    def write_chunk(self, offset: int, position: int, data: bytes) -> int:
        """Append a chunk at position (it must continue the partial file); returns its size."""
        partial = self.directory / f"{offset:020d}{PARTIAL}"
        for other in self.directory.glob(f"*{PARTIAL}"):
            if other != partial:
                other.unlink(missing_ok=True)  # an older transfer that will never finish
        size = self.partial_size(offset)
        if position != size:
            raise CorruptRecord(f"snapshot chunk at {position} does not continue {size} bytes")
        with translated("writing a snapshot chunk"):
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                write_all(fd, data)
            finally:
                os.close(fd)
        return size + len(data)

    def finish(self, offset: int) -> SnapshotMeta:
        """Check the received file whole, then make it this replica's snapshot."""
        partial = self.directory / f"{offset:020d}{PARTIAL}"
        with translated("syncing a received snapshot"), open(partial, "rb+") as f:
            os.fsync(f.fileno())
        meta = SnapshotMeta(offset, partial.stat().st_size, partial)
        try:
            self.load(meta)
        except CorruptRecord:
            partial.unlink(missing_ok=True)
            raise
        final = self._path(offset)
        with translated("installing a received snapshot"):
            os.replace(partial, final)
            fsync_dir(self.directory)
        self.prune()
        return SnapshotMeta(offset, meta.size_bytes, final)
