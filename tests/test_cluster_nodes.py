"""The cluster's nodes: `cluster add-node`, `cluster remove-node`, `cluster describe`, and nodes
that join a running cluster (`serve --join`). The registry's rules as pure functions, then real
processes, real sockets, real files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import topic_at_metadata_leader, wait_for, wait_for_value
from tidelog.cli.cluster import LocalCluster
from tidelog.client.sync_client import Client
from tidelog.cluster_status import merge_status
from tidelog.errors import InvalidRequest, NodeAlreadyExists, NotEnoughNodes, UnknownNode
from tidelog.replication.metadata import (
    MetadataState,
    NodeEntry,
    plan_drain,
    validate_add_node,
    validate_remove_node,
)
from tidelog.replication.metadata_commands import (
    AddNode,
    CreateTopic,
    DrainNode,
    ReassignmentDone,
    ReassignPartition,
    RegisterNodes,
    RemoveNode,
)

pytestmark = pytest.mark.process  # tiers: pyproject.toml's markers


def tidelog(*args: str, ok: bool = True) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "tidelog", *args], capture_output=True, text=True, timeout=600
    )
    assert (proc.returncode == 0) == ok, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def registered(*ids: int) -> MetadataState:
    state = MetadataState()
    state.apply(0, RegisterNodes([NodeEntry(n, "127.0.0.1", 7100 + n) for n in ids]))
    return state


def test_the_registry_adds_drains_and_removes_nodes_the_same_on_every_node() -> None:
    state = registered(1, 2, 3)
    state.apply(1, RegisterNodes([]))  # a second registration: no-op
    assert sorted(state.nodes) == [1, 2, 3]
    state.apply(2, AddNode(NodeEntry(4, "h", 1)))
    state.apply(3, AddNode(NodeEntry(5, "h", 1)))  # address taken
    assert sorted(state.nodes) == [1, 2, 3, 4]
    state.apply(4, CreateTopic("t", "stream", {}, [[1, 2], [2, 3], [3, 4], [4, 1]]))
    state.apply(5, DrainNode(4, 1000))
    assert state.nodes[4].draining and state.nodes[4].drain_throttle_bytes == 1000
    state.apply(6, RemoveNode(4))
    assert 4 in state.nodes, "a node that still holds replicas is not removed"
    moves = plan_drain(state, 4, [1, 2, 3])
    assert [(m.name, p) for m, p, _ in moves] == [("t", 2), ("t", 3)]
    for _, _, replicas in moves:
        assert 4 not in replicas and len(replicas) == 2 and len(set(replicas)) == 2
    targets = [replicas[-1] for _, _, replicas in moves]
    assert len(set(targets)) == 2, "the moves spread over the least loaded nodes"
    for offset, (meta, p, replicas) in zip(range(7, 20, 2), moves, strict=False):
        state.apply(offset, ReassignPartition("t", meta.topic_id, p, replicas, 0))
        state.apply(offset + 1, ReassignmentDone("t", meta.topic_id, p, replicas))
    assert state.hosted_on(4) == []
    state.apply(30, RemoveNode(4))
    assert 4 not in state.nodes and state.removed_nodes == {4}
    again = MetadataState.from_snapshot(state.to_snapshot())
    assert again.nodes == state.nodes and again.removed_nodes == {4}
    with pytest.raises(NodeAlreadyExists, match="not reused"):
        validate_add_node(state, NodeEntry(4, "other", 9))


def test_bad_node_changes_are_refused_with_named_errors() -> None:
    state = registered(1, 2, 3)
    with pytest.raises(NodeAlreadyExists, match="in use"):
        validate_add_node(state, NodeEntry(2, "elsewhere", 9000))
    with pytest.raises(NodeAlreadyExists, match="node 1's"):
        validate_add_node(state, NodeEntry(7, "127.0.0.1", 7101))
    with pytest.raises(NodeAlreadyExists, match="node 1's"):
        validate_add_node(state, NodeEntry(7, "127.0.0.1", 9000, 7101))  # its peer port
    with pytest.raises(NodeAlreadyExists, match="both"):
        validate_add_node(state, NodeEntry(7, "127.0.0.1", 9000, 9000))
    with pytest.raises(UnknownNode):
        validate_remove_node(state, 9, [1, 2, 3])
    state.apply(1, CreateTopic("t", "stream", {}, [[1, 2, 3]]))
    with pytest.raises(NotEnoughNodes, match="t/0 has replication factor 3"):
        validate_remove_node(state, 2, [1, 2, 3])
    assert validate_remove_node(registered(1, 2), 2, [1, 2]).node_id == 2
    with pytest.raises(NotEnoughNodes, match="last voter"):
        validate_remove_node(registered(5), 5, [5])

    # Two drains that each fit alone but not together: the second is refused, and a second
    # drain command that raced the first changes nothing where it is applied.
    state = registered(1, 2, 3, 4)
    state.apply(1, CreateTopic("t", "stream", {}, [[1, 2, 3]]))
    validate_remove_node(state, 2, [1, 2, 3, 4])
    validate_remove_node(state, 3, [1, 2, 3, 4])
    state.apply(2, DrainNode(2, 0))
    with pytest.raises(NotEnoughNodes, match="only 2 node"):
        validate_remove_node(state, 3, [1, 3, 4])
    state.apply(3, DrainNode(3, 0))
    assert state.nodes[2].draining and not state.nodes[3].draining


def test_nodes_are_removed_dead_and_live_and_bad_changes_change_nothing(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, nodes=4) as cluster, Client(cluster.bootstrap) as client:
        client.create_topic("t", partitions=4, replication_factor=3)
        client.create_topic("u", partitions=2, replication_factor=2)
        for p in range(4):
            client.produce("t", [b"t%d-%d" % (p, i) for i in range(20)], partition=p)
        before = client.describe_cluster(leader_only=True)
        assert [n.node_id for n in before.nodes] == [1, 2, 3, 4]

        # Bad input: named errors, and the cluster is as it was.
        with pytest.raises(NodeAlreadyExists, match="in use"):
            client.add_node(2, "127.0.0.1", 1)
        with pytest.raises(NodeAlreadyExists, match="node 1's"):
            client.add_node(9, "127.0.0.1", cluster.ports[1])
        with pytest.raises(UnknownNode):
            client.remove_node(9)
        out = tidelog("cluster", "remove-node", "9", "--bootstrap", cluster.bootstrap, ok=False)
        assert "UnknownNode" in out
        assert client.describe_cluster(leader_only=True).nodes == before.nodes

        # A machine lost for good: its node is dead when it is removed. Its replicas are made
        # again on the other nodes from the replicas that are left (t has three of them).
        dead = next(n for n in (4, 3, 2) if n != before.metadata_leader)
        client.delete_topic("u")  # two replicas: one dead and the partition stands still
        cluster.kill(dead)
        on_dead = sum(dead in a for a in topic_at_metadata_leader(client, "t").assignments)
        out = tidelog(
            "cluster", "remove-node", str(dead), "--wait", "--timeout", "120",
            "--bootstrap", cluster.bootstrap,
        )  # fmt: skip
        assert f"{on_dead} partition(s) move off it" in out and f"node {dead} removed" in out
        staying = sorted(n for n in cluster.node_ids if n != dead)
        after = client.describe_cluster(leader_only=True)
        assert [n.node_id for n in after.nodes] == staying and after.removed_nodes == [dead]
        assert sorted(after.metadata_voters) == staying
        info = topic_at_metadata_leader(client, "t")
        assert all(dead not in a and len(a) == 3 for a in info.assignments)
        assert not info.reassigning
        for p in range(4):
            values = [r.value for r in client.consume("t", p, "earliest")]
            assert values == [b"t%d-%d" % (p, i) for i in range(20)]
        assert "removed: " in tidelog("cluster", "describe", "--bootstrap", cluster.bootstrap)

        # Three nodes left and t has three replicas: no node to move them to.
        with pytest.raises(NotEnoughNodes, match="replication factor 3"):
            client.remove_node(staying[0])
        with pytest.raises(UnknownNode):
            client.remove_node(dead)
        assert client.describe_cluster(leader_only=True).nodes == after.nodes

        # The metadata leader itself leaves, alive: its replicas move off, it hands the
        # metadata log over, its copies are deleted.
        client.delete_topic("t")
        client.create_topic("v", partitions=3, replication_factor=2)
        for p in range(3):
            client.produce("v", [b"v%d" % p], partition=p)
        # Leadership handed to the other replica while the first leads (preferred leader).
        second = topic_at_metadata_leader(client, "v").assignments[0][1]
        out = tidelog(
            "partitions", "elect", "v/0", "--node", str(second), "--bootstrap", cluster.bootstrap
        )
        assert f"v/0: {second} leads" in out
        assert merge_status(client.status(["v"]), "v")[0]["leader"] == second
        gone = client.describe_cluster(leader_only=True).metadata_leader
        assert client.remove_node(gone, wait=True, timeout_s=120) >= 1
        left = [n for n in staying if n != gone]
        final = client.describe_cluster(leader_only=True)
        assert [n.node_id for n in final.nodes] == left and final.metadata_leader in left
        assert sorted(final.metadata_voters) == left
        assert final.removed_nodes == sorted([gone, dead])
        assert all(sorted(a) == left for a in topic_at_metadata_leader(client, "v").assignments)
        wait_for(
            "the removed node to delete its copies",
            lambda: not any((tmp_path / f"node-{gone}").glob("v-*")),
            30,
            every_s=0.1,
        )
        client.produce("v", [b"after"], partition=0)

        # The nodes left restart and still agree on who they are.
        for n in left:
            cluster.stop(n)
        for n in left:
            cluster.start(n)
        cluster.wait_ready(node_ids=left)
        client.wait_for_leaders("v", timeout_s=60)
        restarted = client.describe_cluster(leader_only=True)
        assert [n.node_id for n in restarted.nodes] == left
        assert restarted.removed_nodes == sorted([gone, dead])
        assert [r.value for r in client.consume("v", 0, "earliest")] == [b"v0", b"after"]


def test_the_last_node_cannot_be_removed(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, nodes=1) as cluster, Client(cluster.bootstrap) as client:
        with pytest.raises(NotEnoughNodes, match="last voter"):
            client.remove_node(1)
        assert [n.node_id for n in client.describe_cluster().nodes] == [1]


def test_a_node_started_to_join_waits_until_it_is_added_and_must_listen_where_added(
    tmp_path: Path,
) -> None:
    with LocalCluster(tmp_path, nodes=3) as cluster, Client(cluster.bootstrap) as client:
        n = cluster.new_node()
        cluster.start(n)  # not added yet: it waits, and says so

        def says_it_waits() -> bool:
            if "not a node of cluster" in cluster.log_path(n).read_text():
                return True
            assert cluster.alive(n), f"node {n} exited instead of waiting to be added"
            return False

        wait_for(
            f"node {n} to say it is not a node of the cluster yet", says_it_waits, 30, every_s=0.1
        )
        client.add_node(n, "127.0.0.1", cluster.ports[n], cluster.peer_ports[n])
        assert client.wait_for_node(n, "voter", timeout_s=60).metadata_role == "voter"
        client.create_topic("v", partitions=4, replication_factor=1)
        placed = {a[0] for a in topic_at_metadata_leader(client, "v").assignments}
        assert n in placed, "new replicas are placed on the added node"

        # A node added at one address but started at another is refused with a named error.
        m = cluster.new_node()
        client.add_node(m, "127.0.0.1", cluster.ports[m])
        wrong = tidelog(
            "serve", "--node-id", str(m), "--listen", "127.0.0.1:1", "--join",
            cluster.address(1), "--data", str(tmp_path / "wrong"),
            "--cluster-secret-file", str(cluster.secret_path), ok=False,
        )  # fmt: skip
        assert "InvalidConfig" in wrong and f"--listen 127.0.0.1:{cluster.ports[m]}" in wrong


def test_a_node_that_was_down_while_nodes_came_and_went_finds_its_way_back(
    tmp_path: Path,
) -> None:
    """Node 3 is down while node 4 is added and takes the metadata log's lead: node 3's own
    metadata knows nothing of node 4, so it asks the nodes it knows and lets node 4 in. Then a
    node added but never started does not hold back the removal of another."""
    with LocalCluster(tmp_path, nodes=3) as cluster, Client(cluster.bootstrap) as client:
        client.create_topic("t", partitions=2, replication_factor=2)
        cluster.stop(3)
        four = cluster.new_node()
        client.add_node(four, "127.0.0.1", cluster.ports[four], cluster.peer_ports[four])
        cluster.start(four)
        client.wait_for_node(four, "voter", timeout_s=60)

        client.elect_preferred_leader("__metadata", 0, four)  # the leader hands over
        assert client.describe_cluster(leader_only=True).metadata_leader == four
        client.create_topic("later", partitions=1, replication_factor=1)

        cluster.start(3)
        cluster.wait_ready(node_ids=[3])
        with Client(cluster.address(3)) as on_three:
            wait_for_value(
                f"node 3 to see node {four} in the cluster and leading its metadata",
                on_three.describe_cluster,
                lambda seen: (
                    seen.metadata_leader == four and four in [n.node_id for n in seen.nodes]
                ),
                60,
                every_s=0.2,
            )
            wait_for_value(
                "node 3 to list the topic node 4 created",
                lambda: [t.name for t in on_three.list_topics()],
                lambda names: "later" in names,
                30,
                every_s=0.2,
            )
        assert "letting them in" in cluster.log_path(3).read_text()

        # Node 5 is added and never started: the removal of node 1 still completes.
        five = cluster.new_node()
        client.add_node(five, "127.0.0.1", cluster.ports[five])
        assert client.remove_node(1, wait=True, timeout_s=120) >= 0
        info = client.describe_cluster(leader_only=True)
        assert [n.node_id for n in info.nodes] == [2, 3, four, five] and info.removed_nodes == [1]
        assert sorted(info.metadata_voters) == [2, 3, four]
        assert all(1 not in a for a in topic_at_metadata_leader(client, "t").assignments)
        with pytest.raises(InvalidRequest, match="needs that many nodes"):
            client.create_topic("wide", replication_factor=4)  # node 5 never caught up
