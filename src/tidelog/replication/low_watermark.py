"""What decides what may be deleted: the low-water mark, from facts, in one place.

The LWM is the minimum over everything that still needs the log. `decide_low_watermark` is a
pure function from facts -- the leader's view of its replicas, the partition's segments (sizes,
timestamps), its cursors (positions, idle times, bytes behind), its newest snapshot, its config
and the time -- to the LWM, the hold that sets it, every hold considered and the cursors past
their caps, which the caller invalidates. The node gathers the facts from its disk and the
metadata log, the simulator from its model; both run these rules, and the node only does the IO
(moving the log start, deleting segments, recording invalidations).

The holds, each named and inspectable:
  replica    each follower the leader tracks, until replica.max.lag.ms out of touch
  retention  retention.ms / retention.bytes over closed segments (cleanup.policy=delete);
             none for compact-only topics; for state-machine logs the snapshot replaces it
  snapshot   state-machine logs: the newest snapshot minus snapshot.catchup.entries
  cursor     a named consumer position (backup: a backup cursor), until cursor.max.lag.bytes
             or cursor.max.idle.ms; cursors.hold=false makes cursors advisory
  archive    topics with remote.storage.enable: what the archive has not copied yet; there
             local.retention.* stands in for retention.*, and a cursor holds locally only what
             the archive cannot serve it (archive.lag.policy=release caps it)
  transaction  each transaction whose marker is not below the HW (open, or decided above it),
             from its first offset: the LWM never passes the LSO; the coordinator's
             transaction.timeout.ms bounds how long one holds
  high-watermark  the ceiling: nothing uncommitted is ever discarded
A hold past its cap is reported but does not hold, and says why.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tidelog.config import TopicConfig

KIND_REPLICA = "replica"
KIND_CURSOR = "cursor"
KIND_BACKUP = "backup"
KIND_SNAPSHOT = "snapshot"
KIND_RETENTION = "retention"
KIND_HIGH_WATERMARK = "high-watermark"
KIND_ARCHIVE = "archive"
KIND_TRANSACTION = "transaction"


@dataclass(frozen=True)
class Hold:
    kind: str
    name: str
    offset: int
    detail: str = ""
    live: bool = True  # False: past its cap; reported but not holding
    why_not: str = ""

    def describe(self) -> str:
        text = f"{self.kind} {self.name} at {self.offset}"
        if self.detail:
            text += f" ({self.detail})"
        if not self.live:
            text += f" [not holding: {self.why_not}]"
        return text


# -- the facts ----------------------------------------------------------------------------------


class SegmentView(Protocol):
    @property
    def base_offset(self) -> int: ...

    @property
    def size_bytes(self) -> int: ...

    @property
    def retention_timestamp(self) -> int:
        """Its age: the newest record's timestamp, never later than its last write."""
        ...


@dataclass(frozen=True)
class CursorFact:
    name: str
    position: int  # the next offset its owner will read
    committed_ms: int  # when its owner last committed
    lag_bytes: int  # bytes stored from position to the log end
    backup: bool = False
    invalidated: str = ""  # why it stopped holding; "" while live


@dataclass(frozen=True)
class ArchiveFact:
    name: str  # the archive's URL
    archived_end: int  # everything below is archived (the log start when nothing is)
    start_offset: int  # the archive's first offset (-1: it holds nothing)
    detail: str = ""
    live: bool = True
    why_not: str = ""
    lag_bytes: int = 0
    segments_behind: int = 0
    error: str = ""  # the name of the error the last attempt met ("" if it worked)


@dataclass(frozen=True)
class TransactionFact:
    """A transaction not stable yet: its marker is not below the HW (storage/transactions.py)."""

    producer_id: int
    producer_epoch: int
    first_offset: int
    age_ms: int  # since this replica appended (or recovered) its first batch
    marker_offset: int = -1  # -1: still open


class UnstableTransaction(Protocol):
    @property
    def producer_id(self) -> int: ...

    @property
    def producer_epoch(self) -> int: ...

    @property
    def first_offset(self) -> int: ...

    @property
    def opened_ms(self) -> int: ...


class TransactionsView(Protocol):
    def unstable(self, high_watermark: int) -> Sequence[UnstableTransaction]: ...


def transaction_facts(
    transactions: TransactionsView, high_watermark: int, now_ms: int
) -> tuple[TransactionFact, ...]:
    """The facts of a log's unstable transactions (what the cleaner and the simulator gather)."""
    return tuple(
        TransactionFact(
            t.producer_id,
            t.producer_epoch,
            t.first_offset,
            max(0, now_ms - t.opened_ms),
            getattr(t, "marker_offset", -1),
        )
        for t in transactions.unstable(high_watermark)
    )


