"""tidelog's one error tree: the same names and codes in Python and on the wire.

    TidelogError
    ├── NotLeader(leader_hint)              retriable: ask the hinted leader
    ├── NotEnoughReplicas                   retriable: fewer in sync than min.insync.replicas
    ├── OffsetOutOfRange(log_start, hw)     the reset policy decides
    ├── UnknownTopicOrPartition             retriable (metadata may still be propagating)
    ├── TopicAlreadyExists
    ├── CorruptRecord                       a batch failed its CRC or layout checks
    │   └── UnsupportedCompression(codec)   a codec tidelog does not read (or that does not exist)
    ├── InvalidRecord(rule)                 well-formed bytes breaking a rule (count, keys, bits)
    ├── RecordTooLarge
    ├── InvalidRequest                      malformed or out-of-contract request
    │   ├── InvalidConfig(key)              a config name or value tidelog does not take
    │   ├── InvalidReplicaAssignment        no replicas, duplicates, or an unknown node
    │   ├── PartitionLimitReached(node_id)  more replicas on a node than max.partitions.per.node
    │   ├── NodeAlreadyExists(node_id)      add-node: an id or address in use
    │   ├── UnknownNode(node_id)            a node the cluster does not have
    │   └── NotEnoughNodes(node_id)         remove-node would leave a partition short, or no node
    ├── UnsupportedApi
    ├── Timeout                             retriable
    ├── FencedLeaderEpoch                   the request's leader epoch is stale (retriable)
    ├── UnknownLeaderEpoch                  the request's leader epoch is newer than ours (retriable)
    ├── CursorInvalidated(log_start, reason)
    ├── UnknownCursor
    ├── CursorPastStableOffset(position, last_stable_offset)  a read_committed commit above the LSO
    ├── StorageFull                         retriable: writes resume when space returns
    ├── StorageError                        a file could not be written or read as a whole
    ├── UnsupportedFormatVersion(format)    a file, record or peer in a version this one cannot read
    ├── DuplicateSequence                   an idempotent producer's replay (harmless)
    ├── OutOfOrderSequence
    ├── NetworkError                        retriable: the connection broke (client side only)
    ├── NotAuthorized(principal, operation) the principal may not do that
    ├── AuthenticationFailed                who is asking could not be proved (TLS, token)
    ├── OutcomeUnknown(cause)               a write may or may not have been applied (client side)
    ├── DataLoss(topic, partition, first, last)  a reader needed offsets the log no longer has
    ├── NodeIdentityError                   a data directory belongs to another node id
    │   └── InconsistentClusterId           ... or to another cluster
    ├── NoEligibleLeader                    no replica that holds everything committed is up
    ├── ArchiveError(url)                   the archive (an object store or a directory) failed
    │   ├── InvalidArchiveUrl               not file:///DIR or s3://BUCKET/PREFIX
    │   ├── ArchiveUnavailable              retriable: the store does not answer
    │   ├── ArchiveAccessDenied             the store refused the credentials
    │   ├── ArchiveBucketMissing            the bucket (or directory) does not exist
    │   ├── ArchiveCorrupt(key)             an object's size or checksum is not the manifest's
    │   ├── ArchiveObjectMissing(key)       an object the manifest names is not in the store
    │   ├── ArchiveClusterMismatch          the prefix holds another cluster's archive
    │   └── ArchiveLost                     the store lost what the cluster recorded it held
    │                                       (also an OffsetOutOfRange, for a read of that range)
    ├── ArchiveLagExceeded                  retriable: produce refused, the archive is too far behind
    ├── UnsupportedFeatureLevel             a node does not support a feature level (tidelog/features.py)
    │   └── UnsafeFeatureDowngrade          going back from a level whose formats older nodes cannot read
    ├── TransactionsNotEnabled              a transactional request before feature level 3 is finalized
    ├── ProducerFenced(transactional_id)    a newer epoch of the transactional id took over
    ├── InvalidTxnState(transactional_id)   the transaction is not in a state that allows the request
    ├── ConcurrentTransactions              retriable: the previous transaction is still being completed
    └── UnknownTransactionalId              no transaction (or another producer id) under that id

OS errors are translated once, at the edge (storage and node), never leaked to callers.
"""

