"""A seed replays the same run: the simulator's behaviour, pinned by digests.

`python -m tidelog.testing --seed S [--fault F]` runs `Simulation(SimParams.from_seed(S,
{F}))`; each case below runs exactly that, in-process, and hashes the whole run: every event
the simulator traces (starts, crashes, wipes, partitions, leaders, acknowledgements, log starts,
invalidations), every message handed to a node with its full content (records hashed), how the
run ended (its stats, or the failure a checker named), and each node's final state (quorum
state, log start, watermarks, every batch, table, newest snapshot).

The digests were recorded on the simulator as it was before testing/sim.py was split into a
package (issue 33), so a seed given on a command line replays the same run as it did before the
split. A change of these digests is a change of the simulator's behaviour (what it draws, in
what order, what it checks): re-record them only deliberately, and say why in the commit.

The seeds spread over the swarm's fault kinds (drops, duplicates, two-way and one-way
partitions, crashes, pauses, replaced disks, reassignments, leadership transfers, learners,
state-machine logs with snapshots, quiescence, sparse ticks, cleaning and cursors); the broken
rules make a checker fail, so each checker's path to a named failure is pinned too.
"""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from tidelog.replication.faults import (
    FAULT_DISCARD_PAST_SNAPSHOT,
    FAULT_EMPTY_LOG_FORGETS_EPOCH,
    FAULT_TRUNCATE_TO_HW,
    FAULT_UNCOMMITTED_CHANGES,
)
from tidelog.replication.liveness import Heartbeat
from tidelog.replication.messages import Message
from tidelog.testing.sim import SimParams, Simulation, SimulationFailure


def _field(value: object) -> str:
    read = getattr(value, "read", None)
    if callable(read):  # a records slice: its bytes, hashed
        data = read()
        first = getattr(value, "first_offset", -1)
        return f"<records {first}+{len(data)} {hashlib.sha256(data).hexdigest()}>"
    return repr(value)


def _message(message: Message | Heartbeat) -> str:
    fields = (f"{f.name}={_field(getattr(message, f.name))}" for f in dataclasses.fields(message))
    return f"{type(message).__name__}({', '.join(fields)})"


def _final_state(sim: Simulation) -> list[str]:
    lines = [
        f"acked {sorted(sim.acked.items())}",
        f"acked-one {sorted(sim.acked_one.items())}",
        f"events {sim.digest.hexdigest()}",
    ]
    for node_id in sorted(sim.nodes):
        node = sim.nodes[node_id]
        log = node.log
        replica = node.replica
        lines.append(
            f"node {node_id} {node.directory} {sorted(node.known_directories.items())} "
            f"{node.state} start={log.log_start_offset} hw={log.high_watermark} "
            f"leo={log.log_end_offset} durable={log.durable_end_offset} "
            + (
                f"{replica.role.value} epoch={replica.epoch} leader={replica.leader_id}"
                if replica is not None
                else "down"
            )
        )
        for header, batch in log.batches():
            lines.append(f"  {header.base_offset} {hashlib.sha256(batch).hexdigest()}")
        table = node.table
        if table is not None:
            lines.append(f"  table {table.applied_offset} {sorted(table.entries.items())}")
        snapshot = node.snapshots.latest()
        if snapshot is not None:
            data = node.snapshots.load(snapshot)
            lines.append(f"  snapshot {snapshot} {hashlib.sha256(data).hexdigest()}")
    return lines


def run_digest(seed: int, faults: frozenset[str] = frozenset()) -> tuple[str, str]:
    """The sha256 of the whole run of a seed, as `python -m tidelog.testing` runs it, and how
    the run ended ("passed", or the failure's first line)."""
    digest = hashlib.sha256()

    def note(line: str) -> None:
        digest.update(line.encode() + b"\n")

    def delivered(tick: int, src: int, dst: int, directory: str, m: Message | Heartbeat) -> None:
        note(f"{tick} {src}->{dst} {directory} {_message(m)}")

    sim = Simulation(SimParams.from_seed(seed, faults), trace=note, observe=delivered)
    try:
        note(f"passed {sim.run()}")
        outcome = "passed"
    except SimulationFailure as exc:
        note(f"failed {exc}")
        outcome = str(exc).splitlines()[0]
    for line in _final_state(sim):
        note(line)
    return digest.hexdigest(), outcome


