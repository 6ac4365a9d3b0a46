"""Small state files written atomically: temp file, fsync, rename, fsync the directory.

A checkpoint carries its own CRC so a torn or bit-flipped file is detected on read instead of
silently steering recovery.
"""

from __future__ import annotations

import errno
import json
import os
import threading
from pathlib import Path
from typing import Any

import crc32c as _crc32c

from tidelog.errors import CorruptRecord, StorageError, StorageFull

CHECKPOINT_BYTES_MAX = 1024 * 1024

_write_lock = threading.Lock()


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(path: Path, data: dict[str, Any]) -> None:
    body = json.dumps(data, sort_keys=True, separators=(",", ":"))
    crc = _crc32c.crc32c(body.encode())
    text = json.dumps({"version": 1, "crc": crc, "data": data}, sort_keys=True) + "\n"
    encoded = text.encode()
    assert len(encoded) <= CHECKPOINT_BYTES_MAX
    tmp = path.with_name(path.name + ".tmp")
    with _write_lock:
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                if os.write(fd, encoded) != len(encoded):
                    raise OSError(errno.ENOSPC, "short write")
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
            fsync_dir(path.parent)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StorageFull(f"no space left writing {path.name}") from exc
            raise StorageError(f"writing {path.name}: {exc.strerror or exc}") from exc


def read_checkpoint(path: Path) -> dict[str, Any] | None:
    """The stored dict, None if the file does not exist; CorruptRecord if it fails its CRC."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    if len(raw) > CHECKPOINT_BYTES_MAX:
        raise CorruptRecord(f"checkpoint {path} is {len(raw)} bytes, over the limit")
    try:
        outer = json.loads(raw)
        data = outer["data"]
        body = json.dumps(data, sort_keys=True, separators=(",", ":"))
        ok = outer.get("version") == 1 and _crc32c.crc32c(body.encode()) == outer["crc"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptRecord(f"checkpoint {path} is unreadable: {exc}") from exc
    if not ok or not isinstance(data, dict):
        raise CorruptRecord(f"checkpoint {path} fails its CRC")
    return data
