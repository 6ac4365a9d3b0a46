"""Time as deadlines (issue 18): a replica acts when its next deadline comes or an event makes
it dirty, not at every tick; one with nothing to do costs nothing.

The simulator runs the real core both ways (SimParams.sparse_ticks, drawn per seed): a deadline
the core forgets shows up there as a stall its liveness checker fails."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from tidelog.cli.cluster import LocalCluster
from tidelog.client.sync_client import Client
from tidelog.replication.clock import Clock
from tidelog.replication.liveness import Heartbeat, Liveness
from tidelog.replication.replica import QuorumState, Replica, ReplicaConfig
from tidelog.storage.memory_log import MemoryLog
from tidelog.testing.sim import SimParams, Simulation


def replica(voters: tuple[int, ...], clock: Clock) -> Replica:
    import random

    config = ReplicaConfig(node_id=1, voters=voters)
    return Replica(config, MemoryLog(), QuorumState(), random.Random(1), clock=clock)


def test_a_lone_leader_with_nothing_to_do_has_no_deadline() -> None:
    clock = Clock()
    r = replica((1,), clock)
    r.ready()  # a single voter makes itself leader at once (after its pre-vote)
    for _ in range(300):
        clock.ticks += 1
        due = r.next_deadline()
        if due is not None and due <= clock.ticks:
            r.act()
            r.ready()
    assert r.is_leader
    assert r.next_deadline() is None


def test_a_follower_without_a_leader_waits_for_its_election_deadline() -> None:
    clock = Clock()
    r = replica((1, 2, 3), clock)
    due = r.next_deadline()
    assert due == r.election_deadline and due > clock.ticks
    clock.ticks = due
    r.act()
    r.ready()
    # it stood for election (a pre-vote): now it waits for answers until its next deadline
    assert not r.is_leader and r.next_deadline() is not None


def test_a_campaign_asks_again_a_voter_that_comes_alive() -> None:
    """A new cluster's first node stands before its peers listen: its requests go nowhere.
    When the liveness hears a peer, the campaign asks it again at once, and the group has a
    leader in a few ticks instead of after an election timeout."""
    import random

    clock = Clock()
    voters = (1, 2, 3)
    liveness = {n: Liveness(n, 100 + n, clock, 5, 20) for n in voters}
    replicas = {
        n: Replica(
            ReplicaConfig(node_id=n, voters=voters, election_timeout_ticks=100),
            MemoryLog(),
            QuorumState(),
            random.Random(n),
            clock=clock,
            liveness=liveness[n],
        )
        for n in voters
    }
    replicas[1].campaign()
    assert replicas[1].ready().messages  # sent to nodes not up yet: lost
    for n in voters:  # the peers are up now, and heartbeats cross
        for m in voters:
            if m != n:
                liveness[m].on_heartbeat(n, Heartbeat(n, 100 + n))
    started = clock.ticks
    while not replicas[1].is_leader and clock.ticks - started < 10:
        clock.ticks += 1
        for n in voters:
            replicas[n].act()
        for _ in range(4):  # deliver what each sends, a few rounds a tick
            for n in voters:
                for out in replicas[n].ready().messages:
                    replicas[out.to].step(n, out.message)
    assert replicas[1].is_leader, "the campaign waited out its election timeout"
    assert clock.ticks - started <= 2


@pytest.mark.slow
@pytest.mark.parametrize("sparse", [False, True])
def test_simulator_seeds_both_ways(sparse: bool) -> None:
    """The same seeds with every replica acting every tick and acting only when due: both
    keep every acknowledged write and converge after healing."""
    for seed in range(40):
        params = dataclasses.replace(SimParams.from_seed(seed), sparse_ticks=sparse)
        Simulation(params).run()


@pytest.mark.timed  # acts counted over 1.5 s, a write within 1 s
@pytest.mark.process
@pytest.mark.timeout(180)
def test_idle_partitions_cost_no_acts(tmp_path: Path) -> None:
    """300 idle partitions (RF 1) on one node: between two status reads 1.5 s apart, the
    replicas act a handful of times, not 300 x 150 ticks; a write still commits at once."""
    with LocalCluster(tmp_path, nodes=1) as cluster, Client(cluster.bootstrap) as client:
        client.create_topic("idle", partitions=300, replication_factor=1)
        client.wait_for_leaders("idle")
        time.sleep(1.0)

        def acts() -> int:
            return int(client.status(["idle"])[0]["node"]["counters"]["tidelog_replica_acts_total"])

        before = acts()
        time.sleep(1.5)
        during = acts() - before
        assert during < 300, f"{during} acts in 1.5 s of idle"
        t0 = time.perf_counter()
        client.produce("idle", [b"x"], partition=123)
        assert time.perf_counter() - t0 < 1.0
        assert [r.value for r in client.consume("idle", 123, "earliest")] == [b"x"]


@pytest.mark.process
@pytest.mark.timeout(120)
def test_partitions_past_the_node_limit_are_refused_and_nothing_is_created(tmp_path: Path) -> None:
    from tidelog.errors import PartitionLimitReached

    with (
        LocalCluster(
            tmp_path, nodes=1, serve_args=["--set", "max.partitions.per.node=50"]
        ) as cluster,
        Client(cluster.bootstrap) as client,
    ):
        client.create_topic("fits", partitions=40, replication_factor=1)
        with pytest.raises(PartitionLimitReached, match=r"max\.partitions\.per\.node"):
            client.create_topic("too-many", partitions=20, replication_factor=1)
        with pytest.raises(PartitionLimitReached):
            client.add_partitions("fits", 60)
        assert [t.name for t in client.list_topics()] == ["fits"]
        assert client.topic("fits", refresh=True).partitions == 40
        client.create_topic("still-fits", partitions=10, replication_factor=1)
