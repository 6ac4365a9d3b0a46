"""Feature levels (tidelog/features.py, node/feature_levels.py, `tidelog features`): the rules
as pure functions and the metadata record they finalize, then real clusters of real processes
that start at the highest level, refuse an upgrade a node does not support, upgrade once every
node does, refuse a node that cannot run at the finalized level (at start and at join), refuse
an unsafe downgrade, and keep the level across restarts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import retry, scrape, value, wait_for_value
from tidelog.cli.cluster import LocalCluster
from tidelog.client.sync_client import Client
from tidelog.errors import (
    InvalidRequest,
    TidelogError,
    UnsafeFeatureDowngrade,
    UnsupportedFeatureLevel,
)
from tidelog.features import (
    FEATURE,
    MAX_LEVEL,
    UNANNOUNCED,
    SupportedRange,
    announced_range,
    build_range,
    check_downgrade,
    check_supported,
    check_upgrade,
    highest_common,
    upgrade_target,
)
from tidelog.node.config import node_config_from
from tidelog.node.state_machine import MetadataMachine
from tidelog.record.batch import Record
from tidelog.replication.metadata import MetadataState
from tidelog.replication.metadata_commands import FeatureLevel
from tidelog.storage.quorum_journal import JOURNAL_FILE, RECORD

ONE_TWO = SupportedRange(1, 2)
CAPPED = ["--set", "feature.max.level=1"]  # a node that acts as a build of level 1 only


def test_a_node_that_announces_nothing_runs_0_1_0_and_supports_only_level_1() -> None:
    assert announced_range(None) == UNANNOUNCED == SupportedRange(1, 1)
    assert announced_range({}) == UNANNOUNCED
    assert announced_range({FEATURE: [1, 2]}) == ONE_TWO
    for bad in ([2, 1], [0, 1], "1-2", [1, True], {FEATURE: "x"}):
        with pytest.raises(InvalidRequest):
            announced_range(bad if isinstance(bad, dict) else {FEATURE: bad})
    assert build_range() == SupportedRange(1, MAX_LEVEL)
    assert build_range(1) == SupportedRange(1, 1)
    with pytest.raises(InvalidRequest):
        build_range(MAX_LEVEL + 1)


def test_upgrades_need_every_registered_node_live_and_supporting_the_level() -> None:
    check_upgrade(1, 2, {1: ONE_TWO, 2: ONE_TWO})
    with pytest.raises(UnsupportedFeatureLevel, match="node 2 supports 1-1") as refused:
        check_upgrade(1, 2, {1: ONE_TWO, 2: SupportedRange(1, 1), 3: ONE_TWO})
    assert refused.value.details["nodes"] == [2]
    with pytest.raises(UnsupportedFeatureLevel, match=r"node\(s\) \[3\] are not live"):
        check_upgrade(1, 2, {1: ONE_TWO, 2: ONE_TWO, 3: None})
    with pytest.raises(UnsupportedFeatureLevel, match="node 1 supports 1-2"):
        check_upgrade(1, 3, {1: ONE_TWO})  # a node of level 1..2 cannot join a cluster at 3
    with pytest.raises(UnsupportedFeatureLevel, match=f"not {MAX_LEVEL + 1}"):
        check_upgrade(1, MAX_LEVEL + 1, {1: ONE_TWO})
    with pytest.raises(InvalidRequest, match="downgrade"):
        check_upgrade(2, 1, {1: ONE_TWO})
    assert highest_common({1: ONE_TWO, 2: ONE_TWO}) == 2
    assert highest_common({1: ONE_TWO, 2: SupportedRange(1, 1)}) == 1
    assert highest_common({1: ONE_TWO, 2: None}) == 1


def test_asking_for_the_finalized_level_passes_without_asking_the_nodes() -> None:
    """Nothing changes, and every node had to support the finalized level to run: an upgrade
    to it is not refused for a node that is down or capped below the next level."""
    check_upgrade(2, 2, {1: ONE_TWO, 2: None})
    check_upgrade(1, 1, {1: ONE_TWO, 2: SupportedRange(1, 1), 3: None})
    check_downgrade(2, 2, {1: ONE_TWO, 2: None})
    check_downgrade(1, 1, {1: ONE_TWO})


def test_the_default_upgrade_is_the_highest_level_every_live_node_supports() -> None:
    assert upgrade_target(1, 0, {1: ONE_TWO, 2: ONE_TWO}) == 2
    assert upgrade_target(1, 0, {1: ONE_TWO, 2: SupportedRange(1, 1)}) == 1  # nothing to do
    assert upgrade_target(1, 2, {1: ONE_TWO, 2: None}) == 2  # asked for: checked next
    # A node down: whether it supports more is unknown, so the default is refused, naming it...
    with pytest.raises(UnsupportedFeatureLevel, match=r"node\(s\) \[2\] are not live"):
        upgrade_target(1, 0, {1: ONE_TWO, 2: None})
    # ...unless this build knows no level above the finalized one: nothing to upgrade.
    assert upgrade_target(MAX_LEVEL, 0, {1: ONE_TWO, 2: None}) == MAX_LEVEL


def test_level_2_allows_no_downgrade_and_level_1_has_nothing_below() -> None:
    with pytest.raises(UnsafeFeatureDowngrade, match="from 2 to 1") as refused:
        check_downgrade(2, 1, {1: ONE_TWO})
    assert "before finalizing" in refused.value.message
    with pytest.raises(InvalidRequest, match="lowest level"):
        check_downgrade(1, 0, {1: ONE_TWO})
    with pytest.raises(InvalidRequest, match="lowest level"):
        check_downgrade(1, 2, {1: ONE_TWO})
    with pytest.raises(UnsupportedFeatureLevel, match=f"not {MAX_LEVEL + 1}"):
        check_downgrade(2, MAX_LEVEL + 1, {1: ONE_TWO})


def test_a_node_outside_the_finalized_level_is_refused_by_name() -> None:
    check_supported(2, ONE_TWO, 1)
    with pytest.raises(
        UnsupportedFeatureLevel, match=r"cluster finalized tidelog\.version=3; node 4 supports 1-2"
    ):
        check_supported(3, ONE_TWO, 4)


def test_feature_max_level_is_a_checked_node_setting(tmp_path: Path) -> None:
    config = node_config_from({"data": str(tmp_path), "feature.max.level": "1"})
    assert config.feature_max_level == 1
    with pytest.raises(InvalidRequest, match=rf"feature.max.level must be 1..{MAX_LEVEL}"):
        node_config_from({"data": str(tmp_path), "feature.max.level": "7"})


def test_the_finalized_level_is_a_metadata_record_and_survives_a_snapshot() -> None:
    state = MetadataState()
    assert state.finalized_level == 1 and state.features == {}  # a cluster of 0.1.0
    state.apply(0, FeatureLevel(FEATURE, 2, True, 0))
    assert state.finalized_level == 2
    # A later leader of the new cluster proposes its first level again: the first holds.
    state.apply(1, FeatureLevel(FEATURE, 1, True, 0))
    assert state.finalized_level == 2
    state.apply(2, FeatureLevel(FEATURE, 1, False, 0))  # an operator's change does apply
    assert state.finalized_level == 1
    again = MetadataState.from_snapshot(json.loads(json.dumps(state.to_snapshot())))
    assert again.features == {FEATURE: 1}
    # A snapshot of 0.1.0 holds no features: level 1.
    old = state.to_snapshot()
    del old["features"]
    assert MetadataState.from_snapshot(old).finalized_level == 1


def test_every_applied_command_and_snapshot_reaches_the_machine_s_hook() -> None:
    seen: list[object] = []
    machine = MetadataMachine(lambda name: None, lambda state: None, on_applied=seen.append)
    record = FeatureLevel(FEATURE, 2, False, 5).encode()
    machine.apply([Record(0, 0, None, json.dumps(record).encode())], 1)
    assert seen == [FeatureLevel(FEATURE, 2, False, 5)]
    machine.restore(machine.snapshot(), 1)
    assert seen[-1] is None and machine.state.finalized_level == 2


# -- real nodes ------------------------------------------------------------------------------


def tidelog(*args: str, ok: bool = True) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "tidelog", *args], capture_output=True, text=True, timeout=300
    )
    assert (proc.returncode == 0) == ok, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def finalized(client: Client, level: int) -> None:
    """Wait until the metadata leader answers with this finalized level."""
    wait_for_value(
        f"finalized level {level}",
        lambda: client.describe_features().finalized_level,
        lambda found: found == level,
    )


def ranges(client: Client) -> dict[int, tuple[int, int, bool]]:
    return {
        n["node_id"]: (n["min_level"], n["max_level"], n["live"])
        for n in client.describe_features().nodes
    }


def node_levels(client: Client) -> set[int]:
    """The finalized level each node answering status has applied."""
    return {
        int(n["metadata"]["features"][FEATURE]["finalized_level"])
        for n in client.status()
        if n.get("metadata")
    }


def start_capped(cluster: LocalCluster, node_id: int, capped: bool) -> None:
    """(Re)start a node as a build of level 1 only, or as this build."""
    cluster.stop(node_id)
    cluster.serve_args = CAPPED if capped else []
    cluster.start(node_id)
    cluster.serve_args = []
    cluster.wait_ready(node_ids=[node_id])


@pytest.mark.process
def test_a_new_cluster_starts_at_the_highest_level_every_node_supports(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, nodes=3, http=True) as cluster, Client(cluster.bootstrap) as client:
        finalized(client, MAX_LEVEL)
        answer = client.describe_features()
        assert answer.recorded and answer.feature == FEATURE
        every = {n: (1, MAX_LEVEL, True) for n in (1, 2, 3)}
        wait_for_value("every node's range", lambda: ranges(client), every.__eq__)
        out = tidelog("features", "describe", "--bootstrap", cluster.bootstrap)
        assert f"tidelog.version finalized at level {MAX_LEVEL}" in out
        assert "2: versioned formats (docs/formats.md)" in out
        assert "3: transactions" in out
        described = json.loads(
            tidelog("features", "describe", "--json", "--bootstrap", cluster.bootstrap)
        )
        assert described["finalized_level"] == MAX_LEVEL and len(described["nodes"]) == 3
        info = client.describe_cluster()
        assert info.finalized_features == {FEATURE: MAX_LEVEL}
        assert all(n.supported_features == {FEATURE: [1, MAX_LEVEL]} for n in info.nodes)
        for n in cluster.node_ids:  # each as it applies the finalization
            wait_for_value(
                f"node {n}'s tidelog_feature_level",
                lambda n=n: value(
                    scrape(cluster.http_url(n)), "tidelog_feature_level", feature=FEATURE
                ),
                lambda level: level == MAX_LEVEL,
            )
        assert f"tidelog.version finalized at level {MAX_LEVEL}" in tidelog(
            "status", "--bootstrap", cluster.bootstrap
        )
        # Nothing higher to go to: a success that says it changed nothing (exit status 0).
        nothing = f"tidelog.version is already finalized at level {MAX_LEVEL}; nothing to upgrade"
        assert nothing in tidelog("features", "upgrade", "--bootstrap", cluster.bootstrap)
        assert nothing in tidelog(
            "features", "upgrade", "--to", str(MAX_LEVEL), "--bootstrap", cluster.bootstrap
        )
        unchanged = json.loads(
            tidelog(
                "features",
                "upgrade",
                "--to",
                str(MAX_LEVEL),
                "--json",
                "--bootstrap",
                cluster.bootstrap,
            )
        )
        assert unchanged["changed"] is False and unchanged["finalized_level"] == MAX_LEVEL
        out = tidelog(
            "features", "downgrade", "--to", str(MAX_LEVEL), "--bootstrap", cluster.bootstrap
        )
        assert f"already finalized at level {MAX_LEVEL}; nothing to downgrade" in out
        assert client.update_features(MAX_LEVEL).changed is False
        assert client.update_features(MAX_LEVEL, downgrade=True).changed is False
        # Nothing lower that levels 2 and 3 allow, nor a level that does not exist: refused
        # (status 1).
        out = tidelog("features", "downgrade", "--bootstrap", cluster.bootstrap, ok=False)
        assert "UnsafeFeatureDowngrade" in out and "before finalizing" in out
        beyond = str(MAX_LEVEL + 1)
        out = tidelog(
            "features", "upgrade", "--to", beyond, "--bootstrap", cluster.bootstrap, ok=False
        )
        assert "UnsupportedFeatureLevel" in out and f"not {beyond}" in out


def journal_versions(cluster: LocalCluster) -> set[int]:
    """Each node's quorum journal's format version (its first record names one from 2 on)."""
    versions = set()
    for n in cluster.node_ids:
        raw = (cluster.data_dir / f"node-{n}" / JOURNAL_FILE).read_bytes()
        if len(raw) < RECORD.size:
            versions.add(1)
            continue
        first = raw[RECORD.size : RECORD.size + RECORD.unpack_from(raw)[0]]
        versions.add(json.loads(first).get("v", 1) if b'"format"' in first else 1)
    return versions


@pytest.mark.process
def test_a_rolling_upgrade_finalizes_once_every_node_supports_the_level(tmp_path: Path) -> None:
    """Every node starts as a build of level 1 (the cluster finalizes 1); nodes 1 and 2 get the
    new build, node 3 not yet: the upgrade is refused naming node 3. Node 3 upgraded, the
    cluster upgrades; node 3 started as the old build again is refused at start, by name, and a
    new node of the old build is refused at join. The level survives restarts."""
    cluster = LocalCluster(tmp_path, nodes=3, serve_args=CAPPED)
    with cluster, Client(cluster.bootstrap) as client:
        finalized(client, 1)
        assert journal_versions(cluster) == {1}  # what 0.1.0 writes and reads
        client.create_topic("t", partitions=1, replication_factor=3)
        client.produce("t", [b"before"])
        for n in (1, 2):
            start_capped(cluster, n, capped=False)
        mixed = {1: (1, MAX_LEVEL, True), 2: (1, MAX_LEVEL, True), 3: (1, 1, True)}
        wait_for_value("nodes 1 and 2 upgraded", lambda: ranges(client), mixed.__eq__)
        assert client.describe_features().upgradable_to == 1
        with pytest.raises(UnsupportedFeatureLevel, match="node 3 supports 1-1"):
            client.update_features(2)
        out = tidelog(
            "features", "upgrade", "--to", "2", "--bootstrap", cluster.bootstrap, ok=False
        )
        assert "node 3 supports 1-1" in out
        assert client.describe_features().finalized_level == 1

        cluster.stop(3)  # a registered node that is not live: its support is unknown
        wait_for_value("node 3 not live", lambda: ranges(client)[3][2], lambda live: not live)
        with pytest.raises(UnsupportedFeatureLevel, match=r"\[3\] are not live"):
            client.update_features(2)
        with pytest.raises(UnsupportedFeatureLevel, match=r"\[3\] are not live"):
            client.update_features()  # the highest every node supports: unknown
        assert client.update_features(1).changed is False  # where it is: asks no node
        start_capped(cluster, 3, capped=False)
        wait_for_value("node 3 upgraded", lambda: ranges(client)[3], (1, MAX_LEVEL, True).__eq__)
        upgraded = json.loads(
            tidelog("features", "upgrade", "--json", "--bootstrap", cluster.bootstrap)
        )
        assert upgraded["changed"] is True and upgraded["finalized_level"] == MAX_LEVEL
        wait_for_value(
            "every node applied the level", lambda: node_levels(client), {MAX_LEVEL}.__eq__
        )
        # The quorum journal, rewritten first: the record 0.1.0 refuses (formats.py).
        wait_for_value("journals of version 2", lambda: journal_versions(cluster), {2}.__eq__)

        # The old build of node 3 again: refused at start, with the reason.
        cluster.stop(3)
        cluster.serve_args = CAPPED
        cluster.start(3)
        cluster.serve_args = []
        assert cluster.procs[3].wait(60) == 1
        log = cluster.log_path(3).read_text()
        assert (
            f"UnsupportedFeatureLevel: cluster finalized tidelog.version={MAX_LEVEL}; node 3 "
            "supports 1-1" in log
        )
        start_capped(cluster, 3, capped=False)

        # Every node restarted: the level is in the metadata log.
        for n in cluster.node_ids:
            start_capped(cluster, n, capped=False)
        finalized(client, MAX_LEVEL)
        # What was written at level 1 reads the same at the new level.
        records = retry(
            "a fetch", lambda: client.fetch("t", 0, 0).records, tolerating=(TidelogError,)
        )
        assert [r.value for r in records] == [b"before"]

        # A new node of the old build is refused at join.
        n = cluster.new_node()
        client.add_node(n, "127.0.0.1", cluster.ports[n], cluster.peer_ports[n])
        cluster.serve_args = CAPPED
        cluster.start(n)
        cluster.serve_args = []
        assert cluster.procs[n].wait(60) == 1
        assert (
            f"UnsupportedFeatureLevel: cluster finalized tidelog.version={MAX_LEVEL}; node 4"
            in (cluster.log_path(n).read_text())
        )
