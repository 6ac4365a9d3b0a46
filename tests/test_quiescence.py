"""Quiescence (issue 18): an idle replica group stops talking, and node liveness -- one heartbeat
per pair of nodes -- still finds a dead leader within the election timeout.

These run the real core in the simulator (testing/sim/) with the network's faults off, so the
bounds are exact; the seed sweep (test_replication.py) runs quiescence under every fault too,
in half of its seeds."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tidelog.replication.faults import FAULT_QUIESCE_WITHOUT_LIVENESS
from tidelog.testing.sim import (
    ELECTION_TIMEOUT_TICKS,
    LIVENESS_INTERVAL_TICKS,
    SimNode,
    SimParams,
    Simulation,
    SimulationFailure,
)

DELAY_MAX = 2
JITTER = 20  # the simulator's election_jitter_ticks
# A follower stands at the election timeout (plus jitter) after its leader's last word, and a
# pre-vote and a vote take two round trips: the bound a group that never quiesces is held to.
ELECTION_ROUND = ELECTION_TIMEOUT_TICKS + JITTER + 4 * DELAY_MAX + 2
# Followers that learn of the death at the same moment may split their votes: one more round
# (as in any Raft group).
ELECTION_BOUND = 2 * ELECTION_ROUND
SEEDS = range(1, 6)


def quiet_cluster(seed: int, faults: frozenset[str] = frozenset(), nodes: int = 3) -> Simulation:
    """A group that took writes for a while and then went idle until it quiesced."""
    params = SimParams(
        seed=seed,
        nodes=nodes,
        delay_max=DELAY_MAX,
        flush_delay_max=1,
        produce_rate=0.5,
        read_rate=0.2,
        acks_all_share=1.0,
        cursors=0,
        sparse_ticks=True,
        quiesce=True,
        faults=faults,
    )
    sim = Simulation(params)
    sim.faults_on = False  # no nemesis: each test makes its own fault
    for _ in range(150):
        sim.step()
    for _ in range(300):
        sim.step(clients=False)
        if all_quiesced(sim):
            return sim
    raise AssertionError(f"the idle group never quiesced: {describe(sim)}")


def all_quiesced(sim: Simulation) -> bool:
    replicas = [n.replica for n in sim.nodes.values() if n.replica is not None]
    return len(sim.leading()) == 1 and all(r.quiescent for r in replicas)


def describe(sim: Simulation) -> dict[int, str]:
    return {n: sim.describe_node(n) for n in sim.nodes}


def leader(sim: Simulation) -> SimNode:
    leaders = sim.leading()
    assert len(leaders) == 1, describe(sim)
    return leaders[0]


def ticks_until(sim: Simulation, done: Callable[[], bool], within: int) -> int | None:
    """Step (no clients, no nemesis) until done(): how many ticks it took, or None."""
    for tick in range(1, within + 1):
        sim.step(clients=False)
        if done():
            return tick
    return None


def ticks_to_new_leader(sim: Simulation, old: int, within: int) -> int:
    """The availability checker: a leader other than `old` within `within` ticks, or a
    SimulationFailure naming what every node was doing."""
    took = ticks_until(sim, lambda: any(n.node_id != old for n in sim.leading()), within)
    if took is not None:
        return took
    raise SimulationFailure(
        f"availability: no new leader {within} ticks after leader {old} went: {describe(sim)}"
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_an_idle_group_sends_nothing_but_heartbeats(seed: int) -> None:
    sim = quiet_cluster(seed)
    elections, messages, heartbeats = sim.stats.elections, sim.stats.messages, sim.stats.heartbeats
    idle = 1000
    for _ in range(idle):
        sim.step(clients=False)
    assert sim.stats.messages == messages, "a quiesced group sent replication messages"
    assert sim.stats.elections == elections, "an election while the leader lived"
    # one heartbeat per ordered pair of nodes per interval: not per partition
    pairs = len(sim.nodes) * (len(sim.nodes) - 1)
    assert sim.stats.heartbeats - heartbeats <= pairs * (idle // LIVENESS_INTERVAL_TICKS + 1)
    assert all_quiesced(sim)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_write_to_a_quiesced_group_wakes_it_and_commits(seed: int) -> None:
    sim = quiet_cluster(seed)
    lead = leader(sim)
    acked_before = len(sim.acked)
    offset = sim.propose(lead.node_id, b"after-quiet", "all")
    assert offset is not None
    took = ticks_until(sim, lambda: sim.acked.get(b"after-quiet") == offset, 40)
    assert took is not None, f"the write was not acknowledged: {describe(sim)}"
    assert took <= 4 * DELAY_MAX + 6, f"acknowledged only after {took} ticks"
    assert len(sim.acked) == acked_before + 1
    for _ in range(300):  # and it quiesces again
        sim.step(clients=False)
        if all_quiesced(sim):
            break
    assert all_quiesced(sim)
    sim.heal()
    sim.check_final()


@pytest.mark.parametrize("seed", SEEDS)
def test_a_crashed_quiesced_leader_is_replaced_within_the_election_timeout(seed: int) -> None:
    sim = quiet_cluster(seed)
    old = leader(sim).node_id
    sim.crash(old)
    took = ticks_to_new_leader(sim, old, ELECTION_BOUND)
    assert took <= ELECTION_BOUND
    sim.restart(old)
    for _ in range(40):
        sim.step()
    sim.heal()
    for _ in range(600):
        sim.step(clients=False)
        if sim.converged():
            break
    sim.check_final()  # every acknowledged write is still there


@pytest.mark.parametrize("seed", SEEDS)
def test_without_the_liveness_heartbeat_the_checker_finds_the_stuck_group(seed: int) -> None:
    """The bug the heartbeat prevents: quiesced followers that trust a dead leader for good."""
    sim = quiet_cluster(seed, faults=frozenset({FAULT_QUIESCE_WITHOUT_LIVENESS}))
    old = leader(sim).node_id
    sim.crash(old)
    with pytest.raises(SimulationFailure, match="availability"):
        ticks_to_new_leader(sim, old, 20 * ELECTION_BOUND)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_quiesced_leader_restarted_faster_than_the_liveness_timeout_is_noticed(seed: int) -> None:
    """It comes back (a new incarnation) before its heartbeats lapse: its followers must not
    keep trusting a leader that forgot it led."""
    sim = quiet_cluster(seed)
    old = leader(sim).node_id
    sim.crash(old)
    sim.step(clients=False)
    sim.restart(old)
    took = ticks_until(sim, lambda: len(sim.leading()) == 1, ELECTION_BOUND)
    assert took is not None, f"no leader after a quick restart: {describe(sim)}"


@pytest.mark.parametrize("seed", SEEDS)
def test_a_quiesced_follower_that_restarts_is_told_who_leads_without_an_election(seed: int) -> None:
    sim = quiet_cluster(seed)
    lead = leader(sim)
    follower = next(n for n in sim.nodes if n != lead.node_id)
    elections = sim.stats.elections
    sim.crash(follower)
    sim.step(clients=False)
    sim.restart(follower)
    for _ in range(ELECTION_BOUND):
        sim.step(clients=False)
        replica = sim.nodes[follower].replica
        if replica is not None and replica.leader_id == lead.node_id:
            break
    else:
        raise AssertionError(f"the restarted follower found no leader: {describe(sim)}")
    assert sim.stats.elections == elections
    assert lead.replica is not None and lead.replica.is_leader


@pytest.mark.parametrize("seed", SEEDS)
def test_a_partitioned_quiesced_leader_is_replaced_and_steps_down(seed: int) -> None:
    sim = quiet_cluster(seed, nodes=5)
    old = leader(sim).node_id
    for other in sim.node_ids:
        if other != old:
            sim.blocked.add((old, other))
            sim.blocked.add((other, old))
    ticks_to_new_leader(sim, old, ELECTION_BOUND)
    for _ in range(3 * ELECTION_BOUND):  # check-quorum, from the liveness: it stops leading
        sim.step(clients=False)
        replica = sim.nodes[old].replica
        if replica is not None and not replica.is_leader:
            break
    else:
        raise AssertionError(f"the cut-off leader still leads: {describe(sim)}")
    new = next(n for n in sim.leading() if n.node_id != old)
    assert sim.propose(new.node_id, b"during-partition", "all") is not None
    sim.blocked.clear()
    sim.heal()
    for _ in range(600):
        sim.step(clients=False)
        if sim.converged():
            break
    assert sim.converged(), describe(sim)
    sim.check_final()
    assert b"during-partition" in sim.acked


CHECK_QUORUM_TICKS = 40  # the simulator's (sim/cluster.py)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_write_to_a_cut_off_quiesced_leader_does_not_extend_its_leadership(seed: int) -> None:
    """Check-quorum's promise (issue 34): a leader that has not heard a majority for
    check_quorum_ticks steps down, whatever it does meanwhile. What extends a leadership is
    only news from a voter: its fetch in the leader's epoch, or, while it is quiesced, its
    node's liveness heartbeat. A write to the cut-off leader wakes its quiesced followers;
    the wake used to count as hearing from them (their last fetch set to now), which kept a
    leader cut off since C leading until the write's tick + check_quorum_ticks."""
    sim = quiet_cluster(seed)
    old = leader(sim).node_id
    for other in sim.node_ids:
        if other != old:
            sim.blocked.update({(old, other), (other, old)})
    cut_at = sim.now
    for _ in range(10):  # less than the liveness timeout: the followers still look alive
        sim.step(clients=False)
    assert sim.propose(old, b"to-the-cut-off-leader", "1") is not None
    took = ticks_until(sim, lambda: not sim.nodes[old].replica.is_leader, 200)  # type: ignore[union-attr]
    assert took is not None, f"the cut-off leader still leads: {describe(sim)}"
    led_for = sim.now - cut_at
    assert led_for <= CHECK_QUORUM_TICKS + 2, (
        f"led {led_for} ticks after it was cut off (check-quorum is {CHECK_QUORUM_TICKS})"
    )