# Recorded on the unsplit simulator (see the docstring): seed -> digest of its run.
RUNS = {
    # five nodes, spares and reassignments, a replaced disk, pauses, drops, hw.policy=isr
    0: "688fef2297c2fcf0211f32336f5966cb889565b02a576c35cb57b08d1585a000",
    # a state-machine log and a learner: duplicates, partitions, a replaced disk, a snapshot
    14: "81f1ae3986945d23c112e456b5bbb27b504b5a1eb8413337fd0dd46088744b37",
    # duplicates and drops, partitions, crashes, a learner, transfers, an invalidated cursor
    16: "57f2f21bdc4b1aef9bfabe491be61f2371a95e550646edcc032be826a3aa61d5",
    # a state-machine log that quiesces: crashes, partitions, seven snapshots installed
    22: "8da0e957977ff097766e17ec756288c75db86ffe7b1c9f2d46fc4cd69562b5da",
    # quiescence under partitions, crashes, pauses and a replaced disk; one-byte fetches
    34: "7d8a01f55a560a2e63e22cd4e2767591b948729ea350a118de80507ad0246ecf",
    # sparse ticks, one-way partitions, crashes, pauses, three invalidated cursors
    36: "9aa7b5c7ca071766aa28b9e6d57e7bcee85cb0212789df25eb19373864341f18",
}

# (seed, broken rule, the failure it ends in, digest): each checker's path to a named failure.
BROKEN_RULE_RUNS = [
    (
        0,
        FAULT_TRUNCATE_TO_HW,
        "committed entries stay",
        "c403df6d17b521c12ae22c161eb90a76086b4cb3c2d3c6f669ae8399a785ec98",
    ),
    (
        65,
        FAULT_EMPTY_LOG_FORGETS_EPOCH,
        "vote restriction",
        "381f26e006a4647f98bab4c9d76835fe78291b2e890fcd5fd9b16087e0394115",
    ),
    (
        9,
        FAULT_UNCOMMITTED_CHANGES,
        "leader completeness",
        "a01f5d2bfc69e9254cb7ba0d195c4c5e7104024fb5ece40a9ed7fada9935b51a",
    ),
    (
        11,
        FAULT_UNCOMMITTED_CHANGES,
        "election safety",
        "2945840f441a98ce36e12422aeb7597ea460529d1b31ea12f7cc4cfa6d3ef1ab",
    ),
    (
        20,
        FAULT_DISCARD_PAST_SNAPSHOT,
        "is not the committed log's",
        "19a1e0b68e3a61160995c5cda938a0e08375388928952bc69236d3034516f53c",
    ),
]


@pytest.mark.parametrize("seed", sorted(RUNS))
def test_a_seed_replays_the_run_it_always_did(seed: int) -> None:
    assert run_digest(seed) == (RUNS[seed], "passed"), (
        f"seed {seed} ran differently: the simulator's behaviour changed"
    )


@pytest.mark.parametrize(
    ("seed", "fault", "failure", "expected"),
    BROKEN_RULE_RUNS,
    ids=[f"{seed}-{fault}" for seed, fault, _, _ in BROKEN_RULE_RUNS],
)
def test_a_seed_with_a_broken_rule_fails_as_it_always_did(
    seed: int, fault: str, failure: str, expected: str
) -> None:
    digest, outcome = run_digest(seed, frozenset({fault}))
    assert failure in outcome
    assert digest == expected, (
        f"seed {seed} --fault {fault} ran differently: the simulator's behaviour changed"
    )
