"""The node's parts, each alone (issue 33): built from the collaborators they are handed, with
fakes where a collaborator would be a running replica group, and no node core at all. Before,
the cleaner, archiver, topics, registry and asker took a half-built NodeCore and could not be
made without one."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tidelog.config import TopicConfig
from tidelog.errors import NotLeader, TidelogError
from tidelog.node.asking import NodeAsker
from tidelog.node.background import BackgroundTasks
from tidelog.node.cleaner import Cleaner
from tidelog.node.config import NodeConfig
from tidelog.node.metadata_log import MetadataLog
from tidelog.node.metrics import Counters
from tidelog.node.peer_directories import PeerDirectories
from tidelog.node.registry import NodeRegistry
from tidelog.node.state_machine import MetadataMachine
from tidelog.protocol.api import ApiKey
from tidelog.replication.metadata import METADATA_GROUP, NodeEntry
from tidelog.replication.metadata_commands import ReassignmentDone


def fake_metadata_host(leader: bool, leader_id: int, voters: tuple[int, ...] = (1, 2, 3)) -> Any:
    replica = SimpleNamespace(
        is_leader=leader, leader_id=leader_id, voters=voters, is_observer=False
    )
    return SimpleNamespace(replica=replica, leader_hint=None if leader else leader_id)


def metadata_log(hosts: dict[str, Any], sent: list[tuple[int, int, dict[str, Any]]]) -> MetadataLog:
    machine = MetadataMachine(lambda name: None, lambda state: None, lambda: None, lambda n: None)
    return MetadataLog(
        1,
        hosts,
        machine,
        lambda to, key, header, payload: sent.append((to, key, header)),
        BackgroundTasks(),
    )


def test_the_metadata_log_refuses_before_it_opens_and_reports_to_its_leader() -> None:
    hosts: dict[str, Any] = {}
    sent: list[tuple[int, int, dict[str, Any]]] = []
    log = metadata_log(hosts, sent)
    with pytest.raises(NotLeader, match="starting"):
        log.require_started()
    hosts[METADATA_GROUP] = fake_metadata_host(leader=False, leader_id=3)
    log.require_started()
    with pytest.raises(NotLeader):
        log.require_leader()
    done = ReassignmentDone("t", 7, 0, [1, 2])
    log.report("t/0 moved", ApiKey.REASSIGNMENT, done)
    assert sent == [(3, ApiKey.REASSIGNMENT, done.encode())]
    hosts[METADATA_GROUP] = fake_metadata_host(leader=False, leader_id=-1)
    log.report("t/0 moved", ApiKey.REASSIGNMENT, done)
    assert len(sent) == 1, "no leader known: dropped, the next check reports it again"
    assert "no metadata leader" in log.behind()


def test_the_registry_starts_from_its_peers_and_places_only_on_voters() -> None:
    hosts = {METADATA_GROUP: fake_metadata_host(leader=True, leader_id=1, voters=(1, 2))}
    log = metadata_log(hosts, [])
    config = NodeConfig(
        data_dir=Path("unused"),
        node_id=1,
        peers={1: ("h1", 1), 2: ("h2", 2), 3: ("h3", 3)},
    )
    changed: list[int] = []
    registry = NodeRegistry(log, lambda: config, lambda: changed.append(1))
    assert sorted(registry.nodes()) == [1, 2, 3]  # before the first change: --peers
    assert registry.placeable() == [1, 2]  # node 3 is no voter of the metadata log (yet)
    log.state.nodes = {
        1: NodeEntry(1, "h1", 1),
        2: NodeEntry(2, "h2", 2, draining=True),
        4: NodeEntry(4, "h4", 4),
    }
    log.state.removed_nodes = {3}
    registry.learned = {3: NodeEntry(3, "h3", 3), 5: NodeEntry(5, "h5", 5)}
    assert sorted(registry.peer_nodes()) == [1, 2, 4, 5]  # a removed node never comes back
    assert registry.placeable() == [1]  # 2 drains, 4 is no voter


def test_the_asker_names_a_node_it_does_not_know() -> None:
    asker = NodeAsker(lambda: {}, None)
    with pytest.raises(TidelogError, match="node 7 is not in the registry"):
        asyncio.run(asker.ask(7, ApiKey.AUTHENTICATE, object(), 1.0))


def test_a_topic_archived_on_a_node_without_an_archive_holds_everything() -> None:
    log = metadata_log({}, [])
    cleaner = Cleaner(log, {}, None)
    plain = SimpleNamespace(config=TopicConfig())
    assert cleaner.archive_fact(plain) is None  # type: ignore[arg-type]
    archived = SimpleNamespace(
        config=TopicConfig(remote_storage_enable=True),
        log=SimpleNamespace(log_start_offset=40),
    )
    fact = cleaner.archive_fact(archived)  # type: ignore[arg-type]
    assert fact is not None
    assert (fact.archived_end, fact.error) == (40, "ArchiveError")
    assert "has no --archive" in fact.detail


def test_peer_directories_record_the_first_and_count_a_replaced_disk(tmp_path: Path) -> None:
    counters = Counters()
    directories = PeerDirectories(lambda: tmp_path, counters)
    directories.load("2=d2")  # the cluster's format named node 2's directory
    directories.seen(3, "d3")
    directories.seen(2, "d2-new")  # node 2 came back empty
    assert directories.replaced({}) == [2]
    assert directories.replaced({2: "d2-new"}) == []  # the metadata log admitted it
    assert counters.get("tidelog_peer_directory_changes_total") == 1
    again = PeerDirectories(lambda: tmp_path, Counters())
    again.load("2=d2")
    assert again.first == {2: "d2", 3: "d3"}, "node 3's first directory was kept durably"