from __future__ import annotations

from typing import Any, ClassVar


class TidelogError(Exception):
    code: ClassVar[int] = -1
    retriable: ClassVar[bool] = False

    def __init__(self, message: str = "", **details: Any) -> None:
        super().__init__(message or type(self).__name__)
        self.message = message or type(self).__name__
        self.details: dict[str, Any] = details

    @property
    def name(self) -> str:
        return type(self).__name__

    def to_wire(self) -> dict[str, Any]:
        return {"code": self.code, "name": self.name, "message": self.message, **self.details}

    def __str__(self) -> str:
        extra = ", ".join(f"{k}={v!r}" for k, v in self.details.items())
        return f"{self.name}: {self.message}" + (f" ({extra})" if extra else "")


class NotLeader(TidelogError):
    code = 6
    retriable = True

    def __init__(self, message: str = "", leader_hint: int | None = None, **details: Any) -> None:
        super().__init__(message, leader_hint=leader_hint, **details)

    @property
    def leader_hint(self) -> int | None:
        hint = self.details.get("leader_hint")
        return hint if isinstance(hint, int) else None


class NotEnoughReplicas(TidelogError):
    code = 19
    retriable = True


class OffsetOutOfRange(TidelogError):
    code = 1

    def __init__(
        self, message: str = "", log_start: int = 0, high_watermark: int = 0, **details: Any
    ) -> None:
        super().__init__(message, log_start=log_start, high_watermark=high_watermark, **details)

    @property
    def log_start(self) -> int:
        return int(self.details["log_start"])

    @property
    def high_watermark(self) -> int:
        return int(self.details["high_watermark"])


class UnknownTopicOrPartition(TidelogError):
    code = 3
    retriable = True


class TopicAlreadyExists(TidelogError):
    code = 36


class CorruptRecord(TidelogError):
    code = 2


class InvalidRecord(TidelogError):
    """A batch whose bytes parse but break a rule of the log (Kafka's INVALID_RECORD)."""

    code = 87


class UnsupportedCompression(CorruptRecord):
    """A batch compressed with a codec tidelog does not read (Kafka's
    UNSUPPORTED_COMPRESSION_TYPE); to a reader it is a batch it cannot read, as a corrupt one."""

    code = 76


class RecordTooLarge(TidelogError):
    code = 10


class InvalidRequest(TidelogError):
    code = 42


class UnsupportedApi(TidelogError):
    code = 35


class Timeout(TidelogError):
    code = 7
    retriable = True


class FencedLeaderEpoch(TidelogError):
    """KIP-320: the request named a leader epoch older than this replica knows. The client's
    metadata is stale (it read from a deposed leader, say): refresh it and retry."""

    code = 74
    retriable = True


class UnknownLeaderEpoch(TidelogError):
    """KIP-320: the request named a leader epoch newer than this replica knows: this replica is
    behind (a deposed leader that has not heard of its successor). Retry elsewhere or later."""

    code = 75
    retriable = True


# The names these errors had before KIP-320's were used (issue 34).
FencedEpoch = FencedLeaderEpoch
UnknownEpoch = UnknownLeaderEpoch


class CursorInvalidated(TidelogError):
    code = 100

    def __init__(
        self, message: str = "", log_start: int = 0, reason: str = "", **details: Any
    ) -> None:
        super().__init__(message, log_start=log_start, reason=reason, **details)


class UnknownCursor(TidelogError):
    code = 101


class CursorPastStableOffset(TidelogError):
    """A read_committed cursor commit to a position above its partition's last stable offset
    (as the partition's leader had it at the commit): a read_committed reader never gets there,
    so the position was made by hand or read read_uncommitted. Commit it read_uncommitted, or
    wait until the open transactions below it end."""

    code = 136

    def __init__(
        self, message: str = "", position: int = -1, last_stable_offset: int = -1, **details: Any
    ) -> None:
        super().__init__(
            message, position=position, last_stable_offset=last_stable_offset, **details
        )


class StorageFull(TidelogError):
    code = 102
    retriable = True


class DuplicateSequence(TidelogError):
    code = 46


