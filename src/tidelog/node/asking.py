"""Requests from this node to other nodes' client listeners, over tidelog's own protocol: the
Kafka port's view of the cluster (addresses, leaders, forwarded admin requests) and token checks
a follower leaves to the metadata leader. One connection per node, kept, dialed with the node's
own TLS (its certificate, when it has one)."""

from __future__ import annotations

import ssl
from collections.abc import Callable, Mapping
from typing import Any

from tidelog.client.connection import NodeConnection
from tidelog.errors import TidelogError
from tidelog.invariant import InvariantBroken
from tidelog.protocol import api
from tidelog.protocol.api import ApiKey
from tidelog.replication.metadata import NodeEntry

CONNECT_TIMEOUT_S = 1.0


class NodeAsker:
    def __init__(
        self, nodes: Callable[[], Mapping[int, NodeEntry]], tls: ssl.SSLContext | None
    ) -> None:
        self.nodes = nodes  # the cluster's nodes as the registry has them now
        self.tls = tls
        self._connections: dict[int, NodeConnection] = {}

    async def ask(self, node: int, key: ApiKey, request: Any, timeout_s: float) -> dict[str, Any]:
        """One request to a node; its answer's header (the error it carries raised)."""
        conn = self._connections.get(node)
        if conn is None or conn.closed:
            entry = self.nodes().get(node)
            if entry is None:
                raise TidelogError(f"node {node} is not in the registry")
            conn = await NodeConnection.open((entry.host, entry.port), CONNECT_TIMEOUT_S, self.tls)
            self._connections[node] = conn
        frame = await conn.request(key, api.encode(request), timeout_s=timeout_s)
        if frame is None:
            raise InvariantBroken("frame is not None")
        error = api.error_of(frame.header)
        if error is not None:
            raise error
        return frame.header

    def close(self) -> None:
        for conn in self._connections.values():
            conn.close()
        self._connections.clear()
