"""The node core: replica groups (replication, storage, cleaner, metadata) and the typed
operations every listener translates its requests into.

Two entries, each passing `Access.authorize` first:

    handle(principal, request, payload)   a client request (a dataclass of protocol.api):
                                          its answer, an awaitable of it, or None (acks=0)
    on_peer_message(principal, api, header, payload)
                                          a one-way replication or cursor-invalidation message
                                          from an authenticated peer; its sender is the node
                                          id the peer channel's handshake proved, never a field
                                          of the message

The core owns no socket: it reaches other nodes through the `send_to_peer` function the node
gives it (the peer channel's outbound links).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tidelog import formats
from tidelog.acls import Resource
from tidelog.config import TopicConfig
from tidelog.errors import (
    InvalidRequest,
    UnsupportedApi,
)
from tidelog.features import FEATURE, build_range
from tidelog.invariant import InvariantBroken
from tidelog.logs import event
from tidelog.node.access import Access, Operation, Principal
from tidelog.node.archiver import Archiver
from tidelog.node.asking import NodeAsker
from tidelog.node.background import BackgroundTasks
from tidelog.node.cleaner import Cleaner
from tidelog.node.cluster_view import ClusterView, disk_usage
from tidelog.node.config import NodeConfig
from tidelog.node.failstop import FailStop
from tidelog.node.feature_levels import FeatureLevels
from tidelog.node.flusher import Flusher
from tidelog.node.login_guard import LoginGuard
from tidelog.node.metadata_log import MetadataLog
from tidelog.node.metrics import Counters, Histograms, RequestMetrics
from tidelog.node.ops.cluster_admin import ClusterAdmin
from tidelog.node.ops.cursors import CursorOps
from tidelog.node.ops.data import DataOps
from tidelog.node.ops.features import FeatureOps
from tidelog.node.ops.metadata_answer import MetadataAnswers
from tidelog.node.ops.producers import ProducerOps, producers_scope
from tidelog.node.ops.security import Security
from tidelog.node.ops.stable_offsets import LeaderStableOffsets
from tidelog.node.ops.topic_admin import TopicAdmin
from tidelog.node.ops.transactions import TransactionOps, transaction_scope
from tidelog.node.partition import PartitionHost
from tidelog.node.peer_directories import PeerDirectories
from tidelog.node.peer_liveness import PeerLiveness
from tidelog.node.quotas import (
    ADMIN_REQUEST_RATE,
    CONSUMER_BYTE_RATE,
    DEFAULT_ENTITY,
    PRODUCER_BYTE_RATE,
    Quotas,
)
from tidelog.node.registry import NodeRegistry
from tidelog.node.replica_groups import ReplicaGroups
from tidelog.node.state_machine import Machine, MetadataMachine
from tidelog.node.topics import TopicReplicas
from tidelog.node.transaction_coordinator import TransactionCoordinator
from tidelog.node.transport import PeerSender
from tidelog.node.turns import Turns
from tidelog.protocol import api
from tidelog.protocol.api import ApiKey
from tidelog.protocol.peer_batch import decode_peer_batch
from tidelog.protocol.replication_codec import decode_message, encode_message
from tidelog.replication.clock import MonotonicClock
from tidelog.replication.liveness import Liveness
from tidelog.replication.messages import Message
from tidelog.replication.metadata import (
    METADATA_GROUP,
    METADATA_TOPIC,
    MetadataState,
)
from tidelog.replication.metadata_commands import MetadataCommand
from tidelog.replication.replica_state import NO_LEADER
from tidelog.storage.identity import DirectoryIdentity
from tidelog.storage.quorum_journal import FORMAT as QUORUM_JOURNAL_FORMAT
from tidelog.storage.quorum_journal import QuorumJournal
from tidelog.version import __version__

log = logging.getLogger(__name__)


Result = Any  # an api response, (response, payload), an awaitable of either, or None
Handler = Callable[[Any, bytes], Result]
# What a request does, to which resource (and for principals' tokens, whose): for Access.
Scope = Callable[[Any], tuple[Operation, Resource, str]]


# What each request costs against its principal's quotas (node/quotas.py); the byte rates are
# charged by the bytes produced and fetched, admin requests one each (but their reads are free).
QUOTA_CHARGES: dict[type[Any], str] = {
    api.ProduceRequest: PRODUCER_BYTE_RATE,
    api.FetchRequest: CONSUMER_BYTE_RATE,
    **dict.fromkeys(
        (
            api.CreateTopicRequest,
            api.DeleteTopicRequest,
            api.AlterTopicRequest,
            api.CreatePartitionsRequest,
            api.ReassignPartitionRequest,
            api.DeleteRecordsRequest,
            api.ElectLeadersRequest,
            api.AddNodeRequest,
            api.RemoveNodeRequest,
            api.CursorRequest,
            api.PrincipalsRequest,
            api.AclsRequest,
            api.QuotasRequest,
            api.ArchiveRequest,
            api.FeaturesRequest,
            api.ProducersRequest,
        ),
        ADMIN_REQUEST_RATE,
    ),
}
UNCHARGED_OPS = ("list", "describe", "commit")  # reads, and consumers' commits, are not admin


def on_topic(operation: Operation, field: str) -> Scope:
    return lambda request: (operation, Resource.topic(str(getattr(request, field))), "")


def on_cluster(operation: Operation) -> Scope:
    return lambda request: (operation, Resource.cluster(), "")


def archive_scope(req: api.ArchiveRequest) -> tuple[Operation, Resource, str]:
    return (Operation.DESCRIBE if req.op == "describe" else Operation.ALTER), Resource.cluster(), ""


def features_scope(req: api.FeaturesRequest) -> tuple[Operation, Resource, str]:
    return (Operation.DESCRIBE if req.op == "describe" else Operation.ALTER), Resource.cluster(), ""


def principal_scope(req: api.PrincipalsRequest) -> tuple[Operation, Resource, str]:
    return Operation.PRINCIPAL, Resource.cluster(), "" if req.op == "list" else req.name


CHECKS_EVERY_S = 0.1


class NodeCore:
    def __init__(
        self,
        config: NodeConfig,
        send_to_peer: PeerSender,
        describe_listeners: Callable[[], dict[str, Any]] = dict,
    ) -> None:
        self.config = config
        self.node_id = config.node_id
        self.send_to_peer = send_to_peer
        self.describe_listeners = describe_listeners
        self.access = Access(
            config.authorization,
            config.all_super_users,
            lambda: self.security.parsed_acls(),
            lambda name: name in self.metadata.principals,
        )
        self.counters = Counters()
        self.histograms = Histograms()
        self._request_metrics: dict[tuple[str, int | str], RequestMetrics] = {}
        self.quotas = Quotas(self._quota_limits)
        # Requests to other nodes' client listeners.
        self.asker = NodeAsker(lambda: self.registry.nodes(), config.tls_dialing)
        self.background = BackgroundTasks()
        self.fail_stop = FailStop(config.node_id)
        # The replica groups and their clock, kept as deadlines (node/replica_groups.py).
        self.clock = MonotonicClock(config.tick_ms / 1000, time.monotonic)
        self.groups = ReplicaGroups(
            self.clock,
            self.counters,
            self.histograms,
            self.fail_stop,
            lambda: self.config.checkpoint_interval_ms / 1000,
        )
        self.hosts = self.groups.hosts  # shared with the helpers below
        # One heartbeat per pair of nodes tells quiesced replica groups who is alive
        # (replication/liveness.py); a new incarnation at every start.
        election_ticks = config.ticks(config.election_timeout_ms)
        self.liveness = Liveness(
            config.node_id,
            random.getrandbits(62),
            self.clock,
            max(1, election_ticks // 4),
            election_ticks,
        )
        self._make_metadata_helpers(send_to_peer)
        self.peer_port = -1  # set by the node once its peer channel listens
        self.kafka_address = ""  # HOST:PORT its Kafka listener advertises, once it listens
        self._flusher: Flusher | None = None
        self.quorum_journal: QuorumJournal | None = None
        self._tasks: list[asyncio.Task[None]] = []
        # A principal renewed or removed: the listeners end its sessions (node/server.py).
        self.on_principal_changed: Callable[[str], None] = lambda name: None
        self.identity = DirectoryIdentity("", config.node_id, "")  # the Node sets it at start
        # Each peer's data directory, first seen and current (node/peer_directories.py).
        self.directories = PeerDirectories(lambda: self.config.data_dir, self.counters)
        self._make_request_handlers()
        self._handlers = self._handler_table()
        # What the listeners over the core read of the cluster, read-only (node/cluster_view.py).
        self.view = ClusterView(
            node_id=self.node_id,
            config=lambda: self.config,
            identity=lambda: self.identity,
            metadata=self.metadata_log,
            hosts=self.hosts,
            registry=self.registry,
            liveness=self.liveness,
            features=self.features,
            cleaner=self.cleaner,
            archiver=self.archiver,
            log_start_offset=self.data.log_start_offset,
            stored_bytes=self.stored_bytes,
            counters=self.counters,
            histograms=self.histograms,
        )

    def _make_metadata_helpers(self, send_to_peer: PeerSender) -> None:
        """The metadata log's side of the node, and the helpers that act on what it says."""
        # The metadata log's first voters: --peers, or for a node that joined a running cluster
        # what its metadata leader said (the Node sets it before start).
        self.initial_voters = self.config.voters
        self.on_nodes_changed: Callable[[], None] = lambda: None  # the peer channel follows
        self.joined = False  # the Node sets it: this node joined a running cluster (--join)
        self.metadata_machine = MetadataMachine(
            lambda name: self.topics.on_topic_changed(name),
            lambda state: self.topics.on_reset(state),
            lambda: self.on_nodes_changed(),
            lambda name: self.on_principal_changed(name),
            lambda command: self.features.on_applied(command),
        )
        self.metadata_log = MetadataLog(
            self.config.node_id, self.hosts, self.metadata_machine, send_to_peer, self.background
        )
        self.topics = TopicReplicas(
            self.metadata_log,
            self.hosts,
            lambda: self.config,
            self.open_host,
            lambda topic: self.metadata_answers.forget(topic),
            self.counters,
        )
        self.registry = NodeRegistry(
            self.metadata_log, lambda: self.config, lambda: self.on_nodes_changed()
        )
        # The feature levels this node supports, those its peers announce, the cluster's
        # finalized level and its one hook, `features.subscribe` (node/feature_levels.py).
        self.features = FeatureLevels(
            self.config.node_id,
            build_range(self.config.feature_max_level),
            self.metadata_log,
            self.registry,
            self.liveness,
            self.fail_stop,
        )
        # Kafka transactions: the coordinator (on the metadata leader) and a partition leader's
        # markers (node/transaction_coordinator.py).
        self.transactions = TransactionCoordinator(
            self.config.node_id,
            self.metadata_log,
            self.hosts,
            send_to_peer,
            lambda: self.features.finalized,
            self.background,
            self.counters,
            lambda: self.config.transactional_id_expiration_ms,
        )
        self.peer_liveness = PeerLiveness(
            self.liveness,
            self.clock,
            lambda: self.registry.peer_nodes(),
            send_to_peer,
            self.groups,
            self.counters,
            self.features.announcement,
            self.features.on_heartbeat,
        )
        self.metadata_answers = MetadataAnswers(
            self.config.node_id, self.metadata_log, self.registry, self.hosts
        )
        self.topic_admin = TopicAdmin(self.metadata_log, self.registry, lambda: self.config)
        self.archiver = (
            Archiver(
                self.metadata_log,
                self.hosts,
                self.counters,
                lambda: self.identity.cluster_id,
                self.config.archive,
                self.config.archive_endpoint,
                lambda: self.features.finalized,
            )
            if self.config.archive
            else None
        )
        self.cleaner = Cleaner(self.metadata_log, self.hosts, self.archiver)

    def _make_request_handlers(self) -> None:
        """The request handlers by concern (node/ops/), each given what it uses."""
        self.data = DataOps(
            self.node_id,
            self.metadata_log,
            self.hosts,
            self.cleaner,
            self.archiver,
            self.counters,
            self.stored_bytes,
            lambda: self.config,
        )
        stable_offsets = LeaderStableOffsets(
            self.node_id, self.metadata_log, self.hosts, self.asker
        )
        self.cursor_ops = CursorOps(
            self.metadata_log,
            self.access,
            self.data.check_cursor,
            stable_offsets.last_stable_offset,
        )
        self.security = Security(
            self.node_id,
            self.metadata_log,
            self.access,
            LoginGuard(),
            self.asker,
            lambda: self.config,
        )
        self.cluster_admin = ClusterAdmin(
            self.node_id,
            self.metadata_log,
            self.registry,
            self.hosts,
            self.archiver,
            lambda: self.identity,
            self.directories.current,
            self.features,
        )
        self.feature_ops = FeatureOps(self.node_id, self.metadata_log, self.features)
        self.transaction_ops = TransactionOps(
            self.metadata_log,
            self.access,
            lambda: self.features.finalized,
            lambda: self.config.transaction_max_timeout_ms,
            self.cursor_ops.as_principal,
        )
        self.producer_ops = ProducerOps(
            self.node_id,
            self.metadata_log,
            self.data.leader,
            self.transactions,
            lambda: self.config.transaction_max_timeout_ms,
        )

    def _handler_table(self) -> dict[type[Any], tuple[Handler, Scope]]:
        """Request type -> (its handler, what it does to which resource: for Access)."""
        return {
            api.ProduceRequest: (self.data.produce, on_topic(Operation.WRITE, "topic")),
            api.FetchRequest: (self.data.fetch, on_topic(Operation.READ, "topic")),
            api.ListOffsetsRequest: (self.data.list_offsets, on_topic(Operation.READ, "topic")),
            api.MetadataRequest: (
                self.metadata_answers.metadata_request,
                on_cluster(Operation.DESCRIBE),
            ),
            api.CreateTopicRequest: (
                self.topic_admin.create_topic,
                on_topic(Operation.CREATE, "name"),
            ),
            api.DeleteTopicRequest: (
                self.topic_admin.delete_topic,
                on_topic(Operation.DELETE, "name"),
            ),
            api.AlterTopicRequest: (
                self.topic_admin.alter_topic,
                on_topic(Operation.ALTER, "name"),
            ),
            api.CreatePartitionsRequest: (
                self.topic_admin.create_partitions,
                on_topic(Operation.ALTER, "name"),
            ),
            api.ReassignPartitionRequest: (
                self.topic_admin.reassign_partition,
                on_topic(Operation.ALTER, "topic"),
            ),
            api.StatusRequest: (self._status, on_cluster(Operation.DESCRIBE)),
            api.ApiVersionsRequest: (self._api_versions, on_cluster(Operation.CONNECT)),
            api.CursorRequest: (self.cursor_ops.cursor, self.cursor_ops.scope),
            api.DeleteRecordsRequest: (
                self.data.delete_records,
                on_topic(Operation.DELETE, "topic"),
            ),
            api.TableRequest: (self.data.table, on_topic(Operation.READ, "topic")),
            api.ElectLeadersRequest: (
                self.cluster_admin.elect_leaders,
                on_topic(Operation.ALTER, "topic"),
            ),
            api.DescribeClusterRequest: (
                self.cluster_admin.describe_cluster,
                on_cluster(Operation.DESCRIBE),
            ),
            api.AddNodeRequest: (self.cluster_admin.add_node, on_cluster(Operation.ALTER)),
            api.RemoveNodeRequest: (self.cluster_admin.remove_node, on_cluster(Operation.ALTER)),
            api.PrincipalsRequest: (self.security.principals, principal_scope),
            api.AuthenticateRequest: (self.security.authenticate, on_cluster(Operation.CONNECT)),
            api.AclsRequest: (self.security.acls, on_cluster(Operation.GRANT)),
            api.QuotasRequest: (self.security.quotas, on_cluster(Operation.GRANT)),
            api.ArchiveRequest: (self.cluster_admin.archive, archive_scope),
            api.FeaturesRequest: (self.feature_ops.features_request, features_scope),
            api.TransactionRequest: (self.transaction_ops.without_principal, transaction_scope),
            api.ProducersRequest: (self.producer_ops.producers, producers_scope),
        }

    def _write_formats_of(self, level: int) -> None:
        """Write the formats of the cluster's finalized feature level (formats.py): the quorum
        journal first, whose format record tidelog 0.1.0 refuses, and every other file only once
        that record is on disk, so an old binary put back on this data stops before it can
        misread a file it would take for damaged."""
        journal = self.quorum_journal
        if journal is None or level <= formats.write_level():
            return

        def done(error: BaseException | None) -> None:
            if error is not None:
                log.error(
                    "feature level %d: the quorum journal was not rewritten: %s", level, error
                )
                return
            if level > formats.write_level():
                formats.set_write_level(level)
                log.info("writing the formats of feature level %d", level)

        journal.upgrade(done, formats.write_version(QUORUM_JOURNAL_FORMAT, level))

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._flusher = Flusher(self.config.flush_threads, loop, f"flush-{self.node_id}")
        # Every replica's epoch and vote, synced together (storage/quorum_journal.py)
        self.quorum_journal = QuorumJournal(self.config.data_dir, self._flusher.submit)
        metadata_config = TopicConfig(
            segment_bytes=self.config.metadata_segment_bytes,
            retention_ms=-1,
            snapshot_entries=self.config.metadata_snapshot_entries,
            snapshot_catchup_entries=max(1, self.config.metadata_snapshot_entries // 2),
        )
        # No metadata log yet, in a cluster this node did not join: a new cluster's, whose
        # first leader finalizes its feature level (node/feature_levels.py).
        new_log = not (self.config.data_dir / f"{METADATA_TOPIC}-0").exists() and not self.joined
        metadata = self.open_host(
            METADATA_TOPIC, 0, self.initial_voters, metadata_config, self.metadata_machine
        )
        # A node that does not support the cluster's finalized level is refused here, with the
        # metadata log's committed records applied.
        self.features.check_at_start(new_log)
        self.features.subscribe(self._write_formats_of)
        self.topics.sweep()
        if metadata.replica.epoch == 0 and self.node_id == min(self.initial_voters):
            metadata.replica.campaign()  # a new cluster need not wait out an election timeout
            metadata.process_ready()
        self._tasks.append(loop.create_task(self.groups.tick_loop()))
        self._tasks.append(loop.create_task(self.peer_liveness.run()))
        self._tasks.append(loop.create_task(self.groups.checkpoint_loop()))
        self._tasks.append(loop.create_task(self.cleaner.run()))
        self._tasks.append(loop.create_task(self._checks_loop()))
        self._tasks.append(loop.create_task(self.transactions.run()))
        if self.archiver is not None:
            self._tasks.append(loop.create_task(self.archiver.run()))
        # The partitions the metadata gives this node open in a task that takes turns (the
        # listeners and the peer channel answer meanwhile); start returns once they are open.
        await self.topics.settled()

    def halt(self) -> None:
        """Stop at once after a fail-stop: no more ticks, flushes or checkpoints."""
        for task in self._tasks:
            task.cancel()
        self.background.cancel_all()
        self.groups.halt()
        if self._flusher is not None:
            self._flusher.shutdown()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        self.background.cancel_all()
        await self.groups.close()
        if self._flusher is not None:
            self._flusher.shutdown()
        if self.quorum_journal is not None:
            self.quorum_journal.close()
        self.asker.close()

    async def hand_over_leaderships(self, timeout_s: float, cut_short: asyncio.Event) -> None:
        """A controlled shutdown (Kafka's controlled.shutdown.enable): before the node stops,
        every replica group it leads, the metadata log's too, hands its leadership to an in-sync
        replica (Replica.hand_over), so that clients wait for a hand-over (milliseconds) rather
        than an election timeout. Waits while any hand-over is under way, at most timeout_s or
        until cut_short is set (a second SIGTERM); a group with nobody in sync to take it over
        is not waited for. Logs how many leaderships went over, and how long that took."""
        started = time.monotonic()
        led = [host for host in self.hosts.values() if host.replica.is_leader]
        asked: set[str] = set()  # (a group opened meanwhile is asked too: it never stands)
        while True:
            under_way = 0
            turns = Turns()
            for group, host in list(self.hosts.items()):
                if host.closed:
                    continue
                if group not in asked:
                    asked.add(group)
                    host.driver.hand_over()
                under_way += host.replica.handing_over
                await turns.take()
            left = started + timeout_s - time.monotonic()
            if not under_way or left <= 0 or cut_short.is_set():
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(cut_short.wait(), min(left, self.config.tick_ms / 1000))
        handed = sum(1 for h in led if h.replica.leader_id not in (NO_LEADER, self.node_id))
        took = time.monotonic() - started
        event(
            log,
            logging.INFO if not under_way else logging.WARNING,
            "controlled_shutdown",
            f"node {self.node_id} handed {handed} of {len(led)} leaderships over in {took:.3f} s"
            + (f" ({under_way} still under way, cut short)" if under_way else ""),
            led=len(led),
            handed_over=handed,
            seconds=round(took, 3),
            still_under_way=under_way,
        )

    def peer_connection_lost(self, peer: int) -> None:
        self.peer_liveness.connection_lost(peer)

    async def _checks_loop(self) -> None:
        """Often: moves this node has walked to their target are reported, and the registry
        walks the metadata log's group towards its voters (a lost report is made again)."""
        while True:
            await asyncio.sleep(CHECKS_EVERY_S)
            self.topics.check_moves()
            self.registry.check()
            self.features.check()

    def stored_bytes(self) -> int:
        return self.groups.stored_bytes()

    def log_start_offset(self, host: PartitionHost) -> int:
        """The partition's earliest readable offset (the archive's start, if it holds more)."""
        return self.data.log_start_offset(host)

    @property
    def login_guard(self) -> LoginGuard:
        """Failed logins, per address and name, on every listener (node/login_guard.py)."""
        return self.security.login_guard

    def track(self, task: asyncio.Task[Any]) -> None:
        """Keep a background task alive until it finishes (and cancel it on stop)."""
        self.background.track(task)

    @property
    def flusher(self) -> Flusher:
        if self._flusher is None:
            raise InvariantBroken("the node is not started")
        return self._flusher

    # -- replica groups -------------------------------------------------------------------------

    def open_host(
        self,
        topic: str,
        partition: int,
        voters: tuple[int, ...],
        config: TopicConfig,
        machine: Machine | None = None,
        topic_id: int = -1,
    ) -> PartitionHost:
        directory = self.config.data_dir / f"{topic}-{partition}"
        host = PartitionHost(
            topic,
            partition,
            voters,
            config,
            self.config,
            directory,
            self.flusher,
            self._send_replication,
            on_high_watermark=self._on_high_watermark,
            machine=machine,
            on_roll=self.cleaner.request,
            on_invalidate=self.cleaner.on_cursor_past_cap,
            counters=self.counters,
            fsync_seconds=self.histograms.get("tidelog_fsync_seconds"),
            directory_id=self.identity.directory_id,
            known_directories=self.directories.first,
            topic_id=topic_id,
            clock=self.clock,
            on_leader_known=self.metadata_answers.leader_known,
            liveness=self.liveness if self.config.quiesce else None,
            journal=self.quorum_journal,
        )
        self.cleaner.watch(host)
        if host.recovery.truncated_bytes or host.recovery.removed_segments:
            event(
                log,
                logging.WARNING,
                "recovered_truncated",
                f"{host.group}: recovered with truncation: {host.recovery}",
                topic=topic,
                partition=partition,
                truncated_bytes=host.recovery.truncated_bytes,
                removed_segments=host.recovery.removed_segments,
            )
        self.groups.add(host)
        self.metadata_answers.leader_known(
            host
        )  # a single replica led from its first step: no change to see
        self.cleaner.scrub_later(host)
        host.process_ready()
        return host

    def replaced_peers(self) -> list[int]:
        admitted = self.metadata_host.replica.directories if METADATA_GROUP in self.hosts else {}
        return self.directories.replaced(admitted)

    def _send_replication(self, to: int, group: str, message: Message) -> None:
        header, records = encode_message(group, message)
        host = self.hosts.get(group)
        if host is not None and host.topic_id >= 0:
            header["topic_id"] = host.topic_id
        self.send_to_peer(to, ApiKey.REPLICATION, header, records)

    def on_peer_message(
        self, principal: Principal, key: int, header: dict[str, Any], payload: bytes
    ) -> None:
        """A one-way message on an authenticated peer connection. Its sender is the
        connection's node id; the core drops messages whose own identity fields disagree."""
        self.access.authorize(
            principal, Operation.REPLICATE, Resource.topic(str(header.get("group", "")))
        )
        sender = principal.peer_id
        if sender is None:
            raise InvariantBroken("sender is not None")
        self.liveness.heard_from(sender)
        if key == ApiKey.REPLICATION:
            group, message = decode_message(header, payload)
            host = self.hosts.get(group)
            # Not (yet) a replica of that group here, or one of another incarnation of the
            # topic's name (deleted and created again; one side has not applied it yet): the
            # two must never count each other's votes or logs. The sender retries.
            if host is not None and header.get("topic_id", host.topic_id) == host.topic_id:
                host.step(sender, message, principal.directory_id)
        elif key == ApiKey.CURSOR:
            self.cleaner.on_invalidate_message(header, sender)
        elif key == ApiKey.REASSIGNMENT:
            self.topics.on_moved_message(header, sender)
        elif key == ApiKey.ARCHIVE_REPORT:
            if self.archiver is not None:
                self.archiver.on_report_message(header, sender)
        elif key == ApiKey.TXN_MARKERS:
            self.transactions.on_markers(header, sender)
        elif key == ApiKey.TXN_MARKERS_DONE:
            self.transactions.on_markers_done(header, sender)
        elif key == ApiKey.LIVENESS:
            self.peer_liveness.on_heartbeat(sender, header)
        elif key == ApiKey.PEER_BATCH:
            for inner, inner_header, inner_payload in decode_peer_batch(header, payload):
                self.on_peer_message(principal, inner, inner_header, inner_payload)
        else:
            raise InvalidRequest(f"unknown one-way message api {key}")

    def _on_high_watermark(self, host: PartitionHost) -> None:
        self.groups.high_watermark_moved(host)
        if host.group == METADATA_GROUP:
            self.metadata_log.release_waiters()

    # -- metadata -------------------------------------------------------------------------------

    @property
    def metadata(self) -> MetadataState:
        return self.metadata_log.state

    @property
    def metadata_host(self) -> PartitionHost:
        return self.metadata_log.host

    def metadata_behind(self) -> str:
        return self.metadata_log.behind()

    def require_started(self) -> None:
        self.metadata_log.require_started()

    async def propose_metadata(self, command: MetadataCommand, timeout_s: float) -> int:
        return await self.metadata_log.propose(command, timeout_s)

    # -- the client entry -----------------------------------------------------------------------

    def request_metrics(self, listener: str, request: int | str) -> RequestMetrics:
        """A listener's figures for one request type (tidelog's api key, or a name)."""
        found = self._request_metrics.get((listener, request))
        if found is None:
            name = request
            if isinstance(request, int):
                try:
                    name = ApiKey(request).name.lower()
                except ValueError:
                    name = str(request)
            found = RequestMetrics(self.counters, self.histograms, listener, str(name))
            self._request_metrics[(listener, request)] = found
        return found

    def request_type(self, key: int) -> type[Any]:
        """The typed request an api key carries (UnsupportedApi for one the core does not
        serve to clients)."""
        try:
            request_type = api.REQUEST_TYPES[ApiKey(key)]
        except (ValueError, KeyError):
            raise UnsupportedApi(f"api {key} is not supported", api=key) from None
        if request_type not in self._handlers:
            raise UnsupportedApi(f"api {key} is not supported", api=key)
        return request_type

    def handle(self, principal: Principal, request: Any, payload: bytes) -> Result:
        handler = self.authorize(principal, request)
        if isinstance(request, api.AuthenticateRequest) and not request.forwarded:
            return self.security.guarded_authenticate(principal.address, request, payload)
        if isinstance(request, api.CursorRequest):
            request = self.cursor_ops.as_principal(principal, request)
        if isinstance(request, api.TransactionRequest):
            return self.transaction_ops.handle(principal, request)
        quota = QUOTA_CHARGES.get(type(request))
        if quota == PRODUCER_BYTE_RATE:
            self.quotas.charge(principal.name, quota, len(payload))
        elif quota == ADMIN_REQUEST_RATE and getattr(request, "op", "") not in UNCHARGED_OPS:
            self.quotas.charge(principal.name, quota, 1)
        result = handler(request, payload)
        if (
            quota == CONSUMER_BYTE_RATE
            and isinstance(result, Awaitable)
            and CONSUMER_BYTE_RATE in self._quota_limits(principal.name)
        ):
            return self._charged_fetch(principal.name, result)
        return result

    async def _charged_fetch(self, principal: str, pending: Awaitable[Any]) -> Any:
        result = await pending
        records = result[1] if isinstance(result, tuple) else None
        if records is not None:
            self.quotas.charge(principal, CONSUMER_BYTE_RATE, records.size)
        return result

    def _quota_limits(self, principal: str) -> dict[str, float]:
        quotas = self.metadata.quotas
        if not quotas:
            return {}
        found = quotas.get(principal)
        return found if found is not None else quotas.get(DEFAULT_ENTITY, {})

    def authorize(self, principal: Principal, request: Any) -> Handler:
        """May principal make this request? (A listener that forwards a request to another
        node asks here first.) Its handler if so."""
        self.require_started()
        entry = self._handlers.get(type(request))
        if entry is None:
            raise UnsupportedApi(f"{type(request).__name__} is not a request the core serves")
        handler, scope = entry
        self.access.authorize(principal, *scope(request))
        if isinstance(request, api.ProduceRequest) and request.transactional_id:
            # A transactional produce uses its transactional id too (Kafka's WRITE on it).
            resource = Resource.transactional_id(request.transactional_id)
            self.access.authorize(principal, Operation.TRANSACTION, resource)
        return handler

    @property
    def api_keys(self) -> list[int]:
        return sorted(int(k) for k, t in api.REQUEST_TYPES.items() if t in self._handlers)

    # -- operations -----------------------------------------------------------------------------

    # -- the cluster's nodes (node/registry.py) --------------------------------------------------

    def _status(self, req: api.StatusRequest, payload: bytes) -> api.StatusResponse:
        limit = req.limit or api.STATUS_PAGE_DEFAULT
        if not 1 <= limit <= api.STATUS_PAGE_MAX:
            raise InvalidRequest(
                f"limit must be 1..{api.STATUS_PAGE_MAX} partitions, got {limit}", field="limit"
            )
        wanted = set(req.topics) if req.topics is not None else None
        after = (req.after_topic, req.after_partition)
        # The page and one more (to tell whether more follow), not every replica sorted.
        chosen = heapq.nsmallest(
            limit + 1,
            (
                ((host.topic, host.partition), host)
                for host in self.hosts.values()
                if (host.topic, host.partition) > after
                and (
                    (wanted is None and host.topic != METADATA_TOPIC)
                    or (wanted is not None and host.topic in wanted)
                )
            ),
        )
        partitions = []
        for _, host in chosen[:limit]:
            lwm = self.cleaner.cached_low_watermark(host)
            archive = self.archiver.status(host) if self.archiver is not None else None
            start = self.data.log_start_offset(host)
            partitions.append(host.status(lwm, start, archive).to_wire())
        mh = self.metadata_host
        metadata = {
            "leader": mh.replica.leader_id,
            "epoch": mh.replica.epoch,
            "voters": list(mh.replica.voters),
            "learners": list(mh.replica.learners),
            "applied_offset": self.metadata.applied_offset,
            "topics": len(self.metadata.topics),
            "cursors": len(self.metadata.cursors),
            "storage_bytes": self.stored_bytes(),
            "storage_max_bytes": self.config.storage_max_bytes,
            # tidelog/features.py: the cluster's level as this node applied it, and its range
            "features": {
                FEATURE: {
                    "finalized_level": self.features.finalized,
                    "supported": self.features.supported.to_wire(),
                }
            },
        }
        node = {
            **disk_usage(self.config.data_dir),
            "counters": self.counters.snapshot(),
            "authorization_denied": self.access.denied,
            "quota_throttled_answers": self.quotas.throttled_answers,
            "directory_id": self.identity.directory_id,
            "cluster_id": self.identity.cluster_id,
            "replaced_peers": self.replaced_peers(),
            **self.describe_listeners(),
        }
        return api.StatusResponse(self.node_id, partitions, metadata, node, len(chosen) > limit)

    def _api_versions(self, req: api.ApiVersionsRequest, payload: bytes) -> api.ApiVersionsResponse:
        return api.ApiVersionsResponse(
            self.node_id, __version__, self.api_keys, self.peer_port, self.kafka_address
        )
