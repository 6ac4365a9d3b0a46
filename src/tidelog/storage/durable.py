"""Durable writes, done once: every write checked for its length, every file fsynced, every
rename followed by an fsync of its directory, and an OS error turned into StorageFull or
StorageError at this edge.

A short write is not an error to os.write (it returns what it wrote), so code that ignores the
count can swap in a torn file on a nearly full disk and lose the newest value of some keys. Every
file tidelog writes as a whole (checkpoints, snapshots, cleaned segments, indexes, the directory
identity) goes through write_file(); appends to open files go through write_all().
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

from tidelog.errors import StorageError, StorageFull, TidelogError

Buffer = bytes | bytearray | memoryview


def write_all(fd: int, data: Buffer) -> int:
    """Write every byte of data at the fd's position; a write that makes no progress is an
    error (StorageFull), never a silent truncation."""
    view = memoryview(data).cast("B")
    total = len(view)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.ENOSPC, "a write made no progress")
        view = view[written:]
    return total


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def translate_os_error(exc: OSError, what: str) -> TidelogError:
    """The one place OS errors become tidelog errors."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StorageFull(f"no space left while {what}")
    return StorageError(f"{what}: {exc.strerror or exc}")


@contextlib.contextmanager
def translated(what: str) -> Iterator[None]:
    """OS errors inside become StorageFull / StorageError naming what was being done."""
    try:
        yield
    except OSError as exc:
        raise translate_os_error(exc, what) from exc


def write_file(
    path: Path,
    data: Buffer,
    *,
    exclusive: bool = False,
    sync: bool = True,
    sync_dir: bool = True,
    mode: int = 0o644,
) -> None:
    """path holds exactly data, or (on any failure) what it held before: written to a temp
    file, fsynced, renamed over path, and the directory fsynced. exclusive: never replace an
    existing path (FileExistsError is raised as StorageError). sync=False only for a file
    whose owner fsyncs it itself next (an index), so it is not fsynced twice. mode: the new
    file's (0o600 for a secret: it is never readable by others, not even while written)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        try:
            write_all(fd, data)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        if exclusive:
            os.link(tmp, path)
            tmp.unlink()
        else:
            os.replace(tmp, path)
        if sync_dir:
            fsync_dir(path.parent)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise translate_os_error(exc, f"writing {path.name}") from exc
