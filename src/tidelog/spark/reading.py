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

from tidelog.client.async_client import FetchResult
from tidelog.errors import DataLoss, NetworkError, NotLeader, OffsetOutOfRange, Timeout
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
    client = client_of(r)
    offset = r.start
    deadline = time.monotonic() + COMMITTED_WAIT_S

    def fetch(at: int) -> Future[FetchResult]:
        return client.fetch_ahead(
            r.topic,
            r.partition,
            at,
            max_bytes=r.fetch_max_bytes,
            max_wait_ms=200,
            skip_invalid=r.skip_invalid,
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
