"""A tidelog node: one core (node/core.py) and the listeners over it.

    client listener (node/listeners/client.py)   tidelog's protocol, for clients
    peer channel (node/listeners/peer.py)        other nodes, after a handshake that proves
                                                 membership; replication happens only here
    Kafka listener (tidelog/kafka/)               the Kafka protocol, for Kafka clients and
                                                 tools (--kafka-listen)
    HTTP listener (node/listeners/http.py)        Prometheus's /metrics and the web console
                                                 (--http-listen)

A single node is a cluster of one: the metadata log and every partition are replica groups;
with one voter each, every group elects this node at start.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidelog.errors import InvalidConfig
from tidelog.invariant import InvariantBroken
from tidelog.node.access import Principal
from tidelog.node.cleaner import Cleaner
from tidelog.node.cluster_id import agree_cluster_id
from tidelog.node.config import NodeConfig
from tidelog.node.core import NodeCore
from tidelog.node.join import join_cluster, load_joined
from tidelog.node.listeners.base import ConnectionLimits, Listener
from tidelog.node.listeners.client import client_listener
from tidelog.node.listeners.peer import PeerChannel, PeerListener
from tidelog.node.partition import PartitionHost
from tidelog.replication.metadata import METADATA_GROUP, MetadataState
from tidelog.scram import seed_decoys
from tidelog.storage.descriptors import SEGMENT_FILES, capacity_for
from tidelog.storage.identity import load_or_format, read_identity

if TYPE_CHECKING:
    from tidelog.kafka.broker import KafkaBroker
    from tidelog.node.listeners.http import HttpListener

log = logging.getLogger(__name__)

REVOKE_GRACE_S = 0.2

__all__ = ["METADATA_GROUP", "Node"]


class Node:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.node_id = config.node_id
        if config.cluster_secret:
            seed_decoys(config.cluster_secret)  # unknown SCRAM users look alike on every node
        self.core = NodeCore(config, self._send_to_peer, self._listener_status)
        limits = ConnectionLimits.of(config)
        self.client_listener: Listener = client_listener(self.core, limits, config.zero_copy)
        self.peer_listener = PeerListener(
            self.core, limits, config.cluster_secret, config.peer_handshake_timeout_ms / 1000
        )
        self.peer_channel: PeerChannel | None = None
        self.kafka: KafkaBroker | None = None
        self.kafka_listener: Listener | None = None
        # The Kafka and HTTP listeners are imported only by the nodes that have them: their
        # libraries (kio, aiohttp) are most of a node's start-up time.
        if config.kafka_listen is not None:
            from tidelog.kafka.broker import KafkaBroker
            from tidelog.kafka.listener import kafka_listener

            self.kafka = KafkaBroker(self.core, config.kafka_listen)
            self.kafka_listener = kafka_listener(self.kafka, limits)
        self.http: HttpListener | None = None
        if config.http_listen is not None:
            from tidelog.node.listeners.http import HttpListener

            self.http = HttpListener(self.core)
        self.http_address: tuple[str, int] | None = None
        self.peer_address: tuple[str, int] = ("", -1)
        self._stopped: asyncio.Event | None = None
        self._stopping = False
        # Set by a second stop (SIGTERM or Ctrl-C again): the hand-overs are waited for no more.
        self._hurry = asyncio.Event()
        self.started_at = time.time()
        self.core.fail_stop.on_trip = self._fail_stop
        self.core.on_nodes_changed = self._nodes_changed
        self.core.on_principal_changed = self._end_sessions_of

    # -- what tests and tools look at ------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        return self.config.listen

    @property
    def hosts(self) -> dict[str, PartitionHost]:
        return self.core.hosts

    @property
    def metadata(self) -> MetadataState:
        return self.core.metadata

    @property
    def metadata_host(self) -> PartitionHost:
        return self.core.metadata_host

    @property
    def cleaner(self) -> Cleaner:
        return self.core.cleaner

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        self._stopped = asyncio.Event()
        self._watch_background_failures(asyncio.get_running_loop())
        soft, _ = raise_open_files_limit()
        # Segment files are opened on demand and kept in a bounded cache: a quarter of the
        # limit (storage/descriptors.py), so partitions beyond it cost no descriptor while idle.
        SEGMENT_FILES.resize(capacity_for(soft))
        log.info("segment files kept open: at most %d", SEGMENT_FILES.capacity)
        data = self.config.data_dir
        data.mkdir(parents=True, exist_ok=True)
        joined = load_joined(data)
        if joined is None and self.config.join:
            joined = await join_cluster(self.config)
        if joined is not None:
            self.config = self.core.config = joined.config(self.config)
            self.core.initial_voters = joined.metadata_voters
            self.core.joined = True
        await self._check_identity(data)
        config = self.config
        tls = config.tls
        # tidelog's client listener asks for a certificate and refuses by name, request by
        # request, where one is required (access.Principal.of_connection); Kafka clients
        # expect the refusal in the handshake, as Kafka's ssl.client.auth=required does.
        auth = config.tls_client_auth
        serving = None if tls is None else tls.server_context(auth)
        asking = (
            None if tls is None else tls.server_context("requested" if auth != "none" else auth)
        )
        _, port = await self.client_listener.start(*config.listen, asking)
        if port != config.listen[1]:
            config = self.config = config.with_listen_port(port)
            self.core.config = config
        # Between nodes TLS is mutual: a peer proves itself with a certificate the CA signed.
        mutual = None if tls is None else tls.server_context("required")
        self.peer_address = await self.peer_listener.start(*config.peer_bind, mutual)
        self.core.peer_port = self.peer_address[1]
        if self.kafka is not None and self.kafka_listener is not None:
            if config.kafka_listen is None:
                raise InvariantBroken("config.kafka_listen is not None")
            bound = await self.kafka_listener.start(*config.kafka_listen, serving)
            host = bound[0] if bound[0] not in ("0.0.0.0", "::", "") else config.advertised[0]
            advertised = config.kafka_advertised or (host, bound[1])
            self.kafka.routing.own_address = advertised
            self.core.kafka_address = "{}:{}".format(*advertised)
        if len(config.voters) > 1 and not config.cluster_secret:
            log.warning(
                "node %d: no cluster secret (--cluster-secret-file or %s): any process that "
                "reaches the peer channel on %s:%d can join as a replica",
                self.node_id,
                "TIDELOG_CLUSTER_SECRET",
                *self.peer_address,
            )
        if self.http is not None:
            if config.http_listen is None:
                raise InvariantBroken("config.http_listen is not None")
            plain = None if tls is None else tls.server_context("none")
            self.http_address = await self.http.start(*config.http_listen, plain)
        self.peer_channel = PeerChannel(self.core, config.cluster_secret)
        self.peer_listener.on_bound = self.peer_channel.peer_is_up
        self._nodes_changed()  # dials every node this node knows of
        await self.core.start()
        if self.kafka is not None:
            self.kafka.start()
        log.info(
            "node %d serving clients on %s:%d, peers on %s:%d (data %s, metadata voters %s)",
            self.node_id,
            *config.listen,
            *self.peer_address,
            data,
            list(self.core.metadata_host.replica.voters),
        )

    async def _check_identity(self, data: Path) -> None:
        """The directory's identity (storage/identity.py): refused if it belongs to another
        node or cluster; formatted if new. Nodes of a cluster without an explicit id agree on
        a random one first (node/cluster_id.py)."""
        config = self.config
        if (
            len(config.voters) > 1
            and not config.cluster_secret
            and not config.cluster_id
            and read_identity(data) is None
        ):
            # Each would format a cluster id of its own and refuse the others forever
            # (InconsistentClusterId every 0.3 s, topics create answering NotLeader).
            raise InvalidConfig(
                f"node {self.node_id} is one of {len(config.voters)} nodes (--peers) but has no "
                "--cluster-secret-file: give every node the same secret file, made once with "
                '`python3 -c "import secrets; print(secrets.token_hex(32))" > cluster.secret` '
                "(or TIDELOG_CLUSTER_SECRET), or, on a trusted network, the same --cluster-id ID",
                key="cluster_secret_file",
            )
        agreed = ""
        if len(config.voters) > 1 and not config.cluster_id and read_identity(data) is None:
            agreed = await agree_cluster_id(config)
        self.identity = load_or_format(data, self.node_id, config.cluster_id, agreed)
        self.core.identity = self.identity
        self.core.directories.load(self.identity.initial_directories)
        if self.identity.formatted:
            log.info(
                "node %d: formatted %s (cluster %s, directory %s)",
                self.node_id,
                data,
                self.identity.cluster_id,
                self.identity.directory_id,
            )

    def _end_sessions_of(self, name: str) -> None:
        """A principal was renewed or removed (as this node applies the metadata log): the
        connections that proved its old token end now, on every listener. They kept working,
        and so did a removed principal, until they closed by themselves."""
        ended = 0
        for listener in (self.client_listener, self.kafka_listener):
            for conn in list(listener.connections if listener is not None else ()):
                principal = getattr(conn, "principal", None)
                if (
                    isinstance(principal, Principal)
                    and principal.by_token
                    and principal.name == name
                ):
                    # A moment later: the request that removed it may be this very
                    # session's, and its answer goes first.
                    asyncio.get_running_loop().call_later(REVOKE_GRACE_S, conn.drop, "revoked")
                    ended += 1
        if ended:
            log.info("principal %s renewed or removed: %d of its sessions ended", name, ended)

    def _nodes_changed(self) -> None:
        """The metadata log changed the cluster's nodes: dial the new, drop the removed."""
        nodes = self.core.registry.peer_nodes()
        self.peer_listener.fit(len(nodes))
        if self.peer_channel is not None:
            self.peer_channel.update(nodes, self.core.metadata.removed_nodes)

    def _send_to_peer(self, to: int, key: int, header: dict[str, Any], payload: Any) -> None:
        if self.peer_channel is not None:
            self.peer_channel.send(to, key, header, payload)

    def _listener_status(self) -> dict[str, Any]:
        return {
            "listeners": {
                "client": {
                    "address": "{}:{}".format(*self.config.listen),
                    **self.client_listener.stats(),
                },
                "peer": {
                    "address": "{}:{}".format(*self.peer_address),
                    **self.peer_listener.stats(),
                },
                **(
                    {"kafka": {"address": self.core.kafka_address, **self.kafka_listener.stats()}}
                    if self.kafka_listener is not None
                    else {}
                ),
                **(
                    {"http": {"address": "{}:{}".format(*self.http_address)}}
                    if self.http_address is not None
                    else {}
                ),
            },
            "peers": self.peer_channel.stats() if self.peer_channel is not None else {},
        }

    async def serve_forever(self) -> None:
        if self._stopped is None:
            raise InvariantBroken("the node is not started")
        await self._stopped.wait()

    @property
    def failed(self) -> BaseException | None:
        """The invariant failure that stopped this node (fail-stop), if one did."""
        return self.core.fail_stop.failed

    def _watch_background_failures(self, loop: asyncio.AbstractEventLoop) -> None:
        """Callbacks and tasks nobody awaits (flush completions, the cleaner's jobs) report
        their exceptions to the loop: an invariant failure there stops the node too."""
        previous = loop.get_exception_handler()

        def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            exc = context.get("exception")
            if isinstance(exc, BaseException):
                self.core.fail_stop.check(exc, str(context.get("message", "a background task")))
            if previous is not None:
                previous(loop, context)
            else:
                loop.default_exception_handler(context)

        loop.set_exception_handler(handler)

    def _fail_stop(self, exc: BaseException) -> None:
        # No graceful anything: no checkpoint, no flush, no answer; peers see a dead node.
        if self.http is not None:
            self.core.track(asyncio.get_running_loop().create_task(self.http.close()))
        self._close_kafka()
        self.client_listener.close()
        self.peer_listener.close()
        if self.peer_channel is not None:
            self.peer_channel.close()
        self.core.halt()
        if self._stopped is not None:
            self._stopped.set()

    def _close_kafka(self) -> None:
        if self.kafka_listener is not None:
            self.kafka_listener.close()
        if self.kafka is not None:
            self.kafka.close()

    async def stop(self) -> None:
        """Stop cleanly: first hand every leadership over (a controlled shutdown, at most
        controlled.shutdown.timeout.ms: NodeCore.hand_over_leaderships), with every listener
        still serving; then close the listeners and the peer channel, and close every replica
        (flushed, checkpointed, marked cleanly shut). Called again meanwhile, it waits no more
        for the hand-overs, and returns once the node has stopped."""
        if self._stopped is None or self._stopped.is_set():
            return
        if self._stopping:
            self._hurry.set()
            await self._stopped.wait()
            return
        self._stopping = True
        log.info("node %d stopping", self.node_id)
        timeout_ms = self.config.controlled_shutdown_timeout_ms
        if timeout_ms > 0:
            await self.core.hand_over_leaderships(timeout_ms / 1000, self._hurry)
            if self._stopped.is_set():
                return  # a fail-stop meanwhile: nothing graceful after it
        if self.http is not None:
            await self.http.close()
        self._close_kafka()
        self.client_listener.close()
        self.peer_listener.close()
        if self.peer_channel is not None:
            self.peer_channel.close()
        await self.core.stop()
        self._stopped.set()
        log.info("node %d stopped cleanly", self.node_id)


def raise_open_files_limit() -> tuple[int, int]:
    """Take the hard limit the system allows (as Kafka's packaging sets nofile), and say what
    the node has: sockets and, up to a quarter of it, segment files."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-files limit from %d to %d: %s", soft, hard, exc)
    log.info("open files: soft limit %d, hard limit %d", soft, hard)
    return soft, hard
