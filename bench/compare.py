"""tidelog next to etcd, NATS JetStream and Redis Streams on this machine, in one run (not CI).

    .venv/bin/pip install -e '.[bench]'     # matplotlib, nats-py
    .venv/bin/python bench/compare.py [--seconds 5] [--concurrency 1,8,64]

Installs Debian's etcd-server, etcd-client, nats-server, redis-server and redis-tools with apt
when they are missing, starts every server on 127.0.0.1 in a scratch directory, and stops each
by its PID. Every writer sends one 1 KiB record and waits for its acknowledgement before the
next (concurrency = how many writers, each on its own connection), for --seconds per case:

  tidelog   3 nodes, one partition, RF 3, acks=all: fsynced on a quorum before the ack
            (tidelog's Python client, one per writer; and, as "tidelog, 1 client", the writers
            sharing one client, which sends what they wrote meanwhile as one batch each time
            the one in flight returns, as Kafka's producer does)
  etcd      3 members, put: fsynced on a quorum before the ack (etcd's v3 JSON gateway,
            HTTP/1.1 keep-alive, one connection per writer)
  NATS      3-node JetStream cluster, an R3 file stream, publish with ack (nats-py, the official
            client, one connection per writer): acked once in the page cache of 2 of 3 servers;
            nats-server 2.9 does not fsync it (weaker than the others)
  Redis     one server, no replication, XADD (redis-benchmark, Redis's own load tool):
            appendfsync always (fsynced on one node) and everysec (up to 1 s of acknowledged
            writes lost on a crash: weaker, labelled)

Prints one table (records/s, p50, p99 and tidelog/peer ratios at the same concurrency) and draws
throughput against p99 into bench/compare.png.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import csv
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from common import percentile, print_table, scratch_dir
from tidelog.cli.cluster import LocalCluster
from tidelog.client.async_client import AsyncClient

VALUE = b"v" * 1024
HERE = Path(__file__).parent
PACKAGES = {
    "etcd": "etcd-server",
    "etcdctl": "etcd-client",
    "nats-server": "nats-server",
    "redis-server": "redis-server",
    "redis-benchmark": "redis-tools",
}


@dataclass
class Row:
    system: str
    durability: str
    concurrency: int
    rate: float
    p50_ms: float
    p99_ms: float


def install(packages: Mapping[str, str] = PACKAGES) -> None:
    """apt-get install the packages (command -> Debian package) whose command is missing."""
    missing = sorted({pkg for cmd, pkg in packages.items() if shutil.which(cmd) is None})
    if not missing:
        return
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    print(f"installing {' '.join(missing)} with apt", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run([*sudo, "apt-get", "install", "-y", "-qq", *missing], env=env).returncode:
        subprocess.run([*sudo, "apt-get", "update", "-qq"], env=env, check=True)
        subprocess.run([*sudo, "apt-get", "install", "-y", "-qq", *missing], env=env, check=True)


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


@contextlib.contextmanager
def processes(work: Path) -> Iterator[Callable[[str, list[str]], subprocess.Popen[bytes]]]:
    """Start servers (their output in work/NAME.log) and stop every one by its PID at the end."""
    started: list[subprocess.Popen[bytes]] = []

    def start(name: str, args: list[str]) -> subprocess.Popen[bytes]:
        with open(work / f"{name}.log", "wb") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=work)
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
        for proc in started:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(5)


async def closed_loop(
    writers: int, seconds: float, make: Callable[[int], Awaitable[Callable[[], Awaitable[None]]]]
) -> tuple[float, float, float]:
    """`writers` writers, each writing one record at a time for `seconds`:
    (records/s, p50 ms, p99 ms)."""
    ops = [await make(i) for i in range(writers)]
    for op in ops:  # warm up every connection
        await op()
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def run(op: Callable[[], Awaitable[None]]) -> None:
        while (now := time.perf_counter()) < deadline:
            await op()
            latencies.append(time.perf_counter() - now)

    started = time.perf_counter()
    await asyncio.gather(*(run(op) for op in ops))
    elapsed = time.perf_counter() - started
    ms = [x * 1000 for x in latencies]
    return len(latencies) / elapsed, percentile(ms, 50), percentile(ms, 99)


# -- tidelog ----------------------------------------------------------------------------------


def bench_tidelog(work: Path, levels: list[int], seconds: float) -> list[Row]:
    rows = []
    with LocalCluster(work / "tidelog", 3, log_level="WARNING") as cluster:

        async def main() -> None:
            clients: list[AsyncClient] = []
            async with AsyncClient(cluster.bootstrap) as admin:
                await admin.create_topic("bench", partitions=1, replication_factor=3)
                await admin.wait_for_leaders("bench")

            async def make(_: int) -> Callable[[], Awaitable[None]]:
                client = AsyncClient(cluster.bootstrap)
                clients.append(client)

                async def op() -> None:
                    await client.produce("bench", [VALUE], partition=0, acks="all")

                return op

            shared = AsyncClient(cluster.bootstrap)

            async def make_shared(_: int) -> Callable[[], Awaitable[None]]:
                async def op() -> None:
                    await shared.produce("bench", [VALUE], partition=0, acks="all")

                return op

            try:
                for c in levels:
                    rate, p50, p99 = await closed_loop(c, seconds, make)
                    rows.append(Row("tidelog", "RF3 acks=all, fsync on quorum", c, rate, p50, p99))
                    for client in clients:
                        await client.close()
                    clients.clear()
                for c in levels:
                    rate, p50, p99 = await closed_loop(c, seconds, make_shared)
                    rows.append(
                        Row("tidelog, 1 client", "RF3 acks=all, fsync on quorum", c, rate, p50, p99)
                    )
            finally:
                for client in clients:
                    await client.close()
                await shared.close()

        asyncio.run(main())
    return rows


# -- etcd -------------------------------------------------------------------------------------


class HttpConnection:
    """HTTP/1.1 keep-alive POSTs of JSON bodies (etcd's v3 gateway answers small JSON)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> bytes:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        self.writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = head.split(b" ", 2)[1]
        length = 0
        chunked = False
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
            if name.strip().lower() == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        if chunked:
            data = b""
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
                data += await self.reader.readexactly(size + 2)
                if size == 0:
                    break
        else:
            data = await self.reader.readexactly(length)
        if status != b"200":
            raise RuntimeError(f"etcd answered {status!r}: {data[:200]!r}")
        return data

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def start_etcd(work: Path, start: Callable[[str, list[str]], subprocess.Popen[bytes]]) -> list[int]:
    """Three etcd members on 127.0.0.1 (their data in work/etcd-mN), started with `start`
    (see processes()) and healthy: their client ports."""
    ports = free_ports(6)
    client_ports, peer_ports = ports[:3], ports[3:]
    initial = ",".join(f"m{i + 1}=http://127.0.0.1:{peer_ports[i]}" for i in range(3))
    for i in range(3):
        start(
            f"etcd-m{i + 1}",
            [
                "etcd",
                "--name", f"m{i + 1}",
                "--data-dir", str(work / f"etcd-m{i + 1}"),
                "--listen-client-urls", f"http://127.0.0.1:{client_ports[i]}",
                "--advertise-client-urls", f"http://127.0.0.1:{client_ports[i]}",
                "--listen-peer-urls", f"http://127.0.0.1:{peer_ports[i]}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_ports[i]}",
                "--initial-cluster", initial,
                "--initial-cluster-state", "new",
                "--initial-cluster-token", "tidelog-bench",
                "--quota-backend-bytes", str(8 << 30),
                "--logger", "zap",
                "--log-level", "warn",
            ],
        )  # fmt: skip
    wait_until(lambda: etcd_healthy(client_ports), "etcd cluster")
    return client_ports


def bench_etcd(work: Path, levels: list[int], seconds: float) -> list[Row]:
    rows = []
    with processes(work) as start:
        client_ports = start_etcd(work, start)

        async def main() -> None:
            conns: list[HttpConnection] = []
            counter = 0

            async def make(i: int) -> Callable[[], Awaitable[None]]:
                conn = HttpConnection("127.0.0.1", client_ports[i % 3])
                conns.append(conn)
                value = base64.b64encode(VALUE).decode()

                async def op() -> None:
                    nonlocal counter
                    counter += 1
                    key = base64.b64encode(b"%016d" % counter).decode()
                    body = f'{{"key":"{key}","value":"{value}"}}'.encode()
                    await conn.post("/v3/kv/put", body)

                return op

            for c in levels:
                rate, p50, p99 = await closed_loop(c, seconds, make)
                rows.append(Row("etcd", "3 members, fsync on quorum", c, rate, p50, p99))
                for conn in conns:
                    await conn.close()
                conns.clear()

        asyncio.run(main())
    return rows


def etcd_healthy(ports: list[int]) -> bool:
    result = subprocess.run(
        ["etcdctl", "--endpoints", ",".join(f"127.0.0.1:{p}" for p in ports), "endpoint", "health"],
        capture_output=True,
        text=True,
        env={**os.environ, "ETCDCTL_API": "3"},
    )
    return result.returncode == 0


# -- NATS -------------------------------------------------------------------------------------


def bench_nats(work: Path, levels: list[int], seconds: float) -> list[Row]:
    import nats
    from nats.js.api import StorageType, StreamConfig

    ports = free_ports(6)
    client_ports, route_ports = ports[:3], ports[3:]
    rows = []
    with processes(work) as start:
        for i in range(3):
            routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in route_ports)
            conf = work / f"nats-{i + 1}.conf"
            conf.write_text(
                f"server_name: n{i + 1}\nlisten: 127.0.0.1:{client_ports[i]}\n"
                f'jetstream {{ store_dir: "{work / f"nats-{i + 1}"}" }}\n'
                f"cluster {{ name: bench, listen: 127.0.0.1:{route_ports[i]}, routes: [{routes}] }}\n"
            )
            start(f"nats-{i + 1}", ["nats-server", "-c", str(conf)])
        servers = [f"nats://127.0.0.1:{p}" for p in client_ports]

        async def main() -> None:
            admin = await nats.connect(servers=servers)
            js = admin.jetstream()
            deadline = time.monotonic() + 60
            while True:
                try:
                    await js.add_stream(
                        StreamConfig(
                            name="bench",
                            subjects=["bench"],
                            num_replicas=3,
                            storage=StorageType.FILE,
                        )
                    )
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.5)
            connections = []

            async def make(i: int) -> Callable[[], Awaitable[None]]:
                nc = await nats.connect(servers=[servers[i % 3]])
                connections.append(nc)
                stream = nc.jetstream()

                async def op() -> None:
                    await stream.publish("bench", VALUE)

                return op

            for c in levels:
                rate, p50, p99 = await closed_loop(c, seconds, make)
                rows.append(
                    Row(
                        "NATS JetStream", "R3 file, page cache of 2/3 (no fsync)", c, rate, p50, p99
                    )
                )
                for nc in connections:
                    await nc.close()
                connections.clear()
            await admin.close()

        asyncio.run(main())
    return rows


