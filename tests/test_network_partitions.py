"""Real network partitions under acks=all load (issue 10), in private network namespaces made
by tests/netlab.py: the leader cut off from the majority, one-way cuts, a flapping link. Set
TIDELOG_PARTITION_SECONDS for a longer nemesis (the figures go in the notes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process  # tiers: pyproject.toml's markers

SECONDS = float(os.environ.get("TIDELOG_PARTITION_SECONDS", "20"))
LAB = Path(__file__).with_name("netlab.py")


def namespaces_work() -> bool:
    try:
        return subprocess.run(["unshare", "-rn", "true"], timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not namespaces_work(), reason="no user/network namespaces (unshare -rn)")
@pytest.mark.parametrize("hw_policy", ["quorum", "isr"])
def test_partitions_lose_change_and_duplicate_nothing(hw_policy: str, tmp_path: Path) -> None:
    run = subprocess.run(
        [
            *("unshare", "-rn", sys.executable, str(LAB), "--seconds", str(SECONDS)),
            *("--hw-policy", hw_policy, "--keep", str(tmp_path)),
        ],
        capture_output=True,
        text=True,
        timeout=SECONDS + 240,
        cwd=LAB.parent,
    )
    assert run.returncode == 0, run.stderr[-5000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    print(json.dumps(report))
    assert report["acknowledged"] > 200, report
    assert report["reads"] > 200, report
    assert any(e.startswith("isolate leader") for e in report["events"]), report
    assert report["lost"] == 0 and report["changed"] == 0 and report["duplicated"] == 0, report
    assert report["acks_from_cut_off_leader"] == 0, report
