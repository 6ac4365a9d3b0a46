"""Shared pieces of the benchmarks: a node to measure, the machine's bound, and a table."""

from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from tidelog.cli.progress import Progress
from tidelog.client.async_client import AsyncClient
from tidelog.record import ProducerRecord, build_batch
from tidelog.tls import TlsFiles

RECORD_BYTES = 1024


def scratch_dir(prefix: str) -> Path:
    """On the project disk (the same one the node writes to), not a tmpfs; removed when the
    benchmark exits (a run writes gigabytes) unless TIDELOG_BENCH_KEEP is set."""
    base = Path(
        os.environ.get("TIDELOG_BENCH_DIR", Path(__file__).resolve().parent.parent / ".bench")
    )
    base.mkdir(exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    if not os.environ.get("TIDELOG_BENCH_KEEP"):
        atexit.register(shutil.rmtree, path, True)
    return path


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def make_batch(records: int, seed: int = 0) -> bytes:
    payload = os.urandom(RECORD_BYTES) if seed == 0 else bytes([seed % 256]) * RECORD_BYTES
    return build_batch([ProducerRecord(None, payload)] * records, now_ms=int(time.time() * 1000))


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for i, row in enumerate(cells):
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
        if i == 0:
            print("  ".join("-" * w for w in widths))


def _fmt(value: object) -> str:
    if isinstance(value, float):
        if value != value:
            return "-"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def fsync_append_bound(batch: bytes, seconds: float, directory: Path) -> tuple[float, list[float]]:
    """A plain Python loop: os.write the batch, os.fdatasync, repeat. Returns (batches/s, latencies)."""
    path = directory / "bound.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    latencies: list[float] = []
    count = 0
    try:
        start = time.perf_counter()
        deadline = start + seconds
        while True:
            t0 = time.perf_counter()
            os.write(fd, batch)
            os.fdatasync(fd)
            t1 = time.perf_counter()
            latencies.append(t1 - t0)
            count += 1
            if t1 >= deadline:
                break
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink()
    return count / elapsed, latencies


def replicas_disk_bound(seconds: float, writers: int = 3, chunk: int = 1 << 20) -> float:
    """Bytes/s that `writers` threads appending `chunk` + fdatasync each, to their own files on
    this disk, write in total: what RF `writers` replicas on one machine can make durable."""
    results: list[float] = []
    dirs = [scratch_dir(f"disk{i}-") for i in range(writers)]
    threads = [
        threading.Thread(
            target=lambda d=d: results.append(fsync_append_bound(b"x" * chunk, seconds, d)[0])
        )
        for d in dirs
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(results) * chunk


async def run_producers(
    bootstrap: str,
    topic: str,
    batch: bytes,
    producers: int,
    seconds: float,
    acks: str,
    idempotent: bool = True,
    connections_max: int | None = None,
    tls: TlsFiles | None = None,
) -> tuple[int, float, list[float]]:
    """`producers` producers, each sending batch to partition 0 one at a time for `seconds`,
    over at most connections_max clients (default: one each): (batches sent, elapsed seconds,
    each ack's latency)."""
    connections = min(producers, connections_max or producers)
    clients = [AsyncClient(bootstrap, idempotent=idempotent, tls=tls) for _ in range(connections)]
    for c in clients:
        await c.topic(topic)
    latencies: list[float] = []
    sent = [0]
    start = time.perf_counter()
    deadline = start + seconds
    progress = Progress(f"{producers} producer(s) to {topic}", seconds, unit="batches")

    async def one(client: AsyncClient) -> None:
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            await client.produce_batch(topic, 0, batch, acks)
            t1 = time.perf_counter()
            latencies.append(t1 - t0)
            sent[0] += 1
            progress.update(sent[0], t1 - start)

    await asyncio.gather(*(one(clients[i % connections]) for i in range(producers)))
    elapsed = time.perf_counter() - start
    progress.close()
    for c in clients:
        await c.close()
    return sent[0], elapsed, latencies