# -- Redis ------------------------------------------------------------------------------------


def bench_redis(work: Path, levels: list[int], seconds: float) -> list[Row]:
    rows = []
    for mode, label in (
        ("always", "1 node, AOF fsync always"),
        ("everysec", "1 node, AOF everysec (weaker: ~1 s lost)"),
    ):
        (port,) = free_ports(1)
        directory = work / f"redis-{mode}"
        directory.mkdir()
        with processes(work) as start:
            start(
                f"redis-{mode}",
                [
                    "redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                    "--appendonly", "yes", "--appendfsync", mode, "--dir", str(directory),
                ],
            )  # fmt: skip
            wait_until(lambda port=port: redis_up(port), "redis")
            for c in levels:
                # Size the run to about --seconds from a short probe at this concurrency.
                probe = redis_benchmark(port, c, 2000 * c)
                n = max(2000, int(probe[0] * seconds))
                rate, p50, p99 = redis_benchmark(port, c, n)
                rows.append(Row(f"Redis ({mode})", label, c, rate, p50, p99))
    return rows


def redis_up(port: int) -> bool:
    result = subprocess.run(
        ["redis-cli", "-h", "127.0.0.1", "-p", str(port), "ping"], capture_output=True, text=True
    )
    return result.stdout.strip() == "PONG"


