"""The README's Python and Spark snippets run as written, against a live node: each ```python
block of README.md, in order, in a process of its own, with only the addresses (and the Spark
checkpoint directory) pointed at this test's node. A block preceded by a `<!-- not run ... -->`
comment says why it cannot run here (a remote Spark cluster)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import wait_for_value
from tidelog.cli.cluster import LocalCluster
from tidelog.client.sync_client import Client

pytestmark = pytest.mark.process  # tiers: pyproject.toml's markers

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCK = re.compile(r"(<!-- not run[^>]*-->\s*)?```python\n(.*?)```", re.S)
# What a streaming snippet leaves running: let it process what is there, then stop it.
STREAMING_TAIL = """
for _query in spark.streams.active:
    _query.processAllAvailable()
    _query.stop()
spark.stop()
"""


def blocks() -> list[str]:
    found = [(bool(m.group(1)), m.group(2)) for m in BLOCK.finditer(README.read_text())]
    assert len(found) >= 3, "the README's Python examples are gone"
    return [code for skipped, code in found if not skipped]


def run(code: str, cwd: Path, timeout_s: float) -> str:
    # (Spark's scratch under cwd, not in the system's temp directory, where the Spark kill test
    # running beside looks for what its SIGKILLed drivers might leave: tests/test_spark.py.)
    scratch = cwd / "tmp"
    scratch.mkdir(exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=cwd,
        env=dict(os.environ, TMPDIR=str(scratch)),
    )
    assert done.returncode == 0, (
        f"{code}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr[-4000:]}"
    )
    return done.stdout


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_the_readme_python_and_spark_snippets_run_as_written(tmp_path: Path) -> None:
    with (
        LocalCluster(tmp_path / "cluster", nodes=1, kafka=True, log_level="WARNING") as cluster,
        Client(cluster.bootstrap) as client,
    ):
        cluster.wait_ready()
        outputs = []
        for code in blocks():
            code = code.replace("127.0.0.1:7100", cluster.bootstrap)
            code = code.replace("127.0.0.1:9092", cluster.kafka_bootstrap)
            code = code.replace('"/tmp/ck"', repr(str(tmp_path / "ck")))
            streaming = ".writeStream" in code
            if streaming:
                code += STREAMING_TAIL
            outputs.append(run(code, tmp_path, 240 if "spark" in code else 60))
        # The first block produced "hello" and printed it back; the Kafka block added a record;
        # the streaming block copied every record of events into copy, exactly once.
        assert "0 b'hello'" in outputs[0]
        events = [r.value for p in range(3) for r in client.consume("events", p, "earliest")]
        assert b"hello" in events and b"v" in events
        wait_for_value(
            "the streaming block to copy every record of events",
            lambda: sorted(
                r.value
                for p in range(client.topic("copy").partitions)
                for r in client.consume("copy", p, "earliest")
            ),
            lambda copied: copied == sorted(events),
            30,
            every_s=0.2,
        )
