"""The typed requests and responses of tidelog's protocol.

Every request is a frozen dataclass; `decode(cls, header)` checks each field against its type
and raises InvalidRequest naming the field, so handlers only ever see well-typed values. Unknown
fields are ignored (newer clients may send more).
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, Union

from tidelog.errors import InvalidRequest, TidelogError, from_wire

MiB = 1024 * 1024


class ApiKey(enum.IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    API_VERSIONS = 18
    CREATE_TOPIC = 19
    DELETE_TOPIC = 20
    DELETE_RECORDS = 21
    ALTER_TOPIC = 33  # Kafka's AlterConfigs, for a topic
    CREATE_PARTITIONS = 37
    ELECT_LEADERS = 43
    ALTER_PARTITION_REASSIGNMENTS = 45
    DESCRIBE_CLUSTER = 60
    ADD_NODE = 80  # Kafka's AddRaftVoter (KIP-853), for a whole node
    REMOVE_NODE = 81  # Kafka's RemoveRaftVoter, after the node's replicas moved off
    STATUS = 100
    REPLICATION = 101  # one-way messages between replicas
    CURSOR = 102
    TABLE = 103
    FETCH_SNAPSHOT = 104
    PEER_HELLO = 105  # the peer channel's handshake (protocol/peer_handshake.py)
    PEER_AUTH = 106
    REASSIGNMENT = 107  # a partition leader tells the metadata leader a move is done
    PRINCIPALS = 108  # add, list, remove principals (tokens)
    AUTHENTICATE = 109  # a connection proves its principal with a token (Kafka: SaslAuthenticate)
    ACLS = 110  # add, list, remove ACLs (Kafka: CreateAcls, DescribeAcls, DeleteAcls)
    QUOTAS = 111  # set, list, remove quotas (Kafka: AlterClientQuotas, DescribeClientQuotas)
    LIVENESS = 112  # a node's heartbeat to each peer (replication/liveness.py)
    PEER_BATCH = 113  # the one-way messages a node has for one peer at once, in one frame
    ARCHIVE = 114  # the archive as the cluster recorded it; an operator accepts a loss
    ARCHIVE_REPORT = 115  # a partition leader tells the metadata leader its archive's extent
    FEATURES = 116  # describe, upgrade, downgrade feature levels (Kafka: UpdateFeatures, KIP-584)
    # The transaction coordinator asks a partition's leader to append a transaction's marker
    # (Kafka's WriteTxnMarkers); the leader answers with TXN_MARKERS_DONE once it is committed.
    TXN_MARKERS = 117
    TXN_MARKERS_DONE = 118
    # The transaction coordinator's requests (Kafka's InitProducerId with a transactional id,
    # AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn, DescribeTransactions,
    # ListTransactions, and KIP-664's abort), to the metadata leader
    TRANSACTIONS = 119
    # A partition leader's producers (Kafka's DescribeProducers) and an operator's marker in
    # one partition (Kafka's WriteTxnMarkers, as KIP-664's abort sends it), to that leader
    PRODUCERS = 120


# One-way messages only peers may send, on the peer channel; a client connection that sends one
# is closed.
PEER_ONLY_MESSAGES = frozenset(
    {
        ApiKey.REPLICATION,
        ApiKey.CURSOR,
        ApiKey.REASSIGNMENT,
        ApiKey.LIVENESS,
        ApiKey.PEER_BATCH,
        ApiKey.ARCHIVE_REPORT,
        ApiKey.TXN_MARKERS,
        ApiKey.TXN_MARKERS_DONE,
    }
)


ACKS_NONE = 0
ACKS_LEADER = 1
ACKS_ALL = -1


@dataclass(frozen=True)
class ProduceRequest:
    topic: str
    partition: int
    acks: int = ACKS_ALL
    timeout_ms: int = 30_000
    producer_id: int = -1  # idempotent producers: (producer_id, sequence) deduplicated
    # A transactional producer's transactional id (Kafka's): its batches with the transactional
    # bit must be that id's producer id's, and the principal needs write on the id.
    transactional_id: str = ""


@dataclass(frozen=True)
class ProduceResponse:
    base_offset: int
    last_offset: int
    high_watermark: int
    log_start_offset: int
    duplicate: bool = False


@dataclass(frozen=True)
class FetchRequest:
    topic: str
    partition: int
    offset: int
    max_bytes: int = MiB
    max_wait_ms: int = 0
    min_bytes: int = 1
    replica_read: bool = False  # allow a follower to answer (below its own HW)
    cursor: str = ""  # when set, the cursor's validity is checked (CursorInvalidated)
    # KIP-320: the leader epoch the client knows (-1: none). A replica that knows a newer one
    # answers FencedLeaderEpoch, one that knows only an older one UnknownLeaderEpoch.
    leader_epoch: int = -1
    # The leader confirms with a majority that it still leads before it answers (ReadIndex),
    # so the HW it reports is never a deposed leader's.
    consistent: bool = False
    # read_uncommitted: below the HW (as before transactions); read_committed: below the LSO,
    # with the aborted transactions the answer overlaps. A node from before transactions
    # ignores the field; its answer has no last_stable_offset, which the client refuses.
    isolation_level: str = "read_uncommitted"


READ_UNCOMMITTED = "read_uncommitted"
READ_COMMITTED = "read_committed"
ISOLATION_LEVELS = (READ_UNCOMMITTED, READ_COMMITTED)


@dataclass(frozen=True)
class FetchResponse:
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    leader_epoch: int
    node_id: int
    is_leader: bool = True
    local_log_start_offset: int = -1  # this replica's own first offset (-1: log_start_offset)
    last_stable_offset: int = -1  # -1: a node from before transactions
    # read_committed: [producer id, first offset] of each aborted transaction with a batch in
    # the answer's range; the reader drops the producer's batches from there to its marker.
    aborted_transactions: list[list[int]] = field(default_factory=list)


@dataclass(frozen=True)
class ListOffsetsRequest:
    topic: str
    partition: int
    spec: str = "latest"  # earliest | earliest-local | latest | timestamp
    timestamp_ms: int = -1
    replica_read: bool = False
    leader_epoch: int = -1  # as FetchRequest's
    consistent: bool = False  # as FetchRequest's: "latest" is never a deposed leader's HW
    isolation_level: str = "read_uncommitted"  # read_committed: "latest" is the LSO


@dataclass(frozen=True)
class ListOffsetsResponse:
    offset: int
    log_start_offset: int  # the whole log's, the archive included
    high_watermark: int
    local_log_start_offset: int = -1  # the first offset on the answering node's disk
    last_stable_offset: int = -1  # -1: a node from before transactions


@dataclass(frozen=True)
class MetadataRequest:
    topics: list[str] | None = None
    # Answered by the metadata log's leader only (others: NotLeader with a hint): what was just
    # changed reads back as changed, and a move reads as done only once it is.
    leader_only: bool = False


@dataclass(frozen=True)
class MetadataResponse:
    node_id: int
    metadata_leader: int
    nodes: list[dict[str, Any]]
    topics: list[dict[str, Any]]


@dataclass(frozen=True)
class CreateTopicRequest:
    name: str
    partitions: int = 1
    replication_factor: int = -1  # -1: the cluster's default, min(3, nodes)
    configs: dict[str, str] = field(default_factory=dict)
    kind: str = "stream"  # stream | table


@dataclass(frozen=True)
class CreateTopicResponse:
    name: str
    partitions: int
    replication_factor: int
    assignments: list[list[int]]


@dataclass(frozen=True)
class DeleteTopicRequest:
    name: str
    force: bool = False  # delete even though backup cursors hold the topic


@dataclass(frozen=True)
class DeleteTopicResponse:
    name: str
    topic_id: int
    deleted_cursors: list[str]


@dataclass(frozen=True)
class AlterTopicRequest:
    name: str
    configs: dict[str, str] = field(default_factory=dict)  # set these
    delete_configs: list[str] = field(default_factory=list)  # back to the default


@dataclass(frozen=True)
class AlterTopicResponse:
    name: str
    configs: dict[str, str]  # the topic's overrides now


@dataclass(frozen=True)
class ReassignPartitionRequest:
    """Move a partition onto these replicas (Kafka's AlterPartitionReassignments)."""

    topic: str
    partition: int
    replicas: list[int]
    throttle_bytes: int = 0  # bytes/s a new replica catches up at (0: unthrottled)


@dataclass(frozen=True)
class ReassignPartitionResponse:
    topic: str
    partition: int
    replicas: list[int]  # the target
    leaving: list[int]  # nodes that keep their copy until the move is done


@dataclass(frozen=True)
class DescribeClusterRequest:
    leader_only: bool = False  # NotLeader unless the metadata leader answers


@dataclass(frozen=True)
class DescribeClusterResponse:
    cluster_id: str
    node_id: int  # who answered
    metadata_leader: int
    # node_id, host, port, peer_port, draining, and its part in the metadata log: "voter",
    # "learner" (catching up) or "" (not yet a member, or no longer)
    nodes: list[dict[str, Any]]
    metadata_voters: list[int]
    metadata_learners: list[int]
    # The metadata log's membership at its log start (its initial voters while that is 0): a
    # joining node opens its replica of the metadata log with it.
    metadata_base_voters: list[int]
    removed_nodes: list[int] = field(default_factory=list)
    # The cluster's finalized feature levels as the answering node applied them (none: every
    # feature at its lowest level; an answer from a node of 0.1.0, which knew no levels).
    finalized_features: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class AddNodeRequest:
    node_id: int
    host: str
    port: int
    peer_port: int = 0  # 0: learnt from the node's client listener


@dataclass(frozen=True)
class RemoveNodeRequest:
    node_id: int
    throttle_bytes: int = 0  # catch-up bytes/s for the replicas moved off it (0: unthrottled)


@dataclass(frozen=True)
class NodeChangeResponse:
    node: dict[str, Any]  # the node's registry entry after the change
    moves: int = 0  # remove: partitions being moved off it


@dataclass(frozen=True)
class CreatePartitionsRequest:
    name: str
    partitions: int  # the new total


@dataclass(frozen=True)
class CreatePartitionsResponse:
    name: str
    partitions: int
    assignments: list[list[int]]


STATUS_PAGE_DEFAULT = 500  # partitions per status answer, unless asked for fewer or more
STATUS_PAGE_MAX = 2000


@dataclass(frozen=True)
class StatusRequest:
    """One page of a node's replicas, in (topic, partition) order, starting after the given
    one (KIP-966's cursor): ten thousand partitions' status would not fit one header, and
    building it at once would hold the node's loop."""

    topics: list[str] | None = None
    after_topic: str = ""
    after_partition: int = -1
    limit: int = 0  # 0: STATUS_PAGE_DEFAULT; at most STATUS_PAGE_MAX


@dataclass(frozen=True)
class StatusResponse:
    node_id: int
    partitions: list[dict[str, Any]]
    metadata: dict[str, Any]
    node: dict[str, Any] = field(default_factory=dict)  # connections, limits, counters
    more: bool = False  # further pages follow the last partition of this one


@dataclass(frozen=True)
class ApiVersionsRequest:
    client: str = ""


@dataclass(frozen=True)
class ApiVersionsResponse:
    node_id: int
    version: str
    apis: list[int]
    peer_port: int = -1  # where this node's peer channel listens (peers discover it here)
    kafka_address: str = ""  # HOST:PORT of its Kafka listener ("" if it has none)


@dataclass(frozen=True)
class CursorRequest:
    op: str  # create | commit | delete | list | describe | invalidate
    name: str = ""
    topic: str = ""
    positions: dict[str, int] = field(default_factory=dict)  # partition -> offset
    backup: bool = False
    if_not_exists: bool = False
    reason: str = ""
    # create: positions for some partitions only; the others hold nothing until committed
    # (a Kafka group commits the partitions it was assigned)
    partial: bool = False
    owner: str = ""  # set by the node to the principal asking (what a client sends is ignored)
    # commit: the committer's isolation level. read_committed: no position moves forward past
    # its partition's LSO at the leader (CursorPastStableOffset). Absent: read_uncommitted, as
    # every client before it sends; a node from before it ignores the field and checks nothing.
    isolation_level: str = "read_uncommitted"


@dataclass(frozen=True)
class CursorResponse:
    cursors: list[dict[str, Any]]


@dataclass(frozen=True)
class PrincipalsRequest:
    op: str  # add | list | remove
    name: str = ""
    hash: str = ""  # add: the Argon2id hash of the token's secret, made by the client
    scram: dict[str, Any] = field(default_factory=dict)  # add: scram.credentials(secret)


@dataclass(frozen=True)
class PrincipalsResponse:
    principals: list[dict[str, Any]]  # name, created_ms (never the hash)
    acls_removed: int = 0  # remove: the principal's ACLs, which went with it


@dataclass(frozen=True)
class AuthenticateRequest:
    token: str  # NAME:SECRET
    forwarded: bool = False  # from a node asking the metadata leader: never forwarded again


@dataclass(frozen=True)
class AuthenticateResponse:
    principal: str


@dataclass(frozen=True)
class AclsRequest:
    op: str  # add | list | remove
    acl: dict[str, Any] = field(default_factory=dict)  # add, remove: acls.Acl.to_wire()
    principal: str = ""  # list: only this principal's ("": all)


@dataclass(frozen=True)
class AclsResponse:
    acls: list[dict[str, Any]]  # acls.Acl.to_wire() each


@dataclass(frozen=True)
class QuotasRequest:
    op: str  # set | list | remove
    principal: str = ""  # set, remove: whose ("*": the default)
    limits: dict[str, float] = field(default_factory=dict)  # set: node/quotas.py QUOTA_KEYS


@dataclass(frozen=True)
class QuotasResponse:
    quotas: list[dict[str, Any]]  # principal, limits


@dataclass(frozen=True)
class DeleteRecordsRequest:
    topic: str
    partition: int
    before_offset: int  # -1: the HW
    force: bool = False  # invalidate live cursors that still need the range


@dataclass(frozen=True)
class DeleteRecordsResponse:
    log_start_offset: int
    invalidated_cursors: list[str]


@dataclass(frozen=True)
class ElectLeadersRequest:
    """To one replica: admit every voter's present data directory (unclean: an operator
    accepts losing what only replaced disks held), and/or stand for election now."""

    topic: str
    partition: int
    unclean: bool = False
    campaign: bool = True


@dataclass(frozen=True)
class ElectLeadersResponse:
    node_id: int
    role: str
    epoch: int
    leader: int
    log_end_offset: int
    high_watermark: int
    admitted: list[int]  # voters whose new directory this replica admitted now


@dataclass(frozen=True)
class ArchiveRequest:
    """describe: the archive as the metadata log records it. accept_loss: the store's present
    contents are the truth from now on; every range it lost is recorded (to the metadata
    leader)."""

    op: str  # describe | accept_loss


@dataclass(frozen=True)
class ArchiveResponse:
    archive_id: str
    # per partition: topic, partition, topic_id, start_offset, end_offset, lost [[start, end]]
    extents: list[dict[str, Any]]
    accepted: list[dict[str, Any]]  # accept_loss: what was recorded lost now


@dataclass(frozen=True)
class FeaturesRequest:
    """describe: the cluster's finalized level of the feature and what each node supports.
    upgrade, downgrade: finalize another level (to the metadata leader; refused unless every
    registered node is live and supports it, and for a downgrade unless every level passed
    over allows going back: tidelog/features.py)."""

    op: str  # describe | upgrade | downgrade
    level: int = 0  # upgrade: 0 is the highest every node supports; downgrade: 0 is one lower
    feature: str = "tidelog.version"


@dataclass(frozen=True)
class FeaturesResponse:
    feature: str
    finalized_level: int
    recorded: bool  # False: no level in the metadata log (a cluster from before levels: 1)
    # this build's levels: level, meaning, downgrade_safe (may a cluster go back from it)
    levels: list[dict[str, Any]]
    # per registered node: node_id, min_level, max_level (-1: never heard), live
    nodes: list[dict[str, Any]]
    upgradable_to: int  # the highest level every registered node, live, supports now
    changed: bool = False  # upgrade, downgrade: a new level was finalized now
    node_id: int = -1  # who answered


TRANSACTION_OPS = (
    "init",  # a producer id and a new epoch for the transactional id (fences older epochs)
    "add_partitions",  # partitions join the transaction
    "add_offsets",  # a Kafka group's (group) or a cursor's (cursor) offsets will commit with it
    "commit_offsets",  # the offsets, pending until the transaction ends
    "end",  # the decision (commit or abort): the transaction's commit point
    "describe",  # one transactional id's state
    "list",  # the transactions the coordinator knows
    "abort",  # an operator ends a hanging transaction (KIP-664): abort at a new epoch
)


@dataclass(frozen=True)
class TransactionRequest:
    """A request to the transaction coordinator, the metadata log's leader
    (node/ops/transactions.py has the rules of each op). Every op but list needs a
    transactional id, and all but describe, list and abort the producer id and epoch that init
    gave. A node from before transactions answers UnsupportedApi."""

    op: str  # TRANSACTION_OPS
    transactional_id: str = ""
    producer_id: int = -1
    producer_epoch: int = -1
    # init: the transaction's timeout (Kafka's transaction.timeout.ms); with producer_id and
    # producer_epoch set (KIP-360), the id resumes only if those are still its current ones
    timeout_ms: int = 60_000
    partitions: dict[str, list[int]] = field(default_factory=dict)  # add_partitions
    # add_offsets, commit_offsets: whose offsets, a Kafka consumer group or a tidelog cursor
    group: str = ""
    cursor: str = ""
    # commit_offsets: topic -> partition -> offset; cursors: topic -> the cursor that keeps
    # the group's offsets on it (a cursor's own offsets are on its topic, under its name)
    offsets: dict[str, dict[str, int]] = field(default_factory=dict)
    cursors: dict[str, str] = field(default_factory=dict)
    commit: bool = False  # end: commit (True) or abort
    # list: only these states (none: all), these producer ids, open at least min_age_ms
    states: list[str] = field(default_factory=list)
    producer_ids: list[int] = field(default_factory=list)
    min_age_ms: int = -1
    leader_only: bool = False  # list: NotLeader from a node that does not coordinate


# Why a partition of add_partitions or commit_offsets was refused (the Kafka listener answers
# each with its own code; tidelog's client raises the error of the first).
TXN_NOT_AUTHORIZED = "not_authorized"
TXN_UNKNOWN_PARTITION = "unknown_topic_or_partition"
TXN_INVALID_OFFSET = "invalid_offset"


@dataclass(frozen=True)
class TransactionResponse:
    # init, end, describe, abort: the transactional id's state after the request
    # (replication/metadata_transactions.py, Transaction.to_wire(): transactional_id,
    # producer_id, epoch, state, timeout_ms, owner, partitions {topic: [partition]}, groups,
    # pending_offsets {cursor: {topic, positions}}, started_ms, updated_ms)
    transaction: dict[str, Any] = field(default_factory=dict)
    # add_partitions, commit_offsets: topic -> partition -> why it was refused
    # (not_authorized, unknown_topic_or_partition, invalid_offset); add_partitions adds none
    # if any is refused
    refused: dict[str, dict[str, str]] = field(default_factory=dict)
    transactions: list[dict[str, Any]] = field(default_factory=list)  # list
    unknown_states: list[str] = field(default_factory=list)  # list: filters naming no state


PRODUCERS_OPS = (
    "describe",  # the partition's producers: epoch, last sequence, open transaction (if any)
    "write_marker",  # an operator's COMMIT or ABORT marker for one producer's open transaction
)


@dataclass(frozen=True)
class ProducersRequest:
    """A request to a partition's leader about its producers (node/ops/producers.py has the
    rules). describe needs read on the topic; write_marker, cluster admin (Kafka's
    CLUSTER_ACTION), and is written only where it agrees with the transaction coordinator."""

    op: str  # PRODUCERS_OPS
    topic: str
    partition: int
    # write_marker: whose open transaction, ended how, and the coordinator epoch the marker
    # records (Kafka's WritableTxnMarker fields)
    producer_id: int = -1
    producer_epoch: int = -1
    commit: bool = False
    coordinator_epoch: int = -1


@dataclass(frozen=True)
class ProducersResponse:
    # describe: per producer producer_id, producer_epoch, last_sequence (-1: none),
    # last_timestamp_ms (this leader's clock when it appended the producer's newest batch),
    # coordinator_epoch (-1: not kept), txn_start_offset (-1: no transaction open)
    producers: list[dict[str, Any]] = field(default_factory=list)
    # write_marker: where the marker went (-1: nothing was open, so nothing was written)
    marker_offset: int = -1
    node_id: int = -1  # who answered


# How current a table read is (etcd's names; docs/design.md, "Reads that are current").
LINEARIZABLE = "linearizable"  # ReadIndex: a majority confirms the leader; the default
LEASE = "lease"  # the leader's lease, no round trip: safe under bounded clock drift
SERIALIZABLE = "serializable"  # the answering replica's applied state: possibly stale
CONSISTENCIES = (LINEARIZABLE, LEASE, SERIALIZABLE)


@dataclass(frozen=True)
class TableRequest:
    op: str  # get | scan
    topic: str
    partition: int
    key: str = ""  # base64
    after: str = ""  # base64: scan keys after this one
    limit: int = 1000
    replica_read: bool = False  # the same as consistency="serializable"
    # linearizable (ReadIndex: the latest acknowledged write), lease (the leader's lease, no
    # round trip; assumes bounded clock drift), serializable (this replica's state, possibly
    # stale): etcd's names (docs/design.md)
    consistency: str = "linearizable"


@dataclass(frozen=True)
class TableResponse:
    entries: list[list[str]]  # [key, value] base64 pairs (value "" for a missing key on get)
    found: bool
    applied_offset: int
    high_watermark: int
    consistency: str = "linearizable"  # what the answer guarantees (serializable: maybe stale)
    node_id: int = -1  # the replica that answered
    is_leader: bool = True


REQUEST_TYPES: dict[ApiKey, type[Any]] = {
    ApiKey.PRODUCE: ProduceRequest,
    ApiKey.FETCH: FetchRequest,
    ApiKey.LIST_OFFSETS: ListOffsetsRequest,
    ApiKey.METADATA: MetadataRequest,
    ApiKey.CREATE_TOPIC: CreateTopicRequest,
    ApiKey.DELETE_TOPIC: DeleteTopicRequest,
    ApiKey.ALTER_TOPIC: AlterTopicRequest,
    ApiKey.CREATE_PARTITIONS: CreatePartitionsRequest,
    ApiKey.STATUS: StatusRequest,
    ApiKey.API_VERSIONS: ApiVersionsRequest,
    ApiKey.CURSOR: CursorRequest,
    ApiKey.DELETE_RECORDS: DeleteRecordsRequest,
    ApiKey.ELECT_LEADERS: ElectLeadersRequest,
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: ReassignPartitionRequest,
    ApiKey.DESCRIBE_CLUSTER: DescribeClusterRequest,
    ApiKey.ADD_NODE: AddNodeRequest,
    ApiKey.REMOVE_NODE: RemoveNodeRequest,
    ApiKey.TABLE: TableRequest,
    ApiKey.PRINCIPALS: PrincipalsRequest,
    ApiKey.AUTHENTICATE: AuthenticateRequest,
    ApiKey.ACLS: AclsRequest,
    ApiKey.QUOTAS: QuotasRequest,
    ApiKey.ARCHIVE: ArchiveRequest,
    ApiKey.FEATURES: FeaturesRequest,
    ApiKey.TRANSACTIONS: TransactionRequest,
    ApiKey.PRODUCERS: ProducersRequest,
}

T = TypeVar("T")


_FIELD_NAMES: dict[type[Any], tuple[str, ...]] = {}


def field_names(cls: type[Any]) -> tuple[str, ...]:
    """A dataclass's field names, worked out once per class (dataclasses.fields is slow)."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def encode(message: Any) -> dict[str, Any]:
    return {name: getattr(message, name) for name in field_names(type(message))}


def encode_error(error: TidelogError) -> dict[str, Any]:
    return {"error": error.to_wire()}


def error_of(header: dict[str, Any]) -> TidelogError | None:
    payload = header.get("error")
    if isinstance(payload, dict):
        return from_wire(payload)
    return None


_HINTS: dict[type[Any], dict[str, Any]] = {}


def _hints(cls: type[Any]) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


Checker = Callable[[str, Any], Any]
_PLANS: dict[type[Any], tuple[tuple[str, Checker, bool], ...]] = {}
_CHECKERS: dict[Any, Checker] = {}


def _plan(cls: type[Any]) -> tuple[tuple[str, Checker, bool], ...]:
    """(field, its checker, required) per field of cls, worked out once per class: decoding is
    on every request's path."""
    plan = _PLANS.get(cls)
    if plan is None:
        hints = _hints(cls)
        plan = _PLANS[cls] = tuple(
            (
                f.name,
                _checker(hints[f.name]),
                f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
            )
            for f in dataclasses.fields(cls)
        )
    return plan


def decode(cls: type[T], header: dict[str, Any]) -> T:
    """Build cls from a JSON header, checking every field's type."""
    values: dict[str, Any] = {}
    for name, check, required in _plan(cls):
        if name in header:
            values[name] = check(name, header[name])
        elif required:
            raise InvalidRequest(f"{cls.__name__}: missing field {name!r}", field=name)
    return cls(**values)


def _refuse(name: str, hint: Any, value: Any) -> InvalidRequest:
    return InvalidRequest(f"field {name!r}: {value!r} is not {hint}", field=name)


def _checker(hint: Any) -> Checker:
    """A function that returns value as hint's type (or raises InvalidRequest), made once per
    type hint."""
    try:
        return _CHECKERS[hint]
    except KeyError:
        check = _CHECKERS[hint] = _make_checker(hint)
        return check


# What a JSON value of each scalar type must be.
_SCALARS: dict[Any, Callable[[Any], bool]] = {
    type(None): lambda v: v is None,
    bool: lambda v: isinstance(v, bool),
    int: lambda v: isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63,
    float: lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    str: lambda v: isinstance(v, str),
}


def _make_checker(hint: Any) -> Checker:
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        options = [_checker(option) for option in typing.get_args(hint)]

        def union(name: str, value: Any) -> Any:
            for option in options:
                try:
                    return option(name, value)
                except InvalidRequest:
                    continue
            raise _refuse(name, hint, value)

        return union
    if hint in _SCALARS:
        accepts = _SCALARS[hint]
        as_float = hint is float

        def scalar(name: str, value: Any) -> Any:
            if accepts(value):
                return float(value) if as_float else value
            raise _refuse(name, hint, value)

        return scalar
    if origin is list:
        (item_hint,) = typing.get_args(hint)
        item = _checker(item_hint)

        def items(name: str, value: Any) -> Any:
            if isinstance(value, list):
                return [item(name, v) for v in value]
            raise _refuse(name, hint, value)

        return items
    if origin is dict:
        key_hint, value_hint = typing.get_args(hint)
        key, val = _checker(key_hint), _checker(value_hint)

        def mapping(name: str, value: Any) -> Any:
            if isinstance(value, dict):
                return {key(name, k): val(name, v) for k, v in value.items()}
            raise _refuse(name, hint, value)

        return mapping
    if hint is Any:
        return lambda name, value: value

    def nothing(name: str, value: Any) -> Any:
        raise _refuse(name, hint, value)

    return nothing
