"""`tidelog archive verify URL [--topic T]`: every object against its manifest entry (size,
CRC-32C of the whole object, every batch's own CRC, offsets inside the object's range and in
order), and every manifest's continuity (no hole that is not a recorded gap, no overlap, leader
epochs never decreasing), and that one cluster owns it all. Each entry's list of aborted
transactions (what a read_committed read of the archive drops) is checked against what the
archived batches and markers themselves say."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tidelog.archive.manifest import (
    CLUSTER_KEY,
    Manifest,
    check_object,
    cluster_marker,
    holds_until,
)
from tidelog.archive.reader import iter_batches
from tidelog.archive.store import ArchiveStore
from tidelog.errors import ArchiveError, ArchiveObjectMissing, UnsupportedFormatVersion
from tidelog.record.markers import read_marker
from tidelog.storage.transactions import TransactionState


@dataclass
class PartitionReport:
    topic: str
    topic_id: int
    partition: int
    start_offset: int
    end_offset: int
    objects: int
    bytes: int
    batches: int = 0
    holds_until: int = -1  # one past the last offset its manifest accounts for
    gaps: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def line(self) -> str:
        state = "ok" if not self.problems else f"{len(self.problems)} problem(s)"
        text = (
            f"{self.topic}/{self.partition} (topic id {self.topic_id}): {self.objects} objects, "
            f"offsets [{self.start_offset}, {self.end_offset}), {self.bytes:,} bytes, "
            f"{self.batches:,} batches: {state}"
        )
        for gap in self.gaps:
            text += f"\n  gap (recorded): {gap}"
        for problem in self.problems:
            text += f"\n  PROBLEM: {problem}"
        return text


@dataclass
class VerifyReport:
    url: str
    cluster_id: str
    partitions: list[PartitionReport]
    problems: list[str]
    archive_id: str = ""
    lost: list[str] = field(default_factory=list)  # ranges the cluster recorded lost (accepted)

    @property
    def ok(self) -> bool:
        return not self.problems and all(not p.problems for p in self.partitions)


def manifest_keys(store: ArchiveStore, topic: str | None = None) -> list[str]:
    return [k for k in store.list(topic or "") if k.endswith("/manifest.json")]


def verify_archive(store: ArchiveStore, topic: str | None = None) -> VerifyReport:
    problems: list[str] = []
    cluster_id = archive_id = ""
    try:
        claimed = cluster_marker(store.get(CLUSTER_KEY))
        cluster_id = str(claimed["cluster_id"])
        archive_id = str(claimed.get("archive_id", ""))
    except ArchiveObjectMissing:
        problems.append(
            f"ArchiveLost? {CLUSTER_KEY} is missing from {store.url}: the store lost what it "
            "held, or this is not a tidelog archive (--bootstrap compares it with what the "
            "cluster recorded)"
        )
    except (ArchiveError, UnsupportedFormatVersion) as exc:
        problems.append(f"{CLUSTER_KEY}: {exc.message}")
    except (KeyError, TypeError):
        problems.append(f"{CLUSTER_KEY} is not a tidelog archive's")
    reports = []
    for key in manifest_keys(store, topic):
        try:
            manifest = Manifest.from_bytes(store.get(key), key, store.get)
        except ArchiveError as exc:
            problems.append(exc.message)
            continue
        reports.append(verify_partition(store, manifest, cluster_id))
    if topic is not None and not reports:
        problems.append(f"no manifest of topic {topic!r} in {store.url}")
    return VerifyReport(store.url, cluster_id, reports, problems, archive_id)


def verify_partition(store: ArchiveStore, manifest: Manifest, cluster_id: str) -> PartitionReport:
    report = PartitionReport(
        manifest.topic,
        manifest.topic_id,
        manifest.partition,
        manifest.start_offset,
        manifest.end_offset,
        len(manifest.segments),
        manifest.size_bytes,
        holds_until=holds_until(manifest),
        gaps=[f"[{g.start_offset}, {g.end_offset}): {g.reason}" for g in manifest.gaps],
    )
    if cluster_id and manifest.cluster_id != cluster_id:
        report.problems.append(
            f"manifest of cluster {manifest.cluster_id}, the archive is cluster {cluster_id}"
        )
    report.problems.extend(manifest.check_continuity())
    transactions = TransactionState()  # derived from the archived batches, as a log does
    whole = not manifest.gaps
    for seg in manifest.segments:
        try:
            check_object(seg, store.get(seg.key))
            for header, batch in iter_batches(store, seg):
                report.batches += 1
                if header.is_transactional:
                    transactions.observe(header, read_marker(batch, header), 0)
        except ArchiveError as exc:
            report.problems.append(exc.message)
            whole = False
    if whole:  # (across a gap or a damaged object, what the batches say is not known)
        report.problems.extend(check_aborted_lists(manifest, transactions))
    return report


def check_aborted_lists(manifest: Manifest, transactions: TransactionState) -> list[str]:
    """Each entry's aborted transactions against those the archived batches derive. A
    transaction that began before the archive's start is found starting later by the batches
    (its first ones are gone): there only its producer and marker are compared."""
    problems = []
    for seg in manifest.segments:
        if seg.aborted_transactions is None:
            continue  # written before entries kept the list: read_committed refuses it
        derived = {
            (t.producer_id, t.marker_offset): t.first_offset
            for t in transactions.aborted_transactions(seg.base_offset, seg.end_offset)
        }
        # A marker past the archive's end is not archived yet (an object goes once it is below
        # the LSO, its transactions' markers maybe later): the batches cannot tell that abort.
        recorded = {
            (pid, marker): first
            for pid, first, marker in seg.aborted_transactions
            if marker < manifest.end_offset
        }

        # Begun before the archive's start: its first batches are not archived to tell.
        unknowable = {key for key, first in recorded.items() if first < manifest.start_offset}
        wrong = sorted(
            key
            for key in (recorded.keys() | derived.keys()) - unknowable
            if recorded.get(key) != derived.get(key)
        )
        if wrong:
            said = ", ".join(
                f"producer {pid} ending at {marker}: recorded "
                f"{_from(recorded.get((pid, marker)))}, the batches say "
                f"{_from(derived.get((pid, marker)))}"
                for pid, marker in wrong
            )
            problems.append(
                f"{seg.key}: aborted transactions listed wrong ({said}): a read_committed read "
                "of the archive would show aborted records or drop committed ones"
            )
    return problems


def _from(first: int | None) -> str:
    return "none" if first is None else f"from {first}"


def compare_with_cluster(
    report: VerifyReport,
    archive_id: str,
    extents: Sequence[Mapping[str, Any]],
    topic: str | None = None,
) -> list[str]:
    """What the store lacks of what the cluster's metadata log records it holds (its archive id
    and per-partition extents, as `archive describe` shows them): each named ArchiveLost (the
    store's identity, a partition's manifest, the end of its range)."""
    problems: list[str] = []
    if archive_id and report.archive_id != archive_id:
        problems.append(
            f"ArchiveLost: the store's archive id is {report.archive_id or '(none)'}, the "
            f"cluster recorded {archive_id}: this is not the store it archived to"
        )
    held = {(p.topic, p.topic_id, p.partition): p for p in report.partitions}
    for extent in extents:
        if topic is not None and extent["topic"] != topic:
            continue
        start, end = int(extent["start_offset"]), int(extent["end_offset"])
        for a, b in extent.get("lost", []):
            report.lost.append(f"{extent['topic']}/{extent['partition']}: [{a}, {b})")
        if end <= start or start < 0:
            continue
        found = held.get((extent["topic"], int(extent["topic_id"]), int(extent["partition"])))
        name = f"{extent['topic']}/{extent['partition']}"
        if found is None:
            problems.append(
                f"ArchiveLost: {name}: no manifest, the cluster recorded [{start}, {end}) archived"
            )
        elif found.holds_until < end:
            problems.append(
                f"ArchiveLost: {name}: the store holds up to {found.holds_until}, the cluster "
                f"recorded [{start}, {end}) archived"
            )
    return problems
