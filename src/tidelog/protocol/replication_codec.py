"""Replication messages on the wire: one-way frames whose payload is the records, if any."""

from __future__ import annotations

import dataclasses
from typing import Any

from tidelog.errors import InvalidRequest
from tidelog.protocol.api import decode, field_names
from tidelog.record.slices import BytesSlice
from tidelog.replication.messages import (
    BeginEpoch,
    EpochNotice,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    Message,
    RecordsSlice,
    Resign,
    TransferLeadership,
    VoteRequest,
    VoteResponse,
)

_TYPES: dict[str, type[Any]] = {
    cls.__name__: cls
    for cls in (
        VoteRequest,
        VoteResponse,
        BeginEpoch,
        EpochNotice,
        Resign,
        TransferLeadership,
        FetchRequest,
        FetchResponse,
        FetchSnapshotRequest,
        FetchSnapshotResponse,
    )
}


def encode_message(group: str, message: Message) -> tuple[dict[str, Any], RecordsSlice | None]:
    """(header, records to send as the payload)."""
    header: dict[str, Any] = {"group": group, "type": type(message).__name__}
    records: RecordsSlice | None = None
    for name in field_names(type(message)):
        value = getattr(message, name)
        if name == "records":
            records = value
            if value is not None:
                header["records_first_offset"] = value.first_offset
        else:
            header[name] = value
    return header, records


def decode_message(header: dict[str, Any], payload: bytes) -> tuple[str, Message]:
    group = header.get("group")
    cls = _TYPES.get(str(header.get("type")))
    if not isinstance(group, str) or cls is None:
        raise InvalidRequest("replication message without a valid group or type")
    fields = {
        k: v
        for k, v in header.items()
        if k not in ("group", "type", "records", "records_first_offset", "topic_id")
    }
    records = BytesSlice(payload, int(header.get("records_first_offset", -1))) if payload else None
    if cls is FetchResponse:
        message: Message = decode(_FetchResponseWire, fields).to_message(records)
    elif cls is FetchSnapshotResponse:
        message = FetchSnapshotResponse(
            records=records, **dataclasses.asdict(decode(_FetchSnapshotResponseWire, fields))
        )
    else:
        message = decode(cls, fields)
    return group, message


@dataclasses.dataclass(frozen=True)
class _FetchResponseWire:
    epoch: int
    leader: int
    fetch_offset: int
    high_watermark: int
    log_start_offset: int
    error: str = ""
    diverging: bool = False
    diverging_epoch: int = -1
    diverging_end_offset: int = -1
    snapshot_required: bool = False
    log_start_epoch: int = -1
    last_fetched_epoch: int = -1
    directories: str = ""
    memberships: str = ""
    quiesce: bool = False
    read_round: int = 0

    def to_message(self, records: RecordsSlice | None) -> FetchResponse:
        return FetchResponse(records=records, **dataclasses.asdict(self))


@dataclasses.dataclass(frozen=True)
class _FetchSnapshotResponseWire:
    epoch: int
    leader: int
    snapshot_offset: int
    size: int
    position: int
    error: str = ""
    memberships: str = ""
    snapshot_epoch: int = -1
