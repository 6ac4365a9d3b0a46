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
import base64
import dataclasses
import heapq
import logging
import random
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from tidelog.acls import Resource
from tidelog.config import TopicConfig
from tidelog.errors import (
    ArchiveLost,
    CursorInvalidated,
    DuplicateSequence,
    InvalidRequest,
    NotAuthorized,
    NotLeader,
    OffsetOutOfRange,
    StorageFull,
    TidelogError,
    UnknownTopicOrPartition,
    UnsupportedApi,
    from_wire,
)
from tidelog.invariant import InvariantBroken
from tidelog.logs import event
from tidelog.node.access import Access, Listener, Operation, Principal
from tidelog.node.archiver import Archiver
from tidelog.node.asking import NodeAsker
from tidelog.node.background import BackgroundTasks
from tidelog.node.cleaner import Cleaner, wall_ms
from tidelog.node.config import NodeConfig
from tidelog.node.failstop import FailStop
from tidelog.node.flusher import Flusher
from tidelog.node.login_guard import LoginGuard
from tidelog.node.metadata_log import MetadataLog, PeerSender
from tidelog.node.metrics import Counters, Histograms, RequestMetrics
from tidelog.node.ops.cluster_admin import ClusterAdmin
from tidelog.node.ops.security import Security
from tidelog.node.ops.topic_admin import TopicAdmin
from tidelog.node.partition import PartitionHost
from tidelog.node.quotas import (
    ADMIN_REQUEST_RATE,
    CONSUMER_BYTE_RATE,
    DEFAULT_ENTITY,
    PRODUCER_BYTE_RATE,
    Quotas,
)
from tidelog.node.registry import NodeRegistry
from tidelog.node.replica_groups import ReplicaGroups
from tidelog.node.state_machine import Machine, MetadataMachine, TableMachine
from tidelog.node.topics import TopicReplicas
from tidelog.protocol import api
from tidelog.protocol.api import ApiKey
from tidelog.protocol.peer_batch import decode_peer_batch
from tidelog.protocol.replication_codec import decode_message, encode_message
from tidelog.record.validation import validate_produced
from tidelog.replication.clock import MonotonicClock
from tidelog.replication.directories import decode_directories
from tidelog.replication.liveness import Heartbeat, Liveness
from tidelog.replication.messages import Message
from tidelog.replication.metadata import (
    CURSOR_NAME,
    METADATA_GROUP,
    METADATA_TOPIC,
    MetadataState,
)
from tidelog.storage.checkpoint import read_checkpoint, write_checkpoint
from tidelog.storage.identity import DirectoryIdentity
from tidelog.storage.quorum_journal import QuorumJournal
from tidelog.storage.segment import BytesSlice
from tidelog.version import __version__

log = logging.getLogger(__name__)

STORAGE_FULL_LOG_EVERY_S = 10.0  # a refused produce is logged at most this often


