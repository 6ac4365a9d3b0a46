"""The asyncio client: finds leaders through metadata and retries NotLeader and leader
changes for the caller.

Producing is idempotent by default (as Kafka's producer is since 3.0): the client is one
producer, with a random 63-bit producer id, and stamps each batch it sends to a partition with
the next sequence numbers, one partition's batches one after another. A retried batch the log
already holds is answered as the original was (`ProduceResult.duplicate`), so retries after a
lost answer or a leader change never duplicate records. When retries run out after an attempt
whose fate is unknown (sent, then no answer; or appended by a leader that then lost its
leadership), produce raises OutcomeUnknown, never a plain error that would read as "not
written". With `idempotent=False`, such an attempt is not retried at all.

`AsyncClient` is a facade: each method is documented here and done by one role, which the
client composes: routing.py (connections, the metadata cache, retries to the right node),
admin.py (topics, nodes, leaders, cursors, principals, ACLs, quotas, the archive, feature
levels), produce.py with idempotence.py (writes, as one idempotent producer), consume.py
(fetches and consuming) and tables.py (table reads).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

from tidelog.acls import Acl
from tidelog.client import transactions
from tidelog.client.admin import Admin
from tidelog.client.consume import (
    CONSUME_FETCH_BYTES,
    ConsumeOptions,
    Fetched,
    FetchOptions,
    Reader,
)
from tidelog.client.fetched import FetchResult
from tidelog.client.metadata import ClusterInfo, NodeInfo, TopicInfo
from tidelog.client.produce import Writer
from tidelog.client.results import ProduceResult
from tidelog.client.routing import Router, bootstrap_addresses
from tidelog.client.tables import TableReader
from tidelog.client.transactions import AsyncTransaction
from tidelog.errors import InvalidRequest, TidelogError
from tidelog.protocol import api
from tidelog.protocol.api import ApiKey
from tidelog.record.batch import ProducerRecord, Record
from tidelog.tls import TlsFiles

# What callers import from here: the client and the types its methods take and return.
__all__ = [
    "CONSUME_FETCH_BYTES",
    "AsyncClient",
    "AsyncTransaction",
    "ClusterInfo",
    "FetchResult",
    "NodeInfo",
    "ProduceResult",
    "TopicInfo",
]


class AsyncClient:
    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        request_timeout_ms: int = 30_000,
        retries: int = 40,
        retry_backoff_ms: int = 50,
        retry_backoff_max_ms: int = 250,
        admin_timeout_ms: int = 60_000,
        idempotent: bool = True,
        tls: TlsFiles | None = None,
        token: str | None = None,
    ) -> None:
        # The settings, read by the roles at each use (routing.ClientSettings).
        # TLS to every node: verifies their certificates against tls.ca, presents tls.cert.
        self.tls = tls
        # NAME:SECRET (`tidelog principals add`): every connection proves it before use.
        self.token = token
        self.bootstrap = bootstrap_addresses(bootstrap, tls, token)
        self.request_timeout_s = request_timeout_ms / 1000
        if retries < 0:
            raise InvalidRequest(f"retries must be >= 0, got {retries}")
        self.retries = max(1, retries)  # attempts per request: 0 still makes the one attempt
        self.retry_backoff_s = retry_backoff_ms / 1000
        self.retry_backoff_max_s = retry_backoff_max_ms / 1000
        # How long an admin request goes on retrying retriable errors (no metadata leader yet,
        # a node still starting, a leader change): Kafka's default.api.timeout.ms.
        self.admin_timeout_s = admin_timeout_ms / 1000
        # Called with each retriable error an admin request waits out and the seconds waited
        # so far (the CLI shows them on a terminal).
        self.on_admin_retry: Callable[[TidelogError, float], None] | None = None
        self.idempotent = idempotent
        # The roles.
        self._router = Router(self)
        self._reader = Reader(self._router)
        self._writer = Writer(self._router, self)
        self._admin = Admin(self._router, self._reader)
        self._tables = TableReader(self._router)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        self._router.close()

    # -- requests and metadata (routing.py) -------------------------------------------------------

    async def call(
        self,
        address: tuple[str, int],
        key: ApiKey,
        request: Any,
        payload: bytes | bytearray = b"",
        timeout_s: float | None = None,
        expect_response: bool = True,
    ) -> tuple[dict[str, Any], bytes]:
        """One request to one node; a TidelogError if the node answered with an error."""
        return await self._router.call(address, key, request, payload, timeout_s, expect_response)

    async def refresh_metadata(
        self, topics: list[str] | None = None, at_metadata_leader: bool = False
    ) -> None:
        """at_metadata_leader: read what was just changed (any other node may not have
        applied it yet)."""
        await self._router.refresh_metadata(topics, at_metadata_leader)

    async def topic(self, name: str, refresh: bool = False) -> TopicInfo:
        return await self._router.topic(name, refresh)

    async def list_topics(self) -> list[TopicInfo]:
        return await self._router.list_topics()

    async def nodes(self) -> dict[int, tuple[str, int]]:
        return await self._router.nodes()

    # -- topics (admin.py) ------------------------------------------------------------------------

    async def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int = -1,
        configs: dict[str, str] | None = None,
        kind: str = "stream",
        wait_for_leaders: bool = True,
    ) -> TopicInfo:
        return await self._admin.create_topic(
            name, partitions, replication_factor, configs, kind, wait_for_leaders
        )

    async def delete_topic(self, name: str, force: bool = False) -> api.DeleteTopicResponse:
        """Delete a topic: every replica deletes its data, and its cursors are deleted. A topic
        held by a backup cursor needs force."""
        return await self._admin.delete_topic(name, force)

    async def alter_topic(
        self,
        name: str,
        configs: dict[str, str] | None = None,
        delete_configs: list[str] | None = None,
    ) -> api.AlterTopicResponse:
        """Set (configs) or reset to the default (delete_configs) a topic's configs, live on
        every replica; returns the topic's overrides after the change."""
        return await self._admin.alter_topic(name, configs, delete_configs)

    async def add_partitions(
        self, name: str, partitions: int, wait_for_leaders: bool = True
    ) -> TopicInfo:
        """Grow a stream topic to `partitions` partitions (never fewer)."""
        return await self._admin.add_partitions(name, partitions, wait_for_leaders)

    async def reassign_partition(
        self,
        topic: str,
        partition: int,
        replicas: list[int],
        throttle_bytes: int = 0,
        wait: bool = False,
        timeout_s: float = 300.0,
    ) -> api.ReassignPartitionResponse:
        """Move a partition onto `replicas` (Kafka's kafka-reassign-partitions): new replicas
        catch up (at throttle_bytes/s, 0: unthrottled) as learners, then the voters change one
        at a time, then the nodes left delete their copy. wait: return once the move is done."""
        return await self._admin.reassign_partition(
            topic, partition, replicas, throttle_bytes, wait, timeout_s
        )

    async def wait_for_reassignment(
        self, topic: str, partition: int, timeout_s: float = 300.0
    ) -> TopicInfo:
        """Until the partition's move (if any) is done, as the metadata leader says: another
        node may not have applied the move yet, and would call it done before it began."""
        return await self._admin.wait_for_reassignment(topic, partition, timeout_s)

    async def wait_for_leaders(self, topic: str, timeout_s: float = 30.0) -> None:
        """Until every partition of the topic has a leader that answers."""
        await self._admin.wait_for_leaders(topic, timeout_s)

    async def delete_records(
        self, topic: str, partition: int, before_offset: int, force: bool = False
    ) -> int:
        """Move the log start to before_offset (-1: the HW); returns the new log start."""
        return await self._admin.delete_records(topic, partition, before_offset, force)

    # -- the cluster's nodes and leaders (admin.py) -----------------------------------------------

    async def describe_cluster(self, leader_only: bool = False) -> ClusterInfo:
        """The cluster's nodes and its metadata log's voters, as any node (or with leader_only,
        the metadata leader) knows them."""
        return await self._admin.describe_cluster(leader_only)

    async def add_node(
        self,
        node_id: int,
        host: str,
        port: int,
        peer_port: int = 0,
        wait: bool = False,
        timeout_s: float = 120.0,
    ) -> NodeInfo:
        """Register a node (then start it with `tidelog serve --join`): it catches up on the
        metadata log as a learner, then becomes a voter. wait: return once it is one."""
        return await self._admin.add_node(node_id, host, port, peer_port, wait, timeout_s)

    async def remove_node(
        self, node_id: int, throttle_bytes: int = 0, wait: bool = False, timeout_s: float = 3600.0
    ) -> int:
        """Remove a node: every replica it holds moves to another node (at throttle_bytes/s,
        0: unthrottled), then it leaves the metadata log's voters and the cluster. Returns how
        many partitions move. wait: return once it is gone."""
        return await self._admin.remove_node(node_id, throttle_bytes, wait, timeout_s)

    async def wait_for_node(self, node_id: int, state: str, timeout_s: float = 120.0) -> NodeInfo:
        """Until the metadata leader says the node is a "voter" of the metadata log, or is
        "removed" from the cluster ("": it is registered). Returns its entry (the last one,
        once removed)."""
        return await self._admin.wait_for_node(node_id, state, timeout_s)

    async def elect_leaders(
        self,
        node_id: int,
        topic: str,
        partition: int,
        unclean: bool = False,
        campaign: bool = True,
    ) -> api.ElectLeadersResponse:
        """Ask one node's replica of topic/partition to admit every voter's present directory
        (unclean) and/or to stand for election now."""
        return await self._admin.elect_leaders(node_id, topic, partition, unclean, campaign)

    async def elect_preferred_leader(
        self, topic: str, partition: int, node_id: int, timeout_s: float = 20.0
    ) -> None:
        """Until node_id leads the partition: it asks a live leader to hand over (which happens
        once it holds everything the leader holds), or campaigns (Kafka's preferred leader
        election)."""
        await self._admin.elect_preferred_leader(topic, partition, node_id, timeout_s)

    async def status(self, topics: list[str] | None = None) -> list[dict[str, Any]]:
        """Every node's view of its replicas (unreachable nodes are reported as such)."""
        return await self._admin.status(topics)

    # -- transactions (transactions.py) -----------------------------------------------------------

    def transaction(
        self, transactional_id: str, timeout_ms: int = transactions.DEFAULT_TIMEOUT_MS
    ) -> AsyncTransaction:
        """A transaction of transactional_id, to use as `async with`: writes to any partitions
        and cursor commits, committed together on a clean exit, aborted on an exception.
        Entering it fences any other holder of the id (ProducerFenced there); the coordinator
        aborts it if it stays open past timeout_ms."""
        return AsyncTransaction(
            self._router, self._writer, self._admin, transactional_id, timeout_ms
        )

    async def list_transactions(
        self, states: list[str] | None = None, min_age_ms: int = -1
    ) -> list[dict[str, Any]]:
        """The transactional ids the coordinator knows, each's state (only these states;
        open at least min_age_ms)."""
        return await transactions.list_transactions(self._router, states or (), min_age_ms)

    async def describe_transaction(self, transactional_id: str) -> dict[str, Any]:
        """A transactional id's state: producer id, epoch, state, partitions, pending cursor
        positions, when its transaction began (UnknownTransactionalId if none)."""
        return await transactions.describe_transaction(self._router, transactional_id)

    async def abort_transaction(self, transactional_id: str, wait: bool = True) -> dict[str, Any]:
        """Abort a hanging transaction (KIP-664): at a new epoch, which fences its producer;
        wait: until every partition holds its ABORT marker (the LSO moves on then)."""
        return await transactions.abort_transaction(self._router, transactional_id, wait)

    async def describe_producers(self, topic: str, partition: int) -> list[dict[str, Any]]:
        """A partition's producers, from its leader: id, epoch, last sequence, when it last
        wrote, and where its open transaction starts (txn_start_offset, -1: none open), as
        Kafka's DescribeProducers answers (for finding a hanging transaction)."""
        return await transactions.describe_producers(self._router, topic, partition)

    # -- cursors (admin.py) -----------------------------------------------------------------------

    async def create_cursor(
        self,
        name: str,
        topic: str,
        start: int | str | dict[int, int] = "earliest",
        backup: bool = False,
        if_not_exists: bool = False,
    ) -> dict[str, Any]:
        """A durable position per partition that holds the log (earliest, latest, an offset for
        every partition, or a {partition: offset} map)."""
        return await self._admin.create_cursor(name, topic, start, backup, if_not_exists)

    async def commit_cursor(
        self, name: str, positions: dict[int, int], isolation_level: str = "read_uncommitted"
    ) -> dict[str, Any]:
        """Move a cursor (CursorInvalidated if it was invalidated). isolation_level: the
        committer's; a read_committed reader says so, and the node then refuses to move a
        position forward past its partition's last stable offset (CursorPastStableOffset)."""
        return await self._admin.commit_cursor(name, positions, isolation_level)

    async def delete_cursor(self, name: str) -> None:
        await self._admin.delete_cursor(name)

    async def cursors(self, name: str | None = None) -> list[dict[str, Any]]:
        return await self._admin.cursors(name)

    # -- principals, ACLs and quotas (admin.py) ---------------------------------------------------

    async def add_principal(self, name: str) -> str:
        """A new principal (or a new token for an existing one: the old token stops working).
        Returns its token, NAME:SECRET; only the secret's Argon2id hash leaves this process,
        and the token is shown this once."""
        return await self._admin.add_principal(name)

    async def principals(self) -> list[dict[str, Any]]:
        """Every principal: name and created_ms (never a hash). Asked of the metadata leader, so
        that what this client changed is in the answer (read-your-writes)."""
        return await self._admin.principals()

    async def remove_principal(self, name: str) -> int:
        """Remove a principal: its token stops working, its sessions end, and its ACLs go
        with it (a new principal of that name starts with none). Returns how many ACLs went."""
        return await self._admin.remove_principal(name)

    async def add_acl(
        self,
        principal: str,
        permission: str,
        topic: str | None = None,
        *,
        prefix: str | None = None,
        cluster: bool = False,
        group: str | None = None,
        group_prefix: str | None = None,
        transactional_id: str | None = None,
        transactional_id_prefix: str | None = None,
    ) -> dict[str, Any]:
        """Grant principal a permission (read, write, admin) on a topic, on every topic whose
        name starts with prefix, on a Kafka consumer group (read: use it; admin: delete it) or
        every group whose name starts with group_prefix, on a Kafka transactional id or every
        one starting with transactional_id_prefix (write: use it; read: describe it), or admin
        on the cluster. Adding one twice keeps one."""
        acl = Acl.of(
            principal,
            permission,
            topic,
            prefix,
            cluster,
            group,
            group_prefix,
            transactional_id,
            transactional_id_prefix,
        )
        return await self._admin.change_acl("add", acl)

    async def acls(self, principal: str | None = None) -> list[dict[str, Any]]:
        """Every ACL (or one principal's): principal, permission, resource
        (topic|group|transactional_id|cluster), name, pattern (literal|prefix)."""
        return await self._admin.acls(principal)

    async def remove_acl(
        self,
        principal: str,
        permission: str,
        topic: str | None = None,
        *,
        prefix: str | None = None,
        cluster: bool = False,
        group: str | None = None,
        group_prefix: str | None = None,
        transactional_id: str | None = None,
        transactional_id_prefix: str | None = None,
    ) -> None:
        acl = Acl.of(
            principal,
            permission,
            topic,
            prefix,
            cluster,
            group,
            group_prefix,
            transactional_id,
            transactional_id_prefix,
        )
        await self._admin.change_acl("remove", acl)

    async def set_quota(self, principal: str, limits: dict[str, float]) -> dict[str, Any]:
        """Limit a principal (or "*", every principal without limits of its own) per node:
        producer_byte_rate, consumer_byte_rate (bytes/s), admin_request_rate (requests/s).
        Over it, the principal is slowed (throttle_time_ms), not refused."""
        return await self._admin.set_quota(principal, limits)

    async def quotas(self) -> list[dict[str, Any]]:
        """Every quota: principal, limits (from the metadata leader: read-your-writes)."""
        return await self._admin.quotas()

    async def remove_quota(self, principal: str) -> None:
        await self._admin.remove_quota(principal)

    # -- the archive (admin.py) -------------------------------------------------------------------

    async def archive(self) -> api.ArchiveResponse:
        """The archive as the cluster's metadata log records it: the store's identity
        (archive_id) and per partition what it holds and what it lost."""
        return await self._admin.archive()

    async def accept_archive_loss(self) -> api.ArchiveResponse:
        """An operator's word that the archive's store holds what it holds now: every range it
        lost is recorded (and refused to readers by name), and uploads go on."""
        return await self._admin.accept_archive_loss()

    # -- feature levels (admin.py) ----------------------------------------------------------------

    async def describe_features(self) -> api.FeaturesResponse:
        """The cluster's finalized level of tidelog.version (tidelog/features.py), this build's
        levels and what each registered node announced it supports, from the metadata
        leader."""
        return await self._admin.describe_features()

    async def update_features(
        self, level: int = 0, downgrade: bool = False
    ) -> api.FeaturesResponse:
        """Finalize another level of tidelog.version (Kafka's updateFeatures). An upgrade
        (level 0: the highest every node supports) is refused with UnsupportedFeatureLevel,
        naming the node, unless every registered node is live and supports it; a downgrade
        (level 0: one lower) with UnsafeFeatureDowngrade past a level that does not allow
        going back. The answer's `changed` is False when the cluster was finalized at that
        level already: nothing was done, and that is no error (the step can be run again)."""
        return await self._admin.update_features(level, downgrade)

    # -- tables (tables.py) -----------------------------------------------------------------------

    async def table_get(
        self, topic: str, key: bytes, consistency: str = "linearizable"
    ) -> bytes | None:
        """The committed value of key in a table topic (None: absent). consistency (etcd's
        names): "linearizable" (the default) returns the latest acknowledged write, its leader
        confirmed by a majority (ReadIndex); "lease" skips that round trip while the leader's
        lease runs (safe under bounded clock drift); "serializable" answers from the replica's
        applied state, possibly stale."""
        return await self._tables.get(topic, key, consistency)

    async def table_scan(
        self,
        topic: str,
        partitions: list[int] | None = None,
        consistency: str = "linearizable",
    ) -> list[tuple[bytes, bytes]]:
        """Every committed key and value of a table topic (or of some of its partitions), each
        partition as current as table_get's consistency says."""
        return await self._tables.scan(topic, partitions, consistency)

    # -- writing (produce.py, idempotence.py) -----------------------------------------------------

    async def partition_for(self, topic: str, key: bytes | None) -> int:
        return await self._writer.partition_for(topic, key)

    async def produce(
        self,
        topic: str,
        records: Sequence[ProducerRecord | bytes],
        partition: int | None = None,
        acks: int | str = "all",
        timeout_ms: int = 30_000,
    ) -> ProduceResult | None:
        return await self._writer.produce(topic, records, partition, acks, timeout_ms)

    async def produce_batch(
        self,
        topic: str,
        partition: int,
        batch: bytes,
        acks: int | str = "all",
        timeout_ms: int = 30_000,
        producer_id: int = -1,
    ) -> ProduceResult | None:
        """Send one or more encoded batches; returns the assigned offsets (None for acks=0).
        Batches without a producer id are stamped as this client's (idempotent) unless
        idempotence is off or acks=0; batches with one (the Spark sink's) go as they are."""
        return await self._writer.produce_batch(
            topic, partition, batch, acks, timeout_ms, producer_id
        )

    async def produce_records(
        self,
        topic: str,
        partition: int,
        records: Sequence[ProducerRecord],
        acks: int | str = "all",
        timeout_ms: int = 30_000,
    ) -> ProduceResult | None:
        """Encode records into one batch (as this client's idempotent producer, unless
        idempotence is off or acks=0) and send it. Concurrent calls for one partition that
        arrive while a batch is in flight go together as the next one (the result names each
        call's own offsets)."""
        return await self._writer.produce_records(topic, partition, records, acks, timeout_ms)

    async def produce_pipelined(
        self,
        batches: dict[tuple[str, int], list[bytes]],
        acks: int | str = "all",
        in_flight: int = 5,
        timeout_ms: int = 30_000,
    ) -> dict[tuple[str, int], list[ProduceResult | None]]:
        """Each partition's batches of one idempotent producer (producer id and sequences
        already in them, consecutive: the Spark sink's chunks) in order, up to in_flight of them
        sent before the first is acknowledged, all partitions at once. The log refuses a batch
        whose predecessor has not landed (OutOfOrderSequence): it is sent again once the
        predecessor is in, so whatever happens the log holds a prefix of each partition's
        batches. The first failure (in batch order) is raised once every batch has settled."""
        return await self._writer.produce_pipelined(batches, acks, in_flight, timeout_ms)

    # -- reading (consume.py) ---------------------------------------------------------------------

    async def fetch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int = 1024 * 1024,
        max_wait_ms: int = 0,
        min_bytes: int = 1,
        replica_read: bool = False,
        node_id: int | None = None,
        include_control: bool = False,
        cursor: str = "",
        skip_invalid: bool = False,
        consistent: bool = False,
        leader_epoch: int = -1,
        isolation_level: str = "read_uncommitted",
    ) -> FetchResult:
        """Records at offsets >= offset below the HW of the replica that answers. A batch that
        cannot be read (one written before batches were validated; `tidelog status` lists
        them) raises CorruptRecord, or with skip_invalid is passed over with a warning.
        isolation_level="read_committed": below the last stable offset only, without the
        batches of aborted transactions (a node from before transactions: UnsupportedApi)."""
        options = FetchOptions(
            max_bytes=max_bytes,
            max_wait_ms=max_wait_ms,
            min_bytes=min_bytes,
            replica_read=replica_read,
            node_id=node_id,
            include_control=include_control,
            cursor=cursor,
            skip_invalid=skip_invalid,
            consistent=consistent,
            leader_epoch=leader_epoch,
            isolation_level=isolation_level,
        )
        return await self._reader.fetch(topic, partition, offset, options)

    async def list_offsets(
        self,
        topic: str,
        partition: int,
        spec: str = "latest",
        timestamp_ms: int = -1,
        consistent: bool = False,
        isolation_level: str = "read_uncommitted",
    ) -> int:
        """earliest = log start, latest = HW, timestamp = first offset with ts >= timestamp_ms.
        consistent: the leader confirms with a majority that it still leads before it answers,
        so "latest" is never a deposed leader's HW (default: Kafka's semantics).
        isolation_level="read_committed": "latest" is the last stable offset (LSO)."""
        return await self._reader.list_offsets(
            topic, partition, spec, timestamp_ms, consistent, isolation_level
        )

    async def consume(
        self,
        topic: str,
        partition: int,
        start: int | str = "earliest",
        *,
        reset: str = "earliest",
        follow: bool = False,
        max_records: int | None = None,
        max_wait_ms: int = 500,
        replica_read: bool = False,
        prefer_node: int | None = None,
        cursor: str = "",
        skip_invalid: bool = False,
        max_bytes: int = CONSUME_FETCH_BYTES,
        consistent: bool = False,
        isolation_level: str = "read_uncommitted",
    ) -> AsyncGenerator[Record, None]:
        """Records in offset order from start up to the HW as it is now (or on and on with
        follow); out-of-range offsets follow the reset policy (earliest, latest or none). The
        next fetch is on its way while the caller reads one fetch's records."""
        options = ConsumeOptions(
            reset=reset,
            follow=follow,
            max_records=max_records,
            max_wait_ms=max_wait_ms,
            replica_read=replica_read,
            prefer_node=prefer_node,
            cursor=cursor,
            skip_invalid=skip_invalid,
            max_bytes=max_bytes,
            consistent=consistent,
            isolation_level=isolation_level,
        )
        batches = self._reader.consume_batches(topic, partition, start, options)
        async with contextlib.aclosing(batches):  # stopped early: the fetch ahead ends now
            async for records in batches:
                for rec in records:
                    yield rec

    async def consume_batches(
        self,
        topic: str,
        partition: int,
        start: int | str = "earliest",
        *,
        reset: str = "earliest",
        follow: bool = False,
        max_records: int | None = None,
        max_wait_ms: int = 500,
        replica_read: bool = False,
        prefer_node: int | None = None,
        cursor: str = "",
        skip_invalid: bool = False,
        max_bytes: int = CONSUME_FETCH_BYTES,
        consistent: bool = False,
        isolation_level: str = "read_uncommitted",
    ) -> AsyncGenerator[Fetched, None]:
        """consume(), a fetch's worth of records at a time (at most max_bytes per fetch, as
        Kafka's max.partition.fetch.bytes; one batch larger than that still comes whole). Each
        list's `next_offset` is the position after it, past transaction markers and aborted
        batches too (a fetch that only skipped those comes as an empty list): the offset to
        commit to a cursor once the records are processed, as a Kafka consumer commits its
        position. With
        replica_read, prefer_node (a follower, say) answers while it is reachable; it serves
        only below its own HW."""
        options = ConsumeOptions(
            reset=reset,
            follow=follow,
            max_records=max_records,
            max_wait_ms=max_wait_ms,
            replica_read=replica_read,
            prefer_node=prefer_node,
            cursor=cursor,
            skip_invalid=skip_invalid,
            max_bytes=max_bytes,
            consistent=consistent,
            isolation_level=isolation_level,
        )
        batches = self._reader.consume_batches(topic, partition, start, options)
        async with contextlib.aclosing(batches):  # stopped early: the fetch ahead ends now
            async for records in batches:
                yield records
