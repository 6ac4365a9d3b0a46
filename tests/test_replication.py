"""The replication core: purity, golden scenario scripts, and the deterministic simulator."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from tidelog.replication.replica import FAULT_IGNORE_DIRECTORIES, FAULT_TRUNCATE_TO_HW
from tidelog.testing.scenario import run_script
from tidelog.testing.sim import SimParams, Simulation, SimulationFailure, run_seed

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = sorted((ROOT / "tests" / "scenarios").glob("*.txt"))
SEEDS = 500 if os.environ.get("CI") else 100
CHUNK = 50


def test_the_core_does_no_io() -> None:
    """replication/ imports no asyncio, socket, time, random, os, threading or select."""
    forbidden = {"asyncio", "socket", "time", "random", "os", "threading", "select", "subprocess"}
    for path in (ROOT / "src" / "tidelog" / "replication").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module.split(".")[0]]
                if node.module.startswith("tidelog."):
                    layer = node.module.split(".")[1]
                    assert layer in {"record", "replication", "errors", "config"}, (
                        f"{path.name} imports {node.module}: the core sees storage only through "
                        "its interface"
                    )
            bad = forbidden.intersection(names)
            assert not bad, f"{path.name} imports {bad}"


@pytest.mark.parametrize("script", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_golden_scenarios(script: Path) -> None:
    expected = script.read_text()
    actual = run_script(expected)
    assert actual == expected, (
        f"{script.name} differs; inspect with "
        f"`python -m tidelog.testing.scenario {script.relative_to(ROOT)}` "
        "(--rewrite accepts the new output)"
    )
    if "broken_rule" in script.stem:
        assert "VIOLATION" in actual, "a deliberately broken rule must be caught"
    else:
        assert "VIOLATION" not in actual


@pytest.mark.parametrize("first", range(0, SEEDS, CHUNK))
def test_simulator_seeds(first: int) -> None:
    for seed in range(first, first + CHUNK):
        run_seed(seed)


def test_the_same_seed_replays_exactly() -> None:
    a = Simulation(SimParams.from_seed(7))
    b = Simulation(SimParams.from_seed(7))
    assert a.run() == b.run()
    assert a.digest.hexdigest() == b.digest.hexdigest()
    c = Simulation(SimParams.from_seed(8))
    c.run()
    assert c.digest.hexdigest() != a.digest.hexdigest()


def seeds_caught(fault: str, seeds: int, enough: int | None = None) -> list[int]:
    """The seeds (of the first `seeds`, stopping at `enough`) whose run with a deliberately
    broken rule the checkers fail; each failure names the fault in its replay command."""
    caught = []
    for seed in range(seeds):
        try:
            run_seed(seed, frozenset({fault}))
        except SimulationFailure as exc:
            caught.append(seed)
            assert f"--fault {fault}" in str(exc)
        if enough is not None and len(caught) >= enough:
            break
    return caught


def test_the_simulator_catches_truncation_to_the_local_hw() -> None:
    assert seeds_caught(FAULT_TRUNCATE_TO_HW, 40), "the KIP-101 bug must not pass 40 seeds"


def test_votes_from_replaced_disks_lose_acknowledged_records_and_are_caught() -> None:
    """The observer rule switched off: some of the first 100 seeds (a third of them replace a
    disk) lose or change a committed record, and the checkers say so. With the rule on, the
    same seeds pass (test_simulator_seeds runs them), as does the scripted case."""
    caught = seeds_caught(FAULT_IGNORE_DIRECTORIES, 100, enough=2)
    assert caught, "votes from empty disks must not pass 100 seeds"
    scripts = ROOT / "tests" / "scenarios"
    broken = run_script((scripts / "replaced_disk_broken_rule.txt").read_text())
    assert "VIOLATION: offset 1 was committed" in broken
    kept = run_script((scripts / "replaced_disk_rejoins_as_observer.txt").read_text())
    assert "VIOLATION" not in kept and "2@e2:m3" in kept


def test_committing_an_old_epoch_by_counting_is_caught() -> None:
    # Random faults rarely line up Raft's Figure 8 (1,500 seeds did not); the scripted scenario
    # runs the same simulator with the broken rule switched on and the checkers catch it.
    script = ROOT / "tests" / "scenarios" / "raft_figure8_broken_rule.txt"
    assert "VIOLATION: offset 0 was committed" in run_script(script.read_text())


# Bugs the simulator found, kept as seeds. A seed replays its bug exactly at the commit that
# found it; as the core and the swarm draw evolve the same seed explores a nearby history, so
# these stay as regression cases rather than exact replays:
# 458, 463, 992: a follower took the leader's HW from a *diverging* fetch answer, before it had
#   truncated its own divergent tail, so uncommitted records of an old epoch sat below its HW.
# 135, 220, 278 (with cleaning on): a leader whose epoch history was cut at its log start
#   answered "diverging" to a follower it could not check, which then truncated below its HW;
#   now such a follower starts over at the leader's log start.
# 509: a late answer with the same fetch offset but computed for an older epoch made a follower
#   truncate again; answers now echo the epoch they were computed for.
REGRESSION_SEEDS = [458, 463, 992, 135, 220, 278, 509]


@pytest.mark.parametrize("seed", REGRESSION_SEEDS)
def test_regression_seeds(seed: int) -> None:
    run_seed(seed)


class MemorySnapshots:
    """A SnapshotAccess for the core alone: bytes in memory, and a switch to drop chunks."""

    def __init__(self) -> None:
        self.snapshots: dict[int, bytes] = {}
        self.partial: dict[int, bytes] = {}
        self.installed: int | None = None

    def latest_snapshot(self) -> tuple[int, int] | None:
        if not self.snapshots:
            return None
        offset = max(self.snapshots)
        return offset, len(self.snapshots[offset])

    def read_snapshot_chunk(self, offset: int, position: int, max_bytes: int) -> bytes:
        return self.snapshots[offset][position : position + max_bytes]

    def partial_snapshot_size(self, offset: int) -> int:
        return len(self.partial.get(offset, b""))

    def write_snapshot_chunk(self, offset: int, position: int, data: bytes) -> int:
        self.partial[offset] = self.partial.get(offset, b"") + data
        return len(self.partial[offset])

    def finish_snapshot(self, offset: int) -> bool:
        ok = self.partial.pop(offset) == b"S" * 50
        self.installed = offset if ok else None
        return ok


def test_a_follower_behind_the_log_start_installs_the_snapshot_resuming_after_drops() -> None:
    import random

    from tidelog.record import ProducerRecord, build_batch
    from tidelog.replication.messages import FetchSnapshotResponse
    from tidelog.replication.replica import QuorumState, Replica, ReplicaConfig
    from tidelog.storage.memory_log import MemoryLog

    voters = (1, 2)
    logs = {n: MemoryLog() for n in voters}
    snaps = {n: MemorySnapshots() for n in voters}
    reps = {
        n: Replica(
            ReplicaConfig(n, voters, state_machine=True, fetch_max_bytes=7),
            logs[n],
            QuorumState(),
            random.Random(n),
            snaps[n],
        )
        for n in voters
    }
    queue: list[tuple[int, int, object]] = []
    dropped = [0]

    def drain() -> None:
        for n, r in reps.items():
            ready = r.ready()
            queue.extend((n, o.to, o.message) for o in ready.messages)
            if ready.flush:
                logs[n].flush()
                r.on_flushed()
                queue.extend((n, o.to, o.message) for o in r.ready().messages)

    def run(ticks: int, drop_chunks: bool = False) -> None:
        for _ in range(ticks):
            while queue:
                src, dst, message = queue.pop(0)
                if (
                    drop_chunks
                    and isinstance(message, FetchSnapshotResponse)
                    and message.records
                    and dropped[0] % 2 == 0
                ):
                    dropped[0] += 1
                    continue  # the connection dropped this chunk
                if isinstance(message, FetchSnapshotResponse) and message.records:
                    dropped[0] += 1
                reps[dst].step(src, message)  # type: ignore[arg-type]
                drain()
            for r in reps.values():
                r.tick()
            drain()

    reps[1].campaign(pre_vote=False)
    drain()
    run(20)
    assert reps[1].is_leader
    queue.clear()
    partitioned = reps.pop(2)  # follower 2 is away while the leader moves on
    for i in range(20):
        reps[1].propose(build_batch([ProducerRecord(b"k", b"v%d" % i)]))
        drain()
    logs[1].flush()
    logs[1].high_watermark = logs[1].log_end_offset
    snaps[1].snapshots[15] = b"S" * 50
    reps[1].advance_log_start(15)
    queue.clear()
    reps[2] = partitioned
    run(2000, drop_chunks=True)
    assert snaps[2].installed == 15, "the snapshot arrived despite dropped chunks"
    assert logs[2].log_start_offset == 15 and logs[2].log_end_offset == logs[1].log_end_offset
    assert dropped[0] > 8, "the transfer resumed from the partial file several times"
