"""The metadata log's commands (replication/metadata_commands.py): every kind's record is the
literal form the log has always held, decoding what is encoded gives the command back, and a
record that is no command is skipped by every node alike."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidelog.node.state_machine import MetadataMachine
from tidelog.record.batch import Record
from tidelog.replication.metadata import MetadataState
from tidelog.replication.metadata_commands import (
    COMMANDS,
    AddNode,
    AddPartitions,
    AlterTopic,
    ArchiveClaimed,
    ArchiveExtent,
    ArchiveLoss,
    ArchiveLossAccepted,
    CommitCursor,
    CreateCursor,
    CreateTopic,
    DeleteCursor,
    DeleteTopic,
    DrainNode,
    FeatureLevel,
    GroupRecord,
    InvalidateCursor,
    MalformedCommand,
    MetadataCommand,
    NodeEntry,
    PutAcl,
    PutPrincipal,
    PutQuota,
    ReassignmentDone,
    ReassignPartition,
    RegisterNodes,
    RemoveAcl,
    RemoveNode,
    RemovePrincipal,
    RemoveQuota,
    TxnAddGroup,
    TxnAddPartitions,
    TxnComplete,
    TxnEnd,
    TxnExpire,
    TxnInit,
    TxnOffsets,
    decode_command,
)

NODE = {
    "node_id": 4,
    "host": "10.0.0.4",
    "port": 7104,
    "peer_port": 7204,
    "draining": False,
    "drain_throttle_bytes": 0,
}
ACL = {"principal": "app", "permission": "allow", "resource": "topic", "name": "t", "pattern": "*"}
LOSS = {
    "name": "t",
    "partition": 0,
    "topic_id": 7,
    "start_offset": 20,
    "end_offset": 150,
    "now_start": -1,
    "now_end": -1,
}

# Each kind: a command, and the record its builder wrote before commands were classes (the
# dicts of node/ops/*.py, node/registry.py, node/archiver.py, node/cleaner.py, node/topics.py,
# kafka/broker.py), copied as they were. Key order counts: the record is its JSON text.
SAMPLES: list[tuple[MetadataCommand, dict[str, Any]]] = [
    (
        CreateTopic("t", "table", {"retention.ms": "1000"}, [[1, 2], [2, 3]]),
        {
            "type": "create_topic",
            "name": "t",
            "kind": "table",
            "configs": {"retention.ms": "1000"},
            "assignments": [[1, 2], [2, 3]],
        },
    ),
    (DeleteTopic("t", 7), {"type": "delete_topic", "name": "t", "topic_id": 7}),
    (
        AlterTopic("t", 7, {"segment.bytes": "4096"}),
        {"type": "alter_topic", "name": "t", "topic_id": 7, "configs": {"segment.bytes": "4096"}},
    ),
    (
        AddPartitions("t", 7, [[3, 1]]),
        {"type": "add_partitions", "name": "t", "topic_id": 7, "assignments": [[3, 1]]},
    ),
    (
        ReassignPartition("t", 7, 1, [2, 4], 1000),
        {
            "type": "reassign_partition",
            "name": "t",
            "topic_id": 7,
            "partition": 1,
            "replicas": [2, 4],
            "throttle_bytes": 1000,
        },
    ),
    (
        ReassignmentDone("t", 7, 1, [2, 4]),
        {
            "type": "reassignment_done",
            "name": "t",
            "topic_id": 7,
            "partition": 1,
            "replicas": [2, 4],
        },
    ),
    (
        RegisterNodes([NodeEntry(4, "10.0.0.4", 7104, 7204)]),
        {"type": "register_nodes", "nodes": [NODE]},
    ),
    (AddNode(NodeEntry(4, "10.0.0.4", 7104, 7204)), {"type": "add_node", "node": NODE}),
    (DrainNode(4, 500), {"type": "drain_node", "node_id": 4, "throttle_bytes": 500}),
    (RemoveNode(4), {"type": "remove_node", "node_id": 4}),
    (
        CreateCursor("c", "t", {0: 5, 1: 6}, True, "app", 1700),
        {
            "type": "create_cursor",
            "name": "c",
            "topic": "t",
            "positions": {0: 5, 1: 6},
            "backup": True,
            "owner": "app",
            "at_ms": 1700,
        },
    ),
    (
        CommitCursor("c", {1: 9}, 1701),
        {"type": "commit_cursor", "name": "c", "positions": {1: 9}, "at_ms": 1701},
    ),
    (DeleteCursor("c", 1702), {"type": "delete_cursor", "name": "c", "at_ms": 1702}),
    (
        InvalidateCursor("c", "by request", 1703),
        {"type": "invalidate_cursor", "name": "c", "reason": "by request", "at_ms": 1703},
    ),
    (
        PutPrincipal("app", "$argon2id$x", {"SCRAM-SHA-256": {"iterations": 4096}}, 1704),
        {
            "type": "put_principal",
            "name": "app",
            "hash": "$argon2id$x",
            "scram": {"SCRAM-SHA-256": {"iterations": 4096}},
            "at_ms": 1704,
        },
    ),
    (RemovePrincipal("app", 1705), {"type": "remove_principal", "name": "app", "at_ms": 1705}),
    (
        PutQuota("app", {"produce_bytes_per_s": 1e6}, 1706),
        {"type": "put_quota", "name": "app", "limits": {"produce_bytes_per_s": 1e6}, "at_ms": 1706},
    ),
    (RemoveQuota("app", 1707), {"type": "remove_quota", "name": "app", "at_ms": 1707}),
    (PutAcl(ACL, 1708), {"type": "put_acl", "acl": ACL, "at_ms": 1708}),
    (RemoveAcl(ACL, 1709), {"type": "remove_acl", "acl": ACL, "at_ms": 1709}),
    (
        GroupRecord("g", {"generation": 3, "members": [{"id": "m-1"}]}),
        {"type": "group", "name": "g", "record": {"generation": 3, "members": [{"id": "m-1"}]}},
    ),
    (GroupRecord("g", None), {"type": "group", "name": "g", "record": None}),
    (ArchiveClaimed("A"), {"type": "archive_claimed", "archive_id": "A"}),
    (
        ArchiveExtent("t", 7, 0, "A", 0, 100),
        {
            "type": "archive_extent",
            "name": "t",
            "topic_id": 7,
            "partition": 0,
            "archive_id": "A",
            "start_offset": 0,
            "end_offset": 100,
        },
    ),
    (
        ArchiveLossAccepted("C", [ArchiveLoss("t", 0, 7, 20, 150, -1, -1)]),
        {"type": "archive_loss_accepted", "archive_id": "C", "lost": [LOSS]},
    ),
    (
        FeatureLevel("tidelog.version", 2, True, 1000),
        {
            "type": "feature_level",
            "name": "tidelog.version",
            "level": 2,
            "new_cluster": True,
            "at_ms": 1000,
        },
    ),
    # The transaction coordinator's commands (version 2: feature level 3) had no earlier form.
    (
        TxnInit("tx", 77, -1, 60000, "app", 1000),
        {
            "type": "txn_init",
            "transactional_id": "tx",
            "producer_id": 77,
            "producer_epoch": -1,
            "timeout_ms": 60000,
            "owner": "app",
            "at_ms": 1000,
            "v": 2,
        },
    ),
    (
        TxnAddPartitions("tx", 77, 0, {"t": [0, 2]}, 1000),
        {
            "type": "txn_add_partitions",
            "transactional_id": "tx",
            "producer_id": 77,
            "producer_epoch": 0,
            "partitions": {"t": [0, 2]},
            "at_ms": 1000,
            "v": 2,
        },
    ),
    (
        TxnAddGroup("tx", 77, 0, "g", 1000),
        {
            "type": "txn_add_group",
            "transactional_id": "tx",
            "producer_id": 77,
            "producer_epoch": 0,
            "group": "g",
            "at_ms": 1000,
            "v": 2,
        },
    ),
    (
        TxnOffsets("tx", 77, 0, "g", {"g": {"topic": "t", "positions": {0: 5}}}, 1000),
        {
            "type": "txn_offsets",
            "transactional_id": "tx",
            "producer_id": 77,
            "producer_epoch": 0,
            "group": "g",
            "offsets": {"g": {"topic": "t", "positions": {"0": 5}}},
            "at_ms": 1000,
            "v": 2,
        },
    ),
    (
        TxnEnd("tx", 77, 0, True, False, 1000),
        {
            "type": "txn_end",
            "transactional_id": "tx",
            "producer_id": 77,
            "producer_epoch": 0,
            "commit": True,
            "bump": False,
            "at_ms": 1000,
            "v": 2,
        },
    ),
    (
        TxnComplete("tx", 77, 0, 12, 1000),
        {
            "type": "txn_complete",
            "transactional_id": "tx",
            "producer_id": 77,
            "producer_epoch": 0,
            "prepared_offset": 12,
            "at_ms": 1000,
            "v": 2,
        },
    ),
    (
        TxnExpire("tx", 77, 3, 1000),
        {
            "type": "txn_expire",
            "transactional_id": "tx",
            "producer_id": 77,
            "producer_epoch": 3,
            "at_ms": 1000,
            "v": 2,
        },
    ),
]


def test_every_kind_has_a_sample_and_a_handler() -> None:
    assert {command.KIND for command, _ in SAMPLES} == set(COMMANDS)
    assert set(MetadataState.HANDLERS) == set(COMMANDS)


@pytest.mark.parametrize(("command", "record"), SAMPLES, ids=[c.KIND for c, _ in SAMPLES])
def test_a_command_encodes_to_the_record_the_log_has_always_held(
    command: MetadataCommand, record: dict[str, Any]
) -> None:
    assert json.dumps(command.encode()) == json.dumps(record)
    assert decode_command(json.loads(json.dumps(record))) == command


def test_records_older_versions_wrote_read_with_the_defaults_applying_gave_them() -> None:
    assert decode_command({"type": "create_topic", "name": "t"}) == CreateTopic(
        "t", "stream", {}, []
    )
    assert decode_command({"type": "drain_node", "node_id": 2}) == DrainNode(2, 0)
    assert decode_command(
        {"type": "create_cursor", "name": "c", "topic": "t", "positions": {"0": "3"}}
    ) == CreateCursor("c", "t", {0: 3}, False, "", 0)
    assert decode_command({"type": "invalidate_cursor", "name": "c"}) == InvalidateCursor(
        "c", "invalidated", 0
    )
    assert decode_command({"type": "add_node", "node": {"node_id": 1, "host": "h", "port": 9}}) == (
        AddNode(NodeEntry(1, "h", 9))
    )


@pytest.mark.parametrize(
    ("record", "why"),
    [
        ([1, 2], "not an object"),
        ({"name": "t"}, "unknown kind None"),
        ({"type": "rename_topic", "name": "t"}, "unknown kind 'rename_topic'"),
        ({"type": "delete_topic", "name": "t"}, "without 'topic_id'"),
        ({"type": "add_node"}, "without 'node'"),
        ({"type": "drain_node", "node_id": "two"}, "bad 'node_id'"),
        ({"type": "commit_cursor", "name": "c", "positions": [1]}, "bad 'positions'"),
        ({"type": "add_node", "node": {"node_id": 1}}, "bad 'node'"),
        ({"type": "archive_loss_accepted", "lost": [{"name": "t"}]}, "bad 'lost'"),
    ],
)
def test_a_record_that_is_no_command_is_a_named_error(record: object, why: str) -> None:
    with pytest.raises(MalformedCommand, match=why):
        decode_command(record)


def test_a_committed_record_that_is_no_command_changes_nothing_on_every_node() -> None:
    def records() -> list[Record]:
        values = [
            CreateTopic("t", "stream", {}, [[1]]).encode(),
            {"type": "delete_topic", "name": "t"},  # no topic id: malformed
            {"type": "rename_topic", "name": "t"},  # a kind this version does not know
        ]
        return [Record(i, 0, None, json.dumps(v).encode()) for i, v in enumerate(values)]

    states = []
    for _ in range(2):
        machine = MetadataMachine(lambda name: None, lambda state: None)
        machine.apply(records(), 3)
        states.append(machine.state.to_snapshot())
    assert states[0] == states[1]
    assert [t["name"] for t in states[0]["topics"]] == ["t"]
    assert states[0]["applied_offset"] == 3


# -- every kind, any values ------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
NODES = st.builds(
    NodeEntry, st.integers(), st.text(), st.integers(), st.integers(), st.booleans(), st.integers()
)
FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "str": st.text(),
    "int": st.integers(),
    "bool": st.booleans(),
    "list[int]": st.lists(st.integers()),
    "list[list[int]]": st.lists(st.lists(st.integers(), max_size=5), max_size=5),
    "dict[str, str]": st.dictionaries(st.text(), st.text()),
    "dict[int, int]": st.dictionaries(st.integers(), st.integers()),
    "dict[str, float]": st.dictionaries(
        st.text(), st.floats(allow_nan=False, allow_infinity=False)
    ),
    "dict[str, Any]": st.dictionaries(st.text(), JSON_VALUES, max_size=4),
    "dict[str, Any] | None": st.none() | st.dictionaries(st.text(), JSON_VALUES, max_size=4),
    "dict[str, list[int]]": st.dictionaries(st.text(), st.lists(st.integers(), max_size=4)),
    "dict[str, dict[str, Any]]": st.dictionaries(
        st.text(),
        st.builds(
            lambda topic, positions: {"topic": topic, "positions": positions},
            st.text(),
            st.dictionaries(st.integers(), st.integers()),
        ),
        max_size=3,
    ),
    "NodeEntry": NODES,
    "list[NodeEntry]": st.lists(NODES, max_size=4),
    "list[ArchiveLoss]": st.lists(
        st.builds(ArchiveLoss, st.text(), *[st.integers()] * 6), max_size=4
    ),
}


def commands_of(kind: type[MetadataCommand]) -> st.SearchStrategy[MetadataCommand]:
    """Any command of a kind: each field from its annotation (a new field type needs a line in
    FIELD_VALUES, or this fails)."""
    fields = {f.name: FIELD_VALUES[str(f.type)] for f in dataclasses.fields(kind)}
    return st.builds(kind, **fields)


@pytest.mark.parametrize("kind", sorted(COMMANDS))
@settings(max_examples=25, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_decoding_what_is_encoded_gives_the_command_back(kind: str, data: st.DataObject) -> None:
    command = data.draw(commands_of(COMMANDS[kind]))
    assert decode_command(command.encode()) == command
    text = json.dumps(command.encode())
    again = decode_command(json.loads(text))
    assert again == command
    assert json.dumps(again.encode()) == text, "the record is the same text once more"
    for value in command.encode().values():
        if isinstance(value, dict | list):
            value.clear()
    assert json.dumps(command.encode()) == text, "a record's containers are its own"
