"""What one upload costs the manifest as the archive ages: 1,000 and 10,000 objects, the flat
manifest (every entry in one object, rewritten by each upload: the layout before issue 32) and the
manifest with parts (at most HEAD_MAX entries in the manifest; older ones sealed into immutable
part objects), in the same run on the same disk.

    .venv/bin/python bench/archive_manifest.py [--uploads 50]

For each layout and age: an archive of that many objects' entries (as a leader's uploads made
them) in a file:// store, then --uploads more uploads as the archiver makes them (append the new
object's entry, seal a part when due, the manifest's conditional put), timed; the object bytes
themselves are not written (they cost the same at any age). The ratio 10,000 / 1,000 is what
matters: 1 is an upload that costs the same however old the archive is.
"""

from __future__ import annotations

import argparse
import time
import uuid

from common import print_table, scratch_dir
from tidelog.archive.manifest import (
    ArchivedSegment,
    Manifest,
    ManifestPart,
    part_bytes,
    part_key,
)
from tidelog.archive.store import FileStore

PREFIX = "t/1/0"
KEY = f"{PREFIX}/manifest.json"
PER_OBJECT = 1000  # offsets per object


def entry(i: int) -> ArchivedSegment:
    base = i * PER_OBJECT
    return ArchivedSegment(
        key=f"{PREFIX}/{base:020d}-{base + PER_OBJECT:020d}-e1-{i:08x}.log",
        base_offset=base,
        end_offset=base + PER_OBJECT,
        size=8 * 1024 * 1024,
        crc32c=0x12345678,
        first_timestamp=1_790_000_000_000 + i,
        max_timestamp=1_790_000_000_999 + i,
        epochs=((1, base),),
        index=tuple((base + k * 125, k * 1024 * 1024) for k in range(8)),
        uploaded_by=1,
        uploaded_ms=1_790_000_001_000 + i,
    )


def upload(
    store: FileStore, manifest: Manifest, i: int, version: str | None, parts: bool
) -> tuple[Manifest, str, int]:
    """One upload's manifest work, as node/archiver.py does it: (manifest, version, bytes)."""
    new = manifest.appended(entry(i), 1)
    written = 0
    sealed = new.to_seal() if parts else ()
    if sealed:
        base, end = sealed[0].base_offset, sealed[-1].end_offset
        part = ManifestPart(
            part_key(PREFIX, base, end, uuid.uuid4().hex[:8]), base, end, len(sealed)
        )
        data = part_bytes(sealed)
        store.put(part.key, data)
        written += len(data)
        new = new.sealed(part)
    body = new.to_bytes()
    version = store.put_if(KEY, body, version)
    return new, version, written + len(body)


def measure(objects: int, uploads: int, parts: bool) -> tuple[float, float, int]:
    """(ms per upload, KB written per upload, manifest KB) at this age and layout."""
    root = scratch_dir("manifest-")
    store = FileStore(f"file://{root}", root)
    manifest = Manifest(cluster_id="c", topic="t", topic_id=1, partition=0)
    version: str | None = None
    for i in range(objects):  # build the archive's history (not timed)
        new = manifest.appended(entry(i), 1)
        sealed = new.to_seal() if parts else ()
        if sealed:
            base, end = sealed[0].base_offset, sealed[-1].end_offset
            part = ManifestPart(part_key(PREFIX, base, end, f"{i:08x}"), base, end, len(sealed))
            store.put(part.key, part_bytes(sealed))
            new = new.sealed(part)
        manifest = new
    version = store.put_if(KEY, manifest.to_bytes(), None)
    written = 0
    started = time.perf_counter()
    for i in range(objects, objects + uploads):
        manifest, version, size = upload(store, manifest, i, version, parts)
        written += size
    elapsed = time.perf_counter() - started
    # The manifest read back whole (every part) equals what the leader holds.
    again = Manifest.from_bytes(store.get(KEY), KEY, store.get)
    assert again.segments == manifest.segments, "the manifest does not read back"
    return elapsed / uploads * 1000, written / uploads / 1024, len(store.get(KEY)) // 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--uploads", type=int, default=50)
    args = parser.parse_args()
    rows = []
    for parts in (False, True):
        figures = {n: measure(n, args.uploads, parts) for n in (1_000, 10_000)}
        for n, (ms, kb, size) in figures.items():
            rows.append(["parts" if parts else "flat", n, ms, kb, size, ""])
        ratio = figures[10_000][0] / figures[1_000][0]
        bytes_ratio = figures[10_000][1] / figures[1_000][1]
        rows[-1][-1] = f"time x{ratio:.2f}, bytes x{bytes_ratio:.2f}"
    print_table(
        ["layout", "objects", "ms/upload", "KB written/upload", "manifest KB", "10k / 1k"], rows
    )


if __name__ == "__main__":
    main()
