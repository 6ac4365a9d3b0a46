"""Snapshots of a state-machine log: the state after applying every record below an offset.

    snapshots/<20-digit offset>.snapshot
        8   magic "TLSNAP2\\n"
        8   offset            (the state includes every record < offset)
        8   epoch             (of the record at offset - 1; -1 if not known)
        4   CRC-32C of the payload
        8   payload length
        ..  payload           (the state machine's own encoding)

Version 1 ("TLSNAP1\\n", tidelog 0.1.0's) has no epoch field. The epoch is the last epoch of a
log that starts over at the snapshot: a replica that restarts with its snapshot ahead of its log
(taken from records its crash then lost) still knows it, or it would vote as a log ending in
epoch -1 (fresh seed 898038519). tidelog 0.1.0 reads only version 1 (a version 2 file is to it
a damaged one, skipped; a leader's version 2 chunks a snapshot its followers cannot install), so
until the feature level allows version 2 (tidelog/formats.py) snapshots are written as version
1, and the epoch goes beside it, in `<offset>.epoch` (a checkpoint, written first; 0.1.0 ignores
it). A magic "TLSNAP<n>\\n" of a newer version is refused by name (UnsupportedFormatVersion),
never skipped as damaged.

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
from tidelog.formats import check_version, write_version
from tidelog.storage.checkpoint import read_checkpoint, write_checkpoint
from tidelog.storage.durable import fsync_dir, translated, write_all, write_file

MAGIC_V1 = b"TLSNAP1\n"
HEADER_V1 = struct.Struct(">8sqIq")
MAGIC = b"TLSNAP2\n"
HEADER = struct.Struct(">8sqqIq")
SUFFIX = ".snapshot"
PARTIAL = ".snapshot.partial"
EPOCH_SUFFIX = ".epoch"  # beside a version 1 snapshot: the epoch its header cannot hold


@dataclass(frozen=True)
class SnapshotMeta:
    offset: int
    size_bytes: int  # the whole file, header included
    path: Path
    epoch: int = -1  # of the record at offset - 1 (-1: not known)


def encode_snapshot(
    offset: int, payload: bytes, epoch: int = -1, version: int | None = None
) -> bytes:
    """A snapshot file's bytes, in `version` (default: what the process's feature level writes;
    version 1 has no epoch)."""
    if version is None:
        version = write_version("snapshot")
    check_version("snapshot", version, "a snapshot to write")
    crc = _crc32c.crc32c(payload)
    if version == 1:
        return HEADER_V1.pack(MAGIC_V1, offset, crc, len(payload)) + payload
    return HEADER.pack(MAGIC, offset, epoch, crc, len(payload)) + payload


def decode_snapshot(data: bytes, offset: int, name: str) -> bytes:
    """The payload of a snapshot file's bytes, checked against its header and CRC."""
    return _decode(data, offset, name)[0]


def snapshot_epoch(data: bytes, offset: int, name: str) -> int:
    """The epoch a snapshot file's header records (-1 for version 1, which has none)."""
    return _decode(data, offset, name)[1]


def snapshot_version(data: bytes, name: str) -> int:
    """The version its magic says, if this build reads it: UnsupportedFormatVersion for a
    newer one, CorruptRecord for a magic that is no snapshot's."""
    magic = data[: len(MAGIC)]
    digit = magic[6:7]
    if magic[:6] != b"TLSNAP" or magic[7:] != b"\n" or not digit.isdigit():
        raise CorruptRecord(f"snapshot {name} has a bad header")
    return check_version("snapshot", int(digit), f"snapshot {name}")


def _decode(data: bytes, offset: int, name: str) -> tuple[bytes, int]:
    version_1 = snapshot_version(data, name) == 1
    header = HEADER_V1 if version_1 else HEADER
    if len(data) < header.size:
        raise CorruptRecord(f"snapshot {name} is cut short")
    if version_1:
        _, stored_offset, crc, length = header.unpack_from(data)
        epoch = -1
    else:
        _, stored_offset, epoch, crc, length = header.unpack_from(data)
    payload = data[header.size :]
    if stored_offset != offset or length != len(payload):
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
        """The newest snapshot that reads back whole (a damaged one is skipped; one of a newer
        version than this build reads is refused: UnsupportedFormatVersion)."""
        for meta in reversed(self.all()):
            try:
                data = meta.path.read_bytes()
                epoch = snapshot_epoch(data, meta.offset, meta.path.name)
            except CorruptRecord:
                continue
            if snapshot_version(data, meta.path.name) == 1:
                epoch = self._epoch_beside(meta.offset)
            return SnapshotMeta(meta.offset, meta.size_bytes, meta.path, epoch)
        return None

    def write(
        self, offset: int, payload: bytes, epoch: int = -1, version: int | None = None
    ) -> SnapshotMeta:
        """version: the file's (default: what the process's feature level writes)."""
        if version is None:
            version = write_version("snapshot")
        path = self._path(offset)
        data = encode_snapshot(offset, payload, epoch, version)
        if version == 1:
            self._keep_epoch_beside(offset, epoch)
        write_file(path, data)
        self.prune()
        return SnapshotMeta(offset, len(data), path, epoch)

    def _epoch_path(self, offset: int) -> Path:
        return self.directory / f"{offset:020d}{EPOCH_SUFFIX}"

    def _keep_epoch_beside(self, offset: int, epoch: int) -> None:
        """Before a version 1 snapshot is in place: its epoch, which its header cannot hold."""
        if epoch >= 0:
            write_checkpoint(self._epoch_path(offset), {"epoch": epoch})
        else:
            self._epoch_path(offset).unlink(missing_ok=True)

    def _epoch_beside(self, offset: int) -> int:
        try:
            data = read_checkpoint(self._epoch_path(offset))
        except CorruptRecord:
            return -1  # as a version 1 snapshot without one: the epoch is not known
        return int(data.get("epoch", -1)) if data is not None else -1

    def prune(self) -> None:
        kept = self.all()
        for meta in kept[: -self.retain]:
            meta.path.unlink(missing_ok=True)
        offsets = {meta.offset for meta in kept[-self.retain :]}
        for beside in self.directory.glob(f"*{EPOCH_SUFFIX}"):
            stem = beside.name[: -len(EPOCH_SUFFIX)]
            if not stem.isdigit() or int(stem) not in offsets:
                beside.unlink(missing_ok=True)

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

    def finish(self, offset: int, epoch: int = -1) -> SnapshotMeta:
        """Check the received file whole, then make it this replica's snapshot. epoch: the
        leader's word for it (FetchSnapshotResponse.snapshot_epoch), kept beside a version 1
        file, whose header has none."""
        partial = self.directory / f"{offset:020d}{PARTIAL}"
        with translated("syncing a received snapshot"), open(partial, "rb+") as f:
            os.fsync(f.fileno())
        size = partial.stat().st_size
        try:
            data = partial.read_bytes()
            stored_epoch = snapshot_epoch(data, offset, partial.name)
        except CorruptRecord:
            partial.unlink(missing_ok=True)
            raise
        if snapshot_version(data, partial.name) == 1:
            self._keep_epoch_beside(offset, epoch)
        else:
            epoch = stored_epoch
        final = self._path(offset)
        with translated("installing a received snapshot"):
            os.replace(partial, final)
            fsync_dir(self.directory)
        self.prune()
        return SnapshotMeta(offset, size, final, epoch)
