"""Every length a Kafka request declares, checked against the bytes its frame holds, before kio
decodes it.

kio's readers are native (Rust) and allocate for an array's declared length before reading a
byte of it: a 20-byte request declaring a compact array of 2^32-2 elements asked for 32 GiB and
aborted the whole node (`memory allocation of 34359738352 bytes failed`), before SASL and ACLs
ran. kio promises nothing about hostile lengths, so this walk runs first. It follows the same
schema kio decodes with (kio's dataclasses and their `kafka_type` metadata), allocates nothing,
and refuses a request whose array, string, bytes or tagged-field lengths exceed what remains of
the frame: an array of n elements needs at least n times its element's smallest encoding, as
Kafka's own readers require (`ByteBufferAccessor`, "Tried to allocate a collection of size n,
but there are only m bytes remaining"). What passes can only ask kio for memory in proportion to
the frame, which the listener has already bounded.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from types import NoneType, UnionType
from typing import Any

from tidelog.errors import InvalidRequest

# A field's check: (buffer, position, end) -> position after it. Raises _Short.
Check = Callable[[memoryview, int, int], int]


class _Short(Exception):
    pass


_FIXED = {
    "bool": 1,
    "int8": 1,
    "int16": 2,
    "uint16": 2,
    "int32": 4,
    "uint32": 4,
    "int64": 8,
    "float64": 8,
    "timedelta_i32": 4,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "uuid": 16,
}


def check_request(schema: type[Any], frame: memoryview) -> None:
    """Refuse (InvalidRequest) a request frame (after its size) whose header or body declares
    more than the frame holds."""
    try:
        position = _plan(schema.__header_schema__, header=True)(frame, 0, len(frame))
        _plan(schema, header=False)(frame, position, len(frame))
    except _Short as exc:
        raise InvalidRequest(f"api {schema.__api_key__} v{schema.__version__}: {exc}") from None


def _uvarint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end:
            raise _Short("varint: the frame ends inside it")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise _Short("varint: longer than 5 bytes")


def _int(buf: memoryview, pos: int, end: int, size: int) -> tuple[int, int]:
    if pos + size > end:
        raise _Short("the frame ends inside a length")
    return int.from_bytes(buf[pos : pos + size], "big", signed=True), pos + size


def _fixed(size: int) -> Check:
    def check(buf: memoryview, pos: int, end: int) -> int:
        if pos + size > end:
            raise _Short(f"the frame ends inside a {size}-byte field")
        return pos + size

    return check


def _sized(name: str, flexible: bool, width: int) -> Check:
    """A string, bytes or records field: a length (int16 or int32, -1 for null; compact:
    uvarint of length + 1, 0 for null) and that many bytes."""

    def check(buf: memoryview, pos: int, end: int) -> int:
        if flexible:
            length, pos = _uvarint(buf, pos, end)
            length -= 1
        else:
            length, pos = _int(buf, pos, end, width)
        if length > end - pos:
            raise _Short(f"{name}: declares {length} bytes, {end - pos} remain")
        return pos + max(0, length)

    return check


def _array(name: str, flexible: bool, element: Check, smallest: int) -> Check:
    def check(buf: memoryview, pos: int, end: int) -> int:
        if flexible:
            count, pos = _uvarint(buf, pos, end)
            count -= 1
        else:
            count, pos = _int(buf, pos, end, 4)
        if count * max(1, smallest) > end - pos:
            raise _Short(
                f"{name}: declares {count} elements of at least {max(1, smallest)} bytes, "
                f"{end - pos} bytes remain"
            )
        for _ in range(count):
            pos = element(buf, pos, end)
        return pos

    return check


def _tagged(name: str, known: dict[int, Check]) -> Check:
    """A flexible entity's tagged fields: a count, then (tag, size, size bytes) each; a known
    tag's value must also fit its own size."""

    def check(buf: memoryview, pos: int, end: int) -> int:
        count, pos = _uvarint(buf, pos, end)
        if count > end - pos:
            raise _Short(f"{name}: declares {count} tagged fields, {end - pos} bytes remain")
        for _ in range(count):
            tag, pos = _uvarint(buf, pos, end)
            size, pos = _uvarint(buf, pos, end)
            if size > end - pos:
                raise _Short(f"{name}: tagged field {tag} declares {size} bytes")
            inner = known.get(tag)
            if inner is not None:
                inner(buf, pos, pos + size)
            pos += size
        return pos

    return check


def _element_type(hint: Any) -> tuple[Any, bool]:
    """(the type a field holds, whether it is an array), through Optional and tuple[...]."""
    if typing.get_origin(hint) in (UnionType, typing.Union):
        hint = next(a for a in typing.get_args(hint) if a is not NoneType)
    if typing.get_origin(hint) is tuple:
        return typing.get_args(hint)[0], True
    return hint, False


_PLANS: dict[tuple[type[Any], bool], tuple[Check, int]] = {}


def _plan(entity: type[Any], header: bool) -> Check:
    return _plan_with_size(entity, header)[0]


def _plan_with_size(entity: type[Any], header: bool) -> tuple[Check, int]:
    """The check of one entity, and the fewest bytes it can take."""
    found = _PLANS.get((entity, header))
    if found is not None:
        return found
    flexible = bool(entity.__flexible__)
    hints = typing.get_type_hints(entity)
    steps: list[Check] = []
    known_tags: dict[int, Check] = {}
    smallest = 0
    for field in dataclasses.fields(entity):
        inner, is_array = _element_type(hints[field.name])
        name = f"{entity.__name__}.{field.name}"
        if dataclasses.is_dataclass(inner):
            element, element_size = _plan_with_size(inner, header=False)  # type: ignore[arg-type]
        else:
            kafka_type = field.metadata["kafka_type"]
            # The request header's client id is a legacy nullable string in every version.
            compact = flexible and not (header and field.name == "client_id")
            if kafka_type in _FIXED:
                element_size = _FIXED[kafka_type]
                element = _fixed(element_size)
            elif kafka_type == "string":
                element, element_size = _sized(name, compact, 2), 1 if compact else 2
            elif kafka_type in ("bytes", "records"):
                element, element_size = _sized(name, compact, 4), 1 if compact else 4
            else:
                raise TypeError(f"{name}: kafka type {kafka_type!r} has no bounds check")
        check = _array(name, flexible, element, element_size) if is_array else element
        tag = field.metadata.get("tag")
        if tag is not None:
            known_tags[int(tag)] = check
            continue
        steps.append(check)
        smallest += (1 if flexible else 4) if is_array else element_size
    if flexible:
        steps.append(_tagged(entity.__name__, known_tags))
        smallest += 1

    def run(buf: memoryview, pos: int, end: int) -> int:
        for step in steps:
            pos = step(buf, pos, end)
        return pos

    _PLANS[(entity, header)] = (run, smallest)
    return run, smallest
