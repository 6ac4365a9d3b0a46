"""State-machine logs on a node: apply committed records, snapshot every ~snapshot.entries
(randomized per replica, as ZooKeeper does, so replicas do not all snapshot at once), keep
snapshot.retain snapshots, and serve/install snapshots for followers behind the log start."""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Iterator
from typing import Protocol

from tidelog.errors import CorruptRecord
from tidelog.record.batch import Record, decode_records, iter_headers
from tidelog.replication.log_interface import ReplicaLog
from tidelog.replication.metadata import MetadataState
from tidelog.replication.metadata_commands import (
    NODE_COMMANDS,
    MetadataCommand,
    PutPrincipal,
    RemovePrincipal,
    decode_command,
)
from tidelog.replication.table import TableState
from tidelog.storage.scrub import InvalidBatch
from tidelog.storage.snapshot import SnapshotMeta

log = logging.getLogger(__name__)


class Machine(Protocol):
    @property
    def applied_offset(self) -> int: ...

    def apply(self, records: list[Record], next_offset: int) -> None: ...

    def snapshot(self) -> bytes: ...

    def restore(self, payload: bytes, offset: int) -> None: ...


def committed_batches(
    slog: ReplicaLog,
    start: int,
    hw: int,
    on_invalid: Callable[[InvalidBatch], None] | None = None,
) -> Iterator[tuple[list[Record], int]]:
    """(records, offset after the batch) for every committed batch from start; control batches
    yield no records but still move the position, and so does a batch that cannot be read
    (written before batches were validated): every replica skips it alike, and says so."""
    offset = max(start, slog.log_start_offset)
    while offset < hw:
        chunk = slog.read(offset, 1024 * 1024, hw)
        if chunk is None:
            return
        data = chunk.read()
        for pos, header in iter_headers(data):
            records: list[Record] = []
            if not header.is_control:
                try:
                    records = [r for r in decode_records(data, pos) if r.offset >= offset]
                except CorruptRecord as exc:
                    if on_invalid is not None:
                        on_invalid(
                            InvalidBatch(
                                header.base_offset, header.last_offset, exc.name, exc.message
                            )
                        )
            yield records, min(header.next_offset, hw)
            offset = max(offset, header.next_offset)


class TableMachine:
    def __init__(self) -> None:
        self.state = TableState()

    @property
    def applied_offset(self) -> int:
        return self.state.applied_offset

    def apply(self, records: list[Record], next_offset: int) -> None:
        self.state.apply(records)
        self.state.applied_offset = max(self.state.applied_offset, next_offset)

    def snapshot(self) -> bytes:
        return self.state.to_snapshot()

    def restore(self, payload: bytes, offset: int) -> None:
        self.state = TableState.from_snapshot(payload, offset)


class MetadataMachine:
    """The cluster metadata; the name of each topic a command changed (created, deleted,
    altered, grown) is handed to the node as it is applied, and a restored snapshot as a
    whole."""

    def __init__(
        self,
        on_topic: Callable[[str], None],
        on_reset: Callable[[MetadataState], None],
        on_nodes: Callable[[], None] = lambda: None,
        on_principal: Callable[[str], None] = lambda name: None,
        on_applied: Callable[[MetadataCommand | None], None] = lambda command: None,
    ) -> None:
        self.state = MetadataState()
        # Every command applied (None: a snapshot installed): feature levels follow them.
        self._on_applied = on_applied
        self._on_topic = on_topic
        self._on_reset = on_reset
        self._on_nodes = on_nodes
        self._on_principal = on_principal

    @property
    def applied_offset(self) -> int:
        return self.state.applied_offset

    def apply(self, records: list[Record], next_offset: int) -> None:
        for rec in records:
            try:
                command = decode_command(json.loads(rec.value or b"{}"))
            except ValueError as exc:  # not JSON, or a MalformedCommand
                log.error("metadata offset %d: skipping unreadable command: %s", rec.offset, exc)
                self.state.applied_offset = rec.offset + 1
                continue
            changed = self.state.apply(rec.offset, command)
            if changed is not None:
                self._on_topic(changed)
            if command.KIND in NODE_COMMANDS:
                self._on_nodes()
            if isinstance(command, PutPrincipal | RemovePrincipal):
                self._on_principal(command.name)
            self._on_applied(command)
        self.state.applied_offset = max(self.state.applied_offset, next_offset)

    def snapshot(self) -> bytes:
        return json.dumps(self.state.to_snapshot(), sort_keys=True).encode()

    def restore(self, payload: bytes, offset: int) -> None:
        try:
            state = MetadataState.from_snapshot(json.loads(payload))
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptRecord(f"metadata snapshot is unreadable: {exc}") from exc
        state.applied_offset = offset
        self.state = state
        self._on_reset(state)
        self._on_applied(None)
        self._on_nodes()


