"""The `tidelog` command line against a real node process."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from helpers import wait_for, wait_for_value
from tidelog.cli.cluster import LocalCluster, free_ports

pytestmark = pytest.mark.process  # tiers: pyproject.toml's markers


def tidelog(
    bootstrap: str, *args: str, stdin: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, TIDELOG_BOOTSTRAP=bootstrap)
    proc = subprocess.run(
        [sys.executable, "-m", "tidelog", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def connected(pid: int, port: int) -> bool:
    """Whether process pid holds an established TCP connection to port on this machine (read
    from Linux's /proc: its sockets' inodes, matched in its network namespace's table)."""
    sockets = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed since it was listed
            continue
        if target.startswith("socket:["):
            sockets.add(target.removeprefix("socket:[").removesuffix("]"))
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote_port, state, inode = int(fields[2].rsplit(":", 1)[1], 16), fields[3], fields[9]
        if remote_port == port and state == "01" and inode in sockets:  # 01: ESTABLISHED
            return True
    return False


def test_cli_round_trip(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, nodes=1) as cluster:
        b = cluster.bootstrap
        assert (
            "created topic events"
            in tidelog(b, "topics", "create", "events", "--partitions", "2").stdout
        )
        tidelog(
            b,
            "topics",
            "create",
            "small",
            "--config",
            "segment.bytes=2048",
            "--config",
            "retention.ms=-1",
        )
        assert tidelog(b, "topics", "list").stdout.split() == ["events", "small"]
        # stdin a file or /dev/null, not a pipe (asyncio cannot watch those: a traceback, and a
        # hang on /dev/null, before)
        tidelog(b, "topics", "create", "piped")
        lines = tmp_path / "two.txt"
        lines.write_text("from-a-file\nand-another\n")
        for source, produced in ((lines, 2), (Path(os.devnull), 0)):
            with source.open("rb") as stdin:
                done = subprocess.run(
                    [sys.executable, "-m", "tidelog", "produce", "piped", "--print-offsets"],
                    stdin=stdin,
                    capture_output=True,
                    text=True,
                    env=dict(os.environ, TIDELOG_BOOTSTRAP=b),
                    timeout=60,
                )
            assert done.returncode == 0 and len(done.stdout.splitlines()) == produced, done
        missing = tidelog(b, "produce", "piped", "--file", str(tmp_path / "none"), check=False)
        assert missing.returncode == 1 and "cannot read" in missing.stderr, missing.stderr
        described = tidelog(b, "topics", "describe", "small").stdout
        assert "segment.bytes=2048" in described and "partition 0" in described
        dup = tidelog(b, "topics", "create", "events", check=False)
        assert dup.returncode == 1 and "TopicAlreadyExists" in dup.stderr
        tidelog(b, "topics", "create", "scratch", "--config", "segment.bytes=4096")
        altered = tidelog(
            b,
            "topics",
            "alter",
            "scratch",
            "--config",
            "retention.ms=60000",
            "--delete-config",
            "segment.bytes",
        ).stdout
        assert "retention.ms=60000" in altered and "segment.bytes" not in altered
        bad = tidelog(b, "topics", "alter", "scratch", "--config", "retention.ms=soon", check=False)
        assert bad.returncode == 1 and "InvalidConfig" in bad.stderr
        grown = tidelog(b, "topics", "add-partitions", "scratch", "--partitions", "3").stdout
        assert "now has 3 partitions" in grown
        assert "deleted topic scratch" in tidelog(b, "topics", "delete", "scratch").stdout
        gone = tidelog(b, "topics", "delete", "scratch", check=False)
        assert gone.returncode == 1 and "UnknownTopicOrPartition" in gone.stderr

        out = tidelog(
            b, "produce", "events", "--partition", "1", "--print-offsets", stdin="a\nb\nc\n"
        ).stdout
        assert out.split("\n")[:3] == ["1 0", "1 1", "1 2"]
        keyed = tidelog(
            b,
            "produce",
            "events",
            "--key-separator",
            ":",
            "--acks",
            "1",
            "--print-offsets",
            stdin="k1:v1\nk2:v2\n",
        ).stdout
        assert len(keyed.strip().split("\n")) == 2

        lines = (
            tidelog(b, "consume", "events", "--partition", "1", "--format", "json")
            .stdout.strip()
            .split("\n")
        )
        rows = [json.loads(line) for line in lines]
        assert [(r["partition"], r["offset"], r["value"]) for r in rows[:3]] == [
            (1, 0, "a"),
            (1, 1, "b"),
            (1, 2, "c"),
        ]
        assert all({"partition", "offset", "timestamp", "key", "value"} <= set(r) for r in rows)
        everything = tidelog(b, "consume", "events", "--format", "json").stdout.strip().split("\n")
        keys = {json.loads(line)["key"] for line in everything}
        assert {"k1", "k2"} <= keys
        text = tidelog(
            b, "consume", "events", "--partition", "1", "--from", "1", "--max", "1"
        ).stdout
        assert text == "b\n"
        latest = tidelog(b, "consume", "events", "--partition", "1", "--from", "latest").stdout
        assert latest == ""

        follower = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tidelog",
                "consume",
                "events",
                "--partition",
                "0",
                "--follow",
                "--from",
                "latest",
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=dict(os.environ, TIDELOG_BOOTSTRAP=b),
        )
        try:
            # Produced once it is connected (it asks for the latest offset right then), not
            # after a fixed head start that a busy machine can outrun.
            port = int(b.rsplit(":", 1)[1])
            wait_for("the follower to connect", lambda: connected(follower.pid, port), 60)
            tidelog(b, "produce", "events", "--partition", "0", stdin="followed\n")
            assert follower.stdout is not None
            assert follower.stdout.readline() == "followed\n"
        finally:
            follower.terminate()
            follower.wait(10)

        # Reads below the log start: the CLI says plainly what it skipped.
        tidelog(b, "delete-records", "events", "--partition", "1", "--before", "2")
        skipped = tidelog(b, "consume", "events", "--partition", "1", "--from", "0")
        assert skipped.stdout.split("\n")[0] == "c"
        assert "skipping offsets 0..1" in skipped.stderr
        strict = tidelog(
            b,
            "consume",
            "events",
            "--partition",
            "1",
            "--from",
            "0",
            "--reset",
            "none",
            check=False,
        )
        assert strict.returncode == 1 and "OffsetOutOfRange" in strict.stderr

        tidelog(b, "topics", "create", "kv", "--kind", "table")
        tidelog(b, "produce", "kv", "--key-separator", "=", stdin="a=1\nb=2\na=3\n")
        assert tidelog(b, "table", "get", "kv", "a").stdout == "3\n"
        assert tidelog(b, "table", "scan", "kv").stdout == "a\t3\nb\t2\n"
        assert tidelog(b, "table", "get", "kv", "zz", check=False).returncode == 1

        tidelog(b, "cursors", "create", "etl", "--topic", "events", "--from", "earliest")
        first = tidelog(b, "consume", "events", "--cursor", "etl", "--max", "2").stdout.split()
        rest = tidelog(b, "consume", "events", "--cursor", "etl").stdout.split()
        assert len(first) == 2 and len(first) + len(rest) == 4, (
            "the cursor resumes where it stopped"
        )
        listed = json.loads(tidelog(b, "cursors", "list", "--json").stdout)
        assert {r["partition"]: r["lag"] for r in listed if r["name"] == "etl"} == {0: 0, 1: 0}

        # 400 records in batches of about 500 bytes: several segments of 2,048 bytes, from one
        # process (a process each, the CLI's start-up was most of this test's time).
        lines = "".join(f"line-{i}-{j}\n" for i in range(40) for j in range(10))
        tidelog(b, "produce", "small", "--batch-bytes", "500", stdin=lines)
        status = json.loads(tidelog(b, "status", "--json").stdout)
        rows = {(p["topic"], p["partition"]): p for p in status["partitions"]}
        small = rows[("small", 0)]
        assert small["high_watermark"] == small["log_end_offset"] == 400
        assert (
            small["log_start_offset"] == 0
            and small["segment_count"] > 1
            and small["size_bytes"] > 0
        )
        table = tidelog(b, "status", "small").stdout
        assert "LOG_START" in table and "small" in table and "events" not in table
        missing = tidelog(b, "status", "no-such-topic", check=False)  # not an empty table
        assert missing.returncode == 1 and "UnknownTopicOrPartition" in missing.stderr
        assert "__metadata" in tidelog(b, "status", "__metadata").stdout  # the upgrade guide's


