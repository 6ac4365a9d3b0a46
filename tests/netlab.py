"""Real network partitions for real nodes, as Jepsen makes them (issue 10).

Run inside a private user + network namespace (the test does `unshare -rn python netlab.py`), so
nothing touches the host's network and everything vanishes with the process:

    lab namespace (this process, the clients):  bridge br0, 10.77.0.254
    node N: its own network namespace, veth nvN <-> hvN on br0, 10.77.0.N

Faults are kernel faults: a blackhole route in a node's namespace cuts one direction of one pair
(established TCP connections stall and retransmit, new connects fail), `ip link set down` cuts a
node from everyone. (`tc netem` is not available on these machines; delay and loss are not
simulated.) While faults come and go, producers write unique values with acks=all and readers
read from every node; at the end, after healing, a checker compares everything acknowledged and
everything read with the final log: lost, changed, duplicated. The report is JSON on stdout.

`--workload table` (issue 34) checks reads instead: writers put unique values under a few keys of
a one-partition table (acks=all) while readers send each get straight to every node in turn, and
the nemesis cuts the partition's leader off now and then. The history goes through the
linearizability checker (tidelog.testing.linearizability). With the default linearizable reads an
isolated leader must refuse (NotLeader) rather than answer; `--consistency serializable` reads
may be stale, and the checker should say so.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import random
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from helpers import poll, retry, wait_for
from tidelog.client.routing import is_indeterminate
from tidelog.client.sync_client import Client
from tidelog.errors import NotLeader, OutcomeUnknown, TidelogError, TopicAlreadyExists
from tidelog.protocol import api
from tidelog.protocol.api import ACKS_ALL, ApiKey
from tidelog.record.batch import ProducerRecord, build_batch
from tidelog.testing.linearizability import READ, WRITE, Operation
from tidelog.testing.linearizability import check as check_linearizable

PREFIX = "10.77.0"
PORT, PEER_PORT = 7100, 7200
TOPIC = "jepsen"
TABLE = "kv"  # the table workload's topic: one partition, so one leader to isolate
TABLE_KEYS = ("a", "b", "c")
READERS_CLIENT_BASE = 100  # readers' client numbers in the history, apart from the writers'


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=10)


class Lab:
    def __init__(self, nodes: int, root: Path, hw_policy: str) -> None:
        self.ids = list(range(1, nodes + 1))
        self.root = root
        self.hw_policy = hw_policy
        self.holders: dict[int, subprocess.Popen[bytes]] = {}
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.cuts: set[tuple[int, int]] = set()
        self.secret = root / "cluster.secret"
        self.secret.write_text(secrets.token_hex(32) + "\n")
        self.cluster_id = secrets.token_hex(8)

    def address(self, n: int) -> str:
        return f"{PREFIX}.{n}:{PORT}"

    @property
    def bootstrap(self) -> str:
        return ",".join(self.address(n) for n in self.ids)

    def build(self) -> None:
        sh("ip", "link", "set", "lo", "up")
        sh("ip", "link", "add", "br0", "type", "bridge")
        sh("ip", "addr", "add", f"{PREFIX}.254/24", "dev", "br0")
        sh("ip", "link", "set", "br0", "up")
        for n in self.ids:
            holder = subprocess.Popen(["unshare", "-n", "sleep", "100000"])
            self.holders[n] = holder
            time.sleep(0.2)
            pid = str(holder.pid)
            sh("ip", "link", "add", f"hv{n}", "type", "veth", "peer", "name", f"nv{n}")
            sh("ip", "link", "set", f"nv{n}", "netns", pid)
            sh("ip", "link", "set", f"hv{n}", "master", "br0", "up")
            for cmd in (
                ["ip", "addr", "add", f"{PREFIX}.{n}/24", "dev", f"nv{n}"],
                ["ip", "link", "set", f"nv{n}", "up"],
                ["ip", "link", "set", "lo", "up"],
            ):
                sh("nsenter", "-t", pid, "-n", "--", *cmd)

    def in_node(self, n: int, *cmd: str) -> None:
        sh("nsenter", "-t", str(self.holders[n].pid), "-n", "--", *cmd)

    log_level = "INFO"

    def listeners(self, n: int) -> list[str]:
        """`tidelog serve`'s listener options for node n (a lab with more listeners adds)."""
        return ["--listen", self.address(n), "--peer-listen", f"{PREFIX}.{n}:{PEER_PORT}"]

    def start(self, n: int) -> None:
        peers = ",".join(f"{i}={PREFIX}.{i}:{PORT}/{PEER_PORT}" for i in self.ids)
        log = open(self.root / f"node-{n}.log", "ab")  # noqa: SIM115 (the process owns it)
        self.procs[n] = subprocess.Popen(
            [
                *("nsenter", "-t", str(self.holders[n].pid), "-n", "--", sys.executable, "-m"),
                *("tidelog", "serve", "--node-id", str(n), *self.listeners(n), "--peers", peers),
                *("--cluster-secret-file", str(self.secret), "--cluster-id", self.cluster_id),
                *("--data", str(self.root / f"node-{n}"), "--log-level", self.log_level),
                "--insecure",  # a private network of namespaces, no TLS: said out loud
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    # -- faults ---------------------------------------------------------------------------------

    def cut(self, a: int, b: int) -> None:
        """a no longer reaches b (one direction: packets from a to b are dropped at a)."""
        if (a, b) not in self.cuts:
            self.in_node(a, "ip", "route", "add", "blackhole", f"{PREFIX}.{b}/32")
            self.cuts.add((a, b))

    def uncut(self, a: int, b: int) -> None:
        if (a, b) in self.cuts:
            self.in_node(a, "ip", "route", "del", "blackhole", f"{PREFIX}.{b}/32")
            self.cuts.discard((a, b))

    def isolate(self, n: int) -> None:
        """n cut off from every other node, both ways (clients still reach it)."""
        for other in self.ids:
            if other != n:
                self.cut(n, other)
                self.cut(other, n)

    def heal(self) -> None:
        for a, b in list(self.cuts):
            self.uncut(a, b)
        for n in self.ids:
            self.in_node(n, "ip", "link", "set", f"nv{n}", "up")

    def link(self, n: int, up: bool) -> None:
        self.in_node(n, "ip", "link", "set", f"nv{n}", "up" if up else "down")

    def close(self) -> None:
        for proc in [*self.procs.values(), *self.holders.values()]:
            proc.kill()
            proc.wait()


class Workload:
    """acks=all producers of unique values, and readers that remember what they saw."""

    def __init__(self, lab: Lab, partitions: int) -> None:
        self.lab = lab
        self.partitions = partitions
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.acked: dict[tuple[int, int], str] = {}  # (partition, offset) -> value
        self.acked_by_cut_leader: list[tuple[int, int, str]] = []
        self.unknown = 0
        self.failed = 0
        self.reads: dict[tuple[int, int], set[str]] = {}
        self.reads_count = 0
        self.threads: list[threading.Thread] = []
        self.cut_leader: tuple[int, int, float] | None = None  # (partition, node, since)

    def start(self, producers: int) -> None:
        for i in range(producers):
            self.threads.append(threading.Thread(target=self._produce, args=(i,), daemon=True))
        for n in self.lab.ids:
            self.threads.append(threading.Thread(target=self._read, args=(n,), daemon=True))
        for t in self.threads:
            t.start()

    def _produce(self, worker: int) -> None:
        seq = 0
        with Client(self.lab.bootstrap, retries=2, request_timeout_ms=2000) as client:
            while not self.stop.is_set():
                partition = seq % self.partitions
                value = f"w{worker}-{seq}"
                seq += 1
                try:
                    result = client.produce(
                        TOPIC, [ProducerRecord(None, value.encode())], partition=partition
                    )
                except OutcomeUnknown:
                    self.unknown += 1
                    continue
                except TidelogError:
                    self.failed += 1
                    time.sleep(0.05)
                    continue
                assert result is not None
                with self.lock:
                    self.acked[(partition, result.base_offset)] = value

    def _read(self, node: int) -> None:
        """Reads from one node directly (its replica: what it would serve as leader)."""
        positions = dict.fromkeys(range(self.partitions), 0)
        while not self.stop.is_set():
            try:
                with Client(self.lab.bootstrap, retries=1, request_timeout_ms=1000) as client:
                    while not self.stop.is_set():
                        for p in range(self.partitions):
                            result = client.fetch(
                                TOPIC,
                                p,
                                positions[p],
                                max_wait_ms=50,
                                replica_read=True,
                                node_id=node,
                            )
                            with self.lock:
                                for record in result.records:
                                    seen = self.reads.setdefault((p, record.offset), set())
                                    seen.add((record.value or b"").decode())
                                    self.reads_count += 1
                            positions[p] = max(positions[p], result.next_offset)
            except TidelogError:
                time.sleep(0.1)
            except OSError:
                time.sleep(0.1)

    def probe_isolated(self, node: int, cut_at: float, until: float) -> None:
        """Produce (acks=all) straight to a leader cut off from its followers: more than a
        second after the cut (packets already in flight may still land) it must acknowledge
        nothing. Every attempt is a fresh value; what it did acknowledge is checked as lost."""
        address = (PREFIX + f".{node}", PORT)
        seq = 0
        with Client(self.lab.address(node), retries=1, request_timeout_ms=1500) as client:
            while time.monotonic() < until:
                value = f"isolated-{node}-{cut_at:.0f}-{seq}"
                seq += 1
                call = client._async.call(
                    address,
                    ApiKey.PRODUCE,
                    api.ProduceRequest(TOPIC, 0, ACKS_ALL, timeout_ms=1000),
                    build_batch([ProducerRecord(None, value.encode())]),
                    timeout_s=2.0,
                )
                try:
                    header, _ = client._run(call)
                except TidelogError:
                    continue
                answer = api.decode(api.ProduceResponse, header)
                with self.lock:
                    self.acked[(0, answer.base_offset)] = value
                    if time.monotonic() - cut_at > 1.0:
                        self.acked_by_cut_leader.append((0, answer.base_offset, value))

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=10)


class TableWorkload:
    """A history for the linearizability checker (issue 34): acks=all writers of unique values
    to a few keys of a table, and readers that send each get straight to every node in turn, no
    routing, so an isolated old leader is asked too. Every operation's call and return are read
    from one monotonic clock; a write whose outcome the client could not learn has no return, a
    write refused before it could take effect and a read that got no value are left out."""

    def __init__(self, lab: Lab, consistency: str) -> None:
        self.lab = lab
        self.consistency = consistency
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.history: list[Operation] = []
        self.writes_unknown = 0
        self.writes_refused = 0
        self.answered = dict.fromkeys(lab.ids, 0)
        self.refused: dict[int, dict[str, int]] = {n: {} for n in lab.ids}
        self.isolated: tuple[int, float] | None = None  # (node, since), set by the nemesis
        self.isolated_reads: list[Operation] = []  # answered by a node cut off when asked
        self.not_leader_from_isolated = 0
        self.threads: list[threading.Thread] = []

    def start(self, writers: int, readers: int) -> None:
        for i in range(writers):
            self.threads.append(threading.Thread(target=self._write, args=(i,), daemon=True))
        for i in range(readers):
            self.threads.append(threading.Thread(target=self._read, args=(i,), daemon=True))
        for t in self.threads:
            t.start()

    def _write(self, worker: int) -> None:
        seq = 0
        with Client(self.lab.bootstrap, retries=2, request_timeout_ms=2000) as client:
            while not self.stop.is_set():
                key = TABLE_KEYS[(worker + seq) % len(TABLE_KEYS)]
                value = f"w{worker}-{seq}"
                seq += 1
                record = ProducerRecord(key.encode(), value.encode())
                call = time.monotonic()
                try:
                    client.produce(TABLE, [record], partition=0, acks="all", timeout_ms=2000)
                    ret: float | None = time.monotonic()
                except TidelogError as exc:
                    if not isinstance(exc, OutcomeUnknown) and not is_indeterminate(exc):
                        with self.lock:
                            self.writes_refused += 1  # definite: not in the log, not history
                        time.sleep(0.05)
                        continue
                    ret = None
                with self.lock:
                    self.writes_unknown += ret is None
                    self.history.append(Operation(worker, key, WRITE, value, call, ret))

    def _read(self, reader: int) -> None:
        """Round after round, one get to each node (readers start at different nodes)."""
        ids = self.lab.ids
        with Client(self.lab.bootstrap, retries=1, request_timeout_ms=3000) as client:
            turn = reader
            while not self.stop.is_set():
                node = ids[turn % len(ids)]
                key = TABLE_KEYS[(turn // len(ids) + reader) % len(TABLE_KEYS)]
                turn += 1
                self._read_one(client, READERS_CLIENT_BASE + reader, node, key)

    def _read_one(self, client: Client, who: int, node: int, key: str) -> None:
        request = api.TableRequest(
            "get", TABLE, 0, base64.b64encode(key.encode()).decode(), consistency=self.consistency
        )
        address = (f"{PREFIX}.{node}", PORT)
        call = time.monotonic()
        try:
            header, _ = client._run(
                client._async._router.call(address, ApiKey.TABLE, request, timeout_s=3.0)
            )
        except TidelogError as exc:
            with self.lock:
                counts = self.refused[node]
                counts[exc.name] = counts.get(exc.name, 0) + 1
                if isinstance(exc, NotLeader) and self._isolated_at(node, call):
                    self.not_leader_from_isolated += 1
            if not isinstance(exc, NotLeader):
                time.sleep(0.02)  # a node out of reach fails fast: do not spin on it
            return
        ret = time.monotonic()
        answer = api.decode(api.TableResponse, header)
        value = base64.b64decode(answer.entries[0][1]).decode() if answer.entries else None
        read = Operation(who, key, READ, value, call, ret)
        with self.lock:
            self.answered[node] += 1
            self.history.append(read)
            if self._isolated_at(node, call):
                self.isolated_reads.append(read)

    def _isolated_at(self, node: int, call: float) -> bool:
        """Was node cut off from its peers already when this request was sent? (lock held)"""
        return self.isolated is not None and self.isolated[0] == node and call >= self.isolated[1]

    def set_isolated(self, node: int | None) -> None:
        with self.lock:
            self.isolated = None if node is None else (node, time.monotonic())

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=10)


def leader_of(client: Client, partition: int, topic: str = TOPIC) -> int:
    from tidelog.cluster_status import merge_status

    rows = merge_status(client.status([topic]), topic)
    for row in rows:
        if row["partition"] == partition and row["leader"] >= 0:
            return int(row["leader"])
    return -1


# One round of faults: given an admin client and the round's number, make a fault, hold it, and
# say what was done. The nemesis heals everything after each round.
Faults = Callable[[Client, int], list[str]]


def nemesis(lab: Lab, seconds: float, faults: Faults) -> list[str]:
    """Rounds of faults for the run's seconds, each healed before the next; what was done."""
    events: list[str] = []
    deadline = time.monotonic() + seconds
    admin = Client(lab.bootstrap, retries=3, request_timeout_ms=2000)
    i = 0
    try:
        while time.monotonic() < deadline:
            events.extend(faults(admin, i))
            i += 1
            lab.heal()
            events.append("heal")
    finally:
        admin.close()
    return events


def log_faults(lab: Lab, work: Workload, rng: random.Random) -> Faults:
    """The log workload's faults in turn: partition 0's leader cut off (with a probe writing
    to it), a one-way cut, a flapping link."""
    kinds = ["isolate-leader", "asymmetric", "flap"]

    def one_round(admin: Client, i: int) -> list[str]:
        time.sleep(rng.uniform(1.0, 2.0))
        kind = kinds[i % len(kinds)]
        try:
            leader = leader_of(admin, 0)
        except TidelogError:
            leader = -1
        if kind == "isolate-leader" and leader > 0:
            lab.isolate(leader)
            cut_at = time.monotonic()
            probe = threading.Thread(
                target=work.probe_isolated, args=(leader, cut_at, cut_at + 3.0), daemon=True
            )
            probe.start()
            time.sleep(rng.uniform(3.0, 5.0))  # longer than an election
            probe.join()
            return [f"isolate leader {leader} of partition 0"]
        if kind == "asymmetric":
            a, b = rng.sample(lab.ids, 2)
            lab.cut(a, b)
            time.sleep(rng.uniform(2.0, 4.0))
            return [f"cut {a} -> {b} only"]
        victim = rng.choice(lab.ids)
        for _ in range(rng.randint(3, 6)):
            lab.link(victim, False)
            time.sleep(rng.uniform(0.2, 0.8))
            lab.link(victim, True)
            time.sleep(rng.uniform(0.2, 0.8))
        return [f"flap the link of {victim}"]

    return one_round


def table_faults(lab: Lab, work: TableWorkload, rng: random.Random) -> Faults:
    """The table partition's leader cut off from both peers (blackholes both ways; clients
    still reach it: the reads it is asked then are the point), or every third round its link
    down (nobody reaches it), for longer than an election and check-quorum's step-down."""

    def one_round(admin: Client, i: int) -> list[str]:
        time.sleep(rng.uniform(1.5, 3.0))
        try:
            leader = leader_of(admin, 0, TABLE)
        except TidelogError:
            leader = -1
        if leader <= 0:
            return ["no leader known: no fault this round"]
        by_link = i % 3 == 2
        if by_link:
            lab.link(leader, False)
        else:
            lab.isolate(leader)
        work.set_isolated(leader)
        time.sleep(rng.uniform(4.0, 6.0))
        work.set_isolated(None)
        return [f"isolate leader {leader} ({'link down' if by_link else 'blackholes'})"]

    return one_round


def check(lab: Lab, work: Workload) -> dict[str, Any]:
    final: dict[tuple[int, int], str] = {}
    with Client(lab.bootstrap, retries=10, request_timeout_ms=5000) as client:
        # Up to 60 s for every partition to have a leader (the check reads on either way).
        poll(
            lambda: all(leader_of(client, p) >= 0 for p in range(work.partitions)), 60, every_s=0.2
        )
        time.sleep(3)  # followers catch up after the heal
        for p in range(work.partitions):
            for record in client.consume(TOPIC, p, "earliest"):
                final[(p, record.offset)] = (record.value or b"").decode()
    lost = sorted(k for k, v in work.acked.items() if final.get(k) != v)
    changed = sorted(k for k, vs in work.reads.items() if any(final.get(k) != v for v in vs))
    by_value: dict[str, int] = {}
    for v in final.values():
        by_value[v] = by_value.get(v, 0) + 1
    duplicated = sorted(v for v, c in by_value.items() if c > 1)
    return {
        "acknowledged": len(work.acked),
        "outcome_unknown": work.unknown,
        "failed": work.failed,
        "reads": work.reads_count,
        "final_records": len(final),
        "acks_from_cut_off_leader": len(work.acked_by_cut_leader),
        "lost": len(lost),
        "changed": len(changed),
        "duplicated": len(duplicated),
        "lost_examples": [list(k) for k in lost[:5]],
        "changed_examples": [list(k) for k in changed[:5]],
    }


def check_table(work: TableWorkload) -> dict[str, Any]:
    """The table history through the linearizability checker, and what the readers met."""
    with work.lock:
        history = list(work.history)
        isolated_reads = list(work.isolated_reads)
    started = time.monotonic()
    verdict = check_linearizable(history)
    # The isolated leader's answers alone with every write: dropping reads from a linearizable
    # history leaves it linearizable, so a failure here is the isolated leader's own doing.
    alone = check_linearizable([*(op for op in history if op.kind == WRITE), *isolated_reads])
    return {
        "workload": "table",
        "consistency": work.consistency,
        "operations": len(history),
        "writes": sum(op.kind == WRITE for op in history),
        "writes_unknown": work.writes_unknown,
        "writes_refused": work.writes_refused,
        "reads_answered": {str(n): c for n, c in work.answered.items()},
        "reads_refused": {str(n): dict(sorted(c.items())) for n, c in work.refused.items()},
        "not_leader_from_isolated_leader": work.not_leader_from_isolated,
        "linearizable": verdict.linearizable,
        "stale_reads": sum(len(k.stale_reads) for k in verdict.failures),
        "explanation": verdict.explain(),
        "isolated_leader_reads": {
            "answered": len(isolated_reads),
            "linearizable": alone.linearizable,
            "stale_reads": sum(len(k.stale_reads) for k in alone.failures),
            "explanation": alone.explain(limit=1),
        },
        "check_seconds": round(time.monotonic() - started, 2),
    }


def create_topic(lab: Lab, name: str, partitions: int, kind: str, hw_policy: str) -> None:
    """Create the workload's topic (retried while the cluster forms) and wait for its leaders."""
    with Client(lab.bootstrap, retries=30, request_timeout_ms=3000) as admin:

        def create() -> None:
            try:
                admin.create_topic(
                    name,
                    partitions=partitions,
                    replication_factor=3,
                    configs={"min.insync.replicas": "2", "hw.policy": hw_policy},
                    kind=kind,
                )
            except TopicAlreadyExists:  # a try whose answer was lost made it
                pass

        retry(f"the cluster to create {name}", create, 60, every_s=0.5, tolerating=(TidelogError,))
        wait_for(
            f"a leader for every partition of {name}",
            lambda: all(leader_of(admin, p, name) >= 0 for p in range(partitions)),
            60,
            every_s=0.1,
        )


def run_log(lab: Lab, args: argparse.Namespace) -> dict[str, Any]:
    create_topic(lab, TOPIC, 3, "stream", args.hw_policy)
    work = Workload(lab, 3)
    work.start(producers=6)
    events = nemesis(lab, args.seconds, log_faults(lab, work, random.Random(args.seed)))
    lab.heal()
    time.sleep(2)
    work.finish()
    report = check(lab, work)
    report["events"] = events
    return report


def run_table(lab: Lab, args: argparse.Namespace) -> dict[str, Any]:
    create_topic(lab, TABLE, 1, "table", args.hw_policy)
    work = TableWorkload(lab, args.consistency)
    work.start(writers=3, readers=4)
    events = nemesis(lab, args.seconds, table_faults(lab, work, random.Random(args.seed)))
    lab.heal()
    time.sleep(2)
    work.finish()
    report = check_table(work)
    report["events"] = events
    return report


AnyLab = TypeVar("AnyLab", bound=Lab)


@contextlib.contextmanager
def running(kind: type[AnyLab], hw_policy: str, keep: str | None) -> Iterator[AnyLab]:
    """A lab of three nodes, built and started in a fresh directory; afterwards every process
    ended, the nodes' logs copied to keep (if given) and the directory gone."""
    root = Path(tempfile.mkdtemp(prefix="tidelog-netlab-"))
    lab = kind(3, root, hw_policy)
    try:
        lab.build()
        for n in lab.ids:
            lab.start(n)
        yield lab
    finally:
        lab.close()
        if keep:
            for log in root.glob("node-*.log"):
                shutil.copy(log, Path(keep) / log.name)
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--hw-policy", default="quorum")
    parser.add_argument(
        "--workload",
        choices=["log", "table"],
        default="log",
        help="log: producers and readers of a stream, checked against the final log; table: "
        "writers and readers of a table's keys, checked for linearizability",
    )
    parser.add_argument(
        "--consistency", default="linearizable", help="the table workload's reads (etcd's names)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", help="copy the nodes' logs here")
    args = parser.parse_args()
    with running(Lab, args.hw_policy, args.keep) as lab:
        report = run_table(lab, args) if args.workload == "table" else run_log(lab, args)
    report["hw_policy"] = args.hw_policy
    report["seconds"] = args.seconds
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
