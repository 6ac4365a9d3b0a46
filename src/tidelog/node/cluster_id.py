"""The cluster id the nodes of a new cluster agree on at their first start, without being told.

A data directory records the cluster it belongs to (storage/identity.py), and nodes refuse peers
of another cluster. Nodes started with `--peers` and a cluster secret but no `--cluster-id` must
therefore agree on one id before they format. It used to be a hash of the secret, but the id is
public (status, Kafka's Metadata, the archive) and anything derived from the secret lets it be
guessed offline. Now the id is random, and one node decides it:

- an unformatted node asks every peer's channel for its cluster id (protocol/peer_handshake.py:
  the listener proves the secret and binds its id into that proof), and adopts the id any peer
  already has: a replaced disk rejoins its cluster, and a node started late joins the others;
- if no peer has one yet, the lowest node id among the voters makes a new random id, and the
  others keep asking until it is up. Only one node ever makes an id, so two cannot race.

The one case this cannot settle alone: the lowest voter's disk is replaced while no other node
is reachable. It then makes a new id, and its peers refuse it by name (InconsistentClusterId)
once they are back; starting it with `--cluster-id` set to the cluster's id (`tidelog status`
on any other node) brings it back.
"""

from __future__ import annotations

import asyncio
import logging

from tidelog.errors import InconsistentClusterId, TidelogError
from tidelog.node.config import NodeConfig
from tidelog.node.listeners.peer import ask_cluster_id, discover_peer_port
from tidelog.protocol.peer_handshake import DialerHandshake
from tidelog.storage.identity import new_id

log = logging.getLogger(__name__)

ASK_EVERY_S = 0.3


async def agree_cluster_id(config: NodeConfig) -> str:
    """The id this unformatted node formats with: a peer's, or a new one if it is the lowest
    voter and no peer has one. Waits (saying so once) while neither holds."""
    others = sorted(n for n in config.peers if n != config.node_id)
    decider = min(config.voters)
    waiting_said = False
    refused: set[int] = set()  # peers whose refusal was logged (a different secret, say)
    while True:
        answers = await asyncio.gather(*(_ask(config, peer, refused) for peer in others))
        known = {peer: cid for peer, cid in zip(others, answers, strict=True) if cid}
        ids = set(known.values())
        if len(ids) > 1:
            raise InconsistentClusterId(
                f"node {config.node_id} is not formatted, and its peers belong to different "
                f"clusters: {', '.join(f'node {p}: {c}' for p, c in sorted(known.items()))}; "
                "start it with --cluster-id ID to choose",
            )
        if ids:
            peer, cluster_id = min(known.items())
            log.info(
                "node %d: adopting cluster id %s from node %d", config.node_id, cluster_id, peer
            )
            return cluster_id
        if config.node_id == decider:
            cluster_id = new_id()
            log.info(
                "node %d: no peer is formatted; this node (the lowest voter) made the new "
                "cluster's id %s, and its peers adopt it",
                config.node_id,
                cluster_id,
            )
            return cluster_id
        if not waiting_said:
            log.info(
                "node %d: waiting for node %d (the lowest voter) or any formatted peer, to adopt "
                "the cluster's id",
                config.node_id,
                decider,
            )
            waiting_said = True
        await asyncio.sleep(ASK_EVERY_S)


async def _ask(config: NodeConfig, peer: int, refused: set[int]) -> str:
    """The peer's cluster id; "" if it is unreachable, refused us or is not formatted."""
    timeout_s = config.peer_handshake_timeout_ms / 1000
    tls = config.tls_dialing
    address = config.peers[peer]
    dialer = DialerHandshake(config.cluster_secret, config.node_id, peer)
    try:
        port = config.peer_ports.get(peer) or await discover_peer_port(address, timeout_s, tls)
        return await ask_cluster_id(dialer, (address[0], port), timeout_s, tls)
    except TidelogError as exc:
        # It answered but the handshake failed: most often another secret. Said once.
        level = logging.DEBUG if peer in refused else logging.WARNING
        refused.add(peer)
        log.log(
            level, "node %d: node %d refused to tell its cluster id: %s", config.node_id, peer, exc
        )
        return ""
    except (OSError, TimeoutError) as exc:
        log.debug("node %d: no cluster id from node %d: %s", config.node_id, peer, exc)
        return ""
