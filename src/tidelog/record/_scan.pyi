def scan_records(
    data: bytes | bytearray | memoryview,
    count: int,
    base_timestamp: int,
    require_keys: bool,
    last_offset_delta: int,
    /,
) -> tuple[int, int, int, int]: ...