def test_serve_from_a_toml_file_and_stop_on_sigterm(tmp_path: Path) -> None:
    port = free_ports(1)[0]
    config = tmp_path / "node.toml"
    config.write_text(
        f'node_id = 4\nlisten = "127.0.0.1:{port}"\ndata = "{tmp_path / "data"}"\n'
        '[defaults]\n"segment.bytes" = 4096\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidelog", "serve", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        while "listening" not in first:
            first = proc.stdout.readline()
        assert f"127.0.0.1:{port}" in first
        b = f"127.0.0.1:{port}"
        tidelog(b, "topics", "create", "t")
        tidelog(b, "produce", "t", "--batch-bytes", "500", stdin="x\n" * 1000)
        status = json.loads(tidelog(b, "status", "--json").stdout)
        assert status["partitions"][0]["segment_count"] > 1  # the TOML default applied
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=20)[0]
        assert proc.returncode == 0
        assert "stopped cleanly" in output
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (tmp_path / "data" / "t-0" / ".clean-shutdown").exists()
    time.sleep(0)


def ports_free(base: int, count: int) -> bool:
    for port in range(base, base + count):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def test_cluster_up_starts_real_processes_and_ctrl_c_stops_them(tmp_path: Path) -> None:
    # Below the kernel's ephemeral range: the nodes' own outbound connections take ports from
    # that range, and one could take base + 2 before node 3 binds it.
    base = next(b for b in random.sample(range(20_000, 30_000, 6), 200) if ports_free(b, 6))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tidelog",
            "cluster",
            "up",
            "--nodes",
            "3",
            "--data",
            str(tmp_path),
            "--base-port",
            str(base),
            "--http-listen",
            f"127.0.0.1:{base + 3}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        printed = ""
        while "cluster of 3 nodes up" not in line:
            assert line or proc.poll() is None, f"cluster up exited early:\n{printed}"
            printed += line
            line = proc.stdout.readline()
        bootstrap = line.rsplit(" ", 1)[-1].strip()
        nodes = [proc.stdout.readline() for _ in range(3)]
        for n, shown in enumerate(nodes):
            assert f"console http://127.0.0.1:{base + 3 + n}/" in shown, nodes

        def metrics() -> bytes:
            url = f"http://127.0.0.1:{base + 4}/metrics"
            with urllib.request.urlopen(url, timeout=10) as page:
                return bytes(page.read())

        assert b"tidelog_" in wait_for("node 2's /metrics", metrics, 10, tolerating=(OSError,))
        # No --replication-factor on three nodes: three copies, and it says so (it made one).
        created = tidelog(bootstrap, "topics", "create", "t", "--partitions", "2").stdout
        assert "replication factor 3 (the default: min(3, nodes))" in created, created
        out = tidelog(bootstrap, "produce", "t", "--print-offsets", stdin="a\nb\n").stdout
        assert len(out.split("\n")) >= 2
        wait_for_value(  # the third replica may still be applying the topic
            "three replicas of every partition in the status",
            lambda: json.loads(tidelog(bootstrap, "status", "--json").stdout),
            lambda status: all(len(p["replicas"]) == 3 for p in status["partitions"]),
            10,
            every_s=0.2,
        )
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=30)[0]
        assert "cluster stopped" in rest and proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    for n in (1, 2, 3):
        assert (tmp_path / f"node-{n}" / "t-0" / ".clean-shutdown").exists()
    # Made bare before any node ran; rewritten at the stop, the new cluster being at level 2.
    for name in ("cluster.id", "cluster.secret"):
        assert (tmp_path / name).read_text().startswith(f"# tidelog {name}\nversion=2\n")
