"""Topics that change after they are created: delete (and create again under the same name),
alter configs live, add partitions; bad requests get named errors and change nothing."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from frame_proxy import FrameProxy, Reply, node_behind
from helpers import wait_for, wait_for_async, wait_for_value
from test_node import running_node
from tidelog.cli.cluster import LocalCluster
from tidelog.client.async_client import AsyncClient
from tidelog.client.sync_client import Client
from tidelog.cluster_status import merge_status
from tidelog.config import InvalidConfig
from tidelog.errors import InvalidRequest, UnknownCursor, UnknownTopicOrPartition
from tidelog.node.access import Principal
from tidelog.node.topics import TOPIC_ID_FILE
from tidelog.protocol import api
from tidelog.protocol.api import ApiKey
from tidelog.protocol.framing import Frame
from tidelog.replication.messages import VoteRequest
from wire import Wire, replication_frame

pytestmark = pytest.mark.process  # tiers: pyproject.toml's markers


def test_a_deleted_topic_takes_its_data_and_cursors_and_never_comes_back(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_node(tmp_path) as (_, client):
            await client.create_topic("t", partitions=2)
            await client.produce("t", [b"old-0", b"old-1"], partition=0)
            await client.create_cursor("etl", "t", "earliest")
            await client.create_cursor("nightly", "t", "earliest", backup=True)
            with pytest.raises(InvalidRequest, match="backup cursor"):
                await client.delete_topic("t")
            assert "t" in {t.name for t in await client.list_topics()}, "nothing changed"
            resp = await client.delete_topic("t", force=True)
            assert resp.deleted_cursors == ["etl", "nightly"]
            assert "t" not in {t.name for t in await client.list_topics()}
            assert await client.cursors() == []
            await wait_for_async(
                "the deleted topic's directory to go",
                lambda: not (tmp_path / "node" / "t-0").exists(),
                15,
            )
            with pytest.raises(UnknownTopicOrPartition):
                await client.fetch("t", 0, 0)
            with pytest.raises(UnknownTopicOrPartition):
                await client.delete_topic("t")

            await client.create_topic("t", partitions=1)
            await client.produce("t", [b"new"], partition=0)
            marker = (tmp_path / "node" / "t-0" / TOPIC_ID_FILE).read_text()
        async with running_node(tmp_path) as (_, client):
            await client.wait_for_leaders("t")
            records = (await client.fetch("t", 0, 0)).records
            assert [r.value for r in records] == [b"new"], "no old data after a restart"
            assert (tmp_path / "node" / "t-0" / TOPIC_ID_FILE).read_text() == marker
            assert not (tmp_path / "node" / "t-1").exists()

    asyncio.run(main())


def test_alter_applies_configs_live_and_the_cleaner_follows(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_node(tmp_path) as (node, client):
            await client.create_topic(
                "t",
                configs={"segment.bytes": "1024", "retention.check.interval.ms": "100"},
            )
            for i in range(60):
                await client.produce("t", [b"%03d" % i + b"." * 100], partition=0)
            host = node.hosts["t/0"]
            assert host.log.log_start_offset == 0 and host.log.segment_count > 5
            resp = await client.alter_topic(
                "t", {"retention.bytes": "2048", "file.delete.delay.ms": "0"}
            )
            assert resp.configs["retention.bytes"] == "2048"
            assert resp.configs["segment.bytes"] == "1024", "other overrides are kept"
            await wait_for_async("retention to delete", lambda: host.log.log_start_offset > 0, 15)
            assert host.config.retention_bytes == 2048
            row = merge_status(await client.status(["t"]), "t")[0]
            assert "retention.bytes" in row["low_watermark"]["set_by"]
            info = await client.topic("t", refresh=True)
            assert info.configs["retention.bytes"] == "2048"

            resp = await client.alter_topic("t", delete_configs=["retention.bytes"])
            assert "retention.bytes" not in resp.configs and host.config.retention_bytes == -1

            with pytest.raises(InvalidConfig):
                await client.alter_topic("t", {"retention.bytes": "lots"})
            with pytest.raises(InvalidConfig):
                await client.alter_topic("t", delete_configs=["no.such.config"])
            with pytest.raises(InvalidRequest, match=r"min\.insync\.replicas"):
                await client.alter_topic("t", {"min.insync.replicas": "2"})
            with pytest.raises(UnknownTopicOrPartition):
                await client.alter_topic("missing", {"retention.ms": "1"})
            assert (await client.topic("t", refresh=True)).configs == resp.configs

    asyncio.run(main())


def test_add_partitions_grows_a_stream_and_refuses_bad_counts(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_node(tmp_path) as (_, client):
            await client.create_topic("t", partitions=1)
            await client.create_topic("kv", kind="table")
            info = await client.add_partitions("t", 3)
            assert info.partitions == 3 and len(info.assignments) == 3
            await client.produce("t", [b"in-two"], partition=2)
            assert [r.value for r in (await client.fetch("t", 2, 0)).records] == [b"in-two"]
            for bad in (3, 2, 0):
                with pytest.raises(InvalidRequest, match="partitions"):
                    await client.add_partitions("t", bad)
            with pytest.raises(InvalidRequest, match="table"):
                await client.add_partitions("kv", 2)
            with pytest.raises(UnknownTopicOrPartition):
                await client.add_partitions("missing", 2)
            assert (await client.topic("t", refresh=True)).partitions == 3

    asyncio.run(main())


def test_a_node_down_while_its_topic_was_deleted_and_recreated_keeps_no_old_data(
    tmp_path: Path,
) -> None:
    """Topic ids: node 3 holds a replica of t when it stops; t is deleted and created again
    under the same name; node 3's old directory is another topic's and goes on its return."""
    with LocalCluster(tmp_path, nodes=3) as cluster, Client(cluster.bootstrap) as client:
        client.create_topic("t", replication_factor=3)
        client.produce("t", [b"old"] * 5, partition=0)
        wait_for_replicas(client, "t", 5)
        marker = tmp_path / "node-3" / "t-0" / TOPIC_ID_FILE
        old_id = marker.read_text()
        cluster.stop(3)
        client.delete_topic("t")
        client.create_topic("t", replication_factor=3, configs={"min.insync.replicas": "2"})
        client.produce("t", [b"new"], partition=0)
        cluster.start(3)
        cluster.wait_ready()
        wait_for_replicas(client, "t", 1)
        mine = [
            r.value for r in client.consume("t", 0, "earliest", replica_read=True, prefer_node=3)
        ]
        assert mine == [b"new"]
        assert marker.read_text() != old_id, "node 3's replica is the new topic's"
        log = cluster.log_path(3).read_text()
        assert "replica removed (its topic was deleted)" in log or "a deleted topic's" in log


def wait_for_replicas(client: Client, topic: str, end: int) -> None:
    def all_at_end() -> bool:
        rows = merge_status(client.status([topic]), topic)
        replicas = rows[0]["replicas"] if rows else {}
        return len(replicas) == 3 and all(
            r.get("log_end_offset") == end and r.get("high_watermark") == end
            for r in replicas.values()
        )

    wait_for(f"the replicas of {topic} all to reach {end}", all_at_end, 30, every_s=0.1)


def test_replication_messages_of_another_incarnation_of_a_name_are_dropped(
    tmp_path: Path,
) -> None:
    """A replica of a deleted topic (on a node that has not applied the delete yet) and one of
    the topic created again under the same name share a group name; they must not count each
    other's votes or logs. Each replication message carries its topic id."""

    async def main() -> None:
        async with running_node(tmp_path) as (node, client):
            await client.create_topic("t")
            host = node.hosts["t/0"]
            heard: list[object] = []
            step = host.step
            host.step = lambda sender, message, directory="": (  # type: ignore[method-assign]
                heard.append(message),
                step(sender, message, directory),
            )
            peer = Principal.peer(2, "127.0.0.1:1")
            vote = VoteRequest(host.replica.epoch + 5, 2, 99, 999, False)
            header, payload = replication_frame("t/0", vote)
            node.core.on_peer_message(
                peer, ApiKey.REPLICATION, {**header, "topic_id": host.topic_id + 1}, payload
            )
            assert heard == [], "another incarnation's message is dropped"
            node.core.on_peer_message(
                peer, ApiKey.REPLICATION, {**header, "topic_id": host.topic_id}, payload
            )
            assert heard == [vote], "this incarnation's is heard"

    asyncio.run(main())


