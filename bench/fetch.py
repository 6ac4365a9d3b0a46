"""Fetch throughput of one tidelog node against reading the same bytes from a file.

    .venv/bin/python bench/fetch.py [--records 300000]

The log holds N committed 1 KiB records in batches of 1000. A consumer fetches them all from
offset 0 with 1 MiB fetches; it validates every batch (header and CRC-32C) as any consumer
must, and, in the second row, also decodes every record. The bound, in the same run: a Python
loop that pread()s the segment files in 1 MiB chunks (page cache), with and without the CRC.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path

from common import RECORD_BYTES, make_batch, print_table, scratch_dir
from tidelog.cli.args import run_loop
from tidelog.cli.cluster import LocalCluster
from tidelog.client.async_client import AsyncClient
from tidelog.client.sync_client import Client
from tidelog.record import decode_records, iter_headers
from tidelog.record.batch import decode_records_py, records_payload

FETCH_BYTES = 1024 * 1024


async def fill(bootstrap: str, records: int, batch_records: int) -> None:
    async with AsyncClient(bootstrap) as client:
        await client.create_topic("fetch", configs={"segment.bytes": str(256 * 1024 * 1024)})
        batch = make_batch(batch_records)
        pending = []
        for _ in range(records // batch_records):
            pending.append(asyncio.create_task(client.produce_batch("fetch", 0, batch, "1")))
            if len(pending) >= 8:
                await asyncio.gather(*pending)
                pending = []
        await asyncio.gather(*pending)


async def fetch_all(bootstrap: str, decode: str) -> tuple[int, int, float]:
    """decode: "records" (Record objects, compiled), "reference" (the pure-Python decoder),
    "columns" (Arrow-layout column buffers, compiled), or "" (headers only)."""
    async with AsyncClient(bootstrap) as client:
        end = await client.list_offsets("fetch", 0, "latest")
        offset, records, size = 0, 0, 0
        start = time.perf_counter()
        while offset < end:
            result = await client.fetch("fetch", 0, offset, max_bytes=FETCH_BYTES)
            size += len(result.raw)
            if decode == "records":
                records += len(result.records)
            elif decode == "columns":
                records += result.columns().rows
            elif decode == "reference":
                records += reference_count(result.raw)
            else:
                records += sum(h.records_count for _, h in iter_headers(result.raw))
            offset = result.next_offset
        return records, size, time.perf_counter() - start


async def consume_all(bootstrap: str, max_bytes: int = FETCH_BYTES) -> tuple[int, int, float]:
    """The consumer API: consume_batches pipelines fetches (the next is sent before a fetch's
    records are decoded and handed over), Record objects decoded by the compiled codec."""
    async with AsyncClient(bootstrap) as client:
        records = 0
        start = time.perf_counter()
        async for batch in client.consume_batches("fetch", 0, "earliest", max_bytes=max_bytes):
            records += len(batch)
        elapsed = time.perf_counter() - start
    return records, records * (RECORD_BYTES + 70), elapsed


def read_columns(bootstrap: str) -> tuple[int, int, float]:
    """The Spark source's reader (one fetch ahead, Arrow column buffers, 4 MiB fetches) outside
    Spark."""
    from tidelog.spark.planning import OffsetRange
    from tidelog.spark.reading import read_range

    with Client(bootstrap) as client:
        end = client.list_offsets("fetch", 0, "latest")
    r = OffsetRange(bootstrap, "fetch", 0, 0, end, True, False, 4 << 20, False, ("key", "value"))
    rows, size = 0, 0
    start = time.perf_counter()
    for batch in read_range(r):
        rows += batch.num_rows
        size += batch.nbytes
    return rows, size, time.perf_counter() - start


async def fetch_raw(bootstrap: str) -> tuple[int, int, float]:
    """Fetch without decoding records: just batch validation (what fetch() does minus decode)."""
    from tidelog.protocol import api
    from tidelog.protocol.api import ApiKey

    async with AsyncClient(bootstrap) as client:
        end = await client.list_offsets("fetch", 0, "latest")
        info = await client.topic("fetch")
        address = (await client.nodes())[info.assignments[0][0]]
        offset, records, size = 0, 0, 0
        start = time.perf_counter()
        while offset < end:
            _, payload = await client.call(
                address, ApiKey.FETCH, api.FetchRequest("fetch", 0, offset, FETCH_BYTES)
            )
            size += len(payload)
            for _, header in iter_headers(payload):
                records += header.records_count
                offset = header.next_offset
        return records, size, time.perf_counter() - start


def reference_count(raw: bytes) -> int:
    """Records in raw decoded by the pure-Python reference decoder."""
    count = 0
    for pos, h in iter_headers(raw):
        section = records_payload(memoryview(raw)[pos:], h)
        records = decode_records_py(
            section, h.records_count, h.base_offset, h.base_timestamp, h.last_offset_delta
        )
        count += len(records)
    return count


async def fetched_payloads(bootstrap: str) -> list[bytes]:
    async with AsyncClient(bootstrap) as client:
        end = await client.list_offsets("fetch", 0, "latest")
        offset, out = 0, []
        while offset < end:
            result = await client.fetch("fetch", 0, offset, max_bytes=FETCH_BYTES)
            out.append(result.raw)
            offset = result.next_offset
        return out


def decode_only(payloads: list[bytes], compiled: bool) -> tuple[int, int, float]:
    """Decoding alone, from payloads already in memory (CRC-checked again, as the client does)."""
    records = 0
    start = time.perf_counter()
    for raw in payloads:
        if compiled:
            records += sum(len(decode_records(raw, pos)) for pos, _ in iter_headers(raw))
        else:
            records += reference_count(raw)
    return records, sum(map(len, payloads)), time.perf_counter() - start


def read_bound(directory: Path, crc: bool) -> tuple[int, int, float]:
    start = time.perf_counter()
    records, size = 0, 0
    for path in sorted(directory.glob("*.log")):
        fd = os.open(path, os.O_RDONLY)
        try:
            position = 0
            while True:
                chunk = os.pread(fd, FETCH_BYTES, position)
                if not chunk:
                    break
                usable = chunk
                if crc:
                    last_end = 0
                    for pos, header in iter_headers_partial(chunk):
                        records += header.records_count
                        last_end = pos + header.size_bytes
                    usable = chunk[:last_end]
                size += len(usable)
                position += len(usable)
        finally:
            os.close(fd)
    if not crc:
        records = size // (RECORD_BYTES + 8)
    return records, size, time.perf_counter() - start


def tcp_bound(directory: Path) -> tuple[int, int, float]:
    """The same bytes over loopback TCP into one Python process: a thread sendfile()s the
    segment files, the reader recv_into()s a 1 MiB buffer. No framing, no CRC."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    files = sorted(directory.glob("*.log"))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            for path in files:
                with open(path, "rb") as f:
                    conn.sendfile(f)

    sender = threading.Thread(target=serve)
    sender.start()
    total = sum(p.stat().st_size for p in files)
    buf = bytearray(FETCH_BYTES)
    view = memoryview(buf)
    received = 0
    with socket.create_connection(("127.0.0.1", port)) as sock:
        start = time.perf_counter()
        while received < total:
            n = sock.recv_into(view)
            if not n:
                break
            received += n
        elapsed = time.perf_counter() - start
    sender.join()
    listener.close()
    return received // (RECORD_BYTES + 8), received, elapsed


