"""The node's side of peer liveness (replication/liveness.py decides; this sends and listens):
one heartbeat to every peer every `election_timeout_ms / 4`, whatever the number of partitions,
and the replica groups woken when a peer comes alive, dies or restarts (a quiesced group learns
of it only so)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from tidelog.errors import InvalidRequest
from tidelog.logs import event
from tidelog.node.metrics import Counters
from tidelog.node.replica_groups import ReplicaGroups
from tidelog.node.transport import PeerSender
from tidelog.protocol.api import ApiKey
from tidelog.replication.clock import MonotonicClock
from tidelog.replication.liveness import Heartbeat, Liveness

log = logging.getLogger(__name__)


class PeerLiveness:
    def __init__(
        self,
        liveness: Liveness,
        clock: MonotonicClock,
        peers: Callable[[], Iterable[int]],
        send_to_peer: PeerSender,
        groups: ReplicaGroups,
        counters: Counters,
        announcement: Callable[[], dict[str, Any]] = dict,
        on_announced: Callable[[int, Any], None] = lambda sender, features: None,
    ) -> None:
        self.liveness = liveness
        # What this node announces of itself in every heartbeat (the feature levels it
        # supports), and who hears what peers announce (node/feature_levels.py).
        self.announcement = announcement
        self.on_announced = on_announced
        self.clock = clock
        self.peers = peers  # every node the peer channel dials (this one too)
        self.send_to_peer = send_to_peer
        self.groups = groups
        self.counters = counters

    async def run(self) -> None:
        """Heartbeats to every peer, and the replicas woken when a peer's liveness changes."""
        liveness = self.liveness
        while True:
            if liveness.heartbeat_due():
                heartbeat = liveness.heartbeat()
                header = {
                    "node": heartbeat.node,
                    "incarnation": heartbeat.incarnation,
                    "features": self.announcement(),
                }
                for peer in self.peers():
                    if peer != liveness.node_id:
                        self.send_to_peer(peer, ApiKey.LIVENESS, header, None)
            self.changed()
            delay = self.clock.time_of(liveness.next_deadline()) - time.monotonic()
            await asyncio.sleep(max(delay, 0.001))
            # Let what the sockets hold be read first: a loop that woke late must not take a
            # peer for dead whose heartbeat waits unread.
            await asyncio.sleep(0)

    def on_heartbeat(self, sender: int, header: dict[str, Any]) -> None:
        node, incarnation = header.get("node"), header.get("incarnation")
        if not isinstance(node, int) or not isinstance(incarnation, int):
            raise InvalidRequest("a liveness heartbeat needs integer node and incarnation")
        if node == sender:  # nobody speaks for another node
            self.on_announced(sender, header.get("features"))
        self.liveness.on_heartbeat(sender, Heartbeat(node, incarnation))
        self.changed()

    def connection_lost(self, peer: int) -> None:
        """Our link to a peer closed (its kernel closed the socket: the process exited or is
        restarting; a partition closes nothing and waits for the liveness timeout)."""
        self.liveness.lost(peer)
        self.changed()

    def changed(self) -> None:
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
