"""tidelog's errors as Kafka error codes, mapped on this listener only.

tidelog's own codes (100-109: CursorInvalidated, UnknownCursor, StorageFull, ...) are Kafka's
UNKNOWN_TOPIC_ID, DUPLICATE_BROKER_REGISTRATION and so on; a Kafka client must see the code a
Kafka broker would send in the same situation, so that it retries, refreshes its metadata or
resets its offsets as it does against Kafka. Every error class has its code here (a test walks
the whole tree); where the same error means different things to different requests (a node that
is not the metadata leader is NOT_CONTROLLER to an admin request and NOT_COORDINATOR to a group
request), the caller says which.
"""

from __future__ import annotations

from tidelog.errors import (
    ArchiveAccessDenied,
    ArchiveBucketMissing,
    ArchiveClusterMismatch,
    ArchiveCorrupt,
    ArchiveError,
    ArchiveLagExceeded,
    ArchiveLost,
    ArchiveObjectMissing,
    ArchiveUnavailable,
    AuthenticationFailed,
    ConcurrentTransactions,
    CorruptRecord,
    CursorInvalidated,
    CursorPastStableOffset,
    DataLoss,
    DuplicateSequence,
    FencedLeaderEpoch,
    InconsistentClusterId,
    InvalidArchiveUrl,
    InvalidConfig,
    InvalidRecord,
    InvalidReplicaAssignment,
    InvalidReplicationFactor,
    InvalidRequest,
    InvalidTransactionTimeout,
    InvalidTxnState,
    NetworkError,
    NodeAlreadyExists,
    NodeIdentityError,
    NoEligibleLeader,
    NotAuthorized,
    NotEnoughNodes,
    NotEnoughReplicas,
    NotLeader,
    OffsetOutOfRange,
    OutcomeUnknown,
    OutOfOrderSequence,
    PartitionLimitReached,
    ProducerFenced,
    RecordTooLarge,
    RestorePointOutside,
    StorageError,
    StorageFull,
    TidelogError,
    Timeout,
    TopicAlreadyExists,
    TransactionsNotEnabled,
    UnknownCursor,
    UnknownLeaderEpoch,
    UnknownNode,
    UnknownTopicOrPartition,
    UnknownTransactionalId,
    UnsafeFeatureDowngrade,
    UnsupportedApi,
    UnsupportedCompression,
    UnsupportedFeatureLevel,
    UnsupportedFormatVersion,
)
from tidelog.node.access import Operation

NONE = 0
UNKNOWN_SERVER_ERROR = -1
OFFSET_OUT_OF_RANGE = 1
UNKNOWN_TOPIC_OR_PARTITION = 3
UNKNOWN_TOPIC_ID = 100
GROUP_AUTHORIZATION_FAILED = 30  # Fetch 13+: a topic id no topic has (deleted, or never)
LEADER_NOT_AVAILABLE = 5
NOT_LEADER_OR_FOLLOWER = 6
FENCED_LEADER_EPOCH = 74
UNKNOWN_LEADER_EPOCH = 75
REQUEST_TIMED_OUT = 7
COORDINATOR_NOT_AVAILABLE = 15
NOT_COORDINATOR = 16
NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
ILLEGAL_GENERATION = 22
INCONSISTENT_GROUP_PROTOCOL = 23
INVALID_GROUP_ID = 24
UNKNOWN_MEMBER_ID = 25
INVALID_SESSION_TIMEOUT = 26
REBALANCE_IN_PROGRESS = 27
TOPIC_AUTHORIZATION_FAILED = 29
UNSUPPORTED_VERSION = 35
INVALID_PARTITIONS = 37
INVALID_REPLICATION_FACTOR = 38
INVALID_REQUEST = 42
NOT_CONTROLLER = 41
INVALID_CONFIG = 40
GROUP_ID_NOT_FOUND = 69
NON_EMPTY_GROUP = 68
MEMBER_ID_REQUIRED = 79
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
INVALID_PRODUCER_ID_MAPPING = 49
INVALID_TRANSACTION_TIMEOUT = 50
CONCURRENT_TRANSACTIONS = 51
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
PRODUCER_FENCED = 90
UNSTABLE_OFFSET_COMMIT = 88
TRANSACTIONAL_ID_NOT_FOUND = 105

