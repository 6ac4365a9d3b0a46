from collections.abc import Sequence
from typing import Any

_Buffer = bytes | bytearray | memoryview

def decode_records(
    data: _Buffer,
    count: int,
    base_offset: int,
    base_timestamp: int,
    last_offset_delta: int,
    min_offset: int,
    record_type: type[Any],
    /,
) -> list[Any]: ...
def decode_columns(
    items: Sequence[tuple[_Buffer, int, int, int, int, int, int]],
    include_headers: bool,
    /,
) -> tuple[Any, ...]: ...
def encode_records(records: Sequence[Any], default_timestamp: int, /) -> tuple[bytes, int, int]: ...
def encode_rows(
    rows: _Buffer,
    key_offsets: Any,
    key_data: Any,
    key_validity: Any,
    value_offsets: Any,
    value_data: Any,
    value_validity: Any,
    /,
) -> bytes: ...