class SnapshotFiles(Protocol):
    """Where snapshots are kept: SnapshotStore's files, or the simulator's MemorySnapshotStore."""

    def latest(self) -> SnapshotMeta | None: ...

    def write(self, offset: int, payload: bytes, epoch: int = -1) -> SnapshotMeta: ...

    def load(self, meta: SnapshotMeta) -> bytes: ...

    def read_chunk(self, offset: int, position: int, max_bytes: int) -> bytes: ...

    def partial_size(self, offset: int) -> int: ...

    def write_chunk(self, offset: int, position: int, data: bytes) -> int: ...

    def finish(self, offset: int, epoch: int = -1) -> SnapshotMeta: ...


class StateMachineDriver:
    """Keeps a machine applied up to the HW, snapshots it, and is the core's SnapshotAccess."""

    def __init__(
        self,
        group: str,
        slog: ReplicaLog,
        store: SnapshotFiles,
        machine: Machine,
        snapshot_entries: int,
        seed: int,
        on_invalid: Callable[[InvalidBatch], None] | None = None,
    ) -> None:
        self.group = group
        self.on_invalid = on_invalid
        self.log = slog
        self.store = store
        self.machine = machine
        self._rng = random.Random(seed)
        self._entries = snapshot_entries
        self._latest: SnapshotMeta | None = store.latest()
        self._threshold = self._draw_threshold()
        self.snapshots_taken = 0
        if self._latest is not None:
            machine.restore(store.load(self._latest), self._latest.offset)
            if self._latest.offset > slog.log_end_offset:
                # The snapshot is ahead of the log (installed from the leader before a crash).
                slog.truncate_fully_and_start_at(self._latest.offset, self._latest.epoch)

    def _draw_threshold(self) -> int:
        return self._rng.randint(max(1, self._entries // 2), max(1, self._entries - 1))

    @property
    def snapshot_offset(self) -> int | None:
        return self._latest.offset if self._latest is not None else None

    def catch_up(self) -> None:
        """Apply every committed record not applied yet; snapshot when due."""
        hw = self.log.high_watermark
        if self.machine.applied_offset < self.log.log_start_offset:
            return  # below the log start: only a snapshot can bring it forward
        batches = committed_batches(self.log, self.machine.applied_offset, hw, self.on_invalid)
        for records, next_offset in batches:
            self.machine.apply(records, next_offset)
        last = self._latest.offset if self._latest is not None else 0
        if self.machine.applied_offset - last >= self._threshold:
            self.take_snapshot()

    def take_snapshot(self) -> SnapshotMeta:
        offset = self.machine.applied_offset
        epoch = self.log.epochs.epoch_at(offset - 1) if offset > 0 else -1
        self._latest = self.store.write(offset, self.machine.snapshot(), epoch)
        self._threshold = self._draw_threshold()
        self.snapshots_taken += 1
        log.info(
            "%s: snapshot at offset %d (%d bytes)", self.group, offset, self._latest.size_bytes
        )
        return self._latest

    # -- SnapshotAccess -------------------------------------------------------------------------

    def latest_snapshot(self) -> tuple[int, int] | None:
        return (self._latest.offset, self._latest.size_bytes) if self._latest is not None else None

    def read_snapshot_chunk(self, offset: int, position: int, max_bytes: int) -> bytes:
        return self.store.read_chunk(offset, position, max_bytes)

    def partial_snapshot_size(self, offset: int) -> int:
        return self.store.partial_size(offset)

    def write_snapshot_chunk(self, offset: int, position: int, data: bytes) -> int:
        return self.store.write_chunk(offset, position, data)

    def finish_snapshot(self, offset: int, epoch: int = -1) -> bool:
        try:
            # (A version 1 snapshot's header has no epoch: the store keeps the leader's beside
            # it, so a restart before the log starts over at it still knows the epoch.)
            meta = self.store.finish(offset, epoch)
            self.machine.restore(self.store.load(meta), offset)
        except CorruptRecord as exc:
            log.warning(
                "%s: received snapshot %d is unusable (%s); fetching it again",
                self.group,
                offset,
                exc,
            )
            return False
        self._latest = meta
        log.info("%s: installed the leader's snapshot at offset %d", self.group, offset)
        return True
