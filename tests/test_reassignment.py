"""Moving a partition onto other nodes, online (`tidelog partitions reassign`): new replicas
catch up as learners, voters change one at a time through the group's own log, the nodes left
delete their copy. Real processes, real sockets, real files."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers import poll, topic_at_metadata_leader, wait_for
from tidelog.cli.cluster import LocalCluster
from tidelog.client.sync_client import Client
from tidelog.cluster_status import merge_status
from tidelog.errors import (
    InvalidReplicaAssignment,
    NotLeader,
    TidelogError,
    UnknownTopicOrPartition,
)
from tidelog.protocol import api
from tidelog.protocol.api import ApiKey

pytestmark = pytest.mark.process  # tiers: pyproject.toml's markers


def replicas_of(client: Client, topic: str, partition: int) -> dict[int, dict[str, object]]:
    rows = merge_status(client.status([topic]), topic)
    row = next((r for r in rows if r["partition"] == partition), None)
    return {int(n): r for n, r in row["replicas"].items()} if row else {}


def add_node(cluster: LocalCluster, client: Client) -> int:
    """A fourth node, added to the running cluster as an operator would: `cluster add-node`,
    then the node started with --join; it becomes a voter of the metadata log."""
    new_node = cluster.new_node()
    out = tidelog(
        "cluster", "add-node", cluster.node_spec(new_node), "--bootstrap", cluster.bootstrap
    )
    assert f"node {new_node} added" in out and "--join" in out
    cluster.start(new_node)
    cluster.wait_ready(node_ids=[new_node])
    node = client.wait_for_node(new_node, "voter", timeout_s=60)
    assert node.metadata_role == "voter" and not node.draining
    return new_node


def tidelog(*args: str, ok: bool = True) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "tidelog", *args], capture_output=True, text=True, timeout=300
    )
    assert (proc.returncode == 0) == ok, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def test_a_partition_moves_onto_an_added_node_under_acks_all_load_with_its_leader_killed(
    tmp_path: Path,
) -> None:
    with LocalCluster(tmp_path, nodes=3) as cluster, Client(cluster.bootstrap) as client:
        info = client.create_topic("t", replication_factor=3)
        old = info.assignments[0]
        new_node = add_node(cluster, client)
        assert new_node not in old
        target = sorted([*old[1:], new_node])  # the preferred leader (old[0]) leaves
        acked: list[bytes] = []
        stop = threading.Event()

        def produce() -> None:
            with Client(cluster.bootstrap) as producer:
                i = 0
                while not stop.is_set():
                    value = b"v%06d" % i
                    i += 1
                    try:
                        producer.produce("t", [value], partition=0)
                        acked.append(value)
                    except TidelogError:
                        time.sleep(0.05)  # a leader change: try the next value

        for i in range(200):
            client.produce("t", [b"before-%03d" % i + b"." * 1000], partition=0)
        writer = threading.Thread(target=produce)
        writer.start()
        try:
            time.sleep(0.5)
            leader = client.topic("t", refresh=True).leaders[0]
            # 200 KB at 100 KB/s: the new replica is still catching up when the leader dies.
            resp = client.reassign_partition("t", 0, target, throttle_bytes=100_000)
            assert sorted(resp.replicas) == target and resp.leaving == [old[0]]
            time.sleep(0.3)
            assert 0 in topic_at_metadata_leader(client, "t").reassigning, "still moving"
            cluster.kill(leader)  # SIGKILL mid-move
            client.wait_for_reassignment("t", 0, timeout_s=120)
            time.sleep(0.5)
        finally:
            stop.set()
            writer.join()
        assert len(acked) > 20, "the producer kept writing through the move"
        info = topic_at_metadata_leader(client, "t")
        assert sorted(info.assignments[0]) == target and 0 not in info.reassigning

        # Every replica of the target holds the same log, with every acknowledged record.
        def ends_agree() -> bool:
            reps = replicas_of(client, "t", 0)
            ends = {n: r.get("log_end_offset") for n, r in reps.items() if n in target}
            return len(ends) == 3 and len(set(ends.values())) == 1

        poll(ends_agree, 30, every_s=0.2)  # (not a failure by itself: the logs are compared)
        logs = {
            n: [
                r.value
                for r in client.consume("t", 0, "earliest", replica_read=True, prefer_node=n)
            ]
            for n in target
            if cluster.alive(n)
        }
        first = next(iter(logs.values()))
        assert all(log == first for log in logs.values()), "replicas converge to one log"
        assert set(acked) <= set(first), "nothing acknowledged is lost"
        assert first[:200] == [b"before-%03d" % i + b"." * 1000 for i in range(200)]

        # The node the partition left deletes its copy (at its next start, if it was down).
        if not cluster.alive(old[0]):
            cluster.start(old[0])
            cluster.wait_ready()
        wait_for(
            "the leaving node to delete its copy",
            lambda: not (tmp_path / f"node-{old[0]}" / "t-0").exists(),
            30,
            every_s=0.1,
        )
        assert (tmp_path / f"node-{new_node}" / "t-0").exists()


def test_bad_reassignments_get_named_errors_and_change_nothing(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, nodes=3) as cluster, Client(cluster.bootstrap) as client:
        client.create_topic("t", replication_factor=2, configs={"min.insync.replicas": "2"})
        before = topic_at_metadata_leader(client, "t").assignments
        with pytest.raises(InvalidReplicaAssignment, match="unknown node"):
            client.reassign_partition("t", 0, [1, 9])
        with pytest.raises(InvalidReplicaAssignment, match="duplicate"):
            client.reassign_partition("t", 0, [1, 1])
        with pytest.raises(InvalidReplicaAssignment, match="at least one"):
            client.reassign_partition("t", 0, [])
        with pytest.raises(InvalidReplicaAssignment, match=r"min\.insync\.replicas"):
            client.reassign_partition("t", 0, [2])
        with pytest.raises(UnknownTopicOrPartition):
            client.reassign_partition("t", 5, [1, 2])
        with pytest.raises(UnknownTopicOrPartition):
            client.reassign_partition("nope", 0, [1, 2])
        info = topic_at_metadata_leader(client, "t")
        assert info.assignments == before and not info.reassigning


def test_a_single_replica_partition_moves_between_nodes_with_the_cli(tmp_path: Path) -> None:
    """RF 1: the only voter hands over to the new replica (it leaves last, then resigns)."""
    with LocalCluster(tmp_path, nodes=3) as cluster, Client(cluster.bootstrap) as client:
        info = client.create_topic("one", replication_factor=1)
        (src,) = info.assignments[0]
        dst = src % 3 + 1
        client.produce("one", [b"r%d" % i for i in range(50)], partition=0)
        out = tidelog(
            "partitions", "reassign", "one/0", "--replicas", str(dst), "--wait",
            "--bootstrap", cluster.bootstrap,
        )  # fmt: skip
        assert f"now on replicas [{dst}]" in out
        # --wait read the move's state where it is decided: the metadata leader's answer alone
        # (another node may not have applied the move yet, and would call it done already).
        metadata_leader = client.describe_cluster().metadata_leader
        for node in cluster.node_ids:
            request = api.MetadataRequest(["one"], leader_only=True)
            address = ("127.0.0.1", cluster.ports[node])
            if node == metadata_leader:
                header, _ = client._run(client.async_client.call(address, ApiKey.METADATA, request))
                assert api.decode(api.MetadataResponse, header).metadata_leader == node
            else:
                with pytest.raises(NotLeader) as refused:
                    client._run(client.async_client.call(address, ApiKey.METADATA, request))
                assert refused.value.leader_hint == metadata_leader
        records = client.consume("one", 0, "earliest")
        assert [r.value for r in records] == [b"r%d" % i for i in range(50)]
        assert merge_status(client.status(["one"]), "one")[0]["leader"] == dst
        for node in (src, dst):  # asked of a node that holds it no more, or of its new home
            out = tidelog("topics", "describe", "one", "--bootstrap", cluster.address(node))
            assert f"partition 0  leader {dst}  replicas [{dst}]" in out, out
        client.produce("one", [b"after"], partition=0)
        wait_for(
            f"node {src} to delete its copy of one/0",
            lambda: not (tmp_path / f"node-{src}" / "one-0").exists(),
            30,
            every_s=0.1,
        )


def test_the_rebalance_plan_evens_out_replicas_and_leaders_and_is_then_done() -> None:
    from collections import Counter

    from tidelog.cli.rebalance import plan_rebalance

    nodes = [1, 2, 3, 4, 5]
    assignments = {("a", p): [1, 2, 3] for p in range(6)} | {("b", 0): [1, 2], ("b", 1): [2, 1]}
    plan = plan_rebalance(assignments, nodes)
    after = dict(assignments) | {(m.topic, m.partition): m.after for m in plan}
    replicas = Counter(n for r in after.values() for n in r)
    leaders = Counter(r[0] for r in after.values())
    assert max(replicas.values()) - min(replicas[n] for n in nodes) <= 1
    assert max(leaders.values()) - min(leaders[n] for n in nodes) <= 1
    for key, r in after.items():
        assert len(r) == len(assignments[key]) and len(set(r)) == len(r), "RF kept, no twins"
    assert plan_rebalance(after, nodes) == [], "a balanced cluster has nothing to do"


def test_rebalance_moves_replicas_onto_an_added_node(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, nodes=3) as cluster, Client(cluster.bootstrap) as client:
        client.create_topic("r", partitions=4, replication_factor=2)
        for p in range(4):
            client.produce("r", [b"p%d" % p], partition=p)
        new_node = add_node(cluster, client)
        assert all(new_node not in a for a in topic_at_metadata_leader(client, "r").assignments)

        def rebalance(*extra: str) -> str:
            return tidelog("cluster", "rebalance", *extra, "--bootstrap", cluster.bootstrap)

        before = topic_at_metadata_leader(client, "r").assignments
        planned = rebalance("--dry-run")
        assert "move r/" in planned
        assert topic_at_metadata_leader(client, "r").assignments == before, (
            "a dry run changes nothing"
        )
        done = rebalance("--wait")
        assert "rebalanced" in done
        after = topic_at_metadata_leader(client, "r").assignments
        per_node = [sum(n in a for a in after) for n in (1, 2, 3, new_node)]
        assert max(per_node) - min(per_node) <= 1 and per_node[3] >= 1, per_node
        for p in range(4):
            assert [r.value for r in client.consume("r", p, "earliest")] == [b"p%d" % p]
        assert "nothing to do" in rebalance("--dry-run")