def test_an_admin_request_waits_out_a_cluster_that_has_no_leader_yet(tmp_path: Path) -> None:
    """Right after a cluster starts its first election is still running: admin requests retry
    what passes until admin_timeout_ms (Kafka's default.api.timeout.ms), however few `retries`
    that is (they gave up after a fixed count, and `topics create` failed with NotLeader)."""
    cluster = LocalCluster(tmp_path, 3)
    try:
        cluster.start(1)  # one of three: no metadata leader until the others come
        cluster.wait_ready(node_ids=[1])
        waited: list[tuple[str, float]] = []

        async def create() -> int:
            async with AsyncClient(cluster.address(1), retries=2, admin_timeout_ms=60_000) as c:
                c.on_admin_retry = lambda exc, seconds: waited.append((exc.name, seconds))
                info = await c.create_topic("early", partitions=2)
                return info.replication_factor

        outcome: list[int | BaseException] = []
        creator = threading.Thread(target=lambda: outcome.append(_run(create())))
        creator.start()
        time.sleep(3.0)  # two retries were over long before this
        cluster.start(2)
        cluster.start(3)
        creator.join(60)
        assert outcome and outcome[0] == 3, outcome  # and the default factor: min(3, nodes)
        assert waited and waited[0][0] == "NotLeader" and waited[-1][1] >= 2.5, waited[-3:]
    finally:
        cluster.stop_all()


def _run(coro: Any) -> Any:
    try:
        return asyncio.run(coro)
    except BaseException as exc:  # handed to the test thread, which asserts on it
        return exc


