"""A controlled shutdown in the replication core (Replica.hand_over): a leader whose node stops
hands its leadership to an in-sync voter first, so the group has a new leader within a few
message delays instead of an election timeout, and fails no acknowledgement it owes.

The golden script tests/scenarios/controlled_shutdown.txt walks the usual case step by step
(tests/test_replication.py runs it). Here: the cases with nobody to hand to, the liveness
keeping a stopped node from being chosen, and the simulator's swarm with the leader's node
stopped again and again under load (its checkers watching every step)."""

from __future__ import annotations

import dataclasses
import random

import pytest

from tidelog.replication.messages import Resign
from tidelog.replication.replica import Role
from tidelog.testing.scenario import Scenario, run_command
from tidelog.testing.sim import SimNode, SimParams, Simulation
from tidelog.testing.sim.params import ELECTION_TIMEOUT_TICKS, LIVENESS_TIMEOUT_TICKS


def script(*commands: str) -> tuple[Scenario, list[str]]:
    """Run commands; the scenario and the last command's output."""
    sim: Scenario | None = None
    out: list[str] = []
    for command in commands:
        sim, out = run_command(sim, command)
    assert sim is not None
    return sim, out


def test_a_single_replica_has_nothing_to_hand_over_and_takes_no_more_writes() -> None:
    sim, out = script("nodes 1", "campaign 1", "propose 1 a", "hand-over 1")
    assert out == ["1 has nothing to hand over"]
    replica = sim.nodes[1].replica
    assert replica is not None and replica.role is Role.LEADER and not replica.handing_over
    _, out = run_command(sim, "propose 1 b")
    assert out == ["refused: not the leader"]


def test_a_leader_whose_followers_are_out_of_sync_has_nothing_to_hand_over() -> None:
    # Scripts drop a follower from the ISR after 100 ticks without catching up.
    sim, _ = script("nodes 3", "campaign 1", "stabilize", "partition 1 | 2 3", "tick 101 1")
    _, out = run_command(sim, "hand-over 1")
    assert out == ["1 has nothing to hand over"]
    assert not any(isinstance(q.message, Resign) for q in sim.queue)


def test_a_follower_that_is_asked_to_hand_over_never_stands_again() -> None:
    sim, out = script("nodes 3", "campaign 1", "stabilize", "hand-over 2")
    assert out == ["2 has nothing to hand over"]
    _, out = run_command(sim, "crash 1")
    _, out = run_command(sim, "tick 300 2 3")
    replicas = {n: sim.nodes[n].replica for n in (2, 3)}
    assert replicas[3] is not None and replicas[3].role is not Role.FOLLOWER  # 3 stood
    assert replicas[2] is not None and replicas[2].role is Role.FOLLOWER  # 2 did not


def quiet(params: SimParams, **changes: object) -> SimParams:
    """A seed's draw with no fault but what a test adds: no drops, partitions, crashes, pauses,
    replaced disks, moves or operator elections; message delays and fsyncs short beside the
    election timeout (20 ticks), as a LAN's are beside 800 ms."""
    return dataclasses.replace(
        params,
        drop=0.0,
        partition_rate=0.0,
        crash_rate=0.0,
        pause_rate=0.0,
        wipe_rate=0.0,
        reassign_rate=0.0,
        transfer_rate=0.0,
        spares=0,
        delay_max=1,
        flush_delay_max=min(params.flush_delay_max, 2),
        fetch_max_bytes=1 << 20,
        **changes,  # type: ignore[arg-type]
    )


def the_leader(sim: Simulation, ticks: int = 500) -> SimNode:
    for _ in range(ticks):
        leaders = sim.leading()
        if len(leaders) == 1:
            return leaders[0]
        sim.step()
    raise AssertionError(f"no leader in {ticks} ticks")


