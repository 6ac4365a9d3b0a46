"""The peer channel's handshake, sans-IO: a connection between two nodes is bound to one node id
only after both sides prove they hold the cluster secret (mutual challenge-response).

    dialer                                   listener
    PEER_HELLO {node_id, to, nonce_d, cluster_id, directory_id}
                                       ──►   checks: `to` is itself, node_id is a peer, and
                                             the cluster is ours
               ◄──  {node_id, nonce_l, cluster_id,
                     proof_l = MAC("listener", d, l, nonce_d, nonce_l, cluster_id)}
    checks proof_l
    PEER_AUTH {proof_d = MAC("dialer", ...)}  ──►  checks proof_d; the connection is node d's
               ◄──  {accepted: true}

MAC is HMAC-SHA256 keyed by the cluster secret; each side's nonce makes every proof fresh, so a
recorded handshake cannot be replayed. The dialer's cluster and directory ids are bound into its
proof, so they cannot be changed in flight, and the listener's cluster id into its own (a node
formatting its first start adopts it: node/cluster_id.py). The directory id is how the listener
tells a peer that kept its disk from one that came back empty (replication/directories.py).
Nothing but these two requests is read on a peer connection until it is bound. Under TLS the
channel is mutual TLS as well, and the secret is still proved: a certificate from the CA proves
a machine, the secret proves a member.

The peer protocol's version (tidelog/formats.py, "peer-protocol") is negotiated here: the hello
offers the newest the dialer speaks, the answer says the one the connection speaks (the lower of
the two ends'); absent, either is version 1, tidelog 0.1.0's, which ignores both fields. Version
1's listener proof binds no cluster id (0.1.0's dialer checks it so), and a cluster id its
answer carries is then not taken for proved. An answer in a newer version than the dialer
offered is refused by name (UnsupportedFormatVersion, naming the peer).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass

from tidelog.errors import InconsistentClusterId, InvalidRequest
from tidelog.formats import FORMATS, check_version

PROTOCOL = b"tidelog-peer-v1"  # the MAC's domain: the same in every peer protocol version
NONCE_BYTES = 16
PEER_VERSION = FORMATS["peer-protocol"].reads[1]  # the newest this build speaks
CLUSTER_BOUND_VERSION = 2  # from this version the listener's proof binds its cluster id


@dataclass(frozen=True)
class PeerHello:
    node_id: int  # the dialer
    to: int  # whom the dialer thinks it reached
    nonce: str  # hex
    cluster_id: str = ""
    directory_id: str = ""
    version: int = 1  # the newest peer protocol the dialer speaks (0.1.0 sends none: 1)


@dataclass(frozen=True)
class PeerHelloResponse:
    node_id: int  # the listener
    nonce: str
    proof: str
    cluster_id: str = ""  # the listener's; "" while it is not formatted yet
    version: int = 1  # the peer protocol the connection speaks (0.1.0 sends none: 1)


@dataclass(frozen=True)
class PeerAuth:
    proof: str


@dataclass(frozen=True)
class PeerAuthResponse:
    accepted: bool


def new_nonce() -> str:
    return os.urandom(NONCE_BYTES).hex()


def proof(
    secret: bytes,
    role: str,
    dialer: int,
    listener: int,
    nonce_d: str,
    nonce_l: str,
    ids: str = "",  # the prover's own ids, bound into its proof ("" adds nothing)
) -> str:
    fields = [role, str(dialer), str(listener), nonce_d, nonce_l]
    if ids:
        fields.append(ids)
    message = b"|".join([PROTOCOL, *(f.encode() for f in fields)])
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


HEX = frozenset("0123456789abcdef")
PROOF_CHARS = 64  # a hex SHA-256


def check_nonce(nonce: str) -> None:
    if len(nonce) != 2 * NONCE_BYTES or not HEX.issuperset(nonce):
        raise InvalidRequest("peer handshake: malformed nonce")


def check_proof(proof: str) -> None:
    if len(proof) != PROOF_CHARS or not HEX.issuperset(proof):
        raise InvalidRequest("peer handshake: malformed proof")


class ListenerHandshake:
    """The accepting side: hello() answers a PEER_HELLO, auth() checks the dialer's proof and
    returns the node id the connection now belongs to."""

    def __init__(
        self, secret: bytes, node_id: int, peers: frozenset[int], cluster_id: str = ""
    ) -> None:
        self.secret = secret
        self.node_id = node_id
        self.peers = peers
        self.cluster_id = cluster_id
        self.dialer: int | None = None
        self.dialer_directory = ""
        self._dialer_ids = ""
        self._nonces: tuple[str, str] | None = None
        self.version = 1  # the peer protocol version the connection speaks, once negotiated

    def hello(self, msg: PeerHello) -> PeerHelloResponse:
        if self._nonces is not None:
            raise InvalidRequest("peer handshake: hello sent twice")
        if msg.version < 1:
            raise InvalidRequest(f"peer handshake: peer protocol version {msg.version}")
        check_nonce(msg.nonce)
        if msg.to != self.node_id:
            raise InvalidRequest(f"peer handshake: this is node {self.node_id}, not {msg.to}")
        if msg.node_id not in self.peers or msg.node_id == self.node_id:
            raise InvalidRequest(f"peer handshake: node {msg.node_id} is not a peer of this node")
        if msg.cluster_id and self.cluster_id and msg.cluster_id != self.cluster_id:
            raise InconsistentClusterId(
                f"peer handshake: node {msg.node_id} belongs to cluster {msg.cluster_id}, "
                f"this node to cluster {self.cluster_id}"
            )
        mine = new_nonce()
        self.dialer = msg.node_id
        self.dialer_directory = msg.directory_id
        self._dialer_ids = _ids(msg.cluster_id, msg.directory_id)
        self._nonces = (msg.nonce, mine)
        self.version = min(msg.version, PEER_VERSION)
        bound = self.cluster_id if self.version >= CLUSTER_BOUND_VERSION else ""
        return PeerHelloResponse(
            self.node_id,
            mine,
            proof(self.secret, "listener", msg.node_id, self.node_id, msg.nonce, mine, bound),
            self.cluster_id,
            self.version,
        )

    def auth(self, msg: PeerAuth) -> int:
        if self._nonces is None or self.dialer is None:
            raise InvalidRequest("peer handshake: auth before hello")
        check_proof(msg.proof)
        expected = proof(
            self.secret, "dialer", self.dialer, self.node_id, *self._nonces, self._dialer_ids
        )
        if not hmac.compare_digest(expected, msg.proof):
            raise InvalidRequest(
                f"peer handshake: node {self.dialer} did not prove it holds the cluster secret"
            )
        return self.dialer


class DialerHandshake:
    """The connecting side: hello() to send, then answer() checks the listener's proof and
    returns the PEER_AUTH to send."""

    def __init__(
        self, secret: bytes, node_id: int, to: int, cluster_id: str = "", directory_id: str = ""
    ) -> None:
        self.secret = secret
        self.node_id = node_id
        self.to = to
        self.cluster_id = cluster_id
        self.directory_id = directory_id
        self.nonce = new_nonce()
        self.version = 1  # the peer protocol version the connection speaks, once answered

    def hello(self) -> PeerHello:
        return PeerHello(
            self.node_id, self.to, self.nonce, self.cluster_id, self.directory_id, PEER_VERSION
        )

    def listener_cluster(self, msg: PeerHelloResponse) -> str:
        """The listener's cluster id ("" if not formatted, or not bound into its proof: a
        version 1 listener's), once it proved the secret."""
        # (an answer newer than offered: the listener broke the negotiation, or is no tidelog)
        check_version("peer-protocol", msg.version, f"peer node {self.to}'s handshake")
        check_nonce(msg.nonce)
        check_proof(msg.proof)
        if msg.node_id != self.to:
            raise InvalidRequest(f"peer handshake: expected node {self.to}, reached {msg.node_id}")
        bound = msg.cluster_id if msg.version >= CLUSTER_BOUND_VERSION else ""
        expected = proof(
            self.secret, "listener", self.node_id, self.to, self.nonce, msg.nonce, bound
        )
        if not hmac.compare_digest(expected, msg.proof):
            raise InvalidRequest(
                f"peer handshake: node {self.to} did not prove it holds the cluster secret"
            )
        self.version = msg.version
        return bound

    def answer(self, msg: PeerHelloResponse) -> PeerAuth:
        theirs = self.listener_cluster(msg)
        if theirs and self.cluster_id and theirs != self.cluster_id:
            raise InconsistentClusterId(
                f"peer handshake: node {self.to} belongs to cluster {theirs}, "
                f"this node to cluster {self.cluster_id}"
            )
        ids = _ids(self.cluster_id, self.directory_id)
        return PeerAuth(
            proof(self.secret, "dialer", self.node_id, self.to, self.nonce, msg.nonce, ids)
        )


def _ids(cluster_id: str, directory_id: str) -> str:
    return f"{cluster_id}/{directory_id}" if cluster_id or directory_id else ""
