"""The blocking client: the asyncio client driven on a private event-loop thread.

Every public method of AsyncClient has one here, with the same name and parameters
(tests/test_client_parity.py compares them), so that what the docs say of one holds of both.
Reads build their options (consume.FetchOptions, ConsumeOptions) once, as AsyncClient's do,
and hand them to its reading role."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Coroutine, Iterator, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from tidelog.client.async_client import (
    AsyncClient,
    ClusterInfo,
    FetchResult,
    NodeInfo,
    ProduceResult,
    TopicInfo,
)
from tidelog.client.consume import CONSUME_FETCH_BYTES, ConsumeOptions, Fetched, FetchOptions
from tidelog.client.producer import Producer, RecordMetadata
from tidelog.client.transactions import DEFAULT_TIMEOUT_MS, Transaction
from tidelog.protocol import api
from tidelog.protocol.api import ApiKey
from tidelog.record.batch import ProducerRecord, Record

T = TypeVar("T")


class Client:
    def __init__(self, bootstrap: str | Sequence[str], **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="tidelog-client", daemon=True
        )
        self._thread.start()
        self._async = AsyncClient(bootstrap, **options)
        self._closed = False

    def _run(self, coro: Coroutine[Any, Any, T] | Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(_as_coroutine(coro), self._loop).result()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._run(self._async.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    @property
    def async_client(self) -> AsyncClient:
        return self._async

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int = -1,
        configs: dict[str, str] | None = None,
        kind: str = "stream",
        wait_for_leaders: bool = True,
    ) -> TopicInfo:
        return self._run(
            self._async.create_topic(
                name, partitions, replication_factor, configs, kind, wait_for_leaders
            )
        )

    def delete_topic(self, name: str, force: bool = False) -> api.DeleteTopicResponse:
        return self._run(self._async.delete_topic(name, force))

    def alter_topic(
        self,
        name: str,
        configs: dict[str, str] | None = None,
        delete_configs: list[str] | None = None,
    ) -> api.AlterTopicResponse:
        return self._run(self._async.alter_topic(name, configs, delete_configs))

    def add_partitions(
        self, name: str, partitions: int, wait_for_leaders: bool = True
    ) -> TopicInfo:
        return self._run(self._async.add_partitions(name, partitions, wait_for_leaders))

    def reassign_partition(
        self,
        topic: str,
        partition: int,
        replicas: list[int],
        throttle_bytes: int = 0,
        wait: bool = False,
        timeout_s: float = 300.0,
    ) -> api.ReassignPartitionResponse:
        return self._run(
            self._async.reassign_partition(
                topic, partition, replicas, throttle_bytes, wait, timeout_s
            )
        )

    def transaction(
        self, transactional_id: str, timeout_ms: int = DEFAULT_TIMEOUT_MS
    ) -> Transaction:
        return Transaction(self._async.transaction(transactional_id, timeout_ms), self._run)

    def list_transactions(
        self, states: list[str] | None = None, min_age_ms: int = -1
    ) -> list[dict[str, Any]]:
        return self._run(self._async.list_transactions(states, min_age_ms))

    def describe_transaction(self, transactional_id: str) -> dict[str, Any]:
        return self._run(self._async.describe_transaction(transactional_id))

    def abort_transaction(self, transactional_id: str, wait: bool = True) -> dict[str, Any]:
        return self._run(self._async.abort_transaction(transactional_id, wait))

    def describe_producers(self, topic: str, partition: int) -> list[dict[str, Any]]:
        return self._run(self._async.describe_producers(topic, partition))

    def describe_cluster(self, leader_only: bool = False) -> ClusterInfo:
        return self._run(self._async.describe_cluster(leader_only))

    def add_node(
        self,
        node_id: int,
        host: str,
        port: int,
        peer_port: int = 0,
        wait: bool = False,
        timeout_s: float = 120.0,
    ) -> NodeInfo:
        return self._run(self._async.add_node(node_id, host, port, peer_port, wait, timeout_s))

    def remove_node(
        self, node_id: int, throttle_bytes: int = 0, wait: bool = False, timeout_s: float = 3600.0
    ) -> int:
        return self._run(self._async.remove_node(node_id, throttle_bytes, wait, timeout_s))

    def wait_for_node(self, node_id: int, state: str, timeout_s: float = 120.0) -> NodeInfo:
        return self._run(self._async.wait_for_node(node_id, state, timeout_s))

    def elect_preferred_leader(
        self, topic: str, partition: int, node_id: int, timeout_s: float = 20.0
    ) -> None:
        self._run(self._async.elect_preferred_leader(topic, partition, node_id, timeout_s))

    def wait_for_leaders(self, topic: str, timeout_s: float = 30.0) -> None:
        """Until every partition of the topic has a leader that answers."""
        self._run(self._async.wait_for_leaders(topic, timeout_s))

    def wait_for_reassignment(
        self, topic: str, partition: int, timeout_s: float = 300.0
    ) -> TopicInfo:
        return self._run(self._async.wait_for_reassignment(topic, partition, timeout_s))

    def topic(self, name: str, refresh: bool = False) -> TopicInfo:
        return self._run(self._async.topic(name, refresh))

    def list_topics(self) -> list[TopicInfo]:
        return self._run(self._async.list_topics())

    def nodes(self) -> dict[int, tuple[str, int]]:
        return self._run(self._async.nodes())

    def refresh_metadata(
        self, topics: list[str] | None = None, at_metadata_leader: bool = False
    ) -> None:
        self._run(self._async.refresh_metadata(topics, at_metadata_leader))

    def call(
        self,
        address: tuple[str, int],
        key: ApiKey,
        request: Any,
        payload: bytes | bytearray = b"",
        timeout_s: float | None = None,
        expect_response: bool = True,
    ) -> tuple[dict[str, Any], bytes]:
        return self._run(
            self._async.call(address, key, request, payload, timeout_s, expect_response)
        )

    def partition_for(self, topic: str, key: bytes | None) -> int:
        return self._run(self._async.partition_for(topic, key))

    def elect_leaders(
        self,
        node_id: int,
        topic: str,
        partition: int,
        unclean: bool = False,
        campaign: bool = True,
    ) -> api.ElectLeadersResponse:
        return self._run(self._async.elect_leaders(node_id, topic, partition, unclean, campaign))

    def status(self, topics: list[str] | None = None) -> list[dict[str, Any]]:
        return self._run(self._async.status(topics))

    def produce(
        self,
        topic: str,
        records: Sequence[ProducerRecord | bytes],
        partition: int | None = None,
        acks: int | str = "all",
        timeout_ms: int = 30_000,
    ) -> ProduceResult | None:
        return self._run(self._async.produce(topic, records, partition, acks, timeout_ms))

    def produce_batch(
        self,
        topic: str,
        partition: int,
        batch: bytes,
        acks: int | str = "all",
        timeout_ms: int = 30_000,
        producer_id: int = -1,
    ) -> ProduceResult | None:
        return self._run(
            self._async.produce_batch(topic, partition, batch, acks, timeout_ms, producer_id)
        )

    def produce_records(
        self,
        topic: str,
        partition: int,
        records: Sequence[ProducerRecord],
        acks: int | str = "all",
        timeout_ms: int = 30_000,
    ) -> ProduceResult | None:
        return self._run(self._async.produce_records(topic, partition, records, acks, timeout_ms))

    def produce_pipelined(
        self,
        batches: dict[tuple[str, int], list[bytes]],
        acks: int | str = "all",
        in_flight: int = 5,
        timeout_ms: int = 30_000,
    ) -> dict[tuple[str, int], list[ProduceResult | None]]:
        return self._run(self._async.produce_pipelined(batches, acks, in_flight, timeout_ms))

    def fetch(
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
        return self._run(self._async._reader.fetch(topic, partition, offset, options))

    def fetch_ahead(
        self, topic: str, partition: int, offset: int, **options: Any
    ) -> Future[FetchResult]:
        """fetch() started on the client's thread without waiting: the caller decodes one
        answer while the next is on its way (the Spark source's read-ahead)."""
        coro = self._async._reader.fetch(topic, partition, offset, FetchOptions(**options))
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def list_offsets(
        self,
        topic: str,
        partition: int,
        spec: str = "latest",
        timestamp_ms: int = -1,
        consistent: bool = False,
        isolation_level: str = "read_uncommitted",
    ) -> int:
        return self._run(
            self._async.list_offsets(
                topic, partition, spec, timestamp_ms, consistent, isolation_level
            )
        )

    def consume(
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
    ) -> Iterator[Record]:
        """Records in offset order (see AsyncClient.consume); one thread hop per fetch."""
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
        for records in self._consume_batches(topic, partition, start, options):
            yield from records

    def consume_batches(
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
    ) -> Iterator[Fetched]:
        """Each fetch's records and the position after them (see
        AsyncClient.consume_batches)."""
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
        yield from self._consume_batches(topic, partition, start, options)

    def _consume_batches(
        self, topic: str, partition: int, start: int | str, options: ConsumeOptions
    ) -> Iterator[Fetched]:
        batches = self._async._reader.consume_batches(topic, partition, start, options)
        try:
            while True:
                try:
                    yield self._run(batches.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            self._run(batches.aclose())

    def create_cursor(
        self,
        name: str,
        topic: str,
        start: int | str | dict[int, int] = "earliest",
        backup: bool = False,
        if_not_exists: bool = False,
    ) -> dict[str, Any]:
        return self._run(self._async.create_cursor(name, topic, start, backup, if_not_exists))

    def commit_cursor(
        self, name: str, positions: dict[int, int], isolation_level: str = "read_uncommitted"
    ) -> dict[str, Any]:
        return self._run(self._async.commit_cursor(name, positions, isolation_level))

    def delete_cursor(self, name: str) -> None:
        self._run(self._async.delete_cursor(name))

    def add_principal(self, name: str) -> str:
        return self._run(self._async.add_principal(name))

    def principals(self) -> list[dict[str, Any]]:
        return self._run(self._async.principals())

    def remove_principal(self, name: str) -> int:
        return self._run(self._async.remove_principal(name))

    def add_acl(
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
        return self._run(
            self._async.add_acl(
                principal,
                permission,
                topic,
                prefix=prefix,
                cluster=cluster,
                group=group,
                group_prefix=group_prefix,
                transactional_id=transactional_id,
                transactional_id_prefix=transactional_id_prefix,
            )
        )

    def acls(self, principal: str | None = None) -> list[dict[str, Any]]:
        return self._run(self._async.acls(principal))

    def remove_acl(
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
        self._run(
            self._async.remove_acl(
                principal,
                permission,
                topic,
                prefix=prefix,
                cluster=cluster,
                group=group,
                group_prefix=group_prefix,
                transactional_id=transactional_id,
                transactional_id_prefix=transactional_id_prefix,
            )
        )

    def archive(self) -> api.ArchiveResponse:
        return self._run(self._async.archive())

    def accept_archive_loss(self) -> api.ArchiveResponse:
        return self._run(self._async.accept_archive_loss())

    def describe_features(self) -> api.FeaturesResponse:
        return self._run(self._async.describe_features())

    def update_features(self, level: int = 0, downgrade: bool = False) -> api.FeaturesResponse:
        return self._run(self._async.update_features(level, downgrade))

    def set_quota(self, principal: str, limits: dict[str, float]) -> dict[str, Any]:
        return self._run(self._async.set_quota(principal, limits))

    def quotas(self) -> list[dict[str, Any]]:
        return self._run(self._async.quotas())

    def remove_quota(self, principal: str) -> None:
        self._run(self._async.remove_quota(principal))

    def cursors(self, name: str | None = None) -> list[dict[str, Any]]:
        return self._run(self._async.cursors(name))

    def delete_records(
        self, topic: str, partition: int, before_offset: int, force: bool = False
    ) -> int:
        return self._run(self._async.delete_records(topic, partition, before_offset, force))

    def table_get(self, topic: str, key: bytes, consistency: str = "linearizable") -> bytes | None:
        return self._run(self._async.table_get(topic, key, consistency))

    def table_scan(
        self,
        topic: str,
        partitions: list[int] | None = None,
        consistency: str = "linearizable",
    ) -> list[tuple[bytes, bytes]]:
        return self._run(self._async.table_scan(topic, partitions, consistency))

    def producer(self, **options: Any) -> SyncProducer:
        return SyncProducer(self, Producer(self._async, **options))


class SyncProducer:
    """Blocking face of Producer: send() returns a concurrent Future of RecordMetadata."""

    def __init__(self, client: Client, producer: Producer) -> None:
        self._client = client
        self._producer = producer

    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        partition: int | None = None,
        headers: tuple[tuple[str, bytes | None], ...] = (),
        timestamp_ms: int | None = None,
    ) -> Future[RecordMetadata]:
        async def submit() -> asyncio.Future[RecordMetadata]:
            return await self._producer.send(topic, value, key, partition, headers, timestamp_ms)

        inner = self._client._run(submit())
        outer: Future[RecordMetadata] = Future()

        def done(f: asyncio.Future[RecordMetadata]) -> None:
            if f.exception() is not None:
                outer.set_exception(f.exception())
            else:
                outer.set_result(f.result())

        self._client._loop.call_soon_threadsafe(inner.add_done_callback, done)
        return outer

    def flush(self) -> None:
        self._client._run(self._producer.flush())

    def close(self) -> None:
        self._client._run(self._producer.close())


async def _as_coroutine(awaitable: Awaitable[T]) -> T:
    return await awaitable