def transaction_hold(fact: TransactionFact) -> Hold:
    state = "open" if fact.marker_offset < 0 else f"decided at {fact.marker_offset}"
    detail = f"epoch {fact.producer_epoch}, {state}, {human_ms(fact.age_ms)} old"
    return Hold(KIND_TRANSACTION, f"producer {fact.producer_id}", fact.first_offset, detail)


@dataclass(frozen=True)
class LowWatermarkFacts:
    log_start_offset: int
    high_watermark: int
    segments: Sequence[SegmentView]  # oldest first; the last one is the active segment
    config: TopicConfig
    now_ms: int
    replicas: tuple[Hold, ...] = ()  # the replication core's holds (Replica.replica_holds)
    cursors: tuple[CursorFact, ...] = ()
    snapshot_offset: int | None = None  # the newest durable snapshot (state-machine logs)
    state_machine: bool = False
    archive: ArchiveFact | None = None
    transactions: tuple[TransactionFact, ...] = ()  # every unstable one: the LSO's holds


@dataclass(frozen=True)
class LowWatermark:
    offset: int
    hold: Hold  # the hold that sets it
    holds: tuple[Hold, ...]  # every hold considered, live or not
    to_invalidate: tuple[tuple[str, str], ...] = ()  # (cursor, why): past a cap, still live
    cursor_stats: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return {
            "offset": self.offset,
            "set_by": self.hold.describe(),
            "holds": [
                {
                    "kind": h.kind,
                    "name": h.name,
                    "offset": h.offset,
                    "live": h.live,
                    "detail": h.detail,
                    "why_not": h.why_not,
                }
                for h in self.holds
            ],
        }


# -- the decision -------------------------------------------------------------------------------


def decide_low_watermark(facts: LowWatermarkFacts) -> LowWatermark:
    holds = list(facts.replicas)
    holds.extend(_log_holds(facts))
    holds.extend(transaction_hold(t) for t in facts.transactions)
    archive = facts.archive
    if archive is not None:
        holds.append(
            Hold(
                KIND_ARCHIVE,
                archive.name,
                archive.archived_end,
                archive.detail,
                archive.live,
                archive.why_not,
            )
        )
    to_invalidate: list[tuple[str, str]] = []
    stats: dict[str, Mapping[str, int]] = {}
    for cursor in sorted(facts.cursors, key=lambda c: c.name):
        hold, why = _cursor_hold(cursor, facts)
        holds.append(hold)
        if why:
            to_invalidate.append((cursor.name, why))
        stats[cursor.name] = {
            "position": cursor.position,
            "lag": max(0, facts.high_watermark - cursor.position),
            "lead": cursor.position - facts.log_start_offset,
            "lag_bytes": cursor.lag_bytes,
            "idle_ms": max(0, facts.now_ms - cursor.committed_ms),
        }
    lwm = compute_low_watermark(holds, facts.log_start_offset, facts.high_watermark)
    return LowWatermark(lwm.offset, lwm.hold, lwm.holds, tuple(to_invalidate), stats)


def compute_low_watermark(
    holds: Iterable[Hold], log_start_offset: int, high_watermark: int
) -> LowWatermark:
    """min over live holds, never below the log start, never above the HW."""
    all_holds = tuple(holds)
    ceiling = Hold(KIND_HIGH_WATERMARK, "hw", high_watermark, "nothing uncommitted is discarded")
    best = ceiling
    for hold in all_holds:
        if hold.live and hold.offset < best.offset:
            best = hold
    offset = max(log_start_offset, best.offset)
    return LowWatermark(offset, best, all_holds)


