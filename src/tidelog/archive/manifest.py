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
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from tidelog.errors import ArchiveCorrupt, CorruptRecord
from tidelog.record.batch import BatchHeader, crc32c, iter_headers

FORMAT = 1
CLUSTER_KEY = "cluster.json"
# A sparse index entry per this many bytes of an object: a read fetches at most this much it
# does not need.
INDEX_INTERVAL_BYTES = 1024 * 1024


def partition_prefix(topic: str, topic_id: int, partition: int) -> str:
    return f"{topic}/{topic_id}/{partition}"


def manifest_key(topic: str, topic_id: int, partition: int) -> str:
    return f"{partition_prefix(topic, topic_id, partition)}/manifest.json"


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
        )


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
    start_offset: int = -1  # the archive's first offset (its cleaner moves it); -1: empty
    segments: tuple[ArchivedSegment, ...] = ()
    gaps: tuple[Gap, ...] = ()
    configs: dict[str, str] = field(default_factory=dict)  # the topic's, for a restore
    partitions: int = 1  # how many the topic had, for a restore

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
        start = kept[0].base_offset if kept else -1
        gaps = tuple(g for g in self.gaps if g.end_offset > (start if kept else offset))
        return replace(self, segments=kept, start_offset=start, gaps=gaps), gone

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
        data = {
            "format": FORMAT,
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
            "segments": [s.to_json() for s in self.segments],
        }
        return json.dumps(data, indent=1, sort_keys=True).encode()

    @staticmethod
    def from_bytes(raw: bytes, key: str = "manifest.json") -> Manifest:
        try:
            data = json.loads(raw)
            if int(data.get("format", -1)) != FORMAT:
                raise ArchiveCorrupt(f"{key}: manifest format {data.get('format')!r}", key=key)
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
                segments=tuple(ArchivedSegment.from_json(s) for s in data["segments"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ArchiveCorrupt(f"{key}: not a manifest ({exc})", key=key) from None


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
