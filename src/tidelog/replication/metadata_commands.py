"""The metadata log's commands: one frozen dataclass per kind, and their JSON form.

A command is one JSON record of the metadata log: `{"type": KIND, field: value, ...}`, its
fields in the order its dataclass declares them. Builders construct the dataclass; the metadata
log encodes it once, to propose it or to send it to the metadata leader (node/metadata_log.py);
every node decodes what is committed and applies it (MetadataState.apply). The form is the one
the log has always held, on disk and between nodes: it must never drift, so
tests/test_metadata_commands.py holds a literal sample of every kind.

Decoding reads a record as applying always read it: a field that older records may lack takes
the default applying gave it, and a value is converted as applying converted it. A record that
cannot be read so (not an object, an unknown kind, no field naming what it acts on, a value that
does not convert) is MalformedCommand. Every command was validated before it was proposed, so
that only happens across versions; every node skips it alike.

A command's format version is its "v" (absent: 1, the only version so far and what tidelog
0.1.0 wrote; 0.1.0 ignores the field). A command of a newer version than this build reads is not
skipped: applying the log on without it would be a misread, so decoding raises
UnsupportedFormatVersion and the node stops (Kafka's brokers stop so on a metadata record of an
unknown version). A newer version is written only once the feature level allows it.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Self, TypeVar

from tidelog.formats import check_version

T = TypeVar("T")


class MalformedCommand(ValueError):
    """A metadata record that is no command this version knows: it changes nothing."""


# -- the values commands carry --------------------------------------------------------------------


@dataclass(frozen=True)
class NodeEntry:
    """A node of the cluster: where clients and peers reach it. draining: `cluster remove-node`
    asked for it to go; its replicas move off, then it leaves the metadata log's voters, then
    the registry."""

    node_id: int
    host: str
    port: int
    peer_port: int = 0  # 0: learnt from the client listener's ApiVersions answer
    draining: bool = False
    drain_throttle_bytes: int = 0  # catch-up bytes/s for the moves off a draining node

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def to_wire(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "host": self.host,
            "port": self.port,
            "peer_port": self.peer_port,
            "draining": self.draining,
            "drain_throttle_bytes": self.drain_throttle_bytes,
        }

    @staticmethod
    def from_wire(data: dict[str, Any]) -> NodeEntry:
        return NodeEntry(
            int(data["node_id"]),
            str(data["host"]),
            int(data["port"]),
            int(data.get("peer_port", 0)),
            bool(data.get("draining", False)),
            int(data.get("drain_throttle_bytes", 0)),
        )


@dataclass(frozen=True)
class ArchiveLoss:
    """What an operator accepted the archive lost of a partition: [start_offset, end_offset),
    and what its store holds from now on: [now_start, now_end)."""

    name: str
    partition: int
    topic_id: int
    start_offset: int
    end_offset: int
    now_start: int
    now_end: int

    def to_wire(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_wire(data: dict[str, Any]) -> ArchiveLoss:
        return ArchiveLoss(
            str(data["name"]),
            int(data["partition"]),
            int(data["topic_id"]),
            int(data["start_offset"]),
            int(data["end_offset"]),
            int(data["now_start"]),
            int(data["now_end"]),
        )


# -- reading a record's fields --------------------------------------------------------------------

_REQUIRED: Any = object()  # a field without a default: a record without it is malformed


def _strings(value: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in dict(value).items()}


def _positions(value: Any) -> dict[int, int]:
    return {int(p): int(o) for p, o in dict(value).items()}


def _replicas(value: Any) -> list[int]:
    return [int(r) for r in value]


def _assignments(value: Any) -> list[list[int]]:
    return [_replicas(a) for a in value]


def _limits(value: Any) -> dict[str, float]:
    return {str(k): float(v) for k, v in dict(value).items()}


def _group_record(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def _node(value: Any) -> NodeEntry:
    return NodeEntry.from_wire(dict(value))


def _nodes(value: Any) -> list[NodeEntry]:
    return [_node(n) for n in value]


def _losses(value: Any) -> list[ArchiveLoss]:
    return [ArchiveLoss.from_wire(dict(loss)) for loss in value]


class CommandFields:
    """One record's fields, read as applying always read them."""

    def __init__(self, kind: str, data: dict[str, Any]) -> None:
        self.kind = kind
        self.data = data

    def read(self, key: str, convert: Callable[[Any], T], default: Any = _REQUIRED) -> T:
        """The field converted; a missing one is its default (converted too)."""
        if key in self.data:
            value = self.data[key]
        elif default is _REQUIRED:
            raise MalformedCommand(f"a {self.kind} command without {key!r}")
        else:
            value = default
        try:
            return convert(value)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise MalformedCommand(f"a {self.kind} command with a bad {key!r}: {exc!r}") from None

    def text(self, key: str, default: Any = _REQUIRED) -> str:
        return self.read(key, str, default)

    def integer(self, key: str, default: Any = _REQUIRED) -> int:
        return self.read(key, int, default)

    def at_ms(self) -> int:
        """When the proposer made the command (wall clock), for what records a time."""
        return self.integer("at_ms", 0)


