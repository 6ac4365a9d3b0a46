"""Zig-zag varints as Kafka's record format uses them (protobuf's sint32/sint64 encoding)."""

from __future__ import annotations

from tidelog.errors import CorruptRecord

VARINT_BYTES_MAX = 10


def encode_varint(value: int, out: bytearray) -> None:
    z = (value << 1) ^ (value >> 63)
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)


def size_of_varint(value: int) -> int:
    z = (value << 1) ^ (value >> 63)
    size = 1
    while z >= 0x80:
        z >>= 7
        size += 1
    return size


def decode_varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """Return (value, next position); a truncated or overlong varint is a CorruptRecord."""
    result = 0
    shift = 0
    end = len(buf)
    while True:
        if pos >= end:
            raise CorruptRecord("varint runs past the end of the batch")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if shift >= 7 * VARINT_BYTES_MAX:
            raise CorruptRecord("varint longer than 10 bytes")
    return (result >> 1) ^ -(result & 1), pos
