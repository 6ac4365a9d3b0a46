"""A table topic's state machine: key -> latest value, applied from committed records only; a
null value deletes the key. Snapshots are the whole map (sorted, length-prefixed)."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from tidelog.errors import CorruptRecord
from tidelog.invariant import InvariantBroken
from tidelog.record.batch import Record

_LEN = struct.Struct(">I")


@dataclass
class TableState:
    entries: dict[bytes, bytes] = field(default_factory=dict)
    applied_offset: int = 0  # exclusive: every committed record below has been applied

    def apply(self, records: Iterable[Record]) -> None:
        for rec in records:
            if not rec.offset >= self.applied_offset:
                raise InvariantBroken((rec.offset, self.applied_offset))
            if rec.key is not None:
                if rec.value is None:
                    self.entries.pop(rec.key, None)
                else:
                    self.entries[rec.key] = rec.value
            self.applied_offset = rec.offset + 1

    def get(self, key: bytes) -> bytes | None:
        return self.entries.get(key)

    def scan(
        self, after: bytes | None = None, limit: int | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        n = 0
        for key in sorted(self.entries):
            if after is not None and key <= after:
                continue
            if limit is not None and n >= limit:
                return
            n += 1
            yield key, self.entries[key]

    def to_snapshot(self) -> bytes:
        out = bytearray()
        for key in sorted(self.entries):
            value = self.entries[key]
            out += _LEN.pack(len(key)) + key + _LEN.pack(len(value)) + value
        return bytes(out)

    @staticmethod
    def from_snapshot(payload: bytes, offset: int) -> TableState:
        entries: dict[bytes, bytes] = {}
        pos = 0
        end = len(payload)
        while pos < end:
            if pos + 4 > end:
                raise CorruptRecord("table snapshot entry cut short")
            (klen,) = _LEN.unpack_from(payload, pos)
            key = payload[pos + 4 : pos + 4 + klen]
            pos += 4 + klen
            if pos + 4 > end:
                raise CorruptRecord("table snapshot entry cut short")
            (vlen,) = _LEN.unpack_from(payload, pos)
            value = payload[pos + 4 : pos + 4 + vlen]
            pos += 4 + vlen
            if len(key) != klen or len(value) != vlen:
                raise CorruptRecord("table snapshot entry cut short")
            entries[key] = value
        return TableState(entries, offset)
