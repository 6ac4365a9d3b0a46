"""The small view of storage the replication core uses (the simulator supplies a fake disk)."""

from __future__ import annotations

from typing import Protocol

from tidelog.record.validation import ValidatedBatches
from tidelog.replication.messages import RecordsSlice


class AppendResult(Protocol):
    @property
    def first_offset(self) -> int: ...

    @property
    def last_offset(self) -> int: ...

    @property
    def next_offset(self) -> int: ...


class EpochLookup(Protocol):
    @property
    def latest_epoch(self) -> int: ...

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]: ...

    def epoch_at(self, offset: int) -> int: ...


class TransactionLookup(Protocol):
    """A log's transactions, derived from its batches (storage/transactions.py)."""

    def stable_offset(self, high_watermark: int, log_start_offset: int) -> int:
        """The LSO for this HW and log start."""
        ...


class ReplicaLog(Protocol):
    @property
    def log_start_offset(self) -> int: ...

    @property
    def log_end_offset(self) -> int: ...

    @property
    def effective_durable_end(self) -> int: ...

    @property
    def high_watermark(self) -> int: ...

    @property
    def needs_flush(self) -> bool: ...

    @property
    def epochs(self) -> EpochLookup: ...

    @property
    def transactions(self) -> TransactionLookup: ...

    def set_high_watermark(self, hw: int) -> None: ...

    def append_as_leader(
        self, data: bytes | bytearray | memoryview | ValidatedBatches, epoch: int
    ) -> AppendResult: ...

    def append_as_follower(self, data: bytes | bytearray | memoryview) -> AppendResult: ...

    def truncate_to(self, offset: int) -> None: ...

    def truncate_fully_and_start_at(self, offset: int, prefix_epoch: int = -1) -> None: ...

    def advance_log_start(self, offset: int) -> bool: ...

    def read(self, start_offset: int, max_bytes: int, max_offset: int) -> RecordsSlice | None: ...


class SnapshotAccess(Protocol):
    """The snapshots of a state-machine log, as the core needs them (the node owns the files
    and the state machine)."""

    def latest_snapshot(self) -> tuple[int, int] | None:
        """(offset, size in bytes) of the newest snapshot."""
        ...

    def read_snapshot_chunk(self, offset: int, position: int, max_bytes: int) -> bytes: ...

    def partial_snapshot_size(self, offset: int) -> int: ...

    def write_snapshot_chunk(self, offset: int, position: int, data: bytes) -> int: ...

    def finish_snapshot(self, offset: int, epoch: int = -1) -> bool:
        """Verify the received snapshot and load it into the state machine. epoch: the leader's
        word for the epoch of the last entry it covers (kept with the snapshot)."""
        ...