def iter_headers_partial(chunk: bytes):  # type: ignore[no-untyped-def]
    from tidelog.record.batch import peek_size, validate

    pos = 0
    while True:
        size = peek_size(chunk, pos)
        if size is None or pos + size > len(chunk):
            return
        yield pos, validate(chunk, pos)
        pos += size


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=300_000)
    args = parser.parse_args()
    data = scratch_dir("fetch-")
    cluster = LocalCluster(data, nodes=1, log_level="WARNING")
    rows = []
    with cluster:
        run_loop(fill(cluster.bootstrap, args.records, 1000))
        log_dir = data / "node-1" / "fetch-0"
        for _ in range(2):  # warm the page cache once, report the second pass
            raw = read_bound(log_dir, crc=False)
            bound = read_bound(log_dir, crc=True)
            fetched = run_loop(fetch_raw(cluster.bootstrap))
            decoded = run_loop(fetch_all(cluster.bootstrap, "records"))
            columns = run_loop(fetch_all(cluster.bootstrap, "columns"))
            consumed = run_loop(consume_all(cluster.bootstrap))
            consumed_4m = run_loop(consume_all(cluster.bootstrap, 4 << 20))
            spark_reader = read_columns(cluster.bootstrap)
            reference = run_loop(fetch_all(cluster.bootstrap, "reference"))
            payloads = run_loop(fetched_payloads(cluster.bootstrap))
            only = decode_only(payloads, compiled=True)
            only_reference = decode_only(payloads, compiled=False)
            tcp = tcp_bound(log_dir)
        for name, (records, size, elapsed) in [
            ("tidelog fetch, CRC-checked batches", fetched),
            ("tidelog fetch + decode every record (compiled)", decoded),
            ("tidelog fetch + decode into Arrow columns (compiled)", columns),
            ("tidelog fetch + decode every record (pure-Python reference)", reference),
            ("consume_batches(): fetches pipelined, Record objects", consumed),
            ("consume_batches(max_bytes=4 MiB)", consumed_4m),
            ("Spark source reader: one fetch ahead, 4 MiB, Arrow key+value", spark_reader),
            ("decode alone, payloads in memory (compiled)", only),
            ("decode alone, payloads in memory (pure-Python reference)", only_reference),
            ("bound: pread 1 MiB chunks", raw),
            ("bound: pread + CRC-checked batches", bound),
            ("bound: same bytes over loopback TCP", tcp),
        ]:
            rows.append([name, records, records / elapsed, size / elapsed / 1e6])
    ratio_raw = rows[0][2] / rows[9][2]
    ratio_crc = rows[0][2] / rows[10][2]
    print(f"\nfetch of {args.records:,} committed 1 KiB records (batches of 1000), 1 MiB fetches")
    print_table(["what", "records", "records/s", "MB/s"], rows)
    print(
        f"tidelog fetch / raw read = {ratio_raw:.2f}; tidelog fetch / (read + CRC) = {ratio_crc:.2f}"
    )


if __name__ == "__main__":
    main()
