"""A local cluster of real `tidelog serve` processes, for development, the demo and tests."""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import secrets
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tidelog.cli.args import at_least
from tidelog.errors import Timeout
from tidelog.formats import write_version
from tidelog.storage import versioned_text
from tidelog.storage.identity import META_FILE, format_cluster
from tidelog.storage.quorum_journal import FORMAT as JOURNAL_FORMAT
from tidelog.storage.quorum_journal import journal_version
from tidelog.storage.versioned_text import CLUSTER_ID, CLUSTER_SECRET


def free_ports(count: int) -> list[int]:
    """Ports the kernel hands out now (held together so they differ)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _die_with_parent() -> None:
    """In a node's process before exec: when the thread that started it ends (as when
    `tidelog cluster up` is killed, even by SIGKILL), the node is sent SIGTERM rather than
    left running (Linux's PR_SET_PDEATHSIG; it follows the starting thread, not the process,
    so only a cluster started from a main thread that lives as long as it asks for it)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class LocalCluster:
    def __init__(
        self,
        data_dir: Path,
        nodes: int = 3,
        *,
        ports: list[int] | None = None,
        peer_ports: list[int] | None = None,
        serve_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        log_level: str = "INFO",
        die_with_parent: bool = False,
        kafka: bool = False,
        kafka_ports: list[int] | None = None,
        http: bool = False,
        http_ports: list[int] | None = None,
        open_files_limit: int | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        # Each node's RLIMIT_NOFILE (soft and hard): a node that must live within it
        self.open_files_limit = open_files_limit
        self.die_with_parent = die_with_parent
        self.node_ids = list(range(1, nodes + 1))
        self.initial_ids = list(self.node_ids)  # started with --peers; later ones --join
        self.ports = dict(zip(self.node_ids, ports or free_ports(nodes), strict=True))
        # Fixed peer-channel ports, picked now with the client ports held apart: a port the
        # kernel picked for one node's peer channel could be the client port of a node that
        # has not started yet.
        if peer_ports is None:
            taken = set(self.ports.values())
            peer_ports = [p for p in free_ports(2 * nodes) if p not in taken][:nodes]
        self.peer_ports = dict(zip(self.node_ids, peer_ports, strict=True))
        # Each node's Kafka listener (--kafka-listen), when the cluster has them.
        self.kafka_ports: dict[int, int] = {}
        if kafka or kafka_ports:
            if kafka_ports is None:
                taken = set(self.ports.values()) | set(self.peer_ports.values())
                kafka_ports = [p for p in free_ports(3 * nodes) if p not in taken][:nodes]
            self.kafka_ports = dict(zip(self.node_ids, kafka_ports, strict=True))
        # Each node's HTTP listener (--http-listen: /metrics and the console), when asked for.
        self.http_ports: dict[int, int] = {}
        if http or http_ports:
            if http_ports is None:
                taken = set(self.ports.values()) | set(self.peer_ports.values())
                taken |= set(self.kafka_ports.values())
                http_ports = [p for p in free_ports(4 * nodes) if p not in taken][:nodes]
            self.http_ports = dict(zip(self.node_ids, http_ports, strict=True))
        self.serve_args = list(serve_args or [])
        self.env = dict(os.environ, **(env or {}))
        self.log_level = log_level
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    # Made before any node runs, so before the cluster has a feature level: in tidelog
    # 0.1.0's form, which every release reads, until update_file_versions says otherwise.

    @property
    def secret_path(self) -> Path:
        """The cluster secret every node proves it holds on the peer channel: made once, kept
        with the cluster's data so that restarted nodes still belong."""
        path = self.data_dir / CLUSTER_SECRET.name
        if not path.exists():
            self.data_dir.mkdir(parents=True, exist_ok=True)
            secret = secrets.token_hex(32).encode()
            versioned_text.write(CLUSTER_SECRET, path, secret, 1, mode=0o600, exclusive=True)
        return path

    @property
    def cluster_id(self) -> str:
        """The cluster's id, made once: every node's data directory is formatted for it then
        (with every node's directory id, so a replaced disk is known as one), and a directory
        from another cluster is refused."""
        path = self.data_dir / CLUSTER_ID.name
        stored = versioned_text.read(CLUSTER_ID, path)
        if stored is None:
            cluster_id = uuid.uuid4().hex[:22]
            dirs = {n: self.data_dir / f"node-{n}" for n in self.node_ids}
            if not any((d / META_FILE).exists() for d in dirs.values()):
                format_cluster(cluster_id, dirs)
            self.data_dir.mkdir(parents=True, exist_ok=True)
            versioned_text.write(CLUSTER_ID, path, cluster_id.encode(), 1)
            return cluster_id
        return stored.value.decode()

    def update_file_versions(self) -> None:
        """cluster.id and cluster.secret in the form of the feature level the cluster is
        finalized at, once that is 2 (tidelog/formats.py), while no node runs. The level is read
        from the nodes' data: a node that applies level 2 rewrites its quorum journal in version
        2 before it writes anything else of that level (and tidelog 0.1.0 refuses that journal,
        so it could not run these nodes any more)."""
        journals = [journal_version(self.data_dir / f"node-{n}") for n in self.node_ids]
        if any(v is None or v < write_version(JOURNAL_FORMAT, 2) for v in journals):
            return
        for file, mode in ((CLUSTER_ID, 0o644), (CLUSTER_SECRET, 0o600)):
            path = self.data_dir / file.name
            stored = versioned_text.read(file, path)
            if stored is not None and stored.version < write_version(file.name, 2):
                versioned_text.write(
                    file, path, stored.value, write_version(file.name, 2), mode=mode
                )

    @property
    def peers(self) -> str:
        return ",".join(
            f"{n}=127.0.0.1:{self.ports[n]}/{self.peer_ports[n]}" for n in self.initial_ids
        )

    def new_node(self, node_id: int | None = None) -> int:
        """Pick an id and ports for a node to add to the running cluster (`cluster add-node`
        it with `node_spec`, then `start` it: it joins). Not started here."""
        n = node_id if node_id is not None else max(self.node_ids) + 1
        taken = set(self.ports.values()) | set(self.peer_ports.values())
        taken |= set(self.kafka_ports.values())
        port, peer_port, kafka_port = [p for p in free_ports(3 + len(taken)) if p not in taken][:3]
        self.node_ids.append(n)
        self.ports[n] = port
        self.peer_ports[n] = peer_port
        if self.kafka_ports:
            self.kafka_ports[n] = kafka_port
        return n

    def node_spec(self, node_id: int) -> str:
        """ID=HOST:PORT/PEER_PORT, as `cluster add-node` takes it."""
        return f"{node_id}=127.0.0.1:{self.ports[node_id]}/{self.peer_ports[node_id]}"

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.ports.values())

    @property
    def kafka_bootstrap(self) -> str:
        """bootstrap.servers for Kafka clients ("" when the nodes have no Kafka listener)."""
        return ",".join(f"127.0.0.1:{p}" for p in self.kafka_ports.values())

    def address(self, node_id: int) -> str:
        return f"127.0.0.1:{self.ports[node_id]}"

    def http_url(self, node_id: int) -> str:
        """Where node_id serves /metrics and the console (a cluster made with http=True)."""
        scheme = "https" if "--tls-cert" in self.serve_args else "http"
        return f"{scheme}://127.0.0.1:{self.http_ports[node_id]}"

    def log_path(self, node_id: int) -> Path:
        return self.data_dir / f"node-{node_id}.log"

    def start(self, node_id: int | None = None) -> None:
        for n in [node_id] if node_id is not None else self.node_ids:
            if n in self.procs and self.procs[n].poll() is None:
                continue
            data = self.data_dir / f"node-{n}"
            data.mkdir(parents=True, exist_ok=True)
            if n in self.initial_ids:
                membership = ["--peers", self.peers]
            else:
                seeds = [self.address(i) for i in self.node_ids if i != n]
                membership = ["--join", ",".join(seeds)]
            cmd = [
                sys.executable,
                "-m",
                "tidelog",
                "serve",
                "--node-id",
                str(n),
                "--listen",
                self.address(n),
                *membership,
                *(
                    ["--kafka-listen", f"127.0.0.1:{self.kafka_ports[n]}"]
                    if n in self.kafka_ports
                    else []
                ),
                *(
                    ["--http-listen", f"127.0.0.1:{self.http_ports[n]}"]
                    if n in self.http_ports
                    else []
                ),
                "--cluster-secret-file",
                str(self.secret_path),
                "--cluster-id",
                self.cluster_id,
                "--data",
                str(data),
                "--log-level",
                self.log_level,
                *self.serve_args,
            ]
            with open(self.log_path(n), "ab") as log:
                self.procs[n] = subprocess.Popen(
                    cmd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    start_new_session=True,
                    preexec_fn=self._preexec(),
                )

    def _preexec(self) -> Callable[[], None] | None:
        limit, die = self.open_files_limit, self.die_with_parent
        if limit is None and not die:
            return None

        def preexec() -> None:
            if limit is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
            if die:
                _die_with_parent()

        return preexec

    def wait_ready(self, timeout_s: float = 30.0, node_ids: list[int] | None = None) -> None:
        deadline = time.monotonic() + timeout_s
        for n in node_ids or self.node_ids:
            while True:
                proc = self.procs.get(n)
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError(
                        f"node {n} exited with {proc.returncode}; see {self.log_path(n)}:\n"
                        + self.log_path(n).read_text(errors="replace")[-3000:]
                    )
                try:
                    with socket.create_connection(("127.0.0.1", self.ports[n]), timeout=0.5):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise Timeout(f"node {n} did not start listening in {timeout_s}s") from None
                    time.sleep(0.05)

    def signal(self, node_id: int, sig: int) -> None:
        proc = self.procs[node_id]
        if proc.poll() is None:
            os.kill(proc.pid, sig)

    def kill(self, node_id: int) -> None:
        self.signal(node_id, signal.SIGKILL)
        self.procs[node_id].wait()

    def freeze(self, node_id: int) -> None:
        self.signal(node_id, signal.SIGSTOP)

    def resume(self, node_id: int) -> None:
        self.signal(node_id, signal.SIGCONT)

    def stop(self, node_id: int, timeout_s: float = 20.0) -> int | None:
        proc = self.procs.get(node_id)
        if proc is None:
            return None
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def alive(self, node_id: int) -> bool:
        proc = self.procs.get(node_id)
        return proc is not None and proc.poll() is None

    def stop_all(self) -> None:
        for n in list(self.procs):
            self.stop(n)

    def __enter__(self) -> LocalCluster:
        self.start()
        self.wait_ready()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()