class OutOfOrderSequence(TidelogError):
    code = 45


class NetworkError(TidelogError):
    code = 13
    retriable = True


class NotAuthorized(TidelogError):
    """The principal may not perform this operation (Kafka's *_AUTHORIZATION_FAILED)."""

    code = 29


class AuthenticationFailed(TidelogError):
    """Who is asking could not be proved: a TLS handshake failed (a certificate that does not
    verify, or none where one is required) or a credential was refused (Kafka's
    SASL_AUTHENTICATION_FAILED / SslAuthenticationException)."""

    code = 58


class OutcomeUnknown(TidelogError):
    """A write whose fate is unknown: it was sent, and then the answer was lost (connection
    broken, timed out, leader changed after appending it). It may or may not be in the log;
    unlike a definite failure, retrying a non-idempotent write may duplicate it."""

    code = 105


class InvalidConfig(InvalidRequest):
    code = 40


class PartitionLimitReached(InvalidRequest):
    """Creating the topic or its partitions would put more partition replicas on a node than
    max.partitions.per.node: refused before anything is created."""

    code = 119


class InvalidReplicationFactor(InvalidRequest):
    """A topic's replication factor below 1 or above the nodes that can take its replicas
    (Kafka's INVALID_REPLICATION_FACTOR)."""

    code = 38


class InvalidReplicaAssignment(InvalidRequest):
    """A reassignment names no replicas, a node twice, or a node the cluster does not have
    (Kafka's INVALID_REPLICA_ASSIGNMENT)."""

    code = 39


class NodeAlreadyExists(InvalidRequest):
    """add-node with a node id or an address the cluster already has (or an id it removed)."""

    code = 107


class UnknownNode(InvalidRequest):
    """A node id the cluster does not have (or no longer has)."""

    code = 108


class NotEnoughNodes(InvalidRequest):
    """Removing the node would leave the cluster without one, or a partition on it with no
    other node to move to (fewer replicas than its replication factor)."""

    code = 109


class StorageError(TidelogError):
    """A disk operation failed for a reason other than space (Kafka's KAFKA_STORAGE_ERROR)."""

    code = 56


class UnsupportedFormatVersion(TidelogError):
    """A file, a metadata-log record, an archive object or a peer is in a format version this
    tidelog does not read (tidelog/formats.py): written by a newer tidelog, most likely. Never
    read as damaged and skipped: details name the format, the version found, the versions this
    one reads and where."""

    code = 122


class DataLoss(TidelogError):
    """Offsets a reader (the Spark source) was due to read were deleted first (client side)."""

    code = 104


class NodeIdentityError(TidelogError):
    """A data directory belongs to another node id."""

    code = 103


class NoEligibleLeader(TidelogError):
    """No replica that holds everything committed can lead (Kafka's ELIGIBLE_LEADERS_NOT_
    AVAILABLE): the partition waits for one, or an operator elects uncleanly and accepts loss."""

    code = 83
    retriable = True


class InconsistentClusterId(NodeIdentityError):
    """A data directory (or a peer) belongs to another cluster (Kafka's name)."""

    code = 106


class ArchiveError(TidelogError):
    """The archive (tidelog/archive) could not do what was asked; details name the URL."""

    code = 110


class InvalidArchiveUrl(ArchiveError):
    """An --archive URL that is not file:///DIR or s3://BUCKET[/PREFIX]."""

    code = 111


class ArchiveUnavailable(ArchiveError):
    """The store did not answer (connection refused, timed out): retried with backoff."""

    code = 112
    retriable = True


class ArchiveAccessDenied(ArchiveError):
    """The store refused the credentials or the operation."""

    code = 113


class ArchiveBucketMissing(ArchiveError):
    """The bucket (or the file:// directory) does not exist."""

    code = 114


class ArchiveCorrupt(ArchiveError):
    """An archived object is truncated, or its checksum or contents are not what its manifest
    says: never read as data."""

    code = 115


class ArchiveObjectMissing(ArchiveError):
    """An object the archive needs is not in the store (deleted by hand, or never written)."""

    code = 118


