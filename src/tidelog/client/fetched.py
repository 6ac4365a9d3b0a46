"""What a fetch returns, and how its batches are read: as records or as column buffers, past
any batch that cannot be read when the caller asks to skip such batches."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from tidelog.errors import CorruptRecord
from tidelog.record.batch import BatchHeader, Record, decode_records, iter_headers
from tidelog.record.columns import (
    OFFSET_MAX,
    BatchItem,
    RecordColumns,
    batch_items,
    decode_columns,
)

# The client logs under one name, the one it had before it was split into modules (log filters
# and the text format show it).
log = logging.getLogger("tidelog.client.async_client")


@dataclass(frozen=True)
class FetchResult:
    """One fetch's answer. `raw` holds the batches as they came; `records` (decoded on first
    use) and `columns()` read them, dropping records below `from_offset` and control batches
    unless include_control was asked for. A read_committed fetch's `batches` leave out those
    of aborted transactions (client/consume.py's committed_only)."""

    partition: int
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    next_offset: int
    node_id: int
    raw: bytes = b""
    from_offset: int = 0
    include_control: bool = False
    skip_invalid: bool = False
    where: str = ""
    # (position, header) of each batch in raw, CRC-checked once when the answer arrived
    batches: tuple[tuple[int, BatchHeader], ...] | None = None
    leader_epoch: int = -1  # the answering replica's epoch (KIP-320: name it in the next fetch)
    last_stable_offset: int = -1  # the answering replica's LSO (-1: a node before transactions)

    @cached_property
    def records(self) -> list[Record]:
        records, _ = decode_fetched(
            self.raw,
            self.from_offset,
            self.include_control,
            self.skip_invalid,
            self.where,
            batches=self.batches,
        )
        if records:
            self._check_below_hw(records[-1].offset)
        return records

    def columns(
        self, end_offset: int | None = None, include_headers: bool = False
    ) -> RecordColumns:
        """The records at from_offset <= offset < end_offset as column buffers (the Spark
        source's path: no Python object per record)."""
        stop = OFFSET_MAX if end_offset is None else end_offset
        items = list(
            batch_items(
                self.raw,
                self.from_offset,
                stop,
                include_control=self.include_control,
                batches=self.batches,
            )
        )
        try:
            columns = decode_columns([item for _, item in items], include_headers)
        except CorruptRecord:
            # Find the batch that cannot be read, name it, and skip it if asked to.
            good = [
                item
                for header, item in items
                if _readable(header, item, include_headers, self.skip_invalid, self.where)
            ]
            columns = decode_columns(good, include_headers)
        last = columns.last_offset()
        if last is not None:
            self._check_below_hw(last)
        return columns

    def _check_below_hw(self, offset: int) -> None:
        if offset >= self.high_watermark:
            raise CorruptRecord(
                f"node {self.node_id} returned offset {offset} at or above its HW "
                f"{self.high_watermark}"
            )


def decode_fetched(
    payload: bytes,
    from_offset: int,
    include_control: bool = False,
    skip_invalid: bool = False,
    where: str = "",
    *,
    batches: Sequence[tuple[int, BatchHeader]] | None = None,
) -> tuple[list[Record], int]:
    """Decode fetched batches (CRC-checked here, unless `batches` says where they are, already
    checked); records below from_offset are dropped.
    Returns (records, the offset to fetch next). A batch whose records cannot be decoded raises
    CorruptRecord naming its offsets, or with skip_invalid is skipped with a warning."""
    records: list[Record] = []
    next_offset = from_offset
    for pos, header in iter_headers(payload) if batches is None else batches:
        next_offset = max(next_offset, header.next_offset)
        if header.is_control and not include_control:
            continue
        if header.last_offset < from_offset:
            continue
        try:
            records += decode_records(payload, pos, from_offset)
        except CorruptRecord as exc:
            _unreadable(header, exc, skip_invalid, where)
    return records, next_offset


def _unreadable(header: BatchHeader, exc: CorruptRecord, skip_invalid: bool, where: str) -> None:
    span = f"{where} offsets {header.base_offset}..{header.last_offset}"
    if not skip_invalid:
        raise CorruptRecord(
            f"{span} hold a batch that cannot be read ({exc.message}); read with "
            "skip_invalid (tidelog consume --skip-invalid, Spark option "
            "skipInvalidBatches) to pass over it",
            base_offset=header.base_offset,
            last_offset=header.last_offset,
        ) from None
    log.warning("skipping %s: a batch that cannot be read (%s)", span, exc.message)


def _readable(
    header: BatchHeader, item: BatchItem, include_headers: bool, skip_invalid: bool, where: str
) -> bool:
    try:
        decode_columns([item], include_headers)
    except CorruptRecord as exc:
        _unreadable(header, exc, skip_invalid, where)
        return False
    return True
