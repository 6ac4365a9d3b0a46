"""Real network partitions under acks=all load (issue 10), in private network namespaces made
by tests/netlab.py: the leader cut off from the majority, one-way cuts, a flapping link; and
reads that are current (issue 34): a table's leader cut off now and then while every node is
asked for reads, the history checked for linearizability. Set TIDELOG_PARTITION_SECONDS for a
longer nemesis (the figures go in the notes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# timed: partitions for a set time
pytestmark = [pytest.mark.process, pytest.mark.timed]  # tiers: pyproject.toml's markers

SECONDS = float(os.environ.get("TIDELOG_PARTITION_SECONDS", "20"))
TABLE_SECONDS = float(os.environ.get("TIDELOG_PARTITION_SECONDS", "20"))
LAB = Path(__file__).with_name("netlab.py")


def namespaces_work() -> bool:
    try:
        return subprocess.run(["unshare", "-rn", "true"], timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def run_lab(seconds: float, *args: str, lab: Path = LAB) -> dict[str, Any]:
    """netlab.py (or another lab of its, such as txn_netlab.py) in a private user + network
    namespace; its JSON report."""
    run = subprocess.run(
        ["unshare", "-rn", sys.executable, str(lab), "--seconds", str(seconds), *args],
        capture_output=True,
        text=True,
        timeout=seconds + 240,
        cwd=lab.parent,
    )
    assert run.returncode == 0, run.stderr[-5000:] + run.stdout[-5000:]
    report: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    print(json.dumps(report))
    return report


@pytest.mark.skipif(not namespaces_work(), reason="no user/network namespaces (unshare -rn)")
@pytest.mark.parametrize("hw_policy", ["quorum", "isr"])
def test_partitions_lose_change_and_duplicate_nothing(hw_policy: str, tmp_path: Path) -> None:
    report = run_lab(SECONDS, "--hw-policy", hw_policy, "--keep", str(tmp_path))
    assert report["acknowledged"] > 200, report
    assert report["reads"] > 200, report
    assert any(e.startswith("isolate leader") for e in report["events"]), report
    assert report["lost"] == 0 and report["changed"] == 0 and report["duplicated"] == 0, report
    assert report["acks_from_cut_off_leader"] == 0, report


@pytest.mark.skipif(not namespaces_work(), reason="no user/network namespaces (unshare -rn)")
def test_an_isolated_table_leader_refuses_reads_and_the_history_is_linearizable(
    tmp_path: Path,
) -> None:
    """Writers and readers of a table's keys while its leader is cut off now and then; every
    node is asked for every key in turn. Linearizable reads: the isolated leader refuses
    (NotLeader) and answers nothing, and the checker finds the whole history linearizable.
    (By hand, netlab.py's `--consistency serializable` makes the same run fail the check.)"""
    report = run_lab(TABLE_SECONDS, "--workload", "table", "--keep", str(tmp_path))
    assert any(e.startswith("isolate leader") for e in report["events"]), report
    assert report["writes"] - report["writes_unknown"] > 100, report
    assert sum(report["reads_answered"].values()) > 100, report
    assert report["not_leader_from_isolated_leader"] > 0, report
    assert report["isolated_leader_reads"]["answered"] == 0, report
    assert report["linearizable"], report["explanation"]
