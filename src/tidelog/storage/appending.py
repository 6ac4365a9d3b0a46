"""Checks shared by every log implementation before bytes are appended."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Protocol

from tidelog.config import TopicConfig
from tidelog.errors import (
    CorruptRecord,
    DuplicateSequence,
    InvalidRecord,
    InvalidRequest,
    OutOfOrderSequence,
)
from tidelog.invariant import InvariantBroken
from tidelog.record.batch import BatchHeader, decode_records, iter_headers, read_header, stamp
from tidelog.record.validation import ValidatedBatches
from tidelog.storage.producer_state import ProducerState


def stamp_leader_batches(
    data: bytes | bytearray | memoryview | ValidatedBatches,
    epoch: int,
    log_end_offset: int,
    max_batch_bytes: int,
    producers: ProducerState | None = None,
    batch_at: Callable[[int], bytes | None] | None = None,
) -> tuple[bytearray, list[tuple[int, BatchHeader]]]:
    """Check batches (layout and CRC, unless a producer's payload already passed
    validate_produced), drop replays of idempotent producers, and stamp offsets (from
    log_end_offset) and the leader epoch. DuplicateSequence when every batch is a replay."""
    if isinstance(data, ValidatedBatches):
        buf = bytearray(data.data)
        headers = list(data.headers)
    else:
        buf = bytearray(data)
        headers = list(iter_headers(buf, max_batch_bytes=max_batch_bytes))
    if not headers:
        raise InvalidRequest("produce request carries no record batch")
    if producers is not None:
        for pos, header in headers:
            original = producers.is_duplicate(header)
            if original is None or not producers.maybe_reused(header, original):
                continue
            written = batch_at(original.base_offset) if batch_at is not None else None
            if written is None or _compacted(written):
                # Below the log start, or compaction removed records of it (a producer's
                # newest batch may be left empty): nothing to compare with (as Kafka: a
                # duplicate).
                continue
            if _contents(written) != _contents(bytes(buf[pos : pos + header.size_bytes])):
                raise InvalidRecord(
                    f"producer {header.producer_id} epoch {header.producer_epoch} already wrote "
                    f"sequence {header.base_sequence} at offset {original.base_offset} with "
                    "other records: a producer may not reuse sequence numbers",
                    rule="sequence_reuse",
                    base_offset=original.base_offset,
                )
        fresh = [(pos, h) for pos, h in headers if producers.is_duplicate(h) is None]
        if not fresh:
            last = headers[-1][1]
            original = producers.is_duplicate(last)
            if original is None:
                raise InvariantBroken("original is not None")
            raise DuplicateSequence(
                f"producer {last.producer_id} already wrote sequence "
                f"{last.base_sequence} (epoch {last.producer_epoch})",
                base_offset=original.base_offset,
                last_offset=original.last_offset,
            )
        _check_sequences(producers, [h for _, h in fresh])
        if len(fresh) < len(headers):
            buf = bytearray(b"".join(bytes(buf[p : p + h.size_bytes]) for p, h in fresh))
            headers = list(iter_headers(buf, max_batch_bytes=max_batch_bytes))
    next_offset = log_end_offset
    stamped: list[tuple[int, BatchHeader]] = []
    for pos, header in headers:
        stamp(buf, pos, next_offset, epoch)
        stamped.append(
            (pos, header._replace(base_offset=next_offset, partition_leader_epoch=epoch))
        )
        next_offset += header.last_offset_delta + 1
    return buf, stamped


class _Chunk(Protocol):
    def read(self) -> bytes: ...


class _Readable(Protocol):
    @property
    def log_start_offset(self) -> int: ...

    @property
    def log_end_offset(self) -> int: ...

    def read(self, start_offset: int, max_bytes: int, max_offset: int) -> _Chunk | None: ...


class _LeaderLog(_Readable, Protocol):
    @property
    def producers(self) -> ProducerState: ...

    @property
    def config(self) -> TopicConfig: ...


def stamp_as_leader(
    log: _LeaderLog, data: bytes | bytearray | memoryview | ValidatedBatches, epoch: int
) -> tuple[bytearray, list[tuple[int, BatchHeader]]]:
    """stamp_leader_batches for a log that appends them as its leader (either log kind)."""
    return stamp_leader_batches(
        data,
        epoch,
        log.log_end_offset,
        log.config.max_message_bytes,
        log.producers,
        functools.partial(read_batch_at, log),
    )


def read_batch_at(log: _Readable, offset: int) -> bytes | None:
    """The batch that begins at offset, if the log still holds it (read on a rare path: a
    producer's replay whose bytes differ from what it replays)."""
    if not log.log_start_offset <= offset < log.log_end_offset:
        return None
    chunk = log.read(offset, 1, log.log_end_offset)
    if chunk is None:
        return None
    data = chunk.read()
    header = read_header(data)
    return bytes(data[: header.size_bytes]) if header.base_offset == offset else None


def _compacted(batch: bytes) -> bool:
    """Whether compaction removed records of the batch (fewer records than offsets)."""
    header = read_header(batch)
    return header.records_count <= header.last_offset_delta


def _contents(batch: bytes) -> list[tuple[bytes | None, bytes | None, object]]:
    """What a batch says, without its timestamps: a replay encoded anew keeps these."""
    return [(r.key, r.value, r.headers) for r in decode_records(batch)]


def _check_sequences(producers: ProducerState, headers: list[BatchHeader]) -> None:
    """An idempotent producer's batches land in sequence order with no gap within an epoch:
    a batch that would skip one (an earlier one failed and is being retried, while this one
    was already in flight) is refused, so the log always holds a prefix of what the producer
    sent, and the retried batch's sequence is still free."""
    last: dict[int, tuple[int, int]] = {}
    for header in headers:
        expected = producers.gap(header, last.get(header.producer_id))
        if expected is not None:
            raise OutOfOrderSequence(
                f"producer {header.producer_id} sent sequence {header.base_sequence} (epoch "
                f"{header.producer_epoch}) but the log expects {expected} next: an earlier "
                "batch has not landed yet",
                expected=expected,
            )
        if header.producer_id >= 0 and header.base_sequence >= 0:
            last[header.producer_id] = (header.producer_epoch, header.last_sequence)


def check_follower_batches(
    data: bytes | bytearray | memoryview, log_end_offset: int
) -> list[tuple[int, BatchHeader]]:
    """Validate replicated batches (CRC again on receipt) and their offset order."""
    headers = list(iter_headers(data))
    if not headers:
        raise InvalidRequest("no record batch to append")
    expected = log_end_offset
    for _, header in headers:
        if header.base_offset < expected:
            raise CorruptRecord(f"batch base offset {header.base_offset} is below {expected}")
        expected = header.next_offset
    return headers
