"""Golden text for `tidelog status` and `tidelog cursors list` on a fixed scenario (one node,
known records, known cursor positions): columns as wide as their widest cell, nothing cut, what
holds the LWM and each cursor on lines of their own. Only the cursor's idle seconds (wall-clock)
are masked. Also --watch: printed again until interrupted, and as JSON lines with --json.

To accept a deliberate change of the layout: TIDELOG_GOLDEN_UPDATE=1 pytest tests/test_cli_tables.py
"""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tidelog.cli.cluster import LocalCluster
from tidelog.client.sync_client import Client

pytestmark = pytest.mark.process  # tiers: pyproject.toml's markers

GOLDEN = Path(__file__).parent / "golden"
LONG_TOPIC = "orders-from-the-web-shop-and-the-mobile-app"
LONG_CURSOR = "nightly-backup-to-the-warehouse-in-the-other-region"


def cli(bootstrap: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "tidelog", *args, "--bootstrap", bootstrap],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def masked_idle(text: str) -> str:
    """The IDLE_S column (seconds since a commit) is wall-clock: shown as zeros of its width."""
    return re.sub(
        r"(?m)(\s)(\d+)(  (?:live|backup|INVALIDATED.*))$",
        lambda m: m.group(1) + "0".rjust(len(m.group(2))) + m.group(3),
        text,
    )


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("TIDELOG_GOLDEN_UPDATE"):
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed:\n{text}"


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> str:
    with (
        LocalCluster(tmp_path_factory.mktemp("tables"), nodes=1, log_level="WARNING") as cluster,
        Client(cluster.bootstrap) as client,
    ):
        cluster.wait_ready()
        client.create_topic(LONG_TOPIC, partitions=2)
        client.create_topic("t", partitions=1, configs={"retention.bytes": "100000"})
        client.produce(LONG_TOPIC, [b"order-%02d" % i for i in range(10)], partition=0)
        client.produce(LONG_TOPIC, [b"order-%02d" % i for i in range(3)], partition=1)
        client.produce("t", [b"x" * 50 for _ in range(4)], partition=0)
        run = client._run
        run(client.async_client.create_cursor(LONG_CURSOR, LONG_TOPIC, "earliest", backup=True))
        run(client.async_client.commit_cursor(LONG_CURSOR, {0: 4, 1: 3}))
        run(client.async_client.create_cursor("etl", "t", "earliest"))
        run(client.async_client.commit_cursor("etl", {0: 1}))
        yield cluster.bootstrap


def test_status_is_a_table_that_cuts_nothing(scenario: str) -> None:
    text = cli(scenario, "status")
    check_golden("status.txt", text)
    assert LONG_TOPIC in text and "LWM set by" in text


def test_cursors_list_is_a_table_that_cuts_nothing(scenario: str) -> None:
    text = masked_idle(cli(scenario, "cursors", "list"))
    check_golden("cursors.txt", text)
    assert LONG_CURSOR in text


def test_watch_prints_again_until_interrupted(scenario: str) -> None:
    for extra in ([], ["--json"]):
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tidelog",
                "status",
                "t",
                "--watch",
                "0.3",
                *extra,
                "--bootstrap",
                scenario,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # Interrupted once it has printed twice, however long its start takes.
        assert proc.stdout is not None
        printed, refresh = "", '"partitions"' if extra else "LOG_START"
        while printed.count(refresh) < 2:
            line = proc.stdout.readline()
            assert line, f"status --watch stopped printing:\n{printed}"
            printed += line
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
        out = printed + out
        assert proc.returncode == 0, err
        if extra:
            docs = [json.loads(line) for line in out.splitlines() if line.strip()]
            assert len(docs) >= 2 and all(d["partitions"][0]["topic"] == "t" for d in docs)
        else:
            assert out.count("every 0.3s") >= 2 and out.count("LOG_START") >= 2


def test_produce_from_a_file_shows_progress_on_a_terminal_only(
    scenario: str, tmp_path: Path
) -> None:
    data = tmp_path / "lines.txt"
    data.write_bytes(b"".join(b"line %06d\n" % i for i in range(20_000)))
    command = [sys.executable, "-m", "tidelog", "produce", "t", "--partition", "0"]
    command += ["--file", str(data), "--bootstrap", scenario]
    # Not a terminal: nothing but errors on stderr.
    quiet = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    # A terminal: a progress line with the rate and how far along.
    primary, secondary = pty.openpty()
    try:
        shown = subprocess.run(command, stderr=secondary, stdout=subprocess.PIPE, timeout=120)
        os.close(secondary)
        drawn = b""
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # the terminal's other end is closed: all read
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        os.close(primary)
    assert shown.returncode == 0
    text = drawn.decode()
    assert "produce to t: 20.0k records" in text and "100%" in text and "/s" in text, text
    with Client(scenario) as client:
        assert client.list_offsets("t", 0, "latest") >= 20_000