PEER_DIRECTORIES_FILE = "peer-directories"
REQUEST_TIMEOUT_MS_MAX = 300_000

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
        # Each topic's metadata entry, built when asked after the topic changed (topics.py
        # forgets it) and kept current as its replicas learn leaders: a 10,000-partition
        # topic's entry is 10,000 leaders, and a failover changes thousands.
        self._metadata_cache: dict[str, dict[str, Any]] = {}
        # The metadata log's first voters: --peers, or for a node that joined a running cluster
        # what its metadata leader said (the Node sets it before start).
        self.initial_voters = config.voters
        self.on_nodes_changed: Callable[[], None] = lambda: None  # the peer channel follows
        self.metadata_machine = MetadataMachine(
            lambda name: self.topics.on_topic_changed(name),
            lambda state: self.topics.on_reset(state),
            lambda: self.on_nodes_changed(),
            lambda name: self.on_principal_changed(name),
        )
        self.metadata_log = MetadataLog(
            config.node_id, self.hosts, self.metadata_machine, send_to_peer, self.background
        )
        self.topics = TopicReplicas(
            self.metadata_log,
            self.hosts,
            lambda: self.config,
            self.open_host,
            self.forget_metadata_answer,
            self.counters,
        )
        self.registry = NodeRegistry(
            self.metadata_log, lambda: self.config, lambda: self.on_nodes_changed()
        )
        self.topic_admin = TopicAdmin(self.metadata_log, self.registry, lambda: self.config)
        self.archiver = (
            Archiver(
                self.metadata_log,
                self.hosts,
                self.counters,
                lambda: self.identity.cluster_id,
                config.archive,
                config.archive_endpoint,
            )
            if config.archive
            else None
        )
        self.cleaner = Cleaner(self.metadata_log, self.hosts, self.archiver)
        self.peer_port = -1  # set by the node once its peer channel listens
        self.kafka_address = ""  # HOST:PORT its Kafka listener advertises, once it listens
        self._flusher: Flusher | None = None
        self.quorum_journal: QuorumJournal | None = None
        self._tasks: list[asyncio.Task[None]] = []
        # A principal renewed or removed: the listeners end its sessions (node/server.py).
        self.on_principal_changed: Callable[[str], None] = lambda name: None
        self.identity = DirectoryIdentity("", config.node_id, "")  # the Node sets it at start
        # Each peer's data directory as first seen on the peer channel (durable): a replica
        # group that never recorded a voter's directory still knows the one it first had.
        self.peer_directories: dict[int, str] = {}
        self._initial_directories: dict[int, str] = {}  # from the cluster's format (durable)
        self.peer_current_directories: dict[int, str] = {}  # as their last handshake said
        self._lost_read_logged: dict[str, float] = {}
        self._storage_bytes = 0
        self._storage_checked = 0.0
        self._storage_full_logged = -STORAGE_FULL_LOG_EVERY_S
        self.security = Security(
            config.node_id,
            self.metadata_log,
            self.access,
            LoginGuard(),
            self.asker,
            lambda: self.config,
        )
        self.cluster_admin = ClusterAdmin(
            config.node_id,
            self.metadata_log,
            self.registry,
            self.hosts,
            self.archiver,
            lambda: self.identity,
            self.peer_current_directories,
        )
        # request type -> (handler, what it does to which resource)
        self._handlers: dict[type[Any], tuple[Handler, Scope]] = {
            api.ProduceRequest: (self._produce, on_topic(Operation.WRITE, "topic")),
            api.FetchRequest: (self._fetch, on_topic(Operation.READ, "topic")),
            api.ListOffsetsRequest: (self._list_offsets, on_topic(Operation.READ, "topic")),
            api.MetadataRequest: (self._metadata, on_cluster(Operation.DESCRIBE)),
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
            api.CursorRequest: (self._cursor, self._cursor_scope),
            api.DeleteRecordsRequest: (self._delete_records, on_topic(Operation.DELETE, "topic")),
            api.TableRequest: (self._table, on_topic(Operation.READ, "topic")),
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
        }

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
        metadata = self.open_host(
            METADATA_TOPIC, 0, self.initial_voters, metadata_config, self.metadata_machine
        )
        self.topics.sweep()
        if metadata.replica.epoch == 0 and self.node_id == min(self.initial_voters):
            metadata.replica.campaign()  # a new cluster need not wait out an election timeout
            metadata.process_ready()
        self._tasks.append(loop.create_task(self.groups.tick_loop()))
        self._tasks.append(loop.create_task(self._liveness_loop()))
        self._tasks.append(loop.create_task(self.groups.checkpoint_loop()))
        self._tasks.append(loop.create_task(self.cleaner.run()))
        self._tasks.append(loop.create_task(self._checks_loop()))
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

    async def _liveness_loop(self) -> None:
        """Heartbeats to every peer, and the replicas woken when a peer's liveness changes."""
        liveness = self.liveness
        while True:
            if liveness.heartbeat_due():
                heartbeat = liveness.heartbeat()
                header = {"node": heartbeat.node, "incarnation": heartbeat.incarnation}
                for peer in self.registry.peer_nodes():
                    if peer != self.node_id:
                        self.send_to_peer(peer, ApiKey.LIVENESS, header, None)
            self._liveness_changed()
            delay = self.clock.time_of(liveness.next_deadline()) - time.monotonic()
            await asyncio.sleep(max(delay, 0.001))
            # Let what the sockets hold be read first: a loop that woke late must not take a
            # peer for dead whose heartbeat waits unread.
            await asyncio.sleep(0)

    def _on_heartbeat(self, sender: int, header: dict[str, Any]) -> None:
        node, incarnation = header.get("node"), header.get("incarnation")
        if not isinstance(node, int) or not isinstance(incarnation, int):
            raise InvalidRequest("a liveness heartbeat needs integer node and incarnation")
        self.liveness.on_heartbeat(sender, Heartbeat(node, incarnation))
        self._liveness_changed()

    def peer_connection_lost(self, peer: int) -> None:
        """Our link to a peer closed (its kernel closed the socket: the process exited or is
        restarting; a partition closes nothing and waits for the liveness timeout)."""
        self.liveness.lost(peer)
        self._liveness_changed()

    def _liveness_changed(self) -> None:
        """Wake the replicas that share a group with a peer that came alive, died or
        restarted (a quiesced group learns of it only so)."""
        peers = self.liveness.changed()
        if not peers:
            return
        self.counters.inc("tidelog_peer_liveness_changes_total", len(peers))
        for peer in sorted(peers):
            alive = self.liveness.is_alive(peer)
            event(
                log,
                logging.INFO if alive else logging.WARNING,
                "peer_liveness",
                f"peer liveness: node {peer} is {'alive' if alive else 'not answering'}",
                node=peer,
                alive=alive,
                incarnation=self.liveness.incarnation(peer),
            )
        self.groups.nudge_groups_with(peers)

    async def _checks_loop(self) -> None:
        """Often: moves this node has walked to their target are reported, and the registry
        walks the metadata log's group towards its voters (a lost report is made again)."""
        while True:
            await asyncio.sleep(CHECKS_EVERY_S)
            self.topics.check_moves()
            self.registry.check()

    def stored_bytes(self) -> int:
        return self.groups.stored_bytes()

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
            known_directories=self.peer_directories,
            topic_id=topic_id,
            clock=self.clock,
            on_leader_known=self._leader_known,
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
        self._leader_known(host)  # a single replica led from its first step: no change to see
        self.cleaner.scrub_later(host)
        host.process_ready()
        return host

    def load_peer_directories(self) -> None:
        """What this node knows of its peers' directories: the initial ones it was formatted
        with, then the first seen on the peer channel."""
        self._initial_directories = decode_directories(self.identity.initial_directories)
        stored = read_checkpoint(self.config.data_dir / PEER_DIRECTORIES_FILE) or {}
        self.peer_directories.update(self._initial_directories)
        self.peer_directories.update({int(k): str(v) for k, v in stored.items()})

    def peer_directory_seen(self, node: int, directory: str) -> None:
        """A peer proved itself with this data directory. The first one is recorded (durably,
        before any of its messages is read); another one later means it lost its disk."""
        if not directory:
            return
        self.peer_current_directories[node] = directory
        first = self.peer_directories.get(node)
        if first is None:
            self.peer_directories[node] = directory
            write_checkpoint(
                self.config.data_dir / PEER_DIRECTORIES_FILE,
                {
                    str(n): d
                    for n, d in self.peer_directories.items()
                    if n not in self._initial_directories
                },
            )
        elif first != directory:
            self.counters.inc("tidelog_peer_directory_changes_total")
            log.warning(
                "node %d came back with another data directory (%s, first seen %s): it "
                "rejoins each partition as an observer until it holds what is committed",
                node,
                directory,
                first,
            )

    def replaced_peers(self) -> list[int]:
        """Peers that came back with a data directory the cluster's metadata log has not
        admitted (yet): replaced disks, catching up as observers."""
        admitted = self.metadata_host.replica.directories if METADATA_GROUP in self.hosts else {}
        out = []
        for node, current in sorted(self.peer_current_directories.items()):
            known = admitted.get(node) or self.peer_directories.get(node)
            if known is not None and known != current:
                out.append(node)
        return out

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
        elif key == ApiKey.LIVENESS:
            self._on_heartbeat(sender, header)
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

    async def propose_metadata(self, command: dict[str, Any], timeout_s: float) -> int:
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
            request = self._cursor_as(principal, request)
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

    def _cursor_as(self, principal: Principal, req: api.CursorRequest) -> api.CursorRequest:
        """What a cursor request may do beyond its topic's read permission (checked already):
        a cursor is its creator's; changing another's (commit, so rewind; delete; invalidate)
        needs read on the group of its name (Kafka's group ACL) or cluster admin, and a list
        shows positions only on topics one may read (describe already needs that)."""
        if req.op == "list":
            return dataclasses.replace(req, owner=principal.name)
        if req.op == "create":
            return dataclasses.replace(req, owner=principal.name)
        cursor = self.metadata.cursors.get(req.name)
        if cursor is None or not self.access.enforced or cursor.owner in ("", principal.name):
            return req
        group = cursor.name.split(":", 1)[0]  # a Kafka group's cursors: GROUP:TOPIC
        if req.op == "describe" or any(
            self.access.allows(principal, Operation.GROUP, Resource.group(name))
            for name in {cursor.name, group}
        ):
            return req
        if self.access.is_cluster_admin(principal):
            return req
        self.access.denied += 1
        raise NotAuthorized(
            f"{principal.name} may not {req.op} cursor {cursor.name!r}: {cursor.owner} created "
            f"it (grant read on group {group!r} to share it)",
            principal=principal.name,
            operation=Operation.GROUP.value,
            resource="group",
            resource_name=group,
        )

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
        return handler

    def _cursor_scope(self, req: api.CursorRequest) -> tuple[Operation, Resource, str]:
        """Cursors are read on their topic: to create, commit, describe, delete or invalidate
        one needs read on the topic it follows (as a Kafka group's offsets need read)."""
        if req.op == "list":
            return Operation.DESCRIBE, Resource.cluster(), ""
        topic = req.topic if req.op == "create" else self.metadata.cursor(req.name).topic
        return Operation.READ, Resource.topic(topic), ""

    @property
    def api_keys(self) -> list[int]:
        return sorted(int(k) for k, t in api.REQUEST_TYPES.items() if t in self._handlers)

    # -- operations -----------------------------------------------------------------------------

    def _host(self, topic: str, partition: int) -> PartitionHost:
        host = self.hosts.get(f"{topic}/{partition}")
        if host is not None and topic != METADATA_TOPIC:
            return host
        meta = self.metadata.topic(topic)
        if not 0 <= partition < meta.partitions:
            raise UnknownTopicOrPartition(
                f"topic {topic!r} has partitions 0..{meta.partitions - 1}, not {partition}",
                topic=topic,
                partition=partition,
            )
        raise NotLeader(
            f"node {self.node_id} holds no replica of {topic}/{partition}",
            leader_hint=meta.assignments[partition][0],
        )

    def _leader(self, topic: str, partition: int) -> PartitionHost:
        host = self._host(topic, partition)
        if not host.replica.is_leader:
            raise NotLeader(
                f"node {self.node_id} is not the leader of {host.group}",
                leader_hint=host.leader_hint,
            )
        return host

    @staticmethod
    def _timeout_s(timeout_ms: int) -> float:
        if not 0 <= timeout_ms <= REQUEST_TIMEOUT_MS_MAX:
            raise InvalidRequest(f"timeout_ms must be in [0, {REQUEST_TIMEOUT_MS_MAX}]")
        return timeout_ms / 1000

    def _produce(self, req: api.ProduceRequest, payload: bytes) -> Awaitable[Any] | None:
        if req.acks not in (api.ACKS_NONE, api.ACKS_LEADER, api.ACKS_ALL):
            raise InvalidRequest(f"acks must be 0, 1 or -1 (all), got {req.acks}")
        timeout_s = self._timeout_s(req.timeout_ms)
        host = self._leader(req.topic, req.partition)
        if req.acks == api.ACKS_ALL:
            host.replica.check_min_insync(host.config.min_insync_replicas)
        if host.flush_error is not None and host.log.needs_flush:
            raise host.flush_error
        self._check_storage_space()
        if self.archiver is not None:
            self.archiver.check_produce(host)
        try:
            batches = validate_produced(payload, host.batch_rules, wall_ms())
        except TidelogError as exc:
            self.counters.inc("tidelog_batches_refused_total", rule=str(exc.details.get("rule")))
            raise
        # Appended before any await: pipelined requests on a connection keep their order.
        try:
            info = host.replica.propose(batches)
        except DuplicateSequence as exc:
            # A replay of batches already in the log: answer as for the original, once the
            # original is as durable as acks asks (a retry must not learn of success sooner).
            return self._acknowledge(
                host,
                req,
                int(exc.details["base_offset"]),
                int(exc.details["last_offset"]),
                timeout_s,
                duplicate=True,
            )
        self._storage_bytes += len(payload)  # between recounts, count what we wrote
        try:
            host.process_ready()
            return self._acknowledge(host, req, info.first_offset, info.last_offset, timeout_s)
        except TidelogError as exc:  # the batch is in the log already: its fate is unknown
            raise from_wire({**exc.to_wire(), "appended": True}) from exc

    def _acknowledge(
        self,
        host: PartitionHost,
        req: api.ProduceRequest,
        base: int,
        last: int,
        timeout_s: float,
        duplicate: bool = False,
    ) -> Awaitable[Any] | None:
        if req.acks == api.ACKS_NONE:
            return None
        # Registered now, before anything else runs: a leadership lost from here on fails it.
        pending = host.wait_for_ack(last, req.acks, timeout_s)

        async def acknowledged() -> api.ProduceResponse:
            try:
                await pending
            except TidelogError as exc:
                # The batch is in this replica's log already: whether it survives is unknown.
                # (A copy: the same error object may be raised to other requests.)
                raise from_wire({**exc.to_wire(), "appended": True}) from exc
            return api.ProduceResponse(
                base, last, host.log.high_watermark, host.log.log_start_offset, duplicate
            )

        return acknowledged()

    def _check_storage_space(self) -> None:
        """storage.max.bytes: refuse writes (not reads, commits or cleaning) when it is passed,
        as etcd's NOSPACE alarm does; writes resume by themselves once cleaning frees space."""
        limit = self.config.storage_max_bytes
        if limit < 0:
            return
        now = time.monotonic()
        if now - self._storage_checked > 0.05:
            self._storage_bytes = self.stored_bytes()
            self._storage_checked = now
        if self._storage_bytes >= limit:
            if now - self._storage_full_logged > STORAGE_FULL_LOG_EVERY_S:
                self._storage_full_logged = now
                event(
                    log,
                    logging.WARNING,
                    "storage_full",
                    f"node {self.node_id}: produce refused: {self._storage_bytes} bytes stored, "
                    f"storage.max.bytes is {limit}",
                    stored_bytes=self._storage_bytes,
                    limit_bytes=limit,
                )
            raise StorageFull(
                f"node {self.node_id} stores {self._storage_bytes} bytes, storage.max.bytes is {limit}",
                stored_bytes=self._storage_bytes,
                limit_bytes=limit,
            )

    def _check_cursor(self, name: str, topic: str, partition: int) -> None:
        cursor = self.metadata.cursor(name)
        if not cursor.live:
            host = self.hosts.get(f"{topic}/{partition}")
            raise CursorInvalidated(
                f"cursor {name!r} was invalidated: {cursor.invalidated}",
                log_start=host.log.log_start_offset if host is not None else 0,
                reason=cursor.invalidated,
                cursor=name,
            )

    async def _fetch(self, req: api.FetchRequest, payload: bytes) -> Any:
        if req.max_bytes < 1 or req.min_bytes < 0:
            raise InvalidRequest("max_bytes must be >= 1 and min_bytes >= 0")
        if req.cursor:
            self._check_cursor(req.cursor, req.topic, req.partition)
        wait_s = self._timeout_s(req.max_wait_ms)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            host = self._host(req.topic, req.partition)
            replica = host.replica
            if not replica.is_leader and not req.replica_read:
                raise NotLeader(
                    f"node {self.node_id} is not the leader of {host.group}",
                    leader_hint=host.leader_hint,
                )
            hlog = host.log
            hw = hlog.high_watermark
            limit = (
                hlog.log_end_offset
                if replica.is_leader
                else max(hlog.log_end_offset, replica.leader_high_watermark)
            )
            if (
                req.offset < hlog.log_start_offset
                and self.archiver is not None
                and host.config.remote_storage_enable
            ):
                # Below the local log start: the archive serves it, on any replica.
                max_bytes = min(req.max_bytes, self.config.fetch_max_bytes)
                archived = await self.archiver.read(host, req.offset, max_bytes)
                if archived:
                    return self._fetch_answer(host, hw), BytesSlice(archived, req.offset)
            if req.offset < hlog.log_start_offset or req.offset > limit:
                start = self.log_start_offset(host)
                self._refuse_lost_range(host, req.offset, start, hw)
                raise OffsetOutOfRange(
                    f"offset {req.offset} is outside [{start}, {limit}] of {host.group}",
                    log_start=start,
                    high_watermark=hw,
                )
            # A client chooses max_bytes; the node bounds what one answer may hold in memory.
            max_bytes = min(req.max_bytes, self.config.fetch_max_bytes)
            records = hlog.read(req.offset, max_bytes, hw) if req.offset < hw else None
            remaining = deadline - loop.time()
            if (records is not None and records.size >= req.min_bytes) or remaining <= 0:
                return self._fetch_answer(host, hw), records
            await host.wait_for_change(remaining)

    def _refuse_lost_range(self, host: PartitionHost, offset: int, start: int, hw: int) -> None:
        """A read of what the archive's store lost is refused by name (ArchiveLost), never
        passed off as retention's doing."""
        if self.archiver is None or not host.config.remote_storage_enable:
            return
        lost = self.archiver.lost_range(host, offset)
        if lost is None:
            return
        if self._lost_read_logged.get(host.group, -1e9) < time.monotonic() - 10:
            self._lost_read_logged[host.group] = time.monotonic()
            log.warning(
                "%s: a reader asked for offset %d, in [%d, %d), which the archive %s lost",
                host.group,
                offset,
                *lost,
                self.archiver.url,
            )
        raise ArchiveLost(
            f"offset {offset} of {host.group} is in [{lost[0]}, {lost[1]}), which the archive "
            f"{self.archiver.url} lost; the log now starts at {start}",
            log_start=start,
            high_watermark=hw,
            lost_start=lost[0],
            lost_end=lost[1],
        )

    def _fetch_answer(self, host: PartitionHost, hw: int) -> api.FetchResponse:
        return api.FetchResponse(
            hw,
            self.log_start_offset(host),
            host.log.log_end_offset,
            host.replica.epoch,
            self.node_id,
            host.replica.is_leader,
            host.log.log_start_offset,
        )

    def log_start_offset(self, host: PartitionHost) -> int:
        """The whole log's first offset: the archive's when it holds what is below the local
        log start, else the local log start."""
        if self.archiver is None or not host.config.remote_storage_enable:
            return host.log.log_start_offset
        return self.archiver.log_start_offset(host)

    def _list_offsets(self, req: api.ListOffsetsRequest, payload: bytes) -> api.ListOffsetsResponse:
        host = self._host(req.topic, req.partition)
        if not host.replica.is_leader and not req.replica_read:
            raise NotLeader(f"not the leader of {host.group}", leader_hint=host.leader_hint)
        hlog = host.log
        hw = hlog.high_watermark
        start = self.log_start_offset(host)
        if req.spec == "earliest":
            offset = start
        elif req.spec == "earliest-local":
            offset = hlog.log_start_offset
        elif req.spec == "latest":
            offset = hw
        elif req.spec == "timestamp":
            found = hlog.offset_for_timestamp(req.timestamp_ms)
            offset = hw if found is None or found >= hw else found
        else:
            raise InvalidRequest(
                f"spec must be earliest, earliest-local, latest or timestamp, not {req.spec!r}"
            )
        return api.ListOffsetsResponse(offset, start, hw, hlog.log_start_offset)

    def forget_metadata_answer(self, topic: str) -> None:
        """The topic changed (or was deleted), or a replica of it left this node: its cached
        answer is built again when next asked."""
        self._metadata_cache.pop(topic, None)

    def _leader_known(self, host: PartitionHost) -> None:
        entry = self._metadata_cache.get(host.topic)
        if entry is not None and host.partition < len(entry["leaders"]):
            # In place. An answer still waiting in its connection (behind an earlier request's)
            # goes out with the newer leader: leaders are hints, and a newer one is better.
            entry["leaders"][host.partition] = host.replica.leader_id
            entry["leader_epochs"][host.partition] = host.replica.epoch

    def _metadata(self, req: api.MetadataRequest, payload: bytes) -> api.MetadataResponse:
        if req.leader_only:
            self.metadata_log.require_leader()
        names = req.topics if req.topics is not None else sorted(self.metadata.topics)
        topics: list[dict[str, Any]] = []
        for name in names:
            meta = self.metadata.topics.get(name)
            if meta is None:
                behind = self.metadata_behind()
                if behind:
                    # It may exist: this node does not know all that is committed. Retriable,
                    # and the client asks another node (a node back from a lost disk said
                    # "unknown topic" for one that existed while it caught up).
                    raise NotLeader(
                        f"node {self.node_id} does not know topic {name!r} yet: {behind}",
                        leader_hint=self.metadata_host.leader_hint,
                    )
                topics.append({"name": name, "error": UnknownTopicOrPartition().to_wire()})
                continue
            entry = self._metadata_cache.get(name)
            if entry is None:
                entry = meta.to_wire()
                del entry["initial_assignments"]  # the metadata log's own business
                # Two lists of numbers, not a dict per partition: a 10,000-partition answer is
                # a third of the bytes and a quarter of the time to encode and decode.
                known = [self._known_leader(name, p) for p in range(meta.partitions)]
                entry["leaders"] = [leader for leader, _ in known]
                entry["leader_epochs"] = [epoch for _, epoch in known]
                self._metadata_cache[name] = entry
            topics.append(entry)
        nodes = [
            {"node_id": n, "host": e.host, "port": e.port}
            for n, e in sorted(self.registry.nodes().items())
        ]
        return api.MetadataResponse(
            self.node_id, self.metadata_host.replica.leader_id, nodes, topics
        )

    def _known_leader(self, topic: str, partition: int) -> tuple[int, int]:
        """(leader, epoch) as this node's replica knows them; (-1, -1) without one."""
        host = self.hosts.get(f"{topic}/{partition}")
        if host is None:
            return -1, -1
        return host.replica.leader_id, host.replica.epoch

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
            start = self.log_start_offset(host)
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

    async def _cursor(self, req: api.CursorRequest, payload: bytes) -> api.CursorResponse:
        if req.op in ("list", "describe"):
            names = [req.name] if req.op == "describe" else sorted(self.metadata.cursors)
            listed = [self.metadata.cursor(n).to_wire() for n in names]
            if req.op == "list" and self.access.enforced:
                # Names are open (as Kafka's group names are to DESCRIBE); positions follow
                # read on the topic, as describe's do.
                asking = Principal(req.owner, Listener.CLIENT)
                for wire in listed:
                    topic = Resource.topic(str(wire["topic"]))
                    if not self.access.allows(asking, Operation.READ, topic):
                        wire["positions"] = {}
                        wire["positions_hidden"] = True
            return api.CursorResponse(listed)
        if not CURSOR_NAME.fullmatch(req.name):
            raise InvalidRequest(f"invalid cursor name {req.name!r}")
        if req.op == "create":
            return await self._create_cursor(req)
        cursor = self.metadata.cursor(req.name)
        if req.op == "commit":
            self._check_cursor(req.name, cursor.topic, 0)
            meta = self.metadata.topic(cursor.topic)
            positions = {int(p): o for p, o in req.positions.items()}
            for p, offset in positions.items():
                if not 0 <= p < meta.partitions or offset < 0:
                    raise InvalidRequest(
                        f"cursor {req.name!r}: no partition {p} or bad offset {offset}"
                    )
            command: dict[str, Any] = {
                "type": "commit_cursor",
                "name": req.name,
                "positions": positions,
            }
        elif req.op == "delete":
            command = {"type": "delete_cursor", "name": req.name}
        elif req.op == "invalidate":
            command = {
                "type": "invalidate_cursor",
                "name": req.name,
                "reason": req.reason or "by request",
            }
        else:
            raise InvalidRequest(f"unknown cursor op {req.op!r}")
        command["at_ms"] = wall_ms()
        await self.propose_metadata(command, 30.0)
        if req.op == "commit" and not self.metadata.cursor(req.name).live:
            self._check_cursor(req.name, cursor.topic, 0)  # invalidated meanwhile
        found = self.metadata.cursors.get(req.name)
        return api.CursorResponse([found.to_wire()] if found is not None else [])

    async def _create_cursor(self, req: api.CursorRequest) -> api.CursorResponse:
        existing = self.metadata.cursors.get(req.name)
        if existing is not None:
            if req.if_not_exists and existing.topic == req.topic:
                return api.CursorResponse([existing.to_wire()])
            raise InvalidRequest(f"cursor {req.name!r} already exists (on topic {existing.topic})")
        meta = self.metadata.topic(req.topic)
        positions = {int(p): o for p, o in req.positions.items()}
        partitions = set(range(meta.partitions))
        covered = (
            bool(positions) and set(positions) <= partitions
            if req.partial
            else set(positions) == partitions
        )
        if not covered or any(o < 0 for o in positions.values()):
            raise InvalidRequest(
                f"a cursor on {req.topic!r} needs a position for "
                + ("some of" if req.partial else "each of")
                + f" its {meta.partitions} partitions (and none other)"
            )
        command = {
            "type": "create_cursor",
            "name": req.name,
            "topic": req.topic,
            "positions": positions,
            "backup": req.backup,
            "owner": req.owner,
            "at_ms": wall_ms(),
        }
        await self.propose_metadata(command, 30.0)
        return api.CursorResponse([self.metadata.cursor(req.name).to_wire()])

    async def _delete_records(
        self, req: api.DeleteRecordsRequest, payload: bytes
    ) -> api.DeleteRecordsResponse:
        """Kafka's DeleteRecords: move the log start forward (never past the HW). A live cursor
        that still needs the range stops it, unless force, which invalidates that cursor."""
        host = self._leader(req.topic, req.partition)
        hw = host.log.high_watermark
        target = hw if req.before_offset == -1 else req.before_offset
        if not 0 <= target <= hw:
            raise OffsetOutOfRange(
                f"delete-records before {target}: must be in [0, HW {hw}] (-1 means the HW)",
                log_start=host.log.log_start_offset,
                high_watermark=hw,
            )
        in_the_way = [
            c
            for c in self.metadata.cursors.values()
            if c.live
            and c.topic == req.topic
            and c.positions.get(req.partition, target) < target
            and host.config.cursors_hold
        ]
        if in_the_way and not req.force:
            names = ", ".join(f"{c.name} at {c.positions[req.partition]}" for c in in_the_way)
            raise InvalidRequest(
                f"live cursors still need offsets below {target}: {names}; "
                "use --force to invalidate them",
                cursors=[c.name for c in in_the_way],
            )
        for cursor in in_the_way:
            reason = f"delete-records --force before offset {target} on {host.group}"
            event(
                log,
                logging.WARNING,
                "cursor_invalidated",
                f"cursor {cursor.name} invalidated: {reason}",
                cursor=cursor.name,
                reason=reason,
            )
            await self.propose_metadata(
                {
                    "type": "invalidate_cursor",
                    "name": cursor.name,
                    "reason": reason,
                    "at_ms": wall_ms(),
                },
                30.0,
            )
        host = self._leader(req.topic, req.partition)
        host.replica.advance_log_start(target)
        host.process_ready()
        self.cleaner.delete_below_log_start(host)
        log.info(
            "%s: delete-records moved the log start to %d", host.group, host.log.log_start_offset
        )
        return api.DeleteRecordsResponse(host.log.log_start_offset, [c.name for c in in_the_way])

    def _table(self, req: api.TableRequest, payload: bytes) -> api.TableResponse:
        """A table topic's committed state: get one key or scan, from the applied state machine."""
        host = self._host(req.topic, req.partition)
        if not host.replica.is_leader and not req.replica_read:
            raise NotLeader(f"not the leader of {host.group}", leader_hint=host.leader_hint)
        machine = host.state_machine.machine if host.state_machine is not None else None
        if not isinstance(machine, TableMachine):
            raise InvalidRequest(
                f"topic {req.topic!r} is not a table (create it with --kind table)"
            )
        try:
            key = base64.b64decode(req.key, validate=True)
            after = base64.b64decode(req.after, validate=True) if req.after else None
        except ValueError as exc:
            raise InvalidRequest(f"table keys travel base64-encoded: {exc}") from exc
        state = machine.state
        if req.op == "get":
            value = state.get(key)
            entries = [[req.key, base64.b64encode(value).decode()]] if value is not None else []
        elif req.op == "scan":
            limit = max(1, min(req.limit, 100_000))
            entries = [
                [base64.b64encode(k).decode(), base64.b64encode(v).decode()]
                for k, v in state.scan(after, limit)
            ]
        else:
            raise InvalidRequest(f"table op must be get or scan, not {req.op!r}")
        return api.TableResponse(
            entries, bool(entries), state.applied_offset, host.log.high_watermark
        )

    def _api_versions(self, req: api.ApiVersionsRequest, payload: bytes) -> api.ApiVersionsResponse:
        return api.ApiVersionsResponse(
            self.node_id, __version__, self.api_keys, self.peer_port, self.kafka_address
        )


def disk_usage(directory: Path) -> dict[str, int]:
    """The data directory's disk, as status and the console show it."""
    try:
        disk = shutil.disk_usage(directory)
    except OSError:
        return {}
    return {"disk_free_bytes": disk.free, "disk_total_bytes": disk.total}
