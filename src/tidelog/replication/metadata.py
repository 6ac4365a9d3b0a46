"""Cluster metadata as a state machine applied from the committed metadata log.

Every node applies the same committed commands in the same order, so every node can answer
metadata. The commands and their JSON form are replication/metadata_commands.py's; applying one
is a handler per kind (MetadataState.HANDLERS).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tidelog.config import TopicConfig
from tidelog.errors import (
    InvalidConfig,
    InvalidReplicaAssignment,
    InvalidReplicationFactor,
    InvalidRequest,
    NodeAlreadyExists,
    NotEnoughNodes,
    TopicAlreadyExists,
    UnknownCursor,
    UnknownNode,
    UnknownTopicOrPartition,
)
from tidelog.features import DEFAULT_LEVEL, FEATURE
from tidelog.formats import check_version, write_version
from tidelog.invariant import InvariantBroken
from tidelog.replication.metadata_commands import (
    AddNode,
    AddPartitions,
    AlterTopic,
    ArchiveClaimed,
    ArchiveExtent,
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
    MetadataCommand,
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
    TopicCommand,
    TxnAddGroup,
    TxnAddPartitions,
    TxnComplete,
    TxnEnd,
    TxnExpire,
    TxnInit,
    TxnOffsets,
)
from tidelog.replication.metadata_commands import NodeEntry as NodeEntry
from tidelog.replication.metadata_transactions import (
    Transaction,
    Transactions,
    apply_add_group,
    apply_add_partitions,
    apply_complete,
    apply_end,
    apply_expire,
    apply_init,
    apply_offsets,
)

TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")  # Kafka's rule; matched with fullmatch
NODE_ID_MAX = 2**31 - 1
METADATA_TOPIC = "__metadata"
METADATA_GROUP = f"{METADATA_TOPIC}/0"  # its one replica group
PARTITIONS_MAX = 10_000


@dataclass(frozen=True)
class TopicMeta:
    name: str
    kind: str
    configs: dict[str, str]
    assignments: list[list[int]]  # partition -> replica node ids (first = preferred leader)
    created_offset: int
    # partition -> the voters its replica group was created with (its log's changes follow)
    initial: list[list[int]] = field(default_factory=list)
    # partition -> nodes that still hold a copy while the partition moves off them
    retiring: dict[int, list[int]] = field(default_factory=dict)
    throttles: dict[int, int] = field(default_factory=dict)  # partition -> catch-up bytes/s

    def __post_init__(self) -> None:
        if not self.initial:
            object.__setattr__(self, "initial", [list(a) for a in self.assignments])

    def hosts(self, partition: int) -> set[int]:
        """The nodes that keep a replica of the partition now."""
        return set(self.assignments[partition]) | set(self.retiring.get(partition, []))

    @property
    def partitions(self) -> int:
        return len(self.assignments)

    @property
    def topic_id(self) -> int:
        """Which incarnation of the name: the metadata offset that created it. A topic deleted
        and created again under the same name is another topic (Kafka's topic ids, KIP-516)."""
        return self.created_offset

    @property
    def replication_factor(self) -> int:
        return len(self.assignments[0]) if self.assignments else 0

    @property
    def config(self) -> TopicConfig:
        return TopicConfig.from_mapping(self.configs)

    def to_wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "configs": dict(self.configs),
            "assignments": [list(a) for a in self.assignments],
            "partitions": self.partitions,
            "replication_factor": self.replication_factor,
            "topic_id": self.topic_id,
            "initial_assignments": [list(a) for a in self.initial],
            # A partition being moved: the nodes it is leaving (they hold a copy until done).
            "reassigning": {str(p): list(r) for p, r in sorted(self.retiring.items())},
            "throttles": {str(p): t for p, t in sorted(self.throttles.items())},
        }

    @staticmethod
    def from_wire(t: dict[str, Any]) -> TopicMeta:
        return TopicMeta(
            name=str(t["name"]),
            kind=str(t.get("kind", "stream")),
            configs={str(k): str(v) for k, v in dict(t.get("configs", {})).items()},
            assignments=[[int(r) for r in a] for a in t["assignments"]],
            created_offset=int(t.get("created_offset", t.get("topic_id", 0))),
            initial=[[int(r) for r in a] for a in t.get("initial_assignments", [])],
            retiring={int(p): [int(r) for r in a] for p, a in t.get("reassigning", {}).items()},
            throttles={int(p): int(v) for p, v in t.get("throttles", {}).items()},
        )


