"""What an archive holds, per partition: its manifest, and the objects it names.

Layout under the archive's root (a directory or a bucket prefix):

    cluster.json                                 {"format": 1, "cluster_id": ...}: whose archive
    TOPIC/TOPIC_ID/PARTITION/manifest.json       the manifest (below)
    TOPIC/TOPIC_ID/PARTITION/BASE-END-eEPOCH-NONCE.log   record batches [BASE, END), as on disk

TOPIC_ID is the topic's incarnation (the metadata log offset that created it), so a topic deleted
and created again under the same name never mixes with the old one's objects. An object is the
bytes of whole record batches, exactly as the leader's segment holds them (CRCs included), cut
at batch boundaries; it counts only once the manifest names it, and the manifest names it only
after it was written completely and read back with the checksum it was written with. So an
upload cut short (SIGKILL, leader change) leaves at most an unnamed object behind, never a hole
or an overlap; the next leader continues from the manifest's end.

The manifest is replaced with a conditional put (the store's compare-and-swap): of two leaders
racing, one loses and re-reads. Its writer's leader epoch only grows.

An upload must not cost more as the archive ages: the manifest once named every object, so each
upload rewrote ~400 bytes per object ever archived (4 MB at 10,000 objects). Now the manifest
names at most HEAD_MAX objects itself; older entries are sealed, PART_ENTRIES at a time, into
immutable part objects (TOPIC/TOPIC_ID/PARTITION/manifest-parts/BASE-END-NONCE.json, written
before the manifest that names them), which the manifest lists by key and range. A manifest
without parts is format 1, as before (older readers read it); one with parts is format 2. In
memory a Manifest holds every entry; readers load the parts (immutable: cached by key).

Each entry names the aborted transactions with a batch in its object (producer id, first offset,
marker offset: what the partition's transaction state gives a read_committed reader for that
range, as Kafka's per-segment .txnindex keeps it), so that read_committed reads of the archive
drop them as local reads do. An object is uploaded only once it lies wholly below the LSO, so
every transaction with a batch in it is decided, and the list is complete. The field is new and
optional (older readers ignore it, so the manifest's format is unchanged): an entry without it
was written before the archive kept the list, and its transactions are unknown.

tidelog 0.1.0 reads format 1 only (format 2 is to it a corrupt manifest), so parts are sealed
only once the feature level allows format 2 (tidelog/formats.py): until then the manifest names
every object itself, as 0.1.0's did. A manifest, part or cluster.json of a format newer than
this build reads is refused by name (UnsupportedFormatVersion), never read as corrupt.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from tidelog.errors import ArchiveCorrupt, CorruptRecord
from tidelog.formats import check_version, write_version
from tidelog.record.batch import BatchHeader, crc32c, iter_headers

FORMAT = 1  # a manifest without parts
FORMAT_PARTS = 2  # a manifest naming part objects
CLUSTER_FORMAT = 1  # of cluster.json
PART_ENTRIES = 100  # entries sealed into one part
HEAD_MAX = 2 * PART_ENTRIES  # entries the manifest itself holds before the oldest are sealed
CLUSTER_KEY = "cluster.json"
# A sparse index entry per this many bytes of an object: a read fetches at most this much it
# does not need.
INDEX_INTERVAL_BYTES = 1024 * 1024


def partition_prefix(topic: str, topic_id: int, partition: int) -> str:
    return f"{topic}/{topic_id}/{partition}"


def manifest_key(topic: str, topic_id: int, partition: int) -> str:
    return f"{partition_prefix(topic, topic_id, partition)}/manifest.json"


def part_key(prefix: str, base_offset: int, end_offset: int, nonce: str) -> str:
    return f"{prefix}/manifest-parts/{base_offset:020d}-{end_offset:020d}-{nonce}.json"


@dataclass(frozen=True)
class ArchivedSegment:
    key: str
    base_offset: int
    end_offset: int  # one past its last offset
    size: int
    crc32c: int  # of the whole object
    first_timestamp: int
    max_timestamp: int
    epochs: tuple[tuple[int, int], ...]  # (leader epoch, first offset), as its batches say
    index: tuple[tuple[int, int], ...]  # (batch base offset, position), sparse
    uploaded_by: int = -1
    uploaded_ms: int = 0
    # (producer id, first offset, marker offset) of each aborted transaction with a batch in
    # the object, in marker order; None: an entry from before the archive kept them (unknown)
    aborted_transactions: tuple[tuple[int, int, int], ...] | None = None

    @property
    def transactions_known(self) -> bool:
        return self.aborted_transactions is not None

    def aborted_between(self, start: int, end: int) -> list[list[int]]:
        """[producer id, first offset] of each aborted transaction with a batch in [start, end)
        (what a read_committed answer carries); [] for an entry whose transactions are unknown."""
        return [
            [producer_id, first]
            for producer_id, first, marker in self.aborted_transactions or ()
            if marker >= start and first < end
        ]

    def position_for(self, offset: int) -> int:
        position = 0
        for base, pos in self.index:
            if base > offset:
                break
            position = pos
        return position

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["epochs"] = [list(e) for e in self.epochs]
        data["index"] = [list(e) for e in self.index]
        if self.aborted_transactions is None:
            del data["aborted_transactions"]  # unknown: as the entry was written
        else:
            data["aborted_transactions"] = [list(t) for t in self.aborted_transactions]
        return data

    @staticmethod
    def from_json(data: dict[str, Any]) -> ArchivedSegment:
        return ArchivedSegment(
            key=str(data["key"]),
            base_offset=int(data["base_offset"]),
            end_offset=int(data["end_offset"]),
            size=int(data["size"]),
            crc32c=int(data["crc32c"]),
            first_timestamp=int(data["first_timestamp"]),
            max_timestamp=int(data["max_timestamp"]),
            epochs=tuple((int(a), int(b)) for a, b in data.get("epochs", [])),
            index=tuple((int(a), int(b)) for a, b in data.get("index", [])),
            uploaded_by=int(data.get("uploaded_by", -1)),
            uploaded_ms=int(data.get("uploaded_ms", 0)),
            aborted_transactions=_aborted_of(data.get("aborted_transactions")),
        )


def _aborted_of(value: Any) -> tuple[tuple[int, int, int], ...] | None:
    """An entry's aborted transactions as written; None when it has none (an older entry)."""
    if value is None:
        return None
    return tuple((int(pid), int(first), int(marker)) for pid, first, marker in value)


