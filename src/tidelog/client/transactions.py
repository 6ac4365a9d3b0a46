"""Transactions in the Python client: writes to several partitions and cursor commits that
become visible together, or not at all.

    async with client.transaction("etl-1") as txn:
        await txn.produce("out", [b"x"], partition=0)
        await txn.produce("out", [b"y"], partition=1)
        await txn.commit_cursor("in-reader", {0: 42})
    # committed here; an exception inside the block aborts instead

A transaction is a transactional id's: entering the block asks the transaction coordinator (the
metadata log's leader, node/ops/transactions.py) for the id's producer id and a new epoch, which
fences every older holder of the id (a "zombie" then gets ProducerFenced). Each batch carries the
transactional bit, the id, the producer id and epoch and its partition's next sequence, and the
partition's leader verifies it against the coordinator's state as it does a Kafka producer's.
Cursor commits are the coordinator's pending offsets: they apply in the same metadata command
that commits the transaction, and are dropped if it aborts. The block's exit waits until every
partition holds its marker, so a read_committed reader sees the whole transaction once it
returns.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any, TypeVar

from tidelog.client.admin import Admin
from tidelog.client.produce import Writer
from tidelog.client.results import ProduceResult
from tidelog.client.routing import Router
from tidelog.errors import (
    InvalidRequest,
    InvalidTxnState,
    NotAuthorized,
    OutcomeUnknown,
    ProducerFenced,
    TidelogError,
    Timeout,
    UnknownCursor,
    UnknownTopicOrPartition,
)
from tidelog.protocol import api
from tidelog.protocol.api import ApiKey
from tidelog.record.batch import SEQUENCE_MAX, ProducerRecord, build_batch

T = TypeVar("T")
DEFAULT_TIMEOUT_MS = 60_000
COMPLETED = ("CompleteCommit", "CompleteAbort", "Empty")


async def ask(router: Router, request: api.TransactionRequest) -> api.TransactionResponse:
    """One request to the transaction coordinator (retried as admin writes are: its retriable
    errors, such as ConcurrentTransactions while a previous transaction completes, too)."""
    header = await router.to_metadata_leader(ApiKey.TRANSACTIONS, request)
    return api.decode(api.TransactionResponse, header)


def refused_error(refused: dict[str, dict[str, str]], what: str) -> TidelogError | None:
    """The error of the first partition the coordinator refused (None: it refused none)."""
    for topic, partitions in sorted(refused.items()):
        for partition, reason in sorted(partitions.items()):
            where = f"{what} {topic}/{partition}"
            if reason == api.TXN_NOT_AUTHORIZED:
                return NotAuthorized(
                    f"{where}: not authorized", resource="topic", resource_name=topic
                )
            if reason == api.TXN_UNKNOWN_PARTITION:
                return UnknownTopicOrPartition(f"{where}: no such partition", topic=topic)
            return InvalidRequest(f"{where}: {reason}")
    return None


class AsyncTransaction:
    """One transaction of a transactional id (AsyncClient.transaction)."""

    def __init__(
        self,
        router: Router,
        writer: Writer,
        admin: Admin,
        transactional_id: str,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
    ) -> None:
        if not transactional_id:
            raise InvalidRequest("a transaction needs a transactional id")
        self._router = router
        self._writer = writer
        self._admin = admin
        self.transactional_id = transactional_id
        self.timeout_ms = timeout_ms
        self.producer_id = -1
        self.epoch = -1
        self.state = "new"  # new | open | committed | aborted | fenced
        self._partitions: set[tuple[str, int]] = set()
        self._cursors: dict[str, str] = {}  # cursor -> its topic, once added
        self._sequences: dict[tuple[str, int], int] = {}
        self._locks: dict[tuple[str, int], asyncio.Lock] = {}
        self._failed: TidelogError | None = None  # a write whose fate is not known

    async def __aenter__(self) -> AsyncTransaction:
        await self.begin()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            if self.state in ("committed", "aborted"):
                return  # ended in the block by its own commit() or abort()
            await self.commit()
        elif self.state == "open" and not isinstance(exc, ProducerFenced):
            # The block's own error is what the caller sees; an abort that fails (the
            # coordinator will abort at the timeout) does not hide it.
            try:
                await self.abort()
            except TidelogError:
                pass

    def _request(self, op: str, **fields: Any) -> api.TransactionRequest:
        return api.TransactionRequest(
            op, self.transactional_id, self.producer_id, self.epoch, **fields
        )

    async def begin(self) -> None:
        """The id's producer id and a new epoch: any other holder of the id is fenced, and a
        transaction it left open is aborted first."""
        if self.state != "new":
            raise InvalidTxnState(f"transaction {self.transactional_id!r} is {self.state}")
        request = api.TransactionRequest("init", self.transactional_id, timeout_ms=self.timeout_ms)
        txn = (await ask(self._router, request)).transaction
        self.producer_id, self.epoch = int(txn["producer_id"]), int(txn["epoch"])
        self.state = "open"

    def _check_open(self) -> None:
        if self.state == "fenced":
            raise ProducerFenced(
                f"transactional id {self.transactional_id!r}: epoch {self.epoch} is fenced by "
                "a newer holder of the id, `tidelog transactions abort`, or the coordinator "
                f"aborting a transaction open past its timeout ({self.timeout_ms} ms)",
                transactional_id=self.transactional_id,
                producer_id=self.producer_id,
                epoch=self.epoch,
            )
        if self.state != "open":
            raise InvalidTxnState(
                f"transaction {self.transactional_id!r} is {self.state}",
                transactional_id=self.transactional_id,
            )

    # -- writes ---------------------------------------------------------------------------------

    async def produce(
        self,
        topic: str,
        records: Sequence[ProducerRecord | bytes],
        partition: int | None = None,
        timeout_ms: int = 30_000,
    ) -> ProduceResult:
        """Write records to one partition inside the transaction (acks=all): read_committed
        readers see them once the transaction commits, never if it aborts."""
        self._check_open()
        recs = [r if isinstance(r, ProducerRecord) else ProducerRecord(None, r) for r in records]
        if not recs:
            raise InvalidRequest("a produce with no records")
        if partition is None:
            partition = await self._writer.partition_for(topic, recs[0].key)
        tp = (topic, partition)
        if tp not in self._partitions:
            response = await ask(
                self._router, self._request("add_partitions", partitions={topic: [partition]})
            )
            refused = refused_error(response.refused, "transaction: add")
            if refused is not None:
                raise refused
            self._partitions.add(tp)
        lock = self._locks.setdefault(tp, asyncio.Lock())
        async with lock:
            sequence = self._sequences.get(tp, 0)
            if sequence + len(recs) > SEQUENCE_MAX:
                raise InvalidRequest(f"{topic}/{partition}: too many records in one transaction")
            # Taken whatever happens: a sequence that may be in the log is never reused.
            self._sequences[tp] = sequence + len(recs)
            batch = build_batch(
                recs,
                producer_id=self.producer_id,
                producer_epoch=self.epoch,
                base_sequence=sequence,
                transactional=True,
            )
            try:
                result = await self._writer.send(
                    topic,
                    partition,
                    batch,
                    api.ACKS_ALL,
                    timeout_ms,
                    self.producer_id,
                    True,
                    transactional_id=self.transactional_id,
                )
            except ProducerFenced:
                self.state = "fenced"
                raise
            except OutcomeUnknown as exc:
                # The transaction may hold the batch or not: it can only abort now.
                self._failed = exc
                raise
        if result is None:  # acks=all always answers
            raise InvalidTxnState("a transactional write got no answer")
        return result

    # -- cursor commits -------------------------------------------------------------------------

    async def commit_cursor(
        self, name: str, positions: dict[int, int], topic: str | None = None
    ) -> None:
        """Move a cursor with the transaction: the positions apply iff it commits (the
        coordinator holds them pending until then). topic: for a cursor that does not exist
        yet (it is created, as its owner's, when the transaction commits)."""
        self._check_open()
        if topic is None:
            topic = self._cursors.get(name)
        if topic is None:
            try:
                found = await self._admin.cursors(name)
            except UnknownCursor as exc:
                raise UnknownCursor(
                    f"cursor {name!r} does not exist: name its topic "
                    f"(commit_cursor({name!r}, positions, topic=TOPIC)) to create it when the "
                    "transaction commits",
                    cursor=name,
                ) from exc
            topic = str(found[0]["topic"])
        if name not in self._cursors:
            await ask(self._router, self._request("add_offsets", cursor=name))
            self._cursors[name] = topic
        offsets = {topic: {str(p): int(o) for p, o in positions.items()}}
        response = await ask(
            self._router, self._request("commit_offsets", cursor=name, offsets=offsets)
        )
        refused = refused_error(response.refused, f"transaction: cursor {name!r} on")
        if refused is not None:
            raise refused

    # -- the end --------------------------------------------------------------------------------

    async def commit(self, wait: bool = True) -> None:
        """Commit: every write and cursor commit becomes visible together. wait: return once
        every partition holds its marker (read_committed readers see it all then)."""
        self._check_open()
        if self._failed is not None:
            await self.abort(wait)
            raise InvalidTxnState(
                f"transaction {self.transactional_id!r} was aborted: a write's outcome is not "
                f"known ({self._failed})",
                transactional_id=self.transactional_id,
            )
        await self._end(True, wait)
        self.state = "committed"

    async def abort(self, wait: bool = True) -> None:
        """Abort: no reader in read_committed sees the writes, and no cursor moves."""
        self._check_open()
        await self._end(False, wait)
        self.state = "aborted"

    async def _end(self, commit: bool, wait: bool) -> None:
        if not self._partitions and not self._cursors:
            return  # nothing began at the coordinator
        try:
            await ask(self._router, self._request("end", commit=commit))
        except ProducerFenced:
            self.state = "fenced"
            raise
        if wait:
            await self._completed()

    async def _completed(self) -> None:
        await completed(self._router, self.transactional_id, self.epoch)


async def completed(router: Router, transactional_id: str, epoch: int = -1) -> dict[str, Any]:
    """The id's state once the coordinator has every marker of its transaction (or, given the
    epoch it ended at, once the id moved on to a newer one)."""
    deadline = time.monotonic() + router.settings.admin_timeout_s
    request = api.TransactionRequest("describe", transactional_id)
    while True:
        txn = (await ask(router, request)).transaction
        if txn.get("state") in COMPLETED or (epoch >= 0 and int(txn.get("epoch", -1)) != epoch):
            return txn
        if time.monotonic() > deadline:
            raise Timeout(
                f"transaction {transactional_id!r}: its markers are still being written "
                f"({txn.get('state')}); a partition may have no leader"
            )
        await asyncio.sleep(0.02)


async def list_transactions(
    router: Router, states: Sequence[str] = (), min_age_ms: int = -1
) -> list[dict[str, Any]]:
    """The transactions the coordinator knows (those one may describe)."""
    request = api.TransactionRequest(
        "list", states=list(states), min_age_ms=min_age_ms, leader_only=True
    )
    response = await ask(router, request)
    if response.unknown_states:
        raise InvalidRequest(
            f"no transaction state {', '.join(response.unknown_states)} (states: "
            "Empty, Ongoing, PrepareCommit, PrepareAbort, CompleteCommit, CompleteAbort)"
        )
    return response.transactions


async def describe_transaction(router: Router, transactional_id: str) -> dict[str, Any]:
    request = api.TransactionRequest("describe", transactional_id)
    return (await ask(router, request)).transaction


async def abort_transaction(router: Router, transactional_id: str, wait: bool) -> dict[str, Any]:
    """End a hanging transaction (KIP-664's abort): the coordinator aborts it at a new epoch,
    which fences its producer, and writes the ABORT markers; wait: until they are all in."""
    request = api.TransactionRequest("abort", transactional_id)
    txn = (await ask(router, request)).transaction
    if wait:
        txn = await completed(router, transactional_id)
    return txn


async def describe_producers(router: Router, topic: str, partition: int) -> list[dict[str, Any]]:
    """A partition's producers, as its leader keeps them (Kafka's DescribeProducers): each's
    producer_id, producer_epoch, last_sequence, last_timestamp_ms, coordinator_epoch and
    txn_start_offset, the first offset of its open transaction there (-1: none)."""
    request = api.ProducersRequest("describe", topic, partition)
    header, _ = await router.to_leader(topic, partition, ApiKey.PRODUCERS, request)
    return api.decode(api.ProducersResponse, header).producers


class Transaction:
    """The blocking face of an AsyncTransaction (Client.transaction), run on the client's
    event-loop thread."""

    def __init__(self, inner: AsyncTransaction, run: Callable[[Awaitable[Any]], Any]) -> None:
        self._inner = inner
        self._run = run

    @property
    def transactional_id(self) -> str:
        return self._inner.transactional_id

    @property
    def producer_id(self) -> int:
        return self._inner.producer_id

    @property
    def epoch(self) -> int:
        return self._inner.epoch

    @property
    def state(self) -> str:
        return self._inner.state

    def __enter__(self) -> Transaction:
        self.begin()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._run(self._inner.__aexit__(kind, exc, tb))

    def begin(self) -> None:
        self._run(self._inner.begin())

    def produce(
        self,
        topic: str,
        records: Sequence[ProducerRecord | bytes],
        partition: int | None = None,
        timeout_ms: int = 30_000,
    ) -> ProduceResult:
        result: ProduceResult = self._run(
            self._inner.produce(topic, records, partition, timeout_ms)
        )
        return result

    def commit_cursor(self, name: str, positions: dict[int, int], topic: str | None = None) -> None:
        self._run(self._inner.commit_cursor(name, positions, topic))

    def commit(self, wait: bool = True) -> None:
        self._run(self._inner.commit(wait))

    def abort(self, wait: bool = True) -> None:
        self._run(self._inner.abort(wait))
