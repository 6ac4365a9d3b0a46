"""A data directory's identity (issue 10): formatted once with a cluster id, a node id and a
random directory id; refused by another node or another cluster."""

from __future__ import annotations

import hashlib
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import poll, wait_for
from tidelog.cli.cluster import LocalCluster, free_ports
from tidelog.client.sync_client import Client
from tidelog.storage.identity import read_identity

pytestmark = pytest.mark.process  # tiers: pyproject.toml's markers


def serve(data: Path, *args: str, wait_s: float = 20) -> subprocess.CompletedProcess[str]:
    """Run `tidelog serve` until it listens (then stop it) or exits by itself."""
    (port,) = free_ports(1)
    listen = f"127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidelog", "serve", "--data", str(data), "--listen", listen, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = poll(  # the line that says it listens, else the last one read ("" at the end)
        proc.stdout.readline, wait_s, accept=lambda line: not line or "listening" in line, every_s=0
    )
    proc.terminate()
    out, err = proc.communicate(timeout=20)
    return subprocess.CompletedProcess(proc.args, proc.returncode, line + out, err)


def test_a_directory_is_formatted_once_and_refused_by_another_node_or_cluster(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    first = serve(data, "--node-id", "1", "--cluster-id", "blue")
    assert "listening" in first.stdout, first.stderr
    identity = read_identity(data)
    assert identity is not None
    assert (identity.cluster_id, identity.node_id) == ("blue", 1)
    assert len(identity.directory_id) >= 16
    again = serve(data, "--node-id", "1", "--cluster-id", "blue")
    assert "listening" in again.stdout, again.stderr
    assert read_identity(data) == identity, "written once: a restart keeps the directory id"

    other_node = serve(data, "--node-id", "2", "--cluster-id", "blue")
    assert other_node.returncode == 1
    assert "NodeIdentityError" in other_node.stderr and "belongs to node 1" in other_node.stderr
    other_cluster = serve(data, "--node-id", "1", "--cluster-id", "green")
    assert other_cluster.returncode == 1
    assert "InconsistentClusterId" in other_cluster.stderr
    assert "belongs to cluster blue" in other_cluster.stderr

    # A replaced (empty) directory gets a new directory id under the same node id.
    shutil.rmtree(data)
    fresh = serve(data, "--node-id", "1", "--cluster-id", "blue")
    assert "listening" in fresh.stdout, fresh.stderr
    replaced = read_identity(data)
    assert replaced is not None and replaced.directory_id != identity.directory_id


def test_a_node_directory_from_another_cluster_is_refused(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "a", nodes=3) as a:
        a.wait_ready()
    with LocalCluster(tmp_path / "b", nodes=3) as b:
        b.wait_ready()
        b.kill(2)
        shutil.rmtree(b.data_dir / "node-2")
        shutil.copytree(a.data_dir / "node-2", b.data_dir / "node-2")
        b.start(2)
        code = b.procs[2].wait(timeout=30)
        assert code == 1
        log = b.log_path(2).read_text()
        assert "InconsistentClusterId" in log and a.cluster_id in log


def test_nodes_sharing_a_secret_agree_on_a_random_cluster_id_in_any_order(
    tmp_path: Path,
) -> None:
    """Issue 32: the public cluster id no longer derives from the cluster secret (it let the
    secret be guessed offline). Nodes started without --cluster-id still agree: the lowest voter
    makes a random id, the others adopt it, and a replaced disk adopts its peers' id."""
    secret = tmp_path / "cluster.secret"
    secret.write_text(secrets.token_hex(32) + "\n")
    secret.chmod(0o600)
    ports = free_ports(5)
    client = dict(zip((1, 2, 3), ports[:3], strict=True))
    fixed = {2: ports[3], 3: ports[4]}  # node 1's peer port is found through its client port
    peers = ",".join(
        f"{n}=127.0.0.1:{client[n]}" + (f"/{fixed[n]}" if n in fixed else "") for n in (1, 2, 3)
    )
    procs: dict[int, subprocess.Popen[bytes]] = {}

    def start(n: int) -> None:
        log = (tmp_path / f"node-{n}.log").open("ab")
        cmd = [sys.executable, "-m", "tidelog", "serve", "--node-id", str(n)]
        cmd += ["--listen", f"127.0.0.1:{client[n]}", "--peers", peers]
        cmd += ["--data", str(tmp_path / f"node-{n}"), "--cluster-secret-file", str(secret)]
        procs[n] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)

    def formatted(n: int) -> str:
        identity = read_identity(tmp_path / f"node-{n}")
        return identity.cluster_id if identity is not None else ""

    try:
        start(3)
        start(2)
        wait_for(
            "nodes 2 and 3 to wait",
            lambda: all(
                "waiting for node 1 (the lowest voter)" in (tmp_path / f"node-{n}.log").read_text()
                for n in (2, 3)
            ),
        )
        assert formatted(2) == formatted(3) == "", "nothing formats before node 1 decides"
        start(1)
        wait_for("all three formatted", lambda: all(formatted(n) for n in (1, 2, 3)))
        cluster_id = formatted(1)
        assert formatted(2) == formatted(3) == cluster_id
        derived = hashlib.sha256(b"tidelog cluster id|" + secret.read_bytes().strip())
        assert cluster_id != derived.hexdigest()[:22]
        bootstrap = [f"127.0.0.1:{client[1]}"]
        with Client(bootstrap) as c:
            c.create_topic("t", partitions=1, replication_factor=3)
            c.produce("t", [b"a"], acks="all")
            assert c.describe_cluster().cluster_id == cluster_id

        # The lowest voter's disk replaced while its peers run: it adopts their id.
        procs[1].kill()
        procs[1].wait()
        old = read_identity(tmp_path / "node-1")
        shutil.rmtree(tmp_path / "node-1")
        start(1)
        wait_for("node 1 formatted again", lambda: formatted(1))
        assert formatted(1) == cluster_id
        fresh = read_identity(tmp_path / "node-1")
        assert old is not None and fresh is not None
        assert fresh.directory_id != old.directory_id
        assert "adopting cluster id" in (tmp_path / "node-1.log").read_text()
        with Client([f"127.0.0.1:{client[2]}"]) as c:
            c.produce("t", [b"b"], acks="all")
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
