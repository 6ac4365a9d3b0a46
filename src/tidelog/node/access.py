"""Who is asking, and may they: the one place every request passes before it reaches the core.

A listener authenticates (today: a client connection is anonymous; a peer connection is the node
id its handshake proved) and hands the core a Principal; the core calls `Access.authorize` once,
before it acts. Listeners never decide permissions themselves, so a new listener (Kafka, HTTP)
cannot bypass them.

Today's policy: clients may make every client request; only authenticated peers may replicate
(one-way replication and cursor-invalidation messages). Per-topic ACLs take this same entry.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from tidelog.errors import AuthenticationFailed, NotAuthorized
from tidelog.tls import peer_subject


class Listener(enum.Enum):
    CLIENT = "client"
    PEER = "peer"
    KAFKA = "kafka"  # the Kafka-protocol listener (tidelog.kafka): a client like any other


CLIENT_LISTENERS = frozenset({Listener.CLIENT, Listener.KAFKA})


class Operation(enum.Enum):
    READ = "read"  # fetch, list offsets, table reads, cursor reads
    WRITE = "write"  # produce
    DESCRIBE = "describe"  # metadata, status, api versions
    CREATE = "create"  # create topics
    ALTER = "alter"  # cursors: create, commit, delete, invalidate
    DELETE = "delete"  # delete-records
    REPLICATE = "replicate"  # replication and cursor-invalidation messages between peers
    PRINCIPAL = "principal"  # add (or renew), list, remove principals' tokens


@dataclass(frozen=True)
class Principal:
    name: str  # "anonymous", or "node:N" for an authenticated peer
    listener: Listener
    address: str = ""
    peer_id: int | None = None  # set only for a connection whose handshake proved it
    directory_id: str = ""  # the peer's data directory, as its handshake stated it
    refused: str = ""  # why who is asking could not be established: every request is refused

    @staticmethod
    def anonymous(address: str, listener: Listener = Listener.CLIENT) -> Principal:
        return Principal("anonymous", listener, address)

    @staticmethod
    def of_connection(
        address: str, listener: Listener, certificate: object = None, required: bool = False
    ) -> Principal:
        """A client connection's principal: the subject of the certificate TLS verified
        ("CN=alice,O=..."), or anonymous. Where a certificate is required and there is none,
        the connection is still served, but only to say AuthenticationFailed to each request:
        under TLS 1.3 a refusal inside the handshake reaches the client as a bare closed
        connection."""
        subject = peer_subject(certificate)
        refused = ""
        if required and not subject:
            refused = "this listener requires a client certificate (tls.client.auth=required)"
        return Principal(subject or "anonymous", listener, address, refused=refused)

    @staticmethod
    def of_token(name: str, connection: Principal) -> Principal:
        """The principal a connection proved with a token (on the listener it came in on)."""
        return Principal(name, connection.listener, connection.address, refused=connection.refused)

    @staticmethod
    def peer(node_id: int, address: str, directory_id: str = "") -> Principal:
        return Principal(f"node:{node_id}", Listener.PEER, address, node_id, directory_id)


class Access:
    def __init__(self, principal_exists: Callable[[str], bool] = lambda name: False) -> None:
        self.denied = 0
        self.principal_exists = principal_exists

    def authorize(self, principal: Principal, operation: Operation, resource: str) -> None:
        if principal.refused:
            self.denied += 1
            raise AuthenticationFailed(principal.refused, principal=principal.name)
        allowed = (
            principal.peer_id is not None
            if operation is Operation.REPLICATE
            else principal.listener in CLIENT_LISTENERS
        )
        if (
            allowed
            and operation is Operation.PRINCIPAL
            and resource
            and resource != principal.name
            and self.principal_exists(resource)
        ):
            # Until ACLs name cluster admins, only a principal itself renews or removes its
            # token: nobody else can take it over.
            allowed = False
        if not allowed:
            self.denied += 1
            raise NotAuthorized(
                f"{principal.name} ({principal.listener.value} listener) may not "
                f"{operation.value} {resource}",
                principal=principal.name,
                operation=operation.value,
                resource=resource,
            )
