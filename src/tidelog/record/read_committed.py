"""What a read_committed reader keeps of fetched batches (Kafka's consumer does the same): the
answer lists the aborted transactions overlapping its range, (producer id, first offset); a
producer's transactional batches from that first offset up to its ABORT marker are dropped.
Markers themselves, like every control batch, are never handed to applications.

Each aborted transaction is taken in once the batches reach its first offset, and a
producer's ABORT marker ends it, so a later transaction of the same producer is kept. Only
markers are decoded beyond their header.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tidelog.record.batch import BatchHeader
from tidelog.record.markers import read_marker


def aborted_positions(
    payload: bytes | bytearray | memoryview,
    batches: Iterable[tuple[int, BatchHeader]],
    aborted: Sequence[tuple[int, int]],
) -> frozenset[int]:
    """The positions in payload of the batches an aborted transaction wrote."""
    pending = sorted(aborted, key=lambda t: t[1])
    taken = 0
    aborting: set[int] = set()
    dropped: set[int] = set()
    for pos, header in batches:
        pid = header.producer_id
        if pid < 0:
            continue
        while taken < len(pending) and pending[taken][1] <= header.last_offset:
            aborting.add(pending[taken][0])
            taken += 1
        if header.is_control:
            marker = read_marker(payload, header, pos)
            if marker is not None and not marker.commit:
                aborting.discard(pid)
        elif header.is_transactional and pid in aborting:
            dropped.add(pos)
    return frozenset(dropped)


def committed_batches(
    payload: bytes | bytearray | memoryview,
    batches: Sequence[tuple[int, BatchHeader]],
    aborted: Sequence[tuple[int, int]],
) -> tuple[tuple[int, BatchHeader], ...]:
    """The batches a read_committed reader keeps: no aborted transaction's, no control."""
    dropped = aborted_positions(payload, batches, aborted) if aborted else frozenset()
    return tuple(
        (pos, header) for pos, header in batches if not header.is_control and pos not in dropped
    )