def redis_benchmark(port: int, clients: int, requests: int) -> tuple[float, float, float]:
    out = subprocess.run(
        [
            "redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-c", str(clients),
            "-n", str(requests), "--csv", "XADD", "bench", "*", "f", VALUE.decode(),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout  # fmt: skip
    row = next(r for r in csv.DictReader(io.StringIO(out)) if r.get("rps"))
    return float(row["rps"]), float(row["p50_latency_ms"]), float(row["p99_latency_ms"])


# -- the run ----------------------------------------------------------------------------------


def wait_until(check: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not come up")
        time.sleep(0.3)


def chart(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for system in dict.fromkeys(r.system for r in rows):
        mine = [r for r in rows if r.system == system]
        ax.plot([r.rate for r in mine], [r.p99_ms for r in mine], marker="o", label=system)
        for r in mine:
            ax.annotate(f"c={r.concurrency}", (r.rate, r.p99_ms), fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("records/s (1 KiB, one record per request)")
    ax.set_ylabel("p99 ms")
    ax.set_title("tidelog and peers on this machine, same run")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", default="1,8,64")
    parser.add_argument("--chart", type=Path, default=HERE / "compare.png")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    install()
    work = scratch_dir("compare-")
    rows: list[Row] = []
    try:
        for bench in (bench_tidelog, bench_etcd, bench_nats, bench_redis):
            directory = work / bench.__name__
            directory.mkdir()
            print(f"running {bench.__name__} ...", flush=True)
            rows += bench(directory, levels, args.seconds)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    ours = {r.concurrency: r for r in rows if r.system == "tidelog"}
    shared = {r.concurrency: r for r in rows if r.system == "tidelog, 1 client"}
    table = []
    for r in rows:
        ratios = []
        for mine in (ours.get(r.concurrency), shared.get(r.concurrency)):
            ratios.append(mine.rate / r.rate if mine and r.rate else float("nan"))
        table.append([r.system, r.durability, r.concurrency, r.rate, r.p50_ms, r.p99_ms, *ratios])
    print(
        f"\n1 KiB records, one per request, each writer waits for its ack; {args.seconds:.0f} s per case\n"
    )
    print_table(
        [
            "system",
            "durability",
            "writers",
            "records/s",
            "p50 ms",
            "p99 ms",
            "tidelog/peer",
            "tidelog 1 client/peer",
        ],
        table,
    )
    chart(rows, args.chart)
    print(f"\nchart: {args.chart}")


if __name__ == "__main__":
    sys.exit(main())