@dataclass
class Cursor:
    """A named, durable consumer position that holds the log (a replication slot)."""

    name: str
    topic: str
    positions: dict[int, int]  # partition -> next offset the owner will read
    backup: bool
    created_ms: int
    committed_ms: int
    invalidated: str = ""  # why it stopped holding; "" while live
    owner: str = ""  # the principal that created it ("" before cursors had owners)

    @property
    def live(self) -> bool:
        return not self.invalidated

    def to_wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "topic": self.topic,
            "positions": {str(p): o for p, o in sorted(self.positions.items())},
            "backup": self.backup,
            "created_ms": self.created_ms,
            "committed_ms": self.committed_ms,
            "invalidated": self.invalidated,
            "owner": self.owner,
        }

    @staticmethod
    def from_wire(data: dict[str, Any]) -> Cursor:
        return Cursor(
            name=str(data["name"]),
            topic=str(data["topic"]),
            positions={int(p): int(o) for p, o in dict(data.get("positions", {})).items()},
            backup=bool(data.get("backup", False)),
            created_ms=int(data.get("created_ms", 0)),
            committed_ms=int(data.get("committed_ms", 0)),
            invalidated=str(data.get("invalidated", "")),
            owner=str(data.get("owner", "")),
        )


@dataclass
class MetadataState:
    topics: dict[str, TopicMeta] = field(default_factory=dict)
    cursors: dict[str, Cursor] = field(default_factory=dict)
    applied_offset: int = 0  # exclusive: everything below has been applied
    # The cluster's nodes, once registered: a cluster's first change of nodes registers the
    # initial ones (its --peers); until then the nodes are those every node was started with.
    nodes: dict[int, NodeEntry] = field(default_factory=dict)
    removed_nodes: set[int] = field(default_factory=set)  # ids are never reused
    # Kafka consumer groups' membership as their coordinator last settled it (kafka/groups.py
    # reads and writes the records; here they are opaque), so a new coordinator carries on.
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Principals that authenticate with a token: name -> {"hash": Argon2id of the secret,
    # "created_ms": when}. Never the secret itself.
    principals: dict[str, dict[str, Any]] = field(default_factory=dict)
    # ACLs as their canonical wire form (tidelog/acls.py checks and reads them), by acl_key.
    acls: dict[str, dict[str, str]] = field(default_factory=dict)
    acls_changed: int = 0  # counts changes: readers cache what they made of `acls`
    quotas: dict[str, dict[str, float]] = field(default_factory=dict)  # principal -> limits
    # The archive as the cluster recorded it, where the store cannot lose it: the identity of
    # the store's contents (cluster.json's archive_id), and per partition "TOPIC/PARTITION" what
    # the store holds and what it lost: {"topic_id", "start_offset", "end_offset", "lost":
    # [[start, end], ...]}. A store that comes back without it is ArchiveLost (node/archiver.py).
    archive_id: str = ""
    archive_extents: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Finalized feature levels by feature (tidelog/features.py); none recorded: DEFAULT_LEVEL.
    features: dict[str, int] = field(default_factory=dict)
    # Kafka transactions by transactional id (replication/metadata_transactions.py).
    transactions: Transactions = field(default_factory=Transactions)

    @property
    def finalized_level(self) -> int:
        """The cluster's finalized level of tidelog.version."""
        return self.features.get(FEATURE, DEFAULT_LEVEL)

    def topic(self, name: str) -> TopicMeta:
        meta = self.topics.get(name)
        if meta is None:
            raise UnknownTopicOrPartition(f"unknown topic {name!r}", topic=name)
        return meta

    def cursor(self, name: str) -> Cursor:
        cursor = self.cursors.get(name)
        if cursor is None:
            raise UnknownCursor(f"unknown cursor {name!r}", cursor=name)
        return cursor

    def apply(self, offset: int, command: MetadataCommand) -> str | None:
        """Apply one committed command; returns the name of the topic whose placement or
        configuration it changed (created, deleted, altered, grown), if any. Commands that no
        longer make sense (a race lost between proposal and commit, or a topic deleted and
        created again meanwhile: each names the incarnation it meant by its topic id) change
        nothing, on every node alike."""
        if not offset >= self.applied_offset:
            raise InvariantBroken((offset, self.applied_offset))
        self.applied_offset = offset + 1
        return self.HANDLERS[command.KIND](self, offset, command)

    # -- topics ---------------------------------------------------------------------------------

    def _create_topic(self, offset: int, command: CreateTopic) -> str | None:
        if command.name in self.topics:
            return None  # a concurrent create lost the race; its proposer sees that
        self.topics[command.name] = TopicMeta(
            name=command.name,
            kind=command.kind,
            configs=dict(command.configs),
            assignments=[list(a) for a in command.assignments],
            created_offset=offset,
        )
        return command.name

    def _incarnation(self, command: TopicCommand) -> TopicMeta | None:
        """The topic the command names, if the name still holds the incarnation it meant."""
        meta = self.topics.get(command.name)
        return meta if meta is not None and meta.topic_id == command.topic_id else None

    def _delete_topic(self, offset: int, command: DeleteTopic) -> str | None:
        meta = self._incarnation(command)
        if meta is None:
            return None
        del self.topics[meta.name]
        for key in [k for k in self.archive_extents if k.rpartition("/")[0] == meta.name]:
            del self.archive_extents[key]
        for cursor in [c for c in self.cursors.values() if c.topic == meta.name]:
            del self.cursors[cursor.name]  # a cursor on a topic gone holds nothing
        return meta.name

    def _alter_topic(self, offset: int, command: AlterTopic) -> str | None:
        meta = self._incarnation(command)
        if meta is None:
            return None
        self.topics[meta.name] = dataclasses.replace(meta, configs=dict(command.configs))
        return meta.name

    def _add_partitions(self, offset: int, command: AddPartitions) -> str | None:
        meta = self._incarnation(command)
        if meta is None:
            return None
        added = [list(a) for a in command.assignments]
        self.topics[meta.name] = dataclasses.replace(
            meta, assignments=meta.assignments + added, initial=meta.initial + added
        )
        return meta.name

    def _moving(self, command: ReassignPartition | ReassignmentDone) -> TopicMeta | None:
        """The topic whose partition a move names, if it is the incarnation meant and the
        move names a partition it has and some replicas."""
        meta = self._incarnation(command)
        if meta is None or not 0 <= command.partition < meta.partitions or not command.replicas:
            return None
        return meta

    def _reassign_partition(self, offset: int, command: ReassignPartition) -> str | None:
        """A partition's target replicas change; the nodes it leaves keep their copy until its
        leader reports the move done."""
        meta = self._moving(command)
        if meta is None:
            return None
        partition, replicas = command.partition, list(command.replicas)
        assignments = [list(a) for a in meta.assignments]
        retiring = {p: list(r) for p, r in meta.retiring.items()}
        throttles = dict(meta.throttles)
        leaving = set(retiring.get(partition, [])) | set(assignments[partition])
        leaving -= set(replicas)
        assignments[partition] = replicas
        if leaving:
            retiring[partition] = sorted(leaving)
            throttles[partition] = command.throttle_bytes
        else:  # the same nodes (another preferred leader), or a move undone: no copy to drop
            retiring.pop(partition, None)
            throttles.pop(partition, None)
        self.topics[meta.name] = dataclasses.replace(
            meta, assignments=assignments, retiring=retiring, throttles=throttles
        )
        return meta.name

    def _reassignment_done(self, offset: int, command: ReassignmentDone) -> str | None:
        meta = self._moving(command)
        if meta is None or meta.assignments[command.partition] != command.replicas:
            return None  # done with a move since replaced by another
        retiring = {p: list(r) for p, r in meta.retiring.items() if p != command.partition}
        throttles = {p: t for p, t in meta.throttles.items() if p != command.partition}
        self.topics[meta.name] = dataclasses.replace(meta, retiring=retiring, throttles=throttles)
        return meta.name

    # -- nodes: a command the registry no longer agrees with (a race lost between proposal and
    # commit) changes nothing, on every node alike --------------------------------------------

    def _register_nodes(self, offset: int, command: RegisterNodes) -> None:
        if not self.nodes:
            for entry in command.nodes:
                self.nodes[entry.node_id] = entry

    def _add_node(self, offset: int, command: AddNode) -> None:
        if self.nodes and not node_conflict(self, command.node):
            self.nodes[command.node.node_id] = command.node

    def _drain_node(self, offset: int, command: DrainNode) -> None:
        node = self.nodes.get(command.node_id)
        if node is None:
            return
        staying = [n for n, e in self.nodes.items() if n != node.node_id and not e.draining]
        if not node.draining and drain_shortfall(self, node.node_id, staying):
            return  # another drain won the race for the nodes this one needs
        self.nodes[node.node_id] = dataclasses.replace(
            node, draining=True, drain_throttle_bytes=command.throttle_bytes
        )

    def _remove_node(self, offset: int, command: RemoveNode) -> None:
        node = self.nodes.get(command.node_id)
        if node is not None and node.draining and not self.hosted_on(node.node_id):
            del self.nodes[node.node_id]
            self.removed_nodes.add(node.node_id)

    # -- cursors and groups ---------------------------------------------------------------------

    def _create_cursor(self, offset: int, command: CreateCursor) -> None:
        if command.name in self.cursors:
            return
        self.cursors[command.name] = Cursor(
            command.name,
            command.topic,
            dict(command.positions),
            command.backup,
            command.at_ms,
            command.at_ms,
            owner=command.owner,
        )

    def _commit_cursor(self, offset: int, command: CommitCursor) -> None:
        cursor = self.cursors.get(command.name)
        if cursor is None or not cursor.live:
            return
        cursor.positions.update(command.positions)
        cursor.committed_ms = command.at_ms

    def _delete_cursor(self, offset: int, command: DeleteCursor) -> None:
        self.cursors.pop(command.name, None)

    def _invalidate_cursor(self, offset: int, command: InvalidateCursor) -> None:
        cursor = self.cursors.get(command.name)
        if cursor is not None:
            cursor.invalidated = command.reason

    def _group(self, offset: int, command: GroupRecord) -> None:
        if command.record is not None and command.record.get("members"):
            self.groups[command.name] = command.record
        else:
            self.groups.pop(command.name, None)  # an empty group keeps only its cursors

    # -- security -------------------------------------------------------------------------------

    def _put_principal(self, offset: int, command: PutPrincipal) -> None:
        self.principals[command.name] = {
            "hash": command.hash,
            "scram": dict(command.scram),
            "created_ms": command.at_ms,
        }

    def _remove_principal(self, offset: int, command: RemovePrincipal) -> None:
        # Its ACLs go with it: a new principal of the same name would inherit them.
        self.principals.pop(command.name, None)
        gone = [key for key, acl in self.acls.items() if acl.get("principal") == command.name]
        for key in gone:
            del self.acls[key]
        if gone:
            self.acls_changed += 1

    def _put_quota(self, offset: int, command: PutQuota) -> None:
        self.quotas[command.name] = dict(command.limits)

    def _remove_quota(self, offset: int, command: RemoveQuota) -> None:
        self.quotas.pop(command.name, None)

    def _put_acl(self, offset: int, command: PutAcl) -> None:
        acl = dict(command.acl)
        self.acls[acl_key(acl)] = acl
        self.acls_changed += 1

    def _remove_acl(self, offset: int, command: RemoveAcl) -> None:
        self.acls.pop(acl_key(dict(command.acl)), None)
        self.acls_changed += 1

    # -- the archive: an extent only grows (a leader's report older than one applied changes
    # nothing); only an operator's accepted loss shrinks one, and records what was lost -----

    def _archive_claimed(self, offset: int, command: ArchiveClaimed) -> None:
        if not self.archive_id:
            self.archive_id = command.archive_id

    def _archive_loss_accepted(self, offset: int, command: ArchiveLossAccepted) -> None:
        self.archive_id = command.archive_id
        for loss in command.lost:
            key = f"{loss.name}/{loss.partition}"
            before = self.archive_extents.get(key, {})
            lost = [list(r) for r in before.get("lost", [])]
            if loss.end_offset > loss.start_offset:
                lost.append([loss.start_offset, loss.end_offset])
            self.archive_extents[key] = {
                "topic_id": loss.topic_id,
                "start_offset": loss.now_start,
                "end_offset": loss.now_end,
                "lost": lost,
            }

    def _archive_extent(self, offset: int, command: ArchiveExtent) -> None:
        """A partition leader's manifest as it wrote it."""
        meta = self.topics.get(command.name)
        if (
            meta is None
            or meta.topic_id != command.topic_id
            or command.archive_id != self.archive_id
        ):
            return
        key = f"{command.name}/{command.partition}"
        start, end = command.start_offset, command.end_offset
        old = self.archive_extents.get(key)
        if old is not None and old["topic_id"] == command.topic_id:
            if end < old["end_offset"] or start < old["start_offset"]:
                return
            lost = old["lost"]
        else:
            lost = []
        self.archive_extents[key] = {
            "topic_id": command.topic_id,
            "start_offset": start,
            "end_offset": end,
            "lost": lost,
        }

    # -- feature levels -------------------------------------------------------------------------

    def _feature_level(self, offset: int, command: FeatureLevel) -> None:
        if command.new_cluster and command.name in self.features:
            return  # a new cluster's level, proposed again by a later leader: the first holds
        self.features[command.name] = command.level

    # -- transactions (replication/metadata_transactions.py) -------------------------------------

    def _txn_init(self, offset: int, command: TxnInit) -> None:
        apply_init(self.transactions, offset, command)

    def _txn_add_partitions(self, offset: int, command: TxnAddPartitions) -> None:
        apply_add_partitions(self.transactions, offset, command)

    def _txn_add_group(self, offset: int, command: TxnAddGroup) -> None:
        apply_add_group(self.transactions, offset, command)

    def _txn_offsets(self, offset: int, command: TxnOffsets) -> None:
        apply_offsets(self.transactions, offset, command)

    def _txn_end(self, offset: int, command: TxnEnd) -> None:
        committed = apply_end(self.transactions, offset, command)
        if committed is not None:
            self._commit_transaction_offsets(committed, command.at_ms)

    def _txn_complete(self, offset: int, command: TxnComplete) -> None:
        apply_complete(self.transactions, offset, command)

    def _txn_expire(self, offset: int, command: TxnExpire) -> None:
        apply_expire(self.transactions, offset, command)

    def _commit_transaction_offsets(self, txn: Transaction, at_ms: int) -> None:
        """A committing transaction's offsets become its groups' cursors, in the command that
        commits it. A cursor the cleaner invalidated is created anew (the group reads again);
        a name that now holds a cursor on another topic, or a topic gone, takes nothing."""
        for name, entry in txn.pending_offsets.items():
            meta = self.topics.get(entry["topic"])
            if meta is None:
                continue
            positions = {
                p: o for p, o in entry["positions"].items() if 0 <= p < meta.partitions and o >= 0
            }
            cursor = self.cursors.get(name)
            if cursor is not None and cursor.live and cursor.topic != meta.name:
                continue
            if cursor is None or not cursor.live or cursor.topic != meta.name:
                self.cursors[name] = Cursor(
                    name, meta.name, positions, False, at_ms, at_ms, owner=txn.owner
                )
                continue
            cursor.positions.update(positions)
            cursor.committed_ms = at_ms

    # Each kind's handler: (state, the command's offset, the command) -> the topic it changed.
    HANDLERS: ClassVar[dict[str, Callable[[MetadataState, int, Any], str | None]]] = {
        CreateTopic.KIND: _create_topic,
        DeleteTopic.KIND: _delete_topic,
        AlterTopic.KIND: _alter_topic,
        AddPartitions.KIND: _add_partitions,
        ReassignPartition.KIND: _reassign_partition,
        ReassignmentDone.KIND: _reassignment_done,
        RegisterNodes.KIND: _register_nodes,
        AddNode.KIND: _add_node,
        DrainNode.KIND: _drain_node,
        RemoveNode.KIND: _remove_node,
        CreateCursor.KIND: _create_cursor,
        CommitCursor.KIND: _commit_cursor,
        DeleteCursor.KIND: _delete_cursor,
        InvalidateCursor.KIND: _invalidate_cursor,
        GroupRecord.KIND: _group,
        PutPrincipal.KIND: _put_principal,
        RemovePrincipal.KIND: _remove_principal,
        PutQuota.KIND: _put_quota,
        RemoveQuota.KIND: _remove_quota,
        PutAcl.KIND: _put_acl,
        RemoveAcl.KIND: _remove_acl,
        ArchiveClaimed.KIND: _archive_claimed,
        ArchiveLossAccepted.KIND: _archive_loss_accepted,
        ArchiveExtent.KIND: _archive_extent,
        FeatureLevel.KIND: _feature_level,
        TxnInit.KIND: _txn_init,
        TxnAddPartitions.KIND: _txn_add_partitions,
        TxnAddGroup.KIND: _txn_add_group,
        TxnOffsets.KIND: _txn_offsets,
        TxnEnd.KIND: _txn_end,
        TxnComplete.KIND: _txn_complete,
        TxnExpire.KIND: _txn_expire,
    }

    def hosted_on(self, node_id: int) -> list[tuple[str, int]]:
        """The partitions that keep a replica on a node (assigned there, or moving off it)."""
        return [
            (meta.name, p)
            for meta in self.topics.values()
            for p in range(meta.partitions)
            if node_id in meta.hosts(p)
        ]

    def to_snapshot(self) -> dict[str, Any]:
        """The state as the metadata-snapshot format's version (formats.py) holds it: version 2
        (feature level 3) adds the transactions, and is written whenever there are some."""
        version = write_version("metadata-snapshot")
        if self.transactions.by_id:
            version = max(version, 2)
        extra: dict[str, Any] = {}
        if version >= 2:
            extra = {"v": version, "transactions": self.transactions.to_wire()}
        return {
            **extra,
            "applied_offset": self.applied_offset,
            "topics": [
                {**t.to_wire(), "created_offset": t.created_offset} for t in self.topics.values()
            ],
            "cursors": [c.to_wire() for c in self.cursors.values()],
            "nodes": [n.to_wire() for n in self.nodes.values()],
            "removed_nodes": sorted(self.removed_nodes),
            "groups": self.groups,
            "principals": self.principals,
            "acls": list(self.acls.values()),
            "quotas": self.quotas,
            "archive": {"archive_id": self.archive_id, "extents": self.archive_extents},
            "features": dict(self.features),
        }

    @staticmethod
    def from_snapshot(data: dict[str, Any]) -> MetadataState:
        version = data.get("v", 1)
        if not isinstance(version, int) or isinstance(version, bool):
            raise InvalidRequest(f"a metadata snapshot of version {version!r}")
        check_version("metadata-snapshot", version, "the metadata snapshot")
        state = MetadataState(applied_offset=int(data["applied_offset"]))
        state.transactions = Transactions.from_wire(list(data.get("transactions", [])))
        for t in data.get("topics", []):
            state.topics[str(t["name"])] = TopicMeta.from_wire(t)
        for c in data.get("cursors", []):
            cursor = Cursor.from_wire(c)
            state.cursors[cursor.name] = cursor
        for n in data.get("nodes", []):
            entry = NodeEntry.from_wire(n)
            state.nodes[entry.node_id] = entry
        state.removed_nodes = {int(n) for n in data.get("removed_nodes", [])}
        state.groups = {str(k): dict(v) for k, v in dict(data.get("groups", {})).items()}
        state.principals = {str(k): dict(v) for k, v in dict(data.get("principals", {})).items()}
        state.quotas = {
            str(k): {str(q): float(r) for q, r in dict(v).items()}
            for k, v in dict(data.get("quotas", {})).items()
        }
        archive = dict(data.get("archive", {}))
        state.archive_id = str(archive.get("archive_id", ""))
        state.archive_extents = {
            str(k): dict(v) for k, v in dict(archive.get("extents", {})).items()
        }
        for a in data.get("acls", []):
            acl = {str(k): str(v) for k, v in dict(a).items()}
            state.acls[acl_key(acl)] = acl
        state.features = {str(k): int(v) for k, v in dict(data.get("features", {})).items()}
        return state


def acl_key(acl: dict[str, str]) -> str:
    """An ACL's identity: adding the same one twice keeps one (the leader proposes only the
    canonical form, tidelog.acls.Acl.to_wire)."""
    return json.dumps(acl, sort_keys=True)


CURSOR_NAME = re.compile(r"[A-Za-z0-9._:-]{1,200}")  # matched with fullmatch


def node_conflict(state: MetadataState, entry: NodeEntry) -> str:
    """Why a node cannot be added ("" if it can): its id or an address already in use."""
    if entry.node_id in state.nodes:
        return f"node id {entry.node_id} is in use (by {entry.host}:{entry.port})"
    if entry.node_id in state.removed_nodes:
        return f"node id {entry.node_id} was removed from this cluster; ids are not reused"
    if entry.port == entry.peer_port:
        return f"its client and peer ports are both {entry.port}"
    mine = {entry.port, entry.peer_port} - {0}
    for other in state.nodes.values():
        clash = mine & ({other.port, other.peer_port} - {0})
        if other.host == entry.host and clash:
            return f"address {entry.host}:{min(clash)} is node {other.node_id}'s"
    return ""


def check_topic_name(name: str) -> None:
    """Kafka's topic names: 1-249 of [A-Za-z0-9._-], not '.' or '..'. tidelog also keeps '__'
    for its own topics and refuses a leading '-': a partition directory named '-x-0' reads as
    an option to every shell tool an operator points at it."""
    why = ""
    if not TOPIC_NAME.fullmatch(name):
        why = "use 1-249 of the characters [A-Za-z0-9._-]"
    elif name in (".", ".."):
        why = "'.' and '..' are not names"
    elif name.startswith("__"):
        why = "names starting with '__' are tidelog's own"
    elif name.startswith("-"):
        why = "a name may not start with '-'"
    if why:
        raise InvalidRequest(f"invalid topic name {name!r}: {why}", topic=name)


def validate_create(
    state: MetadataState,
    name: str,
    partitions: int,
    replication_factor: int,
    configs: dict[str, str],
    kind: str,
    node_ids: list[int],
) -> None:
    check_topic_name(name)
    if name in state.topics:
        raise TopicAlreadyExists(f"topic {name!r} already exists", topic=name)
    if not 1 <= partitions <= PARTITIONS_MAX:
        raise InvalidRequest(f"partitions must be in [1, {PARTITIONS_MAX}], got {partitions}")
    if not 1 <= replication_factor <= len(node_ids):
        raise InvalidReplicationFactor(
            f"replication factor {replication_factor} needs that many nodes; "
            f"the cluster has {len(node_ids)}",
            replication_factor=replication_factor,
            nodes=len(node_ids),
        )
    if kind not in ("stream", "table"):
        raise InvalidRequest(f"topic kind must be stream or table, got {kind!r}")
    checked_config(configs, replication_factor)


def checked_config(configs: dict[str, str], replication_factor: int) -> TopicConfig:
    """A topic's configs, parsed and checked against its replication factor."""
    config = TopicConfig.from_mapping(configs)
    if config.min_insync_replicas > replication_factor:
        raise InvalidRequest(
            f"min.insync.replicas {config.min_insync_replicas} exceeds the replication factor "
            f"{replication_factor}"
        )
    return config


def default_replication_factor(node_ids: list[int]) -> int:
    """A topic's replication factor when none is asked for: min(3, nodes that take replicas)."""
    return max(1, min(3, len(node_ids)))


def assign_replicas(
    node_ids: list[int], partitions: int, replication_factor: int, start: int
) -> list[list[int]]:
    """Round-robin placement: partition p's preferred leader is node (start + p) mod n."""
    nodes = sorted(node_ids)
    n = len(nodes)
    return [
        [nodes[(start + p + i) % n] for i in range(replication_factor)] for p in range(partitions)
    ]


def validate_delete(state: MetadataState, name: str, force: bool) -> TopicMeta:
    """The topic to delete. Its cursors go with it; a backup cursor is someone's promise that
    the data is kept, so deleting under one needs force."""
    meta = state.topic(name)
    backups = sorted(c.name for c in state.cursors.values() if c.topic == name and c.backup)
    if backups and not force:
        raise InvalidRequest(
            f"topic {name!r} is held by backup cursor(s) {', '.join(backups)}; "
            "use --force to delete it anyway",
            topic=name,
            cursors=backups,
        )
    return meta


def validate_alter(
    state: MetadataState, name: str, configs: dict[str, str], delete: list[str]
) -> tuple[TopicMeta, dict[str, str]]:
    """The topic and its configs after the change (set configs, then deleted keys back to
    their defaults), checked as a whole as creation checks them."""
    meta = state.topic(name)
    merged = {**meta.configs, **configs}
    for key in delete:
        if key not in TopicConfig().to_mapping():
            raise InvalidConfig(f"unknown config {key!r}", key=key)
        merged.pop(key, None)
    checked_config(merged, meta.replication_factor)
    return meta, merged


def validate_reassign(
    state: MetadataState, name: str, partition: int, replicas: list[int], node_ids: list[int]
) -> TopicMeta:
    """Kafka's kafka-reassign-partitions checks: a known partition, one or more distinct known
    nodes, and enough of them for the topic's min.insync.replicas."""
    meta = state.topic(name)
    if not 0 <= partition < meta.partitions:
        raise UnknownTopicOrPartition(
            f"topic {name!r} has no partition {partition}", topic=name, partition=partition
        )
    if not replicas:
        raise InvalidReplicaAssignment("a partition needs at least one replica", topic=name)
    if len(set(replicas)) != len(replicas):
        raise InvalidReplicaAssignment(
            f"duplicate node ids in {replicas}", topic=name, replicas=replicas
        )
    unknown = sorted(set(replicas) - set(node_ids))
    if unknown:
        raise InvalidReplicaAssignment(
            f"unknown node(s) {unknown}; the cluster's nodes are {sorted(node_ids)}",
            topic=name,
            replicas=replicas,
        )
    if meta.config.min_insync_replicas > len(replicas):
        raise InvalidReplicaAssignment(
            f"{len(replicas)} replica(s) cannot satisfy min.insync.replicas "
            f"{meta.config.min_insync_replicas}",
            topic=name,
        )
    return meta


def validate_add_partitions(state: MetadataState, name: str, partitions: int) -> TopicMeta:
    """Partitions can be added, never removed; a table's keys are placed by the partition
    count, so a table keeps the count it was created with."""
    meta = state.topic(name)
    if meta.kind == "table":
        raise InvalidRequest(
            f"topic {name!r} is a table: adding partitions would move its keys", topic=name
        )
    if not meta.partitions < partitions <= PARTITIONS_MAX:
        raise InvalidRequest(
            f"topic {name!r} has {meta.partitions} partitions; the new count must be in "
            f"[{meta.partitions + 1}, {PARTITIONS_MAX}], got {partitions}",
            topic=name,
        )
    return meta


def validate_add_node(state: MetadataState, entry: NodeEntry) -> None:
    """An id from 0 to 2^31-1 and an address no other node has (etcd's member add checks)."""
    if not 0 <= entry.node_id <= NODE_ID_MAX:
        raise InvalidRequest(f"node ids are 0..{NODE_ID_MAX}, got {entry.node_id}")
    if not entry.host or not 0 < entry.port < 65536 or not 0 <= entry.peer_port < 65536:
        raise InvalidRequest(f"bad address {entry.host}:{entry.port}/{entry.peer_port}")
    why = node_conflict(state, entry)
    if why:
        raise NodeAlreadyExists(why, node_id=entry.node_id)


def validate_remove_node(state: MetadataState, node_id: int, placeable: list[int]) -> NodeEntry:
    """The node to drain. Refused for the last node, and where a partition on it (or on a node
    already draining) would have too few nodes left to keep its replication factor; only
    placeable nodes (voters of the metadata log, not draining) count as staying."""
    entry = state.nodes.get(node_id)
    if entry is None:
        gone = " (it was removed)" if node_id in state.removed_nodes else ""
        raise UnknownNode(
            f"node {node_id} is not in the cluster{gone}; its nodes are {sorted(state.nodes)}",
            node_id=node_id,
        )
    if entry.draining:
        return entry  # asked again: the drain goes on
    staying = [n for n in placeable if n != node_id]
    if not staying:
        raise NotEnoughNodes(
            f"node {node_id} is the cluster's last voter: removing it would leave no one",
            node_id=node_id,
        )
    short = drain_shortfall(state, node_id, staying)
    if short:
        raise NotEnoughNodes(short, node_id=node_id)
    return entry


def drain_shortfall(state: MetadataState, node_id: int, staying: list[int]) -> str:
    """Why the partitions on node_id and on the nodes already draining could not all keep
    their replication factor on the staying nodes ("" if they can)."""
    leaving = {node_id} | {n for n, e in state.nodes.items() if e.draining}
    for meta in state.topics.values():
        for partition, replicas in enumerate(meta.assignments):
            if leaving & set(replicas) and len(replicas) > len(staying):
                return (
                    f"{meta.name}/{partition} has replication factor {len(replicas)} and "
                    f"only {len(staying)} node(s) would stay to hold it: {sorted(staying)}"
                )
    return ""


def replica_load(state: MetadataState, nodes: list[int]) -> dict[int, int]:
    """How many partition replicas are assigned to each of nodes."""
    load = dict.fromkeys(nodes, 0)
    for meta in state.topics.values():
        for assigned in meta.assignments:
            for n in assigned:
                if n in load:
                    load[n] += 1
    return load


def drain_targets(load: dict[int, int], replicas: list[int]) -> list[int]:
    """The nodes (of load's) a replica leaving `replicas` may move to, the least loaded first."""
    return sorted((n for n in load if n not in replicas), key=lambda n: (load[n], n))


def plan_drain(
    state: MetadataState, node_id: int, placeable: list[int]
) -> list[tuple[TopicMeta, int, list[int]]]:
    """For each partition assigned to a draining node: the replicas it moves to (the node
    goes, the least loaded placeable node that holds no replica of it comes; the preferred
    leader becomes the next replica when the draining node was it)."""
    load = replica_load(state, [n for n in placeable if n != node_id])
    moves = []
    for name, partition in state.hosted_on(node_id):
        meta = state.topics[name]
        replicas = meta.assignments[partition]
        if node_id not in replicas:
            continue  # moving off already; its leader will report the move done
        targets = drain_targets(load, replicas)
        if targets:
            load[targets[0]] += 1
            moves.append((meta, partition, [n for n in replicas if n != node_id] + targets[:1]))
    return moves