def test_the_successor_is_a_voter_the_liveness_hears() -> None:
    """A follower whose node stopped a moment ago is still in sync (for replica_lag_ticks) but
    the liveness has found it dead: it is not chosen, the live one is."""
    sim = Simulation(quiet(SimParams.from_seed(3), nodes=3, quiesce=True, produce_rate=0.3))
    sim.faults_on = False  # no nemesis: nothing restarts the stopped node
    for _ in range(50):
        sim.step()
    leader = the_leader(sim)
    assert leader.replica is not None and leader.liveness is not None
    dead, live = (n for n in sim.voter_ids if n != leader.node_id)
    sim.crash(dead)
    for _ in range(LIVENESS_TIMEOUT_TICKS + 2):
        sim.step()
        if not leader.liveness.is_alive(dead):
            break
    assert not leader.liveness.is_alive(dead)
    assert leader.replica.is_leader
    assert dead in leader.replica.in_sync_replicas(), "still in sync: the liveness decides"
    assert leader.driver is not None and leader.driver.hand_over()
    for _ in range(ELECTION_TIMEOUT_TICKS):
        sim.step()
        if not leader.replica.handing_over:
            break
    assert [n.node_id for n in sim.leading()] == [live]
    assert leader.replica.leader_id == live


class ControlledStops(Simulation):
    """The simulator's cluster under load, whose leader's node stops now and then as SIGTERM
    stops a node: its replica hands over (Replica.hand_over), the node waits while that is
    under way (at most three election timeouts), then stops (a crash: what it had not flushed is
    lost, as it would be from a kill at that moment). The nemesis restarts it later. Its own
    random stream, so the seed's draws are the simulator's."""

    def __init__(self, params: SimParams) -> None:
        self.chooser = random.Random(params.seed)
        self.stopping: tuple[SimNode, int] | None = None  # the node, the tick it was asked
        self.new_leader_after: int | None = None
        self.handed_over: list[int] = []  # ticks from the ask to a new leader, per stop
        self.not_handed_over = 0
        self.last_start = 0
        super().__init__(params)

    def step(self, clients: bool = True) -> None:
        super().step(clients)
        if self.faults_on:
            self._stop_the_leader()

    def _start(self, node_id: int) -> None:
        self.last_start = self.now
        super()._start(node_id)

    def _settled(self, leader: SimNode) -> bool:
        """As an operator restarts nodes (docs/operations.md): the previous one is back and in
        sync again (it fetched since its restart: a node is in sync for replica_lag_ticks
        after its last fetch, so one restarted a moment ago may be in sync without knowing the
        leader yet), and the leader has committed what it was elected with."""
        replica = leader.replica
        assert replica is not None
        return (
            all(n.alive for n in self.nodes.values())
            and self.now - self.last_start > replica.config.replica_lag_ticks
            and set(replica.voters) <= replica.in_sync_replicas()
            and leader.log.high_watermark >= replica.epoch_start_offset
        )

    def _stop_the_leader(self) -> None:
        if self.stopping is None:
            leaders = self.leading()
            if len(leaders) == 1 and self._settled(leaders[0]) and self.chooser.random() < 0.01:
                leader = leaders[0]
                assert leader.driver is not None
                leader.driver.hand_over()
                self.stopping = (leader, self.now)
                self.new_leader_after = None
                self.log_event(f"controlled stop of {leader.node_id}")
            return
        node, asked = self.stopping
        if self.new_leader_after is None and any(n is not node for n in self.leading()):
            self.new_leader_after = self.now - asked
        replica = node.replica
        assert replica is not None
        if replica.handing_over and self.now - asked < 3 * ELECTION_TIMEOUT_TICKS:
            return
        if self.new_leader_after is not None:
            self.handed_over.append(self.new_leader_after)
        else:
            self.not_handed_over += 1
        self.crash(node.node_id)
        self.stopping = None


@pytest.mark.parametrize("seed", range(12))
def test_the_leaders_node_stopping_under_load_hands_over_within_an_election_timeout(
    seed: int,
) -> None:
    params = quiet(SimParams.from_seed(seed), safety_ticks=3000)
    sim = ControlledStops(params)
    stats = sim.run()  # every checker passes, and the group converges after
    assert sim.handed_over, f"seed {seed}: no controlled stop happened"
    assert sim.not_handed_over == 0, f"seed {seed}: a stop found nobody to hand over to"
    # The hand-over is a few message delays and fsyncs, far from an election timeout.
    assert max(sim.handed_over) < ELECTION_TIMEOUT_TICKS, sim.handed_over
    # Every write the stopping leader took was committed and acknowledged before it resigned.
    assert stats.failed == 0, f"seed {seed}: {stats.failed} acknowledgements failed"