def add_cluster_commands(
    sub: Any, with_bootstrap: Callable[[argparse.ArgumentParser], argparse.ArgumentParser]
) -> None:
    cluster = sub.add_parser(
        "cluster", help="run a local cluster; describe, grow, shrink and rebalance a cluster"
    )
    csub = cluster.add_subparsers(dest="cluster_command")
    up = csub.add_parser("up", help="start N nodes on 127.0.0.1; Ctrl-C stops them all")
    up.add_argument("--nodes", type=at_least(1), default=3)
    up.add_argument("--data", type=Path, required=True)
    up.add_argument("--base-port", type=int, default=7101)
    up.add_argument("--log-level", default="INFO")
    up.add_argument(
        "--kafka-base-port",
        type=int,
        default=0,
        help="give node N a Kafka listener on this port + N - 1 (default: none)",
    )
    up.add_argument(
        "--kafka-listen",
        metavar="HOST:PORT",
        help="the same as --kafka-base-port PORT (the nodes listen on 127.0.0.1)",
    )
    up.add_argument(
        "--http-base-port",
        type=int,
        default=0,
        help="give node N /metrics and the console on this port + N - 1 (default: none)",
    )
    up.add_argument(
        "--http-listen",
        metavar="HOST:PORT",
        help="the same as --http-base-port PORT (the nodes listen on 127.0.0.1)",
    )
    up.set_defaults(func=cmd_cluster_up)
    from tidelog.cli.nodes import add_node_commands
    from tidelog.cli.rebalance import add_rebalance_command

    add_rebalance_command(csub, with_bootstrap)
    add_node_commands(csub, with_bootstrap)


