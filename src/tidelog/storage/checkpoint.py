"""Small state files written atomically: temp file, fsync, rename, fsync the directory.

A checkpoint carries its own CRC so a torn or bit-flipped file is detected on read instead of
silently steering recovery.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import crc32c as _crc32c

from tidelog.errors import CorruptRecord
from tidelog.invariant import invariant
from tidelog.storage.durable import fsync_dir, write_file

__all__ = ["fsync_dir", "read_checkpoint", "write_checkpoint"]

CHECKPOINT_BYTES_MAX = 1024 * 1024

# One writer per path at a time (a path's temp file is its own); different paths in parallel.
_locks_guard = threading.Lock()
_write_locks: dict[Path, threading.Lock] = {}


def write_checkpoint(path: Path, data: dict[str, Any]) -> None:
    body = json.dumps(data, sort_keys=True, separators=(",", ":"))
    crc = _crc32c.crc32c(body.encode())
    text = json.dumps({"version": 1, "crc": crc, "data": data}, sort_keys=True) + "\n"
    encoded = text.encode()
    invariant(len(encoded) <= CHECKPOINT_BYTES_MAX, "len(encoded) <= CHECKPOINT_BYTES_MAX")
    with _locks_guard:
        lock = _write_locks.setdefault(path, threading.Lock())
    with lock:
        write_file(path, encoded)


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
