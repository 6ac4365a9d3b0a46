"""Finding batches no reader can read among those already in a log.

Everything a leader appends now passes record/validation.py first, but a log may hold batches
written before that (by an older version) or damaged below the CRC's reach. A node scrubs each
partition's committed batches once after it opens them, in the background, and reports what it
finds (`tidelog status`); readers then skip those batches with a warning where they are told to,
rather than finding the partition unreadable. Nothing here changes the log.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tidelog.errors import TidelogError
from tidelog.record.batch import validate
from tidelog.record.validation import check_readable
from tidelog.storage.segment import LogSegment

INFLATE_LIMIT_BYTES = 256 * 1024 * 1024  # a batch already in the log: only memory bounds it


@dataclass(frozen=True)
class InvalidBatch:
    base_offset: int
    last_offset: int
    error: str  # the named error, e.g. UnsupportedCompression
    reason: str

    def to_dict(self) -> dict[str, object]:
        return {
            "base_offset": self.base_offset,
            "last_offset": self.last_offset,
            "error": self.error,
            "reason": self.reason,
        }


def check_batch(data: bytes) -> TidelogError | None:
    """Why one whole batch (as stored) cannot be read, or None."""
    try:
        header = validate(data)
        check_readable(data, 0, header, 0, INFLATE_LIMIT_BYTES)
    except TidelogError as exc:
        return exc
    return None


def scrub_segment(seg: LogSegment, end_offset: int) -> tuple[list[InvalidBatch], int]:
    """Check the segment's batches below end_offset; returns what is invalid and the offset
    checked up to (exclusive)."""
    found: list[InvalidBatch] = []
    checked = seg.base_offset
    for pos, header in seg.scan():
        if header.next_offset > end_offset:
            break
        error = check_batch(os.pread(seg.fd, header.size_bytes, pos))
        if error is not None:
            message = error.message.removeprefix("batch 0: ")
            found.append(InvalidBatch(header.base_offset, header.last_offset, error.name, message))
        checked = header.next_offset
    return found, checked