# Most specific class first is not needed: kafka_code walks each error's class hierarchy.
KAFKA_CODES: dict[type[TidelogError], int] = {
    TidelogError: UNKNOWN_SERVER_ERROR,
    NotLeader: NOT_LEADER_OR_FOLLOWER,
    NotEnoughReplicas: 19,  # NOT_ENOUGH_REPLICAS (after an append: 20)
    OffsetOutOfRange: OFFSET_OUT_OF_RANGE,
    UnknownTopicOrPartition: UNKNOWN_TOPIC_OR_PARTITION,
    TopicAlreadyExists: 36,  # TOPIC_ALREADY_EXISTS
    CorruptRecord: 2,  # CORRUPT_MESSAGE
    UnsupportedCompression: 76,  # UNSUPPORTED_COMPRESSION_TYPE
    InvalidRecord: 87,  # INVALID_RECORD
    RecordTooLarge: 10,  # MESSAGE_TOO_LARGE
    InvalidRequest: INVALID_REQUEST,
    InvalidConfig: INVALID_CONFIG,
    InvalidReplicaAssignment: 39,  # INVALID_REPLICA_ASSIGNMENT
    InvalidReplicationFactor: 38,  # INVALID_REPLICATION_FACTOR
    PartitionLimitReached: 44,  # POLICY_VIOLATION
    NodeAlreadyExists: INVALID_REQUEST,
    UnknownNode: 8,  # BROKER_NOT_AVAILABLE
    NotEnoughNodes: INVALID_REPLICATION_FACTOR,
    UnsupportedApi: UNSUPPORTED_VERSION,
    Timeout: REQUEST_TIMED_OUT,
    FencedLeaderEpoch: FENCED_LEADER_EPOCH,
    UnknownLeaderEpoch: UNKNOWN_LEADER_EPOCH,
    # A group whose cursor was invalidated reads from a position the log no longer has: the
    # consumer resets by its auto.offset.reset, as after Kafka's retention passed it.
    CursorInvalidated: OFFSET_OUT_OF_RANGE,
    UnknownCursor: GROUP_ID_NOT_FOUND,
    # Kafka's OffsetCommit checks no isolation level (neither does tidelog's Kafka listener), so
    # only tidelog's own read_committed cursor commits meet it; Kafka's nearest meaning: the
    # position is not stable yet.
    CursorPastStableOffset: UNSTABLE_OFFSET_COMMIT,
    StorageFull: 56,  # KAFKA_STORAGE_ERROR: retriable, as writes resume when space returns
    StorageError: 56,
    UnsupportedFormatVersion: 56,  # KAFKA_STORAGE_ERROR: a file this node cannot read
    DuplicateSequence: 46,  # DUPLICATE_SEQUENCE_NUMBER
    OutOfOrderSequence: 45,  # OUT_OF_ORDER_SEQUENCE_NUMBER
    NetworkError: 13,  # NETWORK_EXCEPTION
    NotAuthorized: TOPIC_AUTHORIZATION_FAILED,
    AuthenticationFailed: 58,  # SASL_AUTHENTICATION_FAILED
    OutcomeUnknown: REQUEST_TIMED_OUT,
    DataLoss: OFFSET_OUT_OF_RANGE,
    NodeIdentityError: UNKNOWN_SERVER_ERROR,
    InconsistentClusterId: 104,  # INCONSISTENT_CLUSTER_ID
    NoEligibleLeader: LEADER_NOT_AVAILABLE,
    ArchiveError: 56,  # KAFKA_STORAGE_ERROR (the remote storage behind the log)
    InvalidArchiveUrl: 56,
    ArchiveUnavailable: 56,
    ArchiveAccessDenied: 56,
    ArchiveBucketMissing: 56,
    ArchiveObjectMissing: 56,
    RestorePointOutside: 56,
    ArchiveClusterMismatch: 56,
    ArchiveCorrupt: 2,  # CORRUPT_MESSAGE: a damaged archived batch is never served
    ArchiveLost: OFFSET_OUT_OF_RANGE,  # the client's auto.offset.reset decides, as for retention
    ArchiveLagExceeded: 56,  # retriable, as writes resume when the archive catches up
    UnsupportedFeatureLevel: 95,  # INVALID_UPDATE_VERSION (KIP-584's UpdateFeatures refusal)
    UnsafeFeatureDowngrade: 95,
    # Transactions before feature level 3: what a Kafka broker without transactions answers
    # (clients report that the broker does not support them, and do not retry).
    TransactionsNotEnabled: UNSUPPORTED_VERSION,
    # To the coordinator's requests; a produce of a fenced epoch is INVALID_PRODUCER_EPOCH,
    # as Kafka's partition leaders answer (the broker says so where it answers a produce).
    ProducerFenced: PRODUCER_FENCED,
    InvalidTxnState: INVALID_TXN_STATE,
    InvalidTransactionTimeout: INVALID_TRANSACTION_TIMEOUT,
    ConcurrentTransactions: CONCURRENT_TRANSACTIONS,
    UnknownTransactionalId: INVALID_PRODUCER_ID_MAPPING,
}


def kafka_code(error: TidelogError, not_leader: int = NOT_LEADER_OR_FOLLOWER) -> int:
    """The Kafka error code for a tidelog error. not_leader: what "this node is not the
    leader" means to the request at hand (NOT_CONTROLLER for admin requests, NOT_COORDINATOR
    for group requests)."""
    if isinstance(error, NotLeader):
        return not_leader
    if isinstance(error, NotAuthorized):
        if error.details.get("operation") in (Operation.GROUP.value, Operation.DELETE_GROUP.value):
            return 30  # GROUP_AUTHORIZATION_FAILED
        if error.details.get("resource") == "cluster":
            return 31  # CLUSTER_AUTHORIZATION_FAILED
        if error.details.get("resource") == "transactional_id":
            return TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    if isinstance(error, NotEnoughReplicas) and error.details.get("appended"):
        return NOT_ENOUGH_REPLICAS_AFTER_APPEND
    for cls in type(error).__mro__:
        code = KAFKA_CODES.get(cls)
        if code is not None:
            return code
    return UNKNOWN_SERVER_ERROR