def cmd_cluster_up(args: argparse.Namespace) -> int:
    ports = [args.base_port + i for i in range(args.nodes)]
    base = args.kafka_base_port
    if args.kafka_listen:
        from tidelog.config import parse_address

        base = parse_address(args.kafka_listen)[1]
    kafka_ports = [base + i for i in range(args.nodes)] if base else None
    http_base = args.http_base_port
    if args.http_listen:
        from tidelog.config import parse_address

        http_base = parse_address(args.http_listen)[1]
    http_ports = [http_base + i for i in range(args.nodes)] if http_base else None
    cluster = LocalCluster(
        args.data,
        args.nodes,
        ports=ports,
        log_level=args.log_level,
        die_with_parent=True,
        kafka_ports=kafka_ports,
        http_ports=http_ports,
    )
    cluster.update_file_versions()
    cluster.start()
    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        cluster.wait_ready()
        print(f"cluster of {args.nodes} nodes up; bootstrap {cluster.bootstrap}", flush=True)
        if cluster.kafka_bootstrap:
            print(f"Kafka bootstrap.servers {cluster.kafka_bootstrap}", flush=True)
        for n in cluster.node_ids:
            kafka = f", Kafka on {cluster.kafka_ports[n]}" if n in cluster.kafka_ports else ""
            if n in cluster.http_ports:
                kafka += f", console {cluster.http_url(n)}/"
            print(
                f"  node {n}: {cluster.address(n)} (peers on {cluster.peer_ports[n]}{kafka})  "
                f"data {args.data / f'node-{n}'}  log {cluster.log_path(n)}"
            )
        print(f"cluster secret: {cluster.secret_path}", flush=True)
        print("Ctrl-C stops all nodes.", flush=True)
        while not stopping:
            for n in cluster.node_ids:
                if not cluster.alive(n):
                    print(f"node {n} exited; see {cluster.log_path(n)}", file=sys.stderr)
                    stopping = True
            time.sleep(0.2)
    finally:
        cluster.stop_all()
        print("cluster stopped", flush=True)
    cluster.update_file_versions()  # a new cluster's are, once its nodes took up level 2
    return 0
