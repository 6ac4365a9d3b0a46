"""Table reads at each consistency (issue 34): tidelog next to etcd on this machine, in one run
(not CI).

    .venv/bin/python bench/table_reads.py [--seconds 8] [--readers 1,64] [--partitions 3]
                                          [--py-spy PATH]

Installs Debian's etcd-server and etcd-client with apt when they are missing (bench/compare.py's
helpers start and stop the members). Each system holds the same KEYS keys with VALUE_BYTES-byte
values; each reader reads one key at a time, the next key after its answer, for --seconds per
case, checking every value it gets:

  tidelog   3 nodes, a table topic of --partitions partitions, RF 3; `table_get` at each
            consistency: linearizable (ReadIndex: a majority confirms the leader first), lease
            (no round trip while the leader's lease runs), serializable (the leader's applied
            state, unconfirmed). Every read goes to its key's partition leader.
  etcd      3 members; range requests through etcd's v3 JSON gateway (POST /v3/kv/range over
            HTTP/1.1 keep-alive, a connection per reader, readers spread over the members,
            the leader first): the default (linearizable, ReadIndex) and "serializable": true
            (the member's own state, as `etcdctl get --consistency=s`). etcd has no lease read
            a client can ask for, so tidelog's lease is set beside etcd's linearizable.

The load generator is one process on uvloop, a reader an asyncio task; for tidelog they share
one AsyncClient (its connection to each node carries every reader's requests, answered out of
order). That leaves the nodes most of the two cores: a thread per reader with the blocking
Client would be 128 threads (each Client runs an event-loop thread of its own) taking turns at
one GIL, and an AsyncClient per reader (64 connections to each node) gave fewer reads/s and more
node CPU per read in trial runs. CPU per read is read from /proc for the servers and the load
generator around each case: on a shared 2-core machine it moves less than a rate does.

--py-spy PATH: also record the leader of partition 0 with py-spy while linearizable runs at the
most readers, and print where its time goes.
"""

from __future__ import annotations

import argparse
import base64
import collections
import json
import os
import subprocess
import tempfile
import time
import zlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from common import print_table, process_cpu_seconds, scratch_dir
from compare import HttpConnection, closed_loop, install, processes, start_etcd
from tidelog.cli.args import run_loop
from tidelog.cli.cluster import LocalCluster
from tidelog.client.async_client import AsyncClient
from tidelog.record import ProducerRecord

KEYS = 1000
VALUE_BYTES = 256
TOPIC = "reads"
LINEARIZABLE = "linearizable"
TIDELOG_CONSISTENCIES = (LINEARIZABLE, "lease", "serializable")
ETCD_CONSISTENCIES = (LINEARIZABLE, "serializable")
ETCD_PACKAGES = {"etcd": "etcd-server", "etcdctl": "etcd-client"}
EVENT_LOOP_FRAME = "Runner.run (runners.py)"

MakeOp = Callable[[int], Awaitable[Callable[[], Awaitable[None]]]]


@dataclass
class Case:
    system: str
    consistency: str
    readers: int
    rate: float
    p50_ms: float
    p99_ms: float
    server_cpu_us: float  # the three servers' CPU per read
    client_cpu_us: float  # the load generator's CPU per read


def key_of(i: int) -> bytes:
    return b"key-%05d" % i


def value_of(i: int) -> bytes:
    return (b"value-%05d;" % i * VALUE_BYTES)[:VALUE_BYTES]


