"""What a Kafka client must be told that one node does not know by itself: every node's Kafka
address and the leader of every partition, hosted here or not.

A Kafka client routes produce and fetch itself, from one Metadata answer. A tidelog node knows
the leaders of the replica groups it hosts (unless its replica has not heard from one yet: a
new partition, a pre-vote); for the others it asks the nodes that host them,
over tidelog's own client protocol (their Metadata answers carry the leaders they host), and
keeps the answer for a short while. Each node's Kafka address is learnt the same way, from its
ApiVersions answer, once. What this node knows itself (the nodes, the topics, the replicas it
hosts) it reads from its cluster view (node/cluster_view.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any

from tidelog.errors import TidelogError
from tidelog.node.asking import NodeAsker
from tidelog.node.cluster_view import ClusterView
from tidelog.protocol import api
from tidelog.protocol.api import ApiKey

log = logging.getLogger(__name__)

LEADERS_FRESH_S = 1.0  # a leader learnt from another node is trusted this long
ASK_TIMEOUT_S = 1.0
ADDRESS_RETRY_S = 1.0


class Routing:
    def __init__(self, view: ClusterView, asker: NodeAsker, own_address: tuple[str, int]) -> None:
        self.view = view  # the cluster as this node knows it (node/cluster_view.py)
        self.asker = asker
        self.own_address = own_address
        self.addresses: dict[int, tuple[str, int]] = {}  # node -> its Kafka address
        self._address_asked: dict[int, float] = {}
        self._learning: dict[int, asyncio.Future[None]] = {}
        self._leaders: dict[tuple[str, int], tuple[int, int, float]] = {}  # -> leader, epoch, at

    def close(self) -> None:
        """(The connections it asks over are the node's: NodeCore.asker.)"""

    async def ask(
        self, node: int, key: ApiKey, request: Any, timeout_s: float = ASK_TIMEOUT_S
    ) -> dict[str, Any]:
        return await self.asker.ask(node, key, request, timeout_s)

    # -- Kafka addresses --------------------------------------------------------------------------

    async def kafka_addresses(self) -> dict[int, tuple[str, int]]:
        """Every node's Kafka address that is known now; those not yet known are asked for
        (at most once a second each), so a node that is down does not hold up the answer."""
        nodes = self.view.nodes()
        self.addresses[self.view.node_id] = self.own_address
        now = time.monotonic()
        waits = []
        for n in nodes:
            if n in self.addresses:
                continue
            learning = self._learning.get(n)
            if learning is None and now - self._address_asked.get(n, -1e9) > ADDRESS_RETRY_S:
                self._address_asked[n] = now
                learning = self._learning[n] = asyncio.ensure_future(self._learn_address(n))
                learning.add_done_callback(functools.partial(self._learnt, n))
            if learning is not None:  # requests that come meanwhile wait for the same answer
                waits.append(learning)
        if waits:
            await asyncio.wait(waits, timeout=2 * ASK_TIMEOUT_S)
        return {n: a for n, a in self.addresses.items() if n in nodes}

    def _learnt(self, node: int, _: asyncio.Future[None]) -> None:
        self._learning.pop(node, None)

    async def _learn_address(self, node: int) -> None:
        try:
            header = await self.ask(node, ApiKey.API_VERSIONS, api.ApiVersionsRequest("kafka"))
        except (TidelogError, OSError) as exc:
            log.debug("node %d: Kafka address not learnt: %s", node, exc)
            return
        address = api.decode(api.ApiVersionsResponse, header).kafka_address
        host, _, port = address.rpartition(":")
        if host and port.isdigit():
            self.addresses[node] = (host, int(port))

    # -- leaders -------------------------------------------------------------------------------

    def leader(self, topic: str, partition: int) -> tuple[int, int]:
        """(leader, epoch) as this node knows it: its own replica's view, or what a replica
        told it recently; (-1, -1) when unknown."""
        hosted = self.view.leader(topic, partition)
        if hosted is not None and hosted[0] >= 0:
            return hosted
        # A replica here that has not yet heard from its leader (a new partition, a slow
        # follower) falls back on what the other replicas said.
        known = self._leaders.get((topic, partition))
        if (
            known is None
            or (hosted is not None and known[1] < hosted[1])
            or (hosted is not None and known[0] == self.view.node_id)  # it knows it leads not
        ):
            return hosted if hosted is not None else (-1, -1)
        return known[0], known[1]

    async def refresh_leaders(self, topics: list[str]) -> None:
        """Ask the nodes that host partitions this node does not (and whose leader it has not
        heard of lately) who leads them."""
        now = time.monotonic()
        by_node: dict[int, set[str]] = {}
        known_topics = self.view.topics
        for name in topics:
            meta = known_topics.get(name)
            if meta is None:
                continue
            for p in range(meta.partitions):
                hosted = self.view.leader(name, p)
                if hosted is not None and hosted[0] >= 0:
                    continue
                known = self._leaders.get((name, p))
                if known is not None and now - known[2] < LEADERS_FRESH_S and known[0] >= 0:
                    continue
                for node in meta.hosts(p):
                    if node != self.view.node_id:
                        by_node.setdefault(node, set()).add(name)
        if by_node:
            await asyncio.gather(*(self._ask_leaders(n, sorted(t)) for n, t in by_node.items()))

    async def _ask_leaders(self, node: int, topics: list[str]) -> None:
        try:
            header = await self.ask(node, ApiKey.METADATA, api.MetadataRequest(topics))
        except (TidelogError, OSError) as exc:
            log.debug("node %d: leaders not learnt: %s", node, exc)
            return
        now = time.monotonic()
        for entry in api.decode(api.MetadataResponse, header).topics:
            found = zip(entry.get("leaders", []), entry.get("leader_epochs", []), strict=False)
            for p, (leader, epoch) in enumerate(found):
                leader, epoch = int(leader), int(epoch)
                key = (str(entry.get("name")), p)
                old = self._leaders.get(key)
                if leader >= 0 and (old is None or epoch >= old[1] or now - old[2] > 1.0):
                    self._leaders[key] = (leader, epoch, now)
