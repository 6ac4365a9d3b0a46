"""Snapshots of a state-machine log: the state after applying every record below an offset.

    snapshots/<20-digit offset>.snapshot
        8   magic "TLSNAP2\\n"
        8   offset            (the state includes every record < offset)
        8   epoch             (of the record at offset - 1; -1 if not known)
        4   CRC-32C of the payload
        8   payload length
        ..  payload           (the state machine's own encoding)

Version 1 ("TLSNAP1\\n") had no epoch, and is still read (as epoch -1). The epoch is the last
epoch of a log that starts over at the snapshot: a replica that restarts with its snapshot
ahead of its log (taken from records its crash then lost) still knows it, or it would vote as
a log ending in epoch -1 (fresh seed 898038519).

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

MAGIC_V1 = b"TLSNAP1\n"
HEADER_V1 = struct.Struct(">8sqIq")
MAGIC = b"TLSNAP2\n"
HEADER = struct.Struct(">8sqqIq")
SUFFIX = ".snapshot"
PARTIAL = ".snapshot.partial"


@dataclass(frozen=True)
class SnapshotMeta:
    offset: int
    size_bytes: int  # the whole file, header included
    path: Path
    epoch: int = -1  # of the record at offset - 1 (-1: not known)


def encode_snapshot(offset: int, payload: bytes, epoch: int = -1) -> bytes:
    return HEADER.pack(MAGIC, offset, epoch, _crc32c.crc32c(payload), len(payload)) + payload


def decode_snapshot(data: bytes, offset: int, name: str) -> bytes:
    """The payload of a snapshot file's bytes, checked against its header and CRC."""
    return _decode(data, offset, name)[0]


def snapshot_epoch(data: bytes, offset: int, name: str) -> int:
    """The epoch a snapshot file's header records (-1 for version 1, which has none)."""
    return _decode(data, offset, name)[1]


def _decode(data: bytes, offset: int, name: str) -> tuple[bytes, int]:
    version_1 = data[:8] == MAGIC_V1
    header = HEADER_V1 if version_1 else HEADER
    if len(data) < header.size:
        raise CorruptRecord(f"snapshot {name} is cut short")
    if version_1:
        magic, stored_offset, crc, length = header.unpack_from(data)
        epoch = -1
    else:
        magic, stored_offset, epoch, crc, length = header.unpack_from(data)
    payload = data[header.size :]
    if magic not in (MAGIC, MAGIC_V1) or stored_offset != offset or length != len(payload):
        raise CorruptRecord(f"snapshot {name} has a bad header")
    if _crc32c.crc32c(payload) != crc:
        raise CorruptRecord(f"snapshot {name} fails its CRC")
    return payload, int(epoch)


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
                epoch = snapshot_epoch(meta.path.read_bytes(), meta.offset, meta.path.name)
                return SnapshotMeta(meta.offset, meta.size_bytes, meta.path, epoch)
            except CorruptRecord:
                continue
        return None

    def write(self, offset: int, payload: bytes, epoch: int = -1) -> SnapshotMeta:
        path = self._path(offset)
        data = encode_snapshot(offset, payload, epoch)
        write_file(path, data)
        self.prune()
        return SnapshotMeta(offset, len(data), path, epoch)

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
        size = partial.stat().st_size
        try:
            epoch = snapshot_epoch(partial.read_bytes(), offset, partial.name)
        except CorruptRecord:
            partial.unlink(missing_ok=True)
            raise
        final = self._path(offset)
        with translated("installing a received snapshot"):
            os.replace(partial, final)
            fsync_dir(self.directory)
        self.prune()
        return SnapshotMeta(offset, size, final, epoch)