def next_key(reader: int, readers: int) -> Callable[[], int]:
    """Reader `reader` of `readers` walks every key, starting from its own share of them."""
    position = [reader * KEYS // readers]

    def step() -> int:
        position[0] = (position[0] + 1) % KEYS
        return position[0]

    return step


async def measured(
    system: str,
    consistency: str,
    readers: int,
    seconds: float,
    make: MakeOp,
    server_pids: Sequence[int],
) -> Case:
    """compare.py's closed loop, with the CPU the servers and this process spent meanwhile."""
    servers_before = sum(process_cpu_seconds(p) for p in server_pids)
    own_before = time.process_time()
    rate, p50, p99 = await closed_loop(readers, seconds, make)
    reads = max(1.0, rate * seconds)
    servers = sum(process_cpu_seconds(p) for p in server_pids) - servers_before
    own = time.process_time() - own_before
    case = Case(
        system, consistency, readers, rate, p50, p99, servers / reads * 1e6, own / reads * 1e6
    )
    print(
        f"  {system} {consistency} readers={readers}: {rate:,.0f} reads/s, p50 {p50:.2f} ms, "
        f"p99 {p99:.2f} ms, servers {case.server_cpu_us:.0f} µs/read",
        flush=True,
    )
    return case


# -- tidelog ----------------------------------------------------------------------------------


async def load_table(client: AsyncClient, partitions: int) -> None:
    """Every key, acks=all, in one batch per partition (a key lives where its CRC-32 says)."""
    by_partition: dict[int, list[ProducerRecord]] = collections.defaultdict(list)
    for i in range(KEYS):
        by_partition[zlib.crc32(key_of(i)) % partitions].append(
            ProducerRecord(key_of(i), value_of(i))
        )
    for partition, records in sorted(by_partition.items()):
        await client.produce(TOPIC, records, partition=partition, acks="all")


def table_reader(client: AsyncClient, consistency: str, readers: int) -> MakeOp:
    async def make(reader: int) -> Callable[[], Awaitable[None]]:
        step = next_key(reader, readers)

        async def op() -> None:
            i = step()
            if await client.table_get(TOPIC, key_of(i), consistency) != value_of(i):
                raise RuntimeError(f"tidelog read a wrong value for {key_of(i)!r}")

        return op

    return make


def bench_tidelog(
    work: Path, levels: list[int], seconds: float, partitions: int, py_spy: Path | None
) -> list[Case]:
    cases: list[Case] = []
    with LocalCluster(work / "tidelog", 3, log_level="WARNING") as cluster:
        pids = [proc.pid for proc in cluster.procs.values()]

        async def main() -> None:
            async with AsyncClient(cluster.bootstrap) as client:
                await client.create_topic(TOPIC, partitions, 3, kind="table")
                await load_table(client, partitions)
                info = await client.topic(TOPIC, refresh=True)
                print(f"  tidelog partition leaders: {info.leaders}", flush=True)
                for readers in levels:
                    for consistency in TIDELOG_CONSISTENCIES:
                        make = table_reader(client, consistency, readers)
                        cases.append(
                            await measured("tidelog", consistency, readers, seconds, make, pids)
                        )
                if py_spy is not None:
                    # One more linearizable run at the most readers, not in the table: the
                    # sampling takes CPU from the two cores the case runs on.
                    readers = max(levels)
                    print(f"  tidelog linearizable readers={readers} under py-spy", flush=True)
                    profiler = start_py_spy(py_spy, cluster.procs[info.leaders[0]].pid, seconds)
                    await closed_loop(readers, seconds, table_reader(client, LINEARIZABLE, readers))
                    report_py_spy(*profiler, seconds)

        run_loop(main())
    return cases


# -- etcd -------------------------------------------------------------------------------------


def etcd_leader_first(ports: list[int]) -> list[int]:
    """The members' client ports, the leader's first (etcdctl endpoint status)."""
    out = subprocess.run(
        [
            "etcdctl",
            "--endpoints",
            ",".join(f"127.0.0.1:{p}" for p in ports),
            "endpoint",
            "status",
            "-w",
            "json",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "ETCDCTL_API": "3"},
    ).stdout
    leaders = [
        int(s["Endpoint"].rsplit(":", 1)[1])
        for s in json.loads(out)
        if s["Status"]["header"]["member_id"] == s["Status"]["leader"]
    ]
    return leaders + [p for p in ports if p not in leaders]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def load_etcd(port: int) -> None:
    conn = HttpConnection("127.0.0.1", port)
    try:
        for i in range(KEYS):
            body = json.dumps({"key": b64(key_of(i)), "value": b64(value_of(i))}).encode()
            await conn.post("/v3/kv/put", body)
    finally:
        await conn.close()


def etcd_reader(
    ports: list[int], consistency: str, readers: int, conns: list[HttpConnection]
) -> MakeOp:
    """Each reader its own connection, to the members in turn; the bodies made beforehand."""
    extra = ',"serializable":true' if consistency == "serializable" else ""
    bodies = [f'{{"key":"{b64(key_of(i))}"{extra}}}'.encode() for i in range(KEYS)]
    values = [b64(value_of(i)).encode() for i in range(KEYS)]

    async def make(reader: int) -> Callable[[], Awaitable[None]]:
        conn = HttpConnection("127.0.0.1", ports[reader % len(ports)])
        conns.append(conn)
        step = next_key(reader, readers)

        async def op() -> None:
            i = step()
            if values[i] not in await conn.post("/v3/kv/range", bodies[i]):
                raise RuntimeError(f"etcd read a wrong value for {key_of(i)!r}")

        return op

    return make


def bench_etcd(work: Path, levels: list[int], seconds: float) -> list[Case]:
    cases: list[Case] = []
    with processes(work) as start:
        members: list[subprocess.Popen[bytes]] = []

        def recording(name: str, args: list[str]) -> subprocess.Popen[bytes]:
            members.append(start(name, args))
            return members[-1]

        ports = etcd_leader_first(start_etcd(work, recording))
        pids = [m.pid for m in members]

        async def main() -> None:
            await load_etcd(ports[0])
            for readers in levels:
                for consistency in ETCD_CONSISTENCIES:
                    conns: list[HttpConnection] = []
                    make = etcd_reader(ports, consistency, readers, conns)
                    try:
                        cases.append(
                            await measured("etcd", consistency, readers, seconds, make, pids)
                        )
                    finally:
                        for conn in conns:
                            await conn.close()

        run_loop(main())
    return cases


# -- py-spy -----------------------------------------------------------------------------------


def start_py_spy(py_spy: Path, pid: int, seconds: float) -> tuple[subprocess.Popen[bytes], Path]:
    """py-spy recording pid for the case's length, as collapsed stacks (idle frames left out)."""
    out = Path(tempfile.mkdtemp(prefix="py-spy-")) / "leader.txt"
    proc = subprocess.Popen(
        [
            str(py_spy), "record", "--pid", str(pid), "--duration", str(max(1, int(seconds))),
            "--rate", "200", "--format", "raw", "--output", str(out), "--nonblocking",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    time.sleep(0.5)  # (attaching takes a moment)
    return proc, out


def frame_name(frame: str) -> str:
    """py-spy's 'function (path/file.py:line)' as 'function (file.py)': one entry a function."""
    name, _, where = frame.rpartition(" (")
    return f"{name} ({where.rsplit(':', 1)[0].rsplit('/', 1)[-1]})"


def report_py_spy(proc: subprocess.Popen[bytes], out: Path, seconds: float, top: int = 20) -> None:
    """Where the leader's samples were, below its event loop: in a function or what it called
    (inclusive) and in the function itself (self). py-spy leaves out samples of an idle process;
    the self time of the loop's run is uvloop's own C code (polling, socket reads and writes)."""
    proc.wait(60)
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [frame_name(f) for f in stack.split(";") if f]
        if not frames:
            continue
        if EVENT_LOOP_FRAME in frames:
            frames = frames[frames.index(EVENT_LOOP_FRAME) :]
        n = int(count)
        total += n
        for frame in set(frames[1:]):
            inclusive[frame] += n
        own[frames[-1]] += n
    print(
        f"\npy-spy on the leader of partition 0: busy in {total} of {int(seconds * 200)} "
        f"samples (200 Hz); stacks in {out}; shares of the busy samples:"
    )
    for title, counter in (("inclusive", inclusive), ("self", own)):
        print(f"  {title}:")
        for frame, n in counter.most_common(top):
            print(f"    {100 * n / max(1, total):5.1f}%  {frame}")


# -- the run ----------------------------------------------------------------------------------


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def table(cases: list[Case]) -> list[list[object]]:
    """Each case with its ratios: to etcd at the same consistency (tidelog's lease to etcd's
    linearizable) and readers, and to serializable in the same system and readers."""
    by = {(c.system, c.consistency, c.readers): c for c in cases}
    rows: list[list[object]] = []
    for c in cases:
        peer_consistency = "linearizable" if c.consistency == "lease" else c.consistency
        etcd = by.get(("etcd", peer_consistency, c.readers)) if c.system == "tidelog" else None
        ser = by.get((c.system, "serializable", c.readers))
        rows.append(
            [
                c.system,
                c.consistency,
                c.readers,
                c.rate,
                c.p50_ms,
                c.p99_ms,
                c.server_cpu_us,
                c.client_cpu_us,
                ratio(c.rate, etcd.rate) if etcd else float("nan"),
                ratio(c.p50_ms, etcd.p50_ms) if etcd else float("nan"),
                ratio(ser.rate, c.rate) if ser else float("nan"),
                ratio(c.p50_ms, ser.p50_ms) if ser else float("nan"),
            ]
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--readers", default="1,64")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--systems", default="tidelog,etcd")
    parser.add_argument("--py-spy", type=Path, default=None)
    args = parser.parse_args()
    levels = [int(r) for r in args.readers.split(",")]
    systems = args.systems.split(",")
    if "etcd" in systems:
        install(ETCD_PACKAGES)
    work = scratch_dir("table-reads-")
    started = time.monotonic()
    cases: list[Case] = []
    if "tidelog" in systems:
        print("running tidelog ...", flush=True)
        cases += bench_tidelog(work, levels, args.seconds, args.partitions, args.py_spy)
    if "etcd" in systems:
        print("running etcd ...", flush=True)
        (work / "etcd").mkdir()
        cases += bench_etcd(work / "etcd", levels, args.seconds)
    print(
        f"\ntable reads, {KEYS} keys of {VALUE_BYTES} B, each reader one read at a time, "
        f"{args.seconds:.0f} s per case; tidelog {args.partitions} partition(s) RF 3, etcd 3 "
        f"members (whole run {time.monotonic() - started:.0f} s)\n"
    )
    print_table(
        [
            "system",
            "consistency",
            "readers",
            "reads/s",
            "p50 ms",
            "p99 ms",
            "server µs/read",
            "client µs/read",
            "t/etcd reads/s",
            "t/etcd p50",
            "ser/this reads/s",
            "this/ser p50",
        ],
        table(cases),
    )
    print(
        "\nt/etcd: tidelog over etcd at the same consistency and readers (tidelog's lease over "
        "etcd's linearizable); reads/s above 1 and p50 below 1 favour tidelog.\n"
        "ser/this reads/s: how many times more reads serializable served in the same system; "
        "this/ser p50: how many times longer a read waited than a serializable one."
    )


if __name__ == "__main__":
    main()
