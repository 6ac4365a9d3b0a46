"""Small state files written atomically: temp file, fsync, rename, fsync the directory.

A checkpoint carries its own CRC so a torn or bit-flipped file is detected on read instead of
silently steering recovery. One line of JSON:

    version 1 (tidelog 0.1.0)  {"crc": CRC, "data": {...}, "version": 1}
    version 2 (feature level 2) {"crc": CRC, "data": {...}, "format": FILE NAME, "version": 2,
                                 "written_by": TIDELOG VERSION}

CRC is the CRC-32C of data as compact JSON with sorted keys. tidelog 0.1.0 reads any version but
1 as a checkpoint that fails its CRC; this one refuses a version newer than it knows by name
(UnsupportedFormatVersion), which callers that ignore a damaged checkpoint do not catch.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import crc32c as _crc32c

from tidelog.errors import CorruptRecord
from tidelog.formats import check_version, write_version
from tidelog.invariant import invariant
from tidelog.storage.durable import fsync_dir, write_file
from tidelog.version import __version__

__all__ = ["encode_checkpoint", "fsync_dir", "read_checkpoint", "write_checkpoint"]

CHECKPOINT_BYTES_MAX = 1024 * 1024

# One writer per path at a time (a path's temp file is its own); different paths in parallel.
_locks_guard = threading.Lock()
_write_locks: dict[Path, threading.Lock] = {}


def encode_checkpoint(name: str, data: dict[str, Any], version: int) -> bytes:
    """A checkpoint file's bytes (version 1: exactly what tidelog 0.1.0 writes)."""
    body = json.dumps(data, sort_keys=True, separators=(",", ":"))
    crc = _crc32c.crc32c(body.encode())
    outer: dict[str, Any] = {"version": version, "crc": crc, "data": data}
    if version >= 2:
        outer["format"] = name
        outer["written_by"] = __version__
    return (json.dumps(outer, sort_keys=True) + "\n").encode()


def write_checkpoint(path: Path, data: dict[str, Any], version: int | None = None) -> None:
    """version: of the envelope (default: the one the process's feature level writes)."""
    if version is None:
        version = write_version("checkpoint")
    encoded = encode_checkpoint(path.name, data, version)
    invariant(len(encoded) <= CHECKPOINT_BYTES_MAX, "len(encoded) <= CHECKPOINT_BYTES_MAX")
    with _locks_guard:
        lock = _write_locks.setdefault(path, threading.Lock())
    with lock:
        write_file(path, encoded)


def read_checkpoint(path: Path) -> dict[str, Any] | None:
    """The stored dict, None if the file does not exist; CorruptRecord if it fails its CRC,
    UnsupportedFormatVersion if it is of a version newer than this build reads."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    if len(raw) > CHECKPOINT_BYTES_MAX:
        raise CorruptRecord(f"checkpoint {path} is {len(raw)} bytes, over the limit")
    try:
        outer = json.loads(raw)
        version = outer["version"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptRecord(f"checkpoint {path} is unreadable: {exc}") from exc
    if not isinstance(version, int) or isinstance(version, bool):
        raise CorruptRecord(f"checkpoint {path} has no version")
    # A version this build does not know is refused by name before anything else is judged: a
    # newer envelope may be laid out otherwise, and must never pass for a damaged file (which
    # callers ignore).
    check_version("checkpoint", version, f"checkpoint {path}")
    try:
        data = outer["data"]
        body = json.dumps(data, sort_keys=True, separators=(",", ":"))
        ok = _crc32c.crc32c(body.encode()) == outer["crc"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptRecord(f"checkpoint {path} is unreadable: {exc}") from exc
    if not ok or not isinstance(data, dict):
        raise CorruptRecord(f"checkpoint {path} fails its CRC")
    return data
