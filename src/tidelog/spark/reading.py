"""Executor-side reading of one offset range into Arrow record batches.

A range's end was a high-water mark when the driver planned it, so everything in it is
committed and stays the same forever (replays read identical rows). Two things can still be
in the way: a new leader that has not yet re-learned the HW (we wait, bounded), and a log
start that moved past the range's start (data loss: fail, or skip with a warning)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from concurrent.futures import Future

import pyarrow as pa

from tidelog.archive.manifest import Manifest
from tidelog.archive.reader import iter_batches
from tidelog.archive.store import open_store
from tidelog.client.async_client import FetchResult
from tidelog.errors import (
    ArchiveError,
    DataLoss,
    NetworkError,
    NotLeader,
    OffsetOutOfRange,
    Timeout,
)
from tidelog.invariant import InvariantBroken
from tidelog.record.batch import read_header
from tidelog.spark.arrow import columns_to_batch
from tidelog.spark.connection import client_of
from tidelog.spark.planning import OffsetRange

log = logging.getLogger(__name__)

COMMITTED_WAIT_S = 120.0  # how long a range may wait for a new leader to re-learn the HW


def data_loss_message(topic: str, partition: int, first: int, last: int, log_start: int) -> str:
    return (
        f"{topic}/{partition}: offsets {first}..{last} are no longer in the log (its start is "
        f"now {log_start}); retention or delete-records removed them before this query read "
        "them. Hold them with the source option 'cursor', or set the source option "
        "failOnDataLoss=false to skip lost ranges with a warning."
    )


def read_ranges(ranges: tuple[OffsetRange, ...]) -> Iterator[pa.RecordBatch]:
    """One Spark task: its ranges in turn."""
    for r in ranges:
        yield from read_range(r)


def read_range(r: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Arrow batches of the range's records, one per fetch. The next fetch is sent before the
    current answer is decoded and handed to Spark, so the network and the node work while this
    process does."""
    offset = r.start
    if r.archive is not None and offset < r.archive.archived_end:
        try:
            for batch, next_offset in read_archived(r):
                if batch is not None:
                    yield batch
                offset = next_offset
        except ArchiveError as exc:
            # The store is not reachable from here (a file:// archive on another machine, no
            # credentials): the nodes serve the rest of it, as they do any fetch.
            log.warning("%s/%d: reading the archive from the nodes: %s", r.topic, r.partition, exc)
    client = client_of(r)
    deadline = time.monotonic() + COMMITTED_WAIT_S

    def fetch(at: int) -> Future[FetchResult]:
        return client.fetch_ahead(
            r.topic,
            r.partition,
            at,
            max_bytes=r.fetch_max_bytes,
            max_wait_ms=200,
            skip_invalid=r.skip_invalid,
            isolation_level=r.isolation_level,
        )

    ahead: Future[FetchResult] | None = None
    while offset < r.end:
        try:
            result = (ahead or fetch(offset)).result()
        except OffsetOutOfRange as exc:
            if exc.log_start <= offset:
                raise
            last = min(exc.log_start, r.end) - 1
            message = data_loss_message(r.topic, r.partition, offset, last, exc.log_start)
            if r.fail_on_data_loss:
                raise DataLoss(
                    message, topic=r.topic, partition=r.partition, first=offset, last=last
                ) from None
            log.warning("skipping lost offsets: %s", message)
            offset = last + 1
            continue
        except (NetworkError, NotLeader, Timeout):
            # The client already retried across a leader change; keep trying until the deadline.
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
            continue
        finally:
            ahead = None
        if offset < result.next_offset < r.end:
            ahead = fetch(result.next_offset)
        columns = result.columns(r.end, r.include_headers)
        if columns.rows:
            deadline = time.monotonic() + COMMITTED_WAIT_S
            yield columns_to_batch(columns, r.topic, r.partition, r.include_headers, r.columns)
        if result.next_offset > offset:
            offset = result.next_offset
        elif time.monotonic() > deadline:
            raise Timeout(
                f"{r.topic}/{r.partition}: offsets from {offset} below {r.end} were committed "
                f"but the leader's HW is {result.high_watermark} after {COMMITTED_WAIT_S:.0f}s"
            )


def read_archived(r: OffsetRange) -> Iterator[tuple[pa.RecordBatch | None, int]]:
    """(Arrow batch or None, next offset) for the part of r the archive held when it was
    planned, read straight from the store (no node in the way), about fetch_max_bytes at a
    time, every batch CRC-checked: the same columns a fetch gives."""
    if r.archive is None:
        raise InvariantBroken("r.archive is not None")
    where = r.archive
    store = open_store(where.url, where.endpoint)
    key = f"{where.prefix}/manifest.json"
    manifest = Manifest.from_bytes(store.get(key), key, store.get)
    stop = min(r.end, manifest.end_offset)
    offset = r.start
    pending: list[bytes] = []
    size = 0
    for seg in manifest.segments:
        if seg.end_offset <= offset:
            continue
        if seg.base_offset >= stop:
            break
        for header, batch in iter_batches(store, seg, offset, r.fetch_max_bytes):
            if header.base_offset >= stop:
                break
            pending.append(batch)
            size += len(batch)
            if size >= r.fetch_max_bytes:
                end = min(stop, header.next_offset)
                yield _archived_columns(r, b"".join(pending), offset, end), end
                offset, pending, size = end, [], 0
    if pending:
        end = min(stop, read_header(pending[-1]).next_offset)
        yield _archived_columns(r, b"".join(pending), offset, end), end


def _archived_columns(r: OffsetRange, raw: bytes, offset: int, end: int) -> pa.RecordBatch | None:
    # Everything archived was below the HW when it was archived: end is a safe bound.
    result = FetchResult(
        r.partition, end, -1, end, end, -1, raw, offset, skip_invalid=r.skip_invalid
    )
    columns = result.columns(end, r.include_headers)
    if not columns.rows:
        return None
    return columns_to_batch(columns, r.topic, r.partition, r.include_headers, r.columns)
