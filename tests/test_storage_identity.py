"""A data directory's identity (issue 10): formatted once with a cluster id, a node id and a
random directory id; refused by another node or another cluster."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from tidelog.cli.cluster import LocalCluster, free_ports
from tidelog.storage.identity import read_identity


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
    deadline = time.monotonic() + wait_s
    line = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line or "listening" in line:
            break
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
