"""Reads that are current (issue 34), on real nodes: a table read is linearizable by default
(ReadIndex), lease and serializable are named choices, a follower or a leader cut off from its
majority answers NotLeader rather than a value, and fetches carry the leader epoch (KIP-320)."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tidelog.cli.cluster import LocalCluster
from tidelog.client.sync_client import Client
from tidelog.config import parse_address
from tidelog.errors import (
    FencedLeaderEpoch,
    InvalidRequest,
    NotLeader,
    TidelogError,
    UnknownLeaderEpoch,
)
from tidelog.protocol import api
from tidelog.protocol.api import ApiKey
from tidelog.record.batch import ProducerRecord

pytestmark = pytest.mark.process  # tiers: pyproject.toml's markers

TOPIC = "kv"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("reads"), 3) as c:
        with Client(c.bootstrap) as client:
            client.create_topic(TOPIC, 1, 3, kind="table")
            client.produce(TOPIC, [ProducerRecord(b"k", b"v1")], acks="all")
        yield c


def call(client: Client, cluster: LocalCluster, node: int, request: Any) -> dict[str, Any]:
    """One request to one node, no routing and no retry: what that node itself answers."""
    address = parse_address(cluster.address(node))
    key = ApiKey.TABLE if isinstance(request, api.TableRequest) else ApiKey.FETCH
    header, _ = client._run(client._async._router.call(address, key, request, timeout_s=20))
    return header


def get(consistency: str = "linearizable") -> api.TableRequest:
    return api.TableRequest(
        "get", TOPIC, 0, base64.b64encode(b"k").decode(), consistency=consistency
    )


def leader_and_followers(client: Client) -> tuple[int, list[int]]:
    info = client.topic(TOPIC, refresh=True)
    leader = info.leaders[0]
    return leader, [n for n in info.assignments[0] if n != leader]


def test_each_consistency_reads_the_acknowledged_value(cluster: LocalCluster) -> None:
    with Client(cluster.bootstrap) as client:
        client.produce(TOPIC, [ProducerRecord(b"k", b"v2")], acks="all")
        for consistency in ("linearizable", "lease", "serializable"):
            assert client.table_get(TOPIC, b"k", consistency) == b"v2", consistency
        assert client.table_scan(TOPIC, consistency="lease") == [(b"k", b"v2")]
        with pytest.raises(InvalidRequest, match="consistency must be one of"):
            client.table_get(TOPIC, b"k", "eventual")
        leader, _ = leader_and_followers(client)
        with pytest.raises(InvalidRequest, match="consistency must be one of"):
            call(client, cluster, leader, get("sometimes"))


def test_a_follower_refuses_a_linearizable_read_and_says_a_serializable_one_may_be_stale(
    cluster: LocalCluster,
) -> None:
    with Client(cluster.bootstrap) as client:
        _, followers = leader_and_followers(client)
        for consistency in ("linearizable", "lease"):
            with pytest.raises(NotLeader):
                call(client, cluster, followers[0], get(consistency))
        answer = call(client, cluster, followers[0], get("serializable"))
        assert answer["consistency"] == "serializable" and answer["is_leader"] is False
        assert answer["node_id"] == followers[0]


def test_fetches_name_the_leader_epoch_they_know(cluster: LocalCluster) -> None:
    with Client(cluster.bootstrap) as client:
        leader, _ = leader_and_followers(client)
        answer = call(client, cluster, leader, api.FetchRequest(TOPIC, 0, 0))
        epoch = answer["leader_epoch"]
        assert call(client, cluster, leader, api.FetchRequest(TOPIC, 0, 0, leader_epoch=epoch))
        with pytest.raises(FencedLeaderEpoch):
            call(client, cluster, leader, api.FetchRequest(TOPIC, 0, 0, leader_epoch=epoch - 1))
        with pytest.raises(UnknownLeaderEpoch):
            call(client, cluster, leader, api.FetchRequest(TOPIC, 0, 0, leader_epoch=epoch + 1))
        assert client.list_offsets(TOPIC, 0, "latest", consistent=True) >= 1
        assert [r.value for r in client.consume(TOPIC, 0, consistent=True)][-1] is not None


@pytest.mark.timed  # refused within 10 s
def test_a_leader_cut_off_from_its_majority_answers_not_leader_never_a_value(
    cluster: LocalCluster,
) -> None:
    """Both followers frozen: the leader cannot confirm a read. It answers NotLeader (once
    check-quorum makes it step down), never the value it holds; serializable still answers."""
    with Client(cluster.bootstrap) as client:
        client.produce(TOPIC, [ProducerRecord(b"k", b"v3")], acks="all")
        leader, followers = leader_and_followers(client)
        for node in followers:
            cluster.freeze(node)
        try:
            started = time.monotonic()
            with pytest.raises(TidelogError) as refused:
                call(client, cluster, leader, get("linearizable"))
            waited = time.monotonic() - started
            assert isinstance(refused.value, NotLeader), refused.value
            assert waited < 10, f"refused only after {waited:.1f}s"
            answer = call(client, cluster, leader, get("serializable"))
            assert base64.b64decode(answer["entries"][0][1]) == b"v3"
            assert answer["consistency"] == "serializable"
        finally:
            for node in followers:
                cluster.resume(node)
        assert client.table_get(TOPIC, b"k") == b"v3"