class RestorePointOutside(ArchiveError):
    """`tidelog restore`'s point lies before the archive's first record (nothing would be
    restored) or past its last (the restore would stop short of the point asked for); given
    `--allow-outside`, the restore goes on and says so."""

    code = 120


class ArchiveClusterMismatch(ArchiveError):
    """The archive prefix belongs to another cluster (its cluster id differs)."""

    code = 116


class ArchiveLost(ArchiveError, OffsetOutOfRange):
    """The store came back without what the metadata log records it held (a bucket re-created,
    a directory replaced, a manifest deleted, a backup restored): [lost_start, lost_end) of a
    partition, or, without a partition, the whole store (cluster.json gone or another archive
    id). Uploads stop until an operator runs `tidelog archive accept-loss`; a read of the lost
    range gets this error (an OffsetOutOfRange, so a reader with reset=earliest goes on at the
    log start, with a warning)."""

    code = 121


class ArchiveLagExceeded(TidelogError):
    """Produce refused: more than archive.max.lag.bytes of the partition wait to be archived
    (archive.lag.policy=refuse). Writes resume when the archive catches up."""

    code = 117
    retriable = True


class UnsupportedFeatureLevel(TidelogError):
    """A feature level some node does not support: a node whose range does not include the
    cluster's finalized level (refused at start and at join), or an upgrade to a level a
    registered node does not support or that a node not live cannot be asked about (Kafka's
    UpdateFeatures refusals)."""

    code = 123


class UnsafeFeatureDowngrade(UnsupportedFeatureLevel):
    """A downgrade past a level at which nodes may have written formats a lower level cannot
    read (tidelog/features.py says which levels allow going back)."""

    code = 124


class TransactionsNotEnabled(TidelogError):
    """A transactional request (a transactional id, a transactional batch) before the cluster
    finalized feature level 3, `transactions` (tidelog/features.py): nodes of a lower level
    could not read the markers and metadata commands transactions write."""

    code = 130


class ProducerFenced(TidelogError):
    """A transactional producer's epoch is older than its transactional id's: another producer
    with the same transactional.id (or the coordinator, aborting a transaction past its
    timeout) started a newer epoch, which fences this one (Kafka's PRODUCER_FENCED and
    INVALID_PRODUCER_EPOCH)."""

    code = 131


class InvalidTxnState(TidelogError):
    """The transaction is not in a state that allows the request: a transactional batch for a
    partition its transaction does not hold (or with no open transaction), an EndTxn with no
    transaction, or a commit of a transaction being aborted (Kafka's INVALID_TXN_STATE)."""

    code = 132


class ConcurrentTransactions(TidelogError):
    """The transactional id's previous transaction is still being completed (its markers are
    being written): retry shortly (Kafka's CONCURRENT_TRANSACTIONS)."""

    code = 133
    retriable = True


class UnknownTransactionalId(TidelogError):
    """No transaction under that transactional id, or one whose producer id is not the
    request's (Kafka's TRANSACTIONAL_ID_NOT_FOUND and INVALID_PRODUCER_ID_MAPPING)."""

    code = 134


class InvalidTransactionTimeout(InvalidRequest):
    """A transactional id's init asked for a transaction timeout outside 1 ms and the node's
    transaction.max.timeout.ms (Kafka's INVALID_TRANSACTION_TIMEOUT)."""

    code = 135


_BY_CODE: dict[int, type[TidelogError]] = {}
_BY_NAME: dict[str, type[TidelogError]] = {}


def _register() -> None:
    stack: list[type[TidelogError]] = [TidelogError]
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if cls is not TidelogError:
            _BY_CODE[cls.code] = cls
            _BY_NAME[cls.__name__] = cls


_register()


def from_wire(payload: dict[str, Any]) -> TidelogError:
    """Rebuild the typed error a peer sent; an unknown code still becomes a TidelogError."""
    details = {k: v for k, v in payload.items() if k not in ("code", "name", "message")}
    cls = _BY_CODE.get(int(payload.get("code", -1))) or _BY_NAME.get(str(payload.get("name")))
    message = str(payload.get("message", ""))
    if cls is None:
        err = TidelogError(message, **details)
        return err
    err = cls.__new__(cls)
    TidelogError.__init__(err, message, **details)
    return err
