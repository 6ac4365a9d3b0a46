"""Open segment files, at most so many at once: a process-wide LRU of descriptors.

A node with ten thousand partitions has ten thousand segments or more; holding a descriptor for
each would need a file-descriptor limit the operator may not have. A segment asks this cache for
its descriptor at each system call (`LogSegment.fd`): an idle segment's file is closed when the
cache is full, and opened again, without O_CREAT, when next used (a file that vanished meanwhile
is an error, never an empty new one).

Rules that keep a number from naming the wrong file:
  - nobody keeps the int a segment gives: each call asks again (a later call for another
    segment may close it, and the kernel reuses the number at once);
  - what outlives the call owns a duplicate: a `FileSlice` going to a socket, a flush job;
  - work on a thread pins its segment (`pin`/`unpin`, on the event loop): a pinned segment is
    never closed, by the cache or by its own close(), until unpinned.
"""

from __future__ import annotations

import collections
import os
import threading
from typing import Protocol

from tidelog.errors import StorageError

DEFAULT_CAPACITY = 4096
CAPACITY_MIN = 16


class CachedFile(Protocol):
    """What the cache needs of a segment."""

    descriptor: int  # -1 while closed by the cache
    pins: int

    def reopen(self) -> int: ...


class DescriptorCache:
    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = max(CAPACITY_MIN, capacity)
        self._open: collections.OrderedDict[CachedFile, None] = collections.OrderedDict()
        # Threads (compaction, scrub) read pinned segments' descriptors: never evicted, but
        # the LRU order they touch is shared.
        self._lock = threading.Lock()
        self.opened = 0  # files opened again after an eviction
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._open)

    def fd(self, file: CachedFile) -> int:
        with self._lock:
            if file.descriptor >= 0:
                if file in self._open:
                    self._open.move_to_end(file)
                return file.descriptor
            file.descriptor = file.reopen()
            self.opened += 1
            self._open[file] = None
            self._evict(keep=file)
            return file.descriptor

    def adopt(self, file: CachedFile) -> None:
        """A segment opened its file itself (creating it): count it, and make room."""
        with self._lock:
            self._open[file] = None
            self._evict(keep=file)

    def release(self, file: CachedFile) -> None:
        """Close the segment's file now (its close(), when nothing pins it)."""
        with self._lock:
            self._open.pop(file, None)
            if file.descriptor >= 0:
                _close(file.descriptor)
                file.descriptor = -1

    def _evict(self, keep: CachedFile) -> None:
        excess = len(self._open) - self.capacity
        if excess <= 0:
            return
        victims = []
        for candidate in self._open:
            if candidate is not keep and candidate.pins == 0:
                victims.append(candidate)
                if len(victims) >= excess:
                    break
        for victim in victims:  # (all pinned: the cache runs over until they are unpinned)
            del self._open[victim]
            _close(victim.descriptor)
            victim.descriptor = -1
            self.evicted += 1

    def resize(self, capacity: int) -> None:
        with self._lock:
            self.capacity = max(CAPACITY_MIN, capacity)


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError as exc:
        raise StorageError(f"closing a segment file: {exc}") from exc


def capacity_for(soft_limit: int) -> int:
    """A quarter of the open-files limit for segment files (sockets, index files, flush jobs'
    duplicates and the rest take what is left), and no more than DEFAULT_CAPACITY."""
    return max(CAPACITY_MIN, min(DEFAULT_CAPACITY, soft_limit // 4))


# One per process: every log of a node (and of an embedded cluster's nodes) shares it.
SEGMENT_FILES = DescriptorCache()


class OwnedDescriptor:
    """A duplicate descriptor owned by whatever holds it (a FileSlice on its way to a socket):
    closed when the last reference goes, so nobody can close it twice."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __del__(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass
