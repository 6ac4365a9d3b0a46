"""Reading the archive: whole record batches from an offset, with bounded memory, every batch's
CRC checked (a damaged or truncated object is ArchiveCorrupt, never wrong data), and what a
read_committed reader of them must drop (the aborted transactions their manifest entry names).

Used by a node serving a fetch below its local log start, by `tidelog restore`, by `tidelog
archive verify` and by the Spark source's executors, which read archived ranges from the store
themselves.
"""

from __future__ import annotations

from collections.abc import Iterator

from tidelog.archive.manifest import ArchivedSegment, Manifest, manifest_key
from tidelog.archive.store import ArchiveStore
from tidelog.errors import ArchiveCorrupt, CorruptRecord, InvalidRequest
from tidelog.record.batch import BatchHeader, iter_headers, peek_size, validate

# A read asks the store for at least this much, so that small fetches do not become one
# request per batch.
MIN_READ_BYTES = 256 * 1024


def load_manifest(
    store: ArchiveStore, topic: str, topic_id: int, partition: int
) -> Manifest | None:
    versioned = store.get_versioned(manifest_key(topic, topic_id, partition))
    if versioned is None:
        return None
    return Manifest.from_bytes(versioned.data, manifest_key(topic, topic_id, partition), store.get)


def read_batches(store: ArchiveStore, seg: ArchivedSegment, offset: int, max_bytes: int) -> bytes:
    """Whole batches of seg holding offsets >= offset, up to max_bytes (at least one batch)."""
    return read_chunk(store, seg, offset, max_bytes)[0]


def read_chunk(
    store: ArchiveStore, seg: ArchivedSegment, offset: int, max_bytes: int
) -> tuple[bytes, int]:
    """read_batches, and the offset after the last batch it holds (where a reader goes next)."""
    out: list[bytes] = []
    taken = 0
    next_offset = offset
    read_bytes = max(max_bytes, MIN_READ_BYTES)
    for header, batch in _batches(store, seg, offset, read_bytes, one_read=True):
        if header.last_offset < offset:
            continue
        if out and taken + len(batch) > max_bytes:
            break
        out.append(batch)
        taken += len(batch)
        next_offset = header.next_offset
    return b"".join(out), next_offset


def committed_aborted(seg: ArchivedSegment, data: bytes, offset: int, end: int) -> list[list[int]]:
    """[producer id, first offset] of each aborted transaction with a batch in [offset, end), for
    a read_committed answer holding data (whole batches of seg). An entry from before the
    archive kept the list has none: its batches are served only if none is transactional (no
    aborted transaction can be among them then), else the read is refused by name."""
    if seg.transactions_known:
        return seg.aborted_between(offset, end)
    for _, header in iter_headers(data):
        if header.is_transactional:
            raise InvalidRequest(
                f"read_committed of {seg.key} (offsets [{seg.base_offset}, {seg.end_offset})): "
                "it holds transactional batches, and it was archived before the archive kept "
                "the aborted transactions of what it archives; read it read_uncommitted",
                key=seg.key,
            )
    return []


def iter_batches(
    store: ArchiveStore, seg: ArchivedSegment, offset: int = -1, read_bytes: int = 8 * 1024 * 1024
) -> Iterator[tuple[BatchHeader, bytes]]:
    """Every batch of seg from the one holding offset to its end, read_bytes at a time."""
    for header, batch in _batches(store, seg, max(offset, seg.base_offset), read_bytes):
        if header.last_offset >= offset:
            yield header, batch


def _batches(
    store: ArchiveStore,
    seg: ArchivedSegment,
    offset: int,
    read_bytes: int,
    one_read: bool = False,
) -> Iterator[tuple[BatchHeader, bytes]]:
    """one_read: stop at the end of the first read once it gave a batch (a fetch's answer is
    what one ranged read holds, not one more read for a batch that would not fit)."""
    position = seg.position_for(offset)
    chunk = b""
    at = 0  # position in chunk
    expected_base = -1
    yielded = False
    while position + at < seg.size or at < len(chunk):
        size = peek_size(chunk, at)
        if size is None or at + size > len(chunk):
            # read on: what is left of this batch and the next read_bytes
            if one_read and yielded:
                return
            start = position + len(chunk)
            if start >= seg.size:
                raise ArchiveCorrupt(
                    f"{seg.key}: a batch at {position + at} runs past the object's end "
                    f"({seg.size} bytes)",
                    key=seg.key,
                )
            end = min(seg.size, start + max(read_bytes, (size or 0) - (len(chunk) - at)))
            more = store.get_range(seg.key, start, end)
            if len(more) != end - start:
                raise ArchiveCorrupt(
                    f"{seg.key}: {len(more)} bytes at {start}, expected {end - start} (truncated)",
                    key=seg.key,
                )
            chunk = chunk[at:] + more
            position += at
            at = 0
            continue
        try:
            header = validate(chunk, at)
        except CorruptRecord as exc:
            raise ArchiveCorrupt(f"{seg.key} at {position + at}: {exc}", key=seg.key) from None
        if (
            header.base_offset < seg.base_offset
            or header.last_offset >= seg.end_offset
            or header.base_offset < expected_base
        ):
            raise ArchiveCorrupt(
                f"{seg.key} at {position + at}: a batch of offsets [{header.base_offset}, "
                f"{header.last_offset}] outside the object's [{seg.base_offset}, "
                f"{seg.end_offset})",
                key=seg.key,
            )
        expected_base = header.next_offset
        yield header, chunk[at : at + size]
        yielded = yielded or header.last_offset >= offset  # (batches before it are skipped)
        at += size
