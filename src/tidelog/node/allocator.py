"""The C allocator a node process runs with.

A node receives and appends megabyte batches continually. With glibc's default dynamic
thresholds each such buffer can grow the heap (brk) and shrink it again when freed, so every
batch pays fresh page faults: measured here, that was half the node's CPU time in the kernel
and a fifth of its produce throughput. A node sets a fixed mmap threshold and a trim threshold
above the sizes it allocates, so freed buffers are reused. What a node may hold at once is
bounded elsewhere (queued.max.request.bytes, fetch.max.bytes); this only stops returning that
memory to the kernel after every request.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
TRIM_THRESHOLD_BYTES = 128 * 1024 * 1024
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024


def tune_allocator() -> bool:
    """True if glibc took the settings (elsewhere nothing changes)."""
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    ok = bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)) and ok
    if not ok:
        log.debug("mallopt refused the allocator settings")
    return ok
