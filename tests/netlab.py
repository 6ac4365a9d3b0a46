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
"""

from __future__ import annotations

import argparse
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
from pathlib import Path
from typing import Any

from helpers import poll, retry
from tidelog.client.sync_client import Client
from tidelog.errors import OutcomeUnknown, TidelogError
from tidelog.protocol import api
from tidelog.protocol.api import ACKS_ALL, ApiKey
from tidelog.record.batch import ProducerRecord, build_batch

PREFIX = "10.77.0"
PORT, PEER_PORT = 7100, 7200
TOPIC = "jepsen"


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

    def start(self, n: int) -> None:
        peers = ",".join(f"{i}={PREFIX}.{i}:{PORT}/{PEER_PORT}" for i in self.ids)
        log = open(self.root / f"node-{n}.log", "ab")  # noqa: SIM115 (the process owns it)
        self.procs[n] = subprocess.Popen(
            [
                *("nsenter", "-t", str(self.holders[n].pid), "-n", "--", sys.executable, "-m"),
                *("tidelog", "serve", "--node-id", str(n), "--listen", self.address(n)),
                *("--peer-listen", f"{PREFIX}.{n}:{PEER_PORT}", "--peers", peers),
                *("--cluster-secret-file", str(self.secret), "--cluster-id", self.cluster_id),
                *("--data", str(self.root / f"node-{n}"), "--log-level", "INFO"),
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


def leader_of(client: Client, partition: int) -> int:
    from tidelog.cluster_status import merge_status

    rows = merge_status(client.status([TOPIC]), TOPIC)
    for row in rows:
        if row["partition"] == partition and row["leader"] >= 0:
            return int(row["leader"])
    return -1


def nemesis(lab: Lab, work: Workload, seconds: float, rng: random.Random) -> list[str]:
    events: list[str] = []
    deadline = time.monotonic() + seconds
    admin = Client(lab.bootstrap, retries=3, request_timeout_ms=2000)
    kinds = ["isolate-leader", "asymmetric", "flap"]
    i = 0
    try:
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(1.0, 2.0))
            kind = kinds[i % len(kinds)]
            i += 1
            try:
                leader = leader_of(admin, 0)
            except TidelogError:
                leader = -1
            if kind == "isolate-leader" and leader > 0:
                lab.isolate(leader)
                events.append(f"isolate leader {leader} of partition 0")
                cut_at = time.monotonic()
                probe = threading.Thread(
                    target=work.probe_isolated, args=(leader, cut_at, cut_at + 3.0), daemon=True
                )
                probe.start()
                time.sleep(rng.uniform(3.0, 5.0))  # longer than an election
                probe.join()
            elif kind == "asymmetric":
                a, b = rng.sample(lab.ids, 2)
                lab.cut(a, b)
                events.append(f"cut {a} -> {b} only")
                time.sleep(rng.uniform(2.0, 4.0))
            else:
                victim = rng.choice(lab.ids)
                events.append(f"flap the link of {victim}")
                for _ in range(rng.randint(3, 6)):
                    lab.link(victim, False)
                    time.sleep(rng.uniform(0.2, 0.8))
                    lab.link(victim, True)
                    time.sleep(rng.uniform(0.2, 0.8))
            lab.heal()
            events.append("heal")
    finally:
        admin.close()
    return events


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


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--hw-policy", default="quorum")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", help="copy the nodes' logs here")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tidelog-netlab-"))
    lab = Lab(3, root, args.hw_policy)
    try:
        lab.build()
        for n in lab.ids:
            lab.start(n)
        with Client(lab.bootstrap, retries=30, request_timeout_ms=3000) as admin:
            retry(
                f"the cluster to create {TOPIC}",
                lambda: admin.create_topic(
                    TOPIC,
                    partitions=3,
                    replication_factor=3,
                    configs={"min.insync.replicas": "2", "hw.policy": args.hw_policy},
                ),
                60,
                every_s=0.5,
                tolerating=(TidelogError,),
            )
            for p in range(3):
                while leader_of(admin, p) < 0:
                    time.sleep(0.1)
        work = Workload(lab, 3)
        work.start(producers=6)
        events = nemesis(lab, work, args.seconds, random.Random(args.seed))
        lab.heal()
        time.sleep(2)
        work.finish()
        report = check(lab, work)
        report["events"] = events
        report["hw_policy"] = args.hw_policy
        print(json.dumps(report))
        return 0
    finally:
        lab.close()
        if args.keep:
            for log in root.glob("node-*.log"):
                shutil.copy(log, Path(args.keep) / log.name)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