# -- the commands ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class MetadataCommand(ABC):
    """One kind of command. Its fields are its record's, in the record's order."""

    KIND: ClassVar[str]

    def encode(self) -> dict[str, Any]:
        """The record (fresh containers: the command stays as it was built)."""
        fields = dataclasses.fields(self)
        return {"type": self.KIND, **{f.name: _wire(getattr(self, f.name)) for f in fields}}

    @classmethod
    @abstractmethod
    def decode_fields(cls, fields: CommandFields) -> Self:
        """The command a record of this kind holds."""


def _wire(value: Any) -> Any:
    if isinstance(value, NodeEntry | ArchiveLoss):
        return value.to_wire()
    if isinstance(value, list):
        return [_wire(v) for v in value]
    if isinstance(value, dict):
        return {k: _wire(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class CreateTopic(MetadataCommand):
    """A new topic; the offset that commits it is its topic id."""

    KIND: ClassVar[str] = "create_topic"
    name: str
    kind: str  # stream | table
    configs: dict[str, str]
    assignments: list[list[int]]

    @classmethod
    def decode_fields(cls, fields: CommandFields) -> Self:
        return cls(
            fields.text("name"),
            fields.text("kind", "stream"),
            fields.read("configs", _strings, {}),
            fields.read("assignments", _assignments, []),
        )


@dataclass(frozen=True)
class TopicCommand(MetadataCommand):
    """A change to one incarnation of a topic, named by its topic id: if the name holds another
    one by the time it is applied (deleted and created again meanwhile), it changes nothing."""

    name: str
    topic_id: int


@dataclass(frozen=True)
class DeleteTopic(TopicCommand):
    KIND: ClassVar[str] = "delete_topic"

    @classmethod
    def decode_fields(cls, fields: CommandFields) -> Self:
        return cls(fields.text("name"), fields.integer("topic_id"))


@dataclass(frozen=True)
class AlterTopic(TopicCommand):
    """The topic's config overrides, all of them."""

    KIND: ClassVar[str] = "alter_topic"
    configs: dict[str, str]

    @classmethod
    def decode_fields(cls, fields: CommandFields) -> Self:
        return cls(
            fields.text("name"), fields.integer("topic_id"), fields.read("configs", _strings, {})
        )


@dataclass(frozen=True)
class AddPartitions(TopicCommand):
    """The replicas of the partitions added after the topic's last one."""

    KIND: ClassVar[str] = "add_partitions"
    assignments: list[list[int]]

    @classmethod
    def decode_fields(cls, fields: CommandFields) -> Self:
        return cls(
            fields.text("name"),
            fields.integer("topic_id"),
            fields.read("assignments", _assignments, []),
        )


@dataclass(frozen=True)
class ReassignPartition(TopicCommand):
    """A partition's new replicas; the nodes it leaves keep their copy, caught up from at
    throttle_bytes per second, until its leader reports the move done."""

    KIND: ClassVar[str] = "reassign_partition"
    partition: int
    replicas: list[int]
    throttle_bytes: int

    @classmethod
    def decode_fields(cls, fields: CommandFields) -> Self:
        return cls(
            fields.text("name"),
            fields.integer("topic_id"),
            fields.integer("partition"),
            fields.read("replicas", _replicas, []),
            fields.integer("throttle_bytes", 0),
        )


@dataclass(frozen=True)
class ReassignmentDone(TopicCommand):
    """A partition's leader has walked its group to replicas: the nodes it left drop it."""

    KIND: ClassVar[str] = "reassignment_done"
    partition: int
    replicas: list[int]

    @classmethod
    def decode_fields(cls, fields: CommandFields) -> Self:
        return cls(
            fields.text("name"),
            fields.integer("topic_id"),
            fields.integer("partition"),
            fields.read("replicas", _replicas, []),
        )


@dataclass(frozen=True)
class RegisterNodes(MetadataCommand):
    """The nodes a cluster started with, at its first change of nodes."""

    KIND: ClassVar[str] = "register_nodes"
    nodes: list[NodeEntry]

    @classmethod
    def decode_fields(cls, fields: CommandFields) -> Self:
        return cls(fields.read("nodes", _nodes, []))


@dataclass(frozen=True)
class AddNode(MetadataCommand):
    KIND: ClassVar[str] = "add_node"
    node: NodeEntry

    @classmethod
    def decode_fields(cls, fields: CommandFields) -> Self:
        return cls(fields.read("node", _node))


@dataclass(frozen=True)
class DrainNode(MetadataCommand):
    """A node is to go: its replicas move off, caught up at throttle_bytes per second."""

    KIND: ClassVar[str] = "drain_node"
    node_id: int
    throttle_bytes: int

    @classmethod
    def decode_fields(cls, fields: CommandFields) -> Self:
        return cls(fields.integer("node_id"), fields.integer("throttle_bytes", 0))


@dataclass(frozen=True)
class RemoveNode(MetadataCommand):
    """A drained node leaves the registry; its id is never used again."""

    KIND: ClassVar[str] = "remove_node"
    node_id: int

    @classmethod
    def decode_fields(cls, fields: CommandFields) -> Self:
        return cls(fields.integer("node_id"))


@dataclass(frozen=True)
class CreateCursor(MetadataCommand):
    KIND: ClassVar[str] = "create_cursor"
    name: str
    topic: str
    positions: dict[int, int]  # partition -> next offset the owner will read
    backup: bool
    owner: str
    at_ms: int

    @classmethod
    def decode_fields(cls, fields: CommandFields) -> Self:
        return cls(
            fields.text("name"),
            fields.text("topic"),
            fields.read("positions", _positions, {}),
            fields.read("backup", bool, False),
            fields.text("owner", ""),
            fields.at_ms(),
        )


@dataclass(frozen=True)
class CommitCursor(MetadataCommand):
    """New positions of some of a live cursor's partitions."""

    KIND: ClassVar[str] = "commit_cursor"
    name: str
    positions: dict[int, int]
    at_ms: int

    @classmethod
    def decode_fields(cls, fields: CommandFields) -> Self:
        return cls(fields.text("name"), fields.read("positions", _positions, {}), fields.at_ms())


@dataclass(frozen=True)
class DeleteCursor(MetadataCommand):
    KIND: ClassVar[str] = "delete_cursor"
    name: str
    at_ms: int

    @classmethod
    def decode_fields(cls, fields: CommandFields) -> Self:
        return cls(fields.text("name"), fields.at_ms())


@dataclass(frozen=True)
class InvalidateCursor(MetadataCommand):
    """A cursor stops holding the log (it stays, to say why)."""

    KIND: ClassVar[str] = "invalidate_cursor"
    name: str
    reason: str
    at_ms: int

    @classmethod
    def decode_fields(cls, fields: CommandFields) -> Self:
        return cls(fields.text("name"), fields.text("reason", "invalidated"), fields.at_ms())


@dataclass(frozen=True)
class PutPrincipal(MetadataCommand):
    """A principal that authenticates with a token: its Argon2id hash and SCRAM credentials,
    never the secret."""

    KIND: ClassVar[str] = "put_principal"
    name: str
    hash: str
    scram: dict[str, Any]
    at_ms: int

    @classmethod
    def decode_fields(cls, fields: CommandFields) -> Self:
        return cls(
            fields.text("name"),
            fields.text("hash", ""),
            fields.read("scram", dict, {}),
            fields.at_ms(),
        )


@dataclass(frozen=True)
class RemovePrincipal(MetadataCommand):
    """A principal goes, and its ACLs with it."""

    KIND: ClassVar[str] = "remove_principal"
    name: str
    at_ms: int

    @classmethod
    def decode_fields(cls, fields: CommandFields) -> Self:
        return cls(fields.text("name"), fields.at_ms())


@dataclass(frozen=True)
class PutQuota(MetadataCommand):
    KIND: ClassVar[str] = "put_quota"
    name: str  # the principal
    limits: dict[str, float]
    at_ms: int

    @classmethod
    def decode_fields(cls, fields: CommandFields) -> Self:
        return cls(fields.text("name"), fields.read("limits", _limits, {}), fields.at_ms())


@dataclass(frozen=True)
class RemoveQuota(MetadataCommand):
    KIND: ClassVar[str] = "remove_quota"
    name: str  # the principal
    at_ms: int

    @classmethod
    def decode_fields(cls, fields: CommandFields) -> Self:
        return cls(fields.text("name"), fields.at_ms())


@dataclass(frozen=True)
class PutAcl(MetadataCommand):
    """An ACL in its canonical wire form (tidelog.acls.Acl.to_wire)."""

    KIND: ClassVar[str] = "put_acl"
    acl: dict[str, str]
    at_ms: int

    @classmethod
    def decode_fields(cls, fields: CommandFields) -> Self:
        return cls(fields.read("acl", _strings, {}), fields.at_ms())


@dataclass(frozen=True)
class RemoveAcl(MetadataCommand):
    KIND: ClassVar[str] = "remove_acl"
    acl: dict[str, str]
    at_ms: int

    @classmethod
    def decode_fields(cls, fields: CommandFields) -> Self:
        return cls(fields.read("acl", _strings, {}), fields.at_ms())


@dataclass(frozen=True)
class GroupRecord(MetadataCommand):
    """A Kafka consumer group's membership as its coordinator settled it (kafka/groups.py
    writes and reads the record; None or no members: the group keeps only its cursors)."""

    KIND: ClassVar[str] = "group"
    name: str
    record: dict[str, Any] | None

    @classmethod
    def decode_fields(cls, fields: CommandFields) -> Self:
        return cls(fields.text("name"), fields.read("record", _group_record, None))


@dataclass(frozen=True)
class ArchiveClaimed(MetadataCommand):
    """The archive's identity (its cluster.json's archive_id), recorded once."""

    KIND: ClassVar[str] = "archive_claimed"
    archive_id: str

    @classmethod
    def decode_fields(cls, fields: CommandFields) -> Self:
        return cls(fields.text("archive_id", ""))


@dataclass(frozen=True)
class ArchiveExtent(MetadataCommand):
    """What a partition leader's manifest holds: [start_offset, end_offset)."""

    KIND: ClassVar[str] = "archive_extent"
    name: str
    topic_id: int
    partition: int
    archive_id: str
    start_offset: int
    end_offset: int

    @classmethod
    def decode_fields(cls, fields: CommandFields) -> Self:
        return cls(
            fields.text("name"),
            fields.integer("topic_id"),
            fields.integer("partition"),
            fields.text("archive_id", ""),
            fields.integer("start_offset"),
            fields.integer("end_offset"),
        )


@dataclass(frozen=True)
class ArchiveLossAccepted(MetadataCommand):
    """An operator accepted what the store lost: the store's contents are the truth now."""

    KIND: ClassVar[str] = "archive_loss_accepted"
    archive_id: str
    lost: list[ArchiveLoss]

    @classmethod
    def decode_fields(cls, fields: CommandFields) -> Self:
        return cls(fields.text("archive_id", ""), fields.read("lost", _losses, []))


@dataclass(frozen=True)
class FeatureLevel(MetadataCommand):
    """The cluster's finalized level of a feature (Kafka's FeatureLevelRecord; tidelog/
    features.py). new_cluster: proposed by the first leader of a new cluster, which finalizes
    the highest level its nodes support at once; it changes nothing once a level is recorded."""

    KIND: ClassVar[str] = "feature_level"
    name: str
    level: int
    new_cluster: bool
    at_ms: int

    @classmethod
    def decode_fields(cls, fields: CommandFields) -> Self:
        return cls(
            fields.text("name"),
            fields.integer("level"),
            fields.read("new_cluster", bool, False),
            fields.at_ms(),
        )


# -- transactions (Kafka's KIP-98 coordinator state; replication/metadata.py applies them) --------

TRANSACTION_COMMAND_VERSION = 2  # proposed only at feature level 3 (transactions)


def _partition_sets(value: Any) -> dict[str, list[int]]:
    return {str(t): _replicas(ps) for t, ps in dict(value).items()}


def _pending_offsets(value: Any) -> dict[str, dict[str, Any]]:
    """cursor name -> {"topic": name, "positions": {partition: offset}}."""
    return {
        str(name): {"topic": str(entry["topic"]), "positions": _positions(entry["positions"])}
        for name, entry in dict(value).items()
    }


@dataclass(frozen=True)
class TransactionCommand(MetadataCommand):
    """A change to one transactional id's transaction. Version 2 of the metadata-command
    format: a build that reads only version 1 stops on it rather than skip it, and it is
    proposed only once the cluster finalized feature level 3. A command whose producer id
    and epoch are no longer the transactional id's (fenced between proposal and commit)
    changes nothing."""

    transactional_id: str
    producer_id: int
    producer_epoch: int

    def encode(self) -> dict[str, Any]:
        return {**super().encode(), "v": TRANSACTION_COMMAND_VERSION}


@dataclass(frozen=True)
class TxnInit(TransactionCommand):
    """InitProducerId for a transactional id: a new id starts at epoch 0 with producer_id (the
    proposer drew it); a known one bumps its epoch, fencing every older one (with a fresh
    producer_id once the epoch would pass Kafka's int16), and an open transaction of the older
    epoch is aborted first (PrepareAbort at the new epoch; the producer asks again once it is
    complete). producer_epoch: the epoch the proposer saw (-1: none), so that two inits
    racing bump once each."""

    KIND: ClassVar[str] = "txn_init"
    timeout_ms: int
    owner: str
    at_ms: int

    @classmethod
    def decode_fields(cls, fields: CommandFields) -> Self:
        return cls(
            fields.text("transactional_id"),
            fields.integer("producer_id"),
            fields.integer("producer_epoch", -1),
            fields.integer("timeout_ms"),
            fields.text("owner", ""),
            fields.at_ms(),
        )


@dataclass(frozen=True)
class TxnAddPartitions(TransactionCommand):
    """AddPartitionsToTxn: the partitions join the transaction (which begins, Ongoing, with its
    first partition or group)."""

    KIND: ClassVar[str] = "txn_add_partitions"
    partitions: dict[str, list[int]]  # topic -> partitions
    at_ms: int

    @classmethod
    def decode_fields(cls, fields: CommandFields) -> Self:
        return cls(
            fields.text("transactional_id"),
            fields.integer("producer_id"),
            fields.integer("producer_epoch"),
            fields.read("partitions", _partition_sets, {}),
            fields.at_ms(),
        )


@dataclass(frozen=True)
class TxnAddGroup(TransactionCommand):
    """AddOffsetsToTxn: the consumer group's offsets will be committed with the transaction."""

    KIND: ClassVar[str] = "txn_add_group"
    group: str
    at_ms: int

    @classmethod
    def decode_fields(cls, fields: CommandFields) -> Self:
        return cls(
            fields.text("transactional_id"),
            fields.integer("producer_id"),
            fields.integer("producer_epoch"),
            fields.text("group"),
            fields.at_ms(),
        )


@dataclass(frozen=True)
class TxnOffsets(TransactionCommand):
    """TxnOffsetCommit: offsets pending until the transaction ends (committed with it, dropped
    if it aborts), by the cursor that keeps the group's offsets on each topic."""

    KIND: ClassVar[str] = "txn_offsets"
    group: str
    offsets: dict[str, dict[str, Any]]  # cursor -> {"topic", "positions": {partition: offset}}
    at_ms: int

    @classmethod
    def decode_fields(cls, fields: CommandFields) -> Self:
        return cls(
            fields.text("transactional_id"),
            fields.integer("producer_id"),
            fields.integer("producer_epoch"),
            fields.text("group"),
            fields.read("offsets", _pending_offsets, {}),
            fields.at_ms(),
        )


@dataclass(frozen=True)
class TxnEnd(TransactionCommand):
    """EndTxn's decision, the transaction's commit point: PrepareCommit (the pending offsets
    become the groups' cursors in this same command) or PrepareAbort. bump: the coordinator
    aborts a transaction past its timeout, at a new epoch that fences the producer."""

    KIND: ClassVar[str] = "txn_end"
    commit: bool
    bump: bool
    at_ms: int

    @classmethod
    def decode_fields(cls, fields: CommandFields) -> Self:
        return cls(
            fields.text("transactional_id"),
            fields.integer("producer_id"),
            fields.integer("producer_epoch"),
            fields.read("commit", bool),
            fields.read("bump", bool, False),
            fields.at_ms(),
        )


@dataclass(frozen=True)
class TxnComplete(TransactionCommand):
    """Every partition of the prepared transaction holds its marker (committed there): the
    transaction is complete. prepared_offset names the decision it completes."""

    KIND: ClassVar[str] = "txn_complete"
    prepared_offset: int
    at_ms: int

    @classmethod
    def decode_fields(cls, fields: CommandFields) -> Self:
        return cls(
            fields.text("transactional_id"),
            fields.integer("producer_id"),
            fields.integer("producer_epoch"),
            fields.integer("prepared_offset"),
            fields.at_ms(),
        )


@dataclass(frozen=True)
class TxnExpire(TransactionCommand):
    """A transactional id with no transaction open, not used for transactional.id.expiration.ms,
    is forgotten (Kafka's expiration): its next producer starts at a new producer id."""

    KIND: ClassVar[str] = "txn_expire"
    at_ms: int

    @classmethod
    def decode_fields(cls, fields: CommandFields) -> Self:
        return cls(
            fields.text("transactional_id"),
            fields.integer("producer_id"),
            fields.integer("producer_epoch"),
            fields.at_ms(),
        )


TRANSACTION_COMMANDS = (
    TxnInit,
    TxnAddPartitions,
    TxnAddGroup,
    TxnOffsets,
    TxnEnd,
    TxnComplete,
    TxnExpire,
)

COMMANDS: dict[str, type[MetadataCommand]] = {
    c.KIND: c
    for c in (
        CreateTopic,
        DeleteTopic,
        AlterTopic,
        AddPartitions,
        ReassignPartition,
        ReassignmentDone,
        RegisterNodes,
        AddNode,
        DrainNode,
        RemoveNode,
        CreateCursor,
        CommitCursor,
        DeleteCursor,
        InvalidateCursor,
        PutPrincipal,
        RemovePrincipal,
        PutQuota,
        RemoveQuota,
        PutAcl,
        RemoveAcl,
        GroupRecord,
        ArchiveClaimed,
        ArchiveExtent,
        ArchiveLossAccepted,
        FeatureLevel,
        *TRANSACTION_COMMANDS,
    )
}
NODE_COMMANDS = frozenset(c.KIND for c in (RegisterNodes, AddNode, DrainNode, RemoveNode))


def decode_command(data: object) -> MetadataCommand:
    """The command a record holds (MalformedCommand if it holds none this version knows;
    UnsupportedFormatVersion if it is of a newer version than this build reads)."""
    if not isinstance(data, dict):
        raise MalformedCommand("not an object")
    kind = data.get("type")
    version = data.get("v", 1)
    if not isinstance(version, int) or isinstance(version, bool):
        raise MalformedCommand(f"version {version!r} is not a number")
    check_version("metadata-command", version, f"metadata command {kind!r}")
    command = COMMANDS.get(kind) if isinstance(kind, str) else None
    if command is None:
        raise MalformedCommand(f"unknown kind {kind!r}")
    return command.decode_fields(CommandFields(command.KIND, data))