@dataclass(frozen=True)
class ManifestPart:
    """An immutable object holding count manifest entries, objects [base_offset, end_offset)."""

    key: str
    base_offset: int
    end_offset: int
    count: int


def _base_offset(seg: ArchivedSegment) -> int:
    return seg.base_offset


def part_bytes(entries: tuple[ArchivedSegment, ...]) -> bytes:
    return json.dumps(
        {"format": FORMAT_PARTS, "segments": [s.to_json() for s in entries]}, sort_keys=True
    ).encode()


def part_entries(raw: bytes, key: str) -> tuple[ArchivedSegment, ...]:
    try:
        data = json.loads(raw)
        _check_format("archive-manifest", data, key)
        return tuple(ArchivedSegment.from_json(s) for s in data["segments"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ArchiveCorrupt(f"{key}: not a manifest part ({exc})", key=key) from None


def cluster_marker(raw: bytes, key: str = CLUSTER_KEY) -> dict[str, Any]:
    """cluster.json's fields, its format checked (UnsupportedFormatVersion if newer than this
    build reads; ArchiveCorrupt if it is no JSON object)."""
    try:
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise TypeError("not an object")
    except (ValueError, TypeError) as exc:
        raise ArchiveCorrupt(f"{key}: not a tidelog archive's ({exc})", key=key) from None
    _check_format("archive-cluster", data, key)
    return data


def _check_format(name: str, data: Any, key: str) -> int:
    """The "format" of an archive object's JSON, if this build reads it (a missing one is
    ArchiveCorrupt, a newer one UnsupportedFormatVersion naming the key)."""
    found = data.get("format") if isinstance(data, dict) else None
    if not isinstance(found, int) or isinstance(found, bool):
        raise ArchiveCorrupt(f"{key}: format {found!r}", key=key)
    return check_version(name, found, f"archive object {key}")


@dataclass(frozen=True)
class Gap:
    """A range the archive was never given: released by archive.lag.policy=release, or deleted
    locally before the archive was enabled. Recorded, so a reader is told, never surprised."""

    start_offset: int
    end_offset: int
    reason: str


@dataclass(frozen=True)
class Manifest:
    cluster_id: str
    topic: str
    topic_id: int
    partition: int
    leader_epoch: int = -1  # the epoch of the leader that last wrote it
    # the archive's first offset (its cleaner moves it; an emptied one keeps where it stopped);
    # -1: it never held anything
    start_offset: int = -1
    segments: tuple[ArchivedSegment, ...] = ()
    gaps: tuple[Gap, ...] = ()
    configs: dict[str, str] = field(default_factory=dict)  # the topic's, for a restore
    partitions: int = 1  # how many the topic had, for a restore
    parts: tuple[ManifestPart, ...] = ()  # sealed entries (the first of segments), oldest first

    @property
    def head(self) -> tuple[ArchivedSegment, ...]:
        """The entries the manifest object itself holds: those after its last part."""
        if not self.parts:
            return self.segments
        sealed_end = self.parts[-1].end_offset  # (entries are in offset order: a bisection)
        return self.segments[bisect_left(self.segments, sealed_end, key=_base_offset) :]

    def to_seal(self, version: int | None = None) -> tuple[ArchivedSegment, ...]:
        """The oldest PART_ENTRIES of the head, once it holds more than HEAD_MAX: the next part
        (none while the manifest is written in format 1, which has no parts; version: default,
        what the process's feature level writes)."""
        if version is None:
            version = write_version("archive-manifest")
        head = self.head
        return head[:PART_ENTRIES] if len(head) > HEAD_MAX and version >= FORMAT_PARTS else ()

    def sealed(self, part: ManifestPart) -> Manifest:
        return replace(self, parts=(*self.parts, part))

    @property
    def end_offset(self) -> int:
        """One past the last archived offset (-1: nothing archived yet)."""
        return self.segments[-1].end_offset if self.segments else -1

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    def segment_for(self, offset: int) -> ArchivedSegment | None:
        """The object holding offset, or the first one after it (an offset in a gap)."""
        for seg in self.segments:
            if seg.end_offset > offset:
                return seg
        return None

    def appended(self, seg: ArchivedSegment, leader_epoch: int) -> Manifest:
        gaps = self.gaps
        if self.segments and seg.base_offset > self.end_offset:
            gaps += (Gap(self.end_offset, seg.base_offset, "not archived before local deletion"),)
        start = self.start_offset if self.segments else seg.base_offset
        return replace(
            self,
            segments=(*self.segments, seg),
            leader_epoch=max(self.leader_epoch, leader_epoch),
            start_offset=start,
            gaps=gaps,
        )

    def without_below(self, offset: int) -> tuple[Manifest, list[ArchivedSegment]]:
        """The manifest without the objects wholly below offset (its cleaner), and those."""
        gone = [s for s in self.segments if s.end_offset <= offset]
        kept = self.segments[len(gone) :]
        if not gone:
            return self, []
        # Emptied, it keeps where its cleaner left it (holds_until: the metadata log's record
        # of what the store holds must not read an emptied archive as a lost one).
        start = kept[0].base_offset if kept else max(offset, gone[-1].end_offset)
        gaps = tuple(g for g in self.gaps if g.end_offset > start)
        # A part with nothing left goes (its object with the objects); one partly cleaned
        # stays, its entries below the start ignored when it is read.
        parts = tuple(p for p in self.parts if kept and p.end_offset > start)
        return replace(self, segments=kept, start_offset=start, gaps=gaps, parts=parts), gone

    def parts_without(self, other: Manifest) -> list[ManifestPart]:
        """The parts self names that other does not (to delete once other is written)."""
        keep = {p.key for p in other.parts}
        return [p for p in self.parts if p.key not in keep]

    def check_continuity(self) -> list[str]:
        """What is wrong with it: holes not recorded as gaps, overlaps, epochs going back."""
        problems: list[str] = []
        recorded = {(g.start_offset, g.end_offset) for g in self.gaps}
        last_epoch = -1
        for prev, seg in zip(self.segments, self.segments[1:], strict=False):
            if seg.base_offset < prev.end_offset:
                problems.append(
                    f"{seg.key} starts at {seg.base_offset}, inside {prev.key} (ends at "
                    f"{prev.end_offset}): overlap"
                )
            elif (
                seg.base_offset > prev.end_offset
                and (prev.end_offset, seg.base_offset) not in recorded
            ):
                problems.append(
                    f"hole [{prev.end_offset}, {seg.base_offset}) between {prev.key} and {seg.key}"
                )
        for seg in self.segments:
            if seg.end_offset <= seg.base_offset:
                problems.append(f"{seg.key}: empty range [{seg.base_offset}, {seg.end_offset})")
            for epoch, _ in seg.epochs:
                if epoch < last_epoch:
                    problems.append(f"{seg.key}: leader epoch {epoch} after {last_epoch}")
                last_epoch = max(last_epoch, epoch)
        return problems

    def to_bytes(self) -> bytes:
        data: dict[str, Any] = {
            "format": FORMAT_PARTS if self.parts else FORMAT,
            "cluster_id": self.cluster_id,
            "topic": self.topic,
            "topic_id": self.topic_id,
            "partition": self.partition,
            "partitions": self.partitions,
            "leader_epoch": self.leader_epoch,
            "start_offset": self.start_offset,
            "end_offset": self.end_offset,
            "configs": self.configs,
            "gaps": [asdict(g) for g in self.gaps],
            "segments": [s.to_json() for s in self.head],
        }
        if self.parts:
            data["parts"] = [asdict(p) for p in self.parts]
        return json.dumps(data, indent=1, sort_keys=True).encode()

    @staticmethod
    def from_bytes(
        raw: bytes, key: str = "manifest.json", read_part: Callable[[str], bytes] | None = None
    ) -> Manifest:
        """The manifest and, for a format-2 one, every entry of its parts, each part read with
        read_part(key) (a store's get, or a cache of it: parts never change)."""
        try:
            data = json.loads(raw)
            _check_format("archive-manifest", data, key)
            parts = tuple(
                ManifestPart(
                    str(p["key"]), int(p["base_offset"]), int(p["end_offset"]), int(p["count"])
                )
                for p in data.get("parts", [])
            )
            start = int(data["start_offset"])
            sealed: list[ArchivedSegment] = []
            for part in parts:
                if read_part is None:
                    raise ArchiveCorrupt(f"{key}: names parts, and nothing reads them", key=key)
                sealed.extend(
                    s for s in part_entries(read_part(part.key), part.key) if s.base_offset >= start
                )
            return Manifest(
                cluster_id=str(data["cluster_id"]),
                topic=str(data["topic"]),
                topic_id=int(data["topic_id"]),
                partition=int(data["partition"]),
                partitions=int(data.get("partitions", 1)),
                leader_epoch=int(data["leader_epoch"]),
                start_offset=int(data["start_offset"]),
                configs={str(k): str(v) for k, v in dict(data.get("configs", {})).items()},
                gaps=tuple(
                    Gap(int(g["start_offset"]), int(g["end_offset"]), str(g["reason"]))
                    for g in data.get("gaps", [])
                ),
                segments=(
                    *sealed,
                    *(ArchivedSegment.from_json(s) for s in data["segments"]),
                ),
                parts=parts,
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ArchiveCorrupt(f"{key}: not a manifest ({exc})", key=key) from None


def holds_until(manifest: Manifest | None) -> int:
    """One past the last offset a manifest accounts for: its end, or where its cleaner left it
    when it emptied it; -1 for none."""
    if manifest is None:
        return -1
    return manifest.end_offset if manifest.segments else manifest.start_offset


# -- objects ----------------------------------------------------------------------------------------


def describe_object(
    data: bytes, key: str, uploaded_by: int = -1, uploaded_ms: int = 0
) -> ArchivedSegment:
    """The manifest entry of an object made of these whole batches (CRCs checked: nothing
    damaged on the local disk is archived as if it were data)."""
    epochs: list[tuple[int, int]] = []
    index: list[tuple[int, int]] = []
    first_ts, max_ts = -1, -1
    last: BatchHeader | None = None
    next_index_at = 0
    try:
        for pos, header in iter_headers(data):
            if not epochs or epochs[-1][0] != header.partition_leader_epoch:
                epochs.append((header.partition_leader_epoch, header.base_offset))
            if pos >= next_index_at:
                index.append((header.base_offset, pos))
                next_index_at = pos + INDEX_INTERVAL_BYTES
            if first_ts < 0:
                first_ts = header.base_timestamp
            max_ts = max(max_ts, header.max_timestamp)
            last = header
    except CorruptRecord as exc:
        raise ArchiveCorrupt(f"{key}: {exc}", key=key) from None
    if last is None:
        raise ArchiveCorrupt(f"{key}: no batches", key=key)
    return ArchivedSegment(
        key=key,
        base_offset=index[0][0],
        end_offset=last.next_offset,
        size=len(data),
        crc32c=crc32c(data),
        first_timestamp=first_ts,
        max_timestamp=max_ts,
        epochs=tuple(epochs),
        index=tuple(index),
        uploaded_by=uploaded_by,
        uploaded_ms=uploaded_ms,
    )


def check_object(seg: ArchivedSegment, data: bytes) -> None:
    """The object is what its manifest entry says, byte for byte (size and CRC-32C)."""
    if len(data) != seg.size:
        raise ArchiveCorrupt(
            f"{seg.key}: {len(data)} bytes, the manifest says {seg.size} (truncated?)", key=seg.key
        )
    actual = crc32c(data)
    if actual != seg.crc32c:
        raise ArchiveCorrupt(
            f"{seg.key}: CRC-32C {actual:#010x}, the manifest says {seg.crc32c:#010x}",
            key=seg.key,
        )