class LaggingNode(FrameProxy):
    """A node, behind a proxy, that answers Metadata and cursor requests as it did before a
    topic or cursor was created: one that has not applied the creation yet (found in CI: a Kafka
    test's `wait_for_leaders` right after CreateTopics failed with UnknownTopicOrPartition)."""

    def __init__(
        self,
        upstream: tuple[str, int],
        replayed: tuple[ApiKey, ...] = (ApiKey.METADATA, ApiKey.CURSOR),
        catches_up_after: int | None = None,
    ) -> None:
        super().__init__(upstream)
        self.replayed = replayed
        self.lagging = False
        self.catches_up_after = catches_up_after  # stale answers, then it is current
        self.answers: dict[str, Frame] = {}  # the last answer to each request, as text
        self.stale_answers = 0
        self._asked: dict[int, str] = {}  # correlation id -> the request, as text

    def from_client(self, frame: Frame, reply: Reply) -> bool:
        key = f"{frame.api}:{json.dumps(frame.header, sort_keys=True)}"
        if self.lagging and key in self.answers:
            self.stale_answers += 1
            self.lagging = self.stale_answers != self.catches_up_after
            reply(replace(self.answers[key], correlation_id=frame.correlation_id))
            return False
        if frame.api in self.replayed:
            self._asked[frame.correlation_id] = key
        return True

    def from_node(self, frame: Frame) -> bool:
        if frame.correlation_id in self._asked:
            self.answers[self._asked.pop(frame.correlation_id)] = frame
        return True


def describe_by_hand(address: str, cursor: str) -> Frame:
    host, port = address.split(":")
    wire = Wire((host, int(port)))
    try:
        return wire.request(ApiKey.CURSOR, api.CursorRequest("describe", cursor))
    finally:
        wire.close()


def test_what_was_just_created_is_found_through_a_node_that_has_not_applied_it(
    tmp_path: Path,
) -> None:
    """A node behind on the metadata log calls a new topic or cursor unknown; the client asks
    the metadata leader before it believes that, as a Kafka client retries
    UNKNOWN_TOPIC_OR_PARTITION. What does not exist is still unknown at once."""
    with LocalCluster(tmp_path, 3) as cluster:
        with Client(cluster.bootstrap) as admin:
            leader = wait_for_value(
                "a metadata leader", lambda: admin.describe_cluster().metadata_leader, (0).__lt__
            )
        follower = next(n for n in cluster.node_ids if n != leader)

        async def main() -> None:
            lagging = LaggingNode(("127.0.0.1", cluster.ports[follower]))
            address = "{}:{}".format(*await lagging.start())
            try:
                # What the follower says now, as a new client (one that knows no other node
                # yet) would hear it. A cursor's describe is asked by hand: the client asks the
                # metadata leader for cursors, and the stale answer is there if it did not.
                async with AsyncClient(address) as before:
                    with pytest.raises(UnknownTopicOrPartition):
                        await before.topic("late", refresh=True)
                described = await asyncio.to_thread(describe_by_hand, address, "late")
                assert "error" in described.header, described.header
                async with AsyncClient(cluster.bootstrap) as creator:
                    await creator.create_topic("late", partitions=2)
                    await creator.create_cursor("late", "late")
                    await creator.commit_cursor("late", {0: 0, 1: 0})
                lagging.lagging = True
                async with AsyncClient(address) as client:
                    [cursor] = await client.cursors("late")
                    assert cursor["positions"] == {"0": 0, "1": 0}, cursor
                async with AsyncClient(address) as client:
                    await client.wait_for_leaders("late")
                    assert (await client.produce("late", [b"x"], partition=1)) is not None
                    with pytest.raises(UnknownTopicOrPartition):
                        await client.topic("never-created", refresh=True)
                    with pytest.raises(UnknownCursor):
                        await client.cursors("never-created")
                assert lagging.stale_answers >= 1
            finally:
                await lagging.stop()

        asyncio.run(main())


def test_a_fetch_naming_a_cursor_its_node_has_not_applied_yet_is_tried_again(
    tmp_path: Path,
) -> None:
    """A partition's leader that has not applied a cursor's creation answers a fetch naming it
    with UnknownCursor (found from outside: `consume --follow --cursor NEW` failed now and
    then right after creating the cursor). The client asks the metadata leader whether the
    cursor exists, and if so fetches again; a cursor that exists nowhere is still refused."""

    async def main() -> None:
        lagging = LaggingNode(("127.0.0.1", 0), (ApiKey.FETCH,), catches_up_after=2)
        async with (
            node_behind(lagging, tmp_path / "node") as (_, address),
            AsyncClient(address) as client,
        ):
            await client.create_topic("t")
            await client.produce("t", [b"x"], partition=0)
            with pytest.raises(UnknownCursor):  # what the node says before the creation
                await client.fetch("t", 0, 0, cursor="late")
            await client.create_cursor("late", "t")
            lagging.lagging = True
            fetched = await client.fetch("t", 0, 0, cursor="late")
            assert [r.value for r in fetched.records] == [b"x"]
            assert lagging.stale_answers == 2
            with pytest.raises(UnknownCursor):
                await client.fetch("t", 0, 0, cursor="never-created")

    asyncio.run(main())