def _log_holds(facts: LowWatermarkFacts) -> list[Hold]:
    config = facts.config
    if facts.state_machine:
        # A state-machine log is kept by its snapshots, not by age or size.
        keep = facts.log_start_offset
        snap = facts.snapshot_offset
        if snap is None:
            return [Hold(KIND_SNAPSHOT, "latest", keep, "no snapshot yet: everything is kept")]
        keep = max(keep, snap - config.snapshot_catchup_entries)
        detail = f"snapshot at {snap}, keeping {config.snapshot_catchup_entries} entries behind it"
        return [Hold(KIND_SNAPSHOT, "latest", keep, detail)]
    if facts.archive is not None:
        # Local retention: what stays on this disk; the whole log's retention is the archive's.
        config = dataclasses.replace(
            config,
            retention_ms=config.effective_local_retention_ms,
            retention_bytes=config.effective_local_retention_bytes,
        )
    if "delete" in config.cleanup_policy:
        verdict = retention_keep_from(facts.segments, facts.log_start_offset, config, facts.now_ms)
    else:  # compact only: retention never deletes, compaction keeps the latest per key
        verdict = RetentionVerdict(facts.log_start_offset, "unlimited")
    detail = {
        "retention.ms": f"segments older than {human_ms(config.retention_ms)} may go",
        "retention.bytes": f"over {human_bytes(config.retention_bytes)} may go",
        "within-limits": "nothing is past retention.ms or retention.bytes",
        "unlimited": "nothing is deleted by age or size",
    }[verdict.reason]
    return [Hold(KIND_RETENTION, verdict.reason, verdict.keep_from, detail)]


def _cursor_hold(cursor: CursorFact, facts: LowWatermarkFacts) -> tuple[Hold, str]:
    """The cursor's hold, and why to invalidate it ("": it is within its caps)."""
    config = facts.config
    kind = KIND_BACKUP if cursor.backup else KIND_CURSOR
    idle_ms = max(0, facts.now_ms - cursor.committed_ms)
    detail = f"idle {human_ms(idle_ms)}, {human_bytes(cursor.lag_bytes)} behind"
    position = cursor.position
    readable_from = facts.log_start_offset
    archive = facts.archive
    if archive is not None:
        # What the archive holds, it serves: the cursor holds locally only from there.
        if 0 <= archive.start_offset < readable_from:
            readable_from = archive.start_offset
        if position < archive.archived_end:
            detail += f", position {position} is read from the archive"
            position = archive.archived_end
    if not config.cursors_hold:
        return Hold(kind, cursor.name, position, detail, False, "cursors.hold=false"), ""
    if cursor.invalidated:
        return Hold(kind, cursor.name, position, detail, False, cursor.invalidated), ""
    why = ""
    if cursor.position < readable_from:
        why = f"position {cursor.position} is below the log start {readable_from}"
    elif 0 <= config.cursor_max_lag_bytes < cursor.lag_bytes:
        why = (
            f"{human_bytes(cursor.lag_bytes)} behind > cursor.max.lag.bytes "
            f"{human_bytes(config.cursor_max_lag_bytes)}"
        )
    elif 0 <= config.cursor_max_idle_ms < idle_ms:
        why = f"idle {human_ms(idle_ms)} > cursor.max.idle.ms {human_ms(config.cursor_max_idle_ms)}"
    elif config.cursor_max_idle_ms >= 0:
        detail += f", invalidated in {human_ms(config.cursor_max_idle_ms - idle_ms)} if idle"
    return Hold(kind, cursor.name, position, detail, live=not why, why_not=why), why


# -- retention: predicates over whole segments (Kafka's retention.ms and retention.bytes) --------


@dataclass(frozen=True)
class RetentionVerdict:
    keep_from: int  # retention wants every offset >= keep_from kept
    # "retention.ms" or "retention.bytes" (that rule set it), "within-limits", "unlimited"
    reason: str


def retention_keep_from(
    segments: Sequence[SegmentView], log_start_offset: int, config: TopicConfig, now_ms: int
) -> RetentionVerdict:
    """The first offset retention keeps: everything below is eligible for deletion. Only closed
    segments are candidates, never the active one."""
    closed = segments[:-1]
    keep = log_start_offset
    limited = config.retention_ms >= 0 or config.retention_bytes >= 0
    reason = "within-limits" if limited else "unlimited"
    if config.retention_ms >= 0:
        for i, seg in enumerate(closed):
            if now_ms - seg.retention_timestamp > config.retention_ms:
                nxt = segments[i + 1].base_offset
                if nxt > keep:
                    keep, reason = nxt, "retention.ms"
            else:
                break
    if config.retention_bytes >= 0:
        # Oldest closed segments go while the partition is over retention.bytes; with a pass at
        # every roll, the partition stays within retention.bytes plus the active segment.
        total = sum(s.size_bytes for s in segments)
        for i, seg in enumerate(closed):
            if total <= config.retention_bytes:
                break
            total -= seg.size_bytes
            nxt = segments[i + 1].base_offset
            if nxt > keep:
                keep, reason = nxt, "retention.bytes"
    return RetentionVerdict(keep, reason)


def human_ms(ms: int) -> str:
    s = ms / 1000
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    if s < 172800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{n} B"
