"""Who is asking, and may they: the one place every request passes before it reaches the core.

A listener authenticates (a TLS client certificate's subject, a token, or anonymous; a peer
connection is the node id its handshake proved) and hands the core a Principal; the core calls
`Access.authorize` once, before it acts. Listeners never decide permissions themselves, so a new
listener (Kafka, HTTP) cannot bypass them.

Two policies (a node's `authorization`):
- none (the default; a node that listens beyond loopback refuses to start with it unless told
  --insecure): every client may make every client request, except take over another
  principal's token.
- acl: what ACLs in the metadata log grant (tidelog/acls.py); super users may do everything.
In both, only authenticated peers replicate.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from tidelog.acls import ANONYMOUS, Acl, Permission, Resource, permitted, permitted_somewhere
from tidelog.errors import AuthenticationFailed, NotAuthorized
from tidelog.tls import peer_subject


class Listener(enum.Enum):
    CLIENT = "client"
    PEER = "peer"
    KAFKA = "kafka"  # the Kafka-protocol listener (tidelog.kafka): a client like any other
    HTTP = "http"  # metrics and the console (node/listeners/http.py): status only


CLIENT_LISTENERS = frozenset({Listener.CLIENT, Listener.KAFKA, Listener.HTTP})


class Operation(enum.Enum):
    CONNECT = "connect"  # api versions, authenticate: what a connection needs before all else
    DESCRIBE = "describe"  # metadata, status, the cluster's nodes, cursor names
    READ = "read"  # fetch, list offsets, table reads, cursors and groups on a topic
    WRITE = "write"  # produce
    CREATE = "create"  # create a topic
    ALTER = "alter"  # alter a topic's configs or partitions or replicas; the cluster's nodes
    DELETE = "delete"  # delete a topic or its records
    GRANT = "grant"  # add, list, remove ACLs
    # Kafka's consumer groups: read on the group (Resource.group) to use it, admin to delete
    # it; offsets also need read on their topic. Producer ids name no topic: they need write
    # on some topic.
    GROUP = "use consumer group"
    DELETE_GROUP = "delete consumer group"
    PRODUCER_ID = "get a producer id"
    # Kafka's transactional ids (Resource.transactional_id): write to use one, read to
    # describe one (write implies it).
    TRANSACTION = "use transactional id"
    DESCRIBE_TRANSACTION = "describe transactional id"
    PRINCIPAL = "principal"  # add (or renew), list, remove principals' tokens
    REPLICATE = "replicate"  # replication and cursor-invalidation messages between peers


# What an operation needs under ACLs (CONNECT and DESCRIBE need nothing, REPLICATE a peer,
# PRINCIPAL is decided by whose token it is).
NEEDS = {
    Operation.READ: Permission.READ,
    Operation.WRITE: Permission.WRITE,
    Operation.CREATE: Permission.ADMIN,
    Operation.ALTER: Permission.ADMIN,
    Operation.DELETE: Permission.ADMIN,
    Operation.GRANT: Permission.ADMIN,
    Operation.DELETE_GROUP: Permission.ADMIN,
    Operation.TRANSACTION: Permission.WRITE,
    Operation.DESCRIBE_TRANSACTION: Permission.READ,
}


class Authorization(enum.Enum):
    NONE = "none"
    ACL = "acl"


@dataclass(frozen=True)
class Principal:
    name: str  # "anonymous", or "node:N" for an authenticated peer
    listener: Listener
    address: str = ""
    peer_id: int | None = None  # set only for a connection whose handshake proved it
    directory_id: str = ""  # the peer's data directory, as its handshake stated it
    refused: str = ""  # why who is asking could not be established: every request is refused
    by_token: bool = False  # proved with a token (or SASL): renewing or removing it ends this

    @staticmethod
    def anonymous(address: str, listener: Listener = Listener.CLIENT) -> Principal:
        return Principal(ANONYMOUS, listener, address)

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
        return Principal(subject or ANONYMOUS, listener, address, refused=refused)

    @staticmethod
    def of_token(name: str, connection: Principal) -> Principal:
        """The principal a connection proved with a token (on the listener it came in on)."""
        return Principal(
            name, connection.listener, connection.address, refused=connection.refused, by_token=True
        )

    @staticmethod
    def peer(node_id: int, address: str, directory_id: str = "") -> Principal:
        return Principal(f"node:{node_id}", Listener.PEER, address, node_id, directory_id)


class Access:
    def __init__(
        self,
        authorization: Authorization = Authorization.NONE,
        super_users: Iterable[str] = (),
        acls: Callable[[], Sequence[Acl]] = lambda: (),
        principal_exists: Callable[[str], bool] = lambda name: False,
    ) -> None:
        self.authorization = authorization
        self.super_users = frozenset(super_users)
        self.acls = acls
        self.principal_exists = principal_exists
        self.denied = 0

    @property
    def enforced(self) -> bool:
        return self.authorization is Authorization.ACL

    def authorize(
        self, principal: Principal, operation: Operation, resource: Resource, target: str = ""
    ) -> None:
        """Refuses (AuthenticationFailed, NotAuthorized) unless principal may do operation on
        resource. target: for PRINCIPAL, whose token is added or removed."""
        if principal.refused:
            self.denied += 1
            raise AuthenticationFailed(principal.refused, principal=principal.name)
        if not self.allows(principal, operation, resource, target):
            self.denied += 1
            if operation is Operation.PRINCIPAL:
                what = f" principal {target!r}"
            elif operation is Operation.PRODUCER_ID:
                what = ""
            elif operation in (
                Operation.GROUP,
                Operation.DELETE_GROUP,
                Operation.TRANSACTION,
                Operation.DESCRIBE_TRANSACTION,
            ):
                what = f" {resource.name!r}"
            else:
                what = f" {resource}"
            raise NotAuthorized(
                f"{principal.name} ({principal.listener.value} listener) may not "
                f"{operation.value}{what}",
                principal=principal.name,
                operation=operation.value,
                resource=resource.kind.value,
                resource_name=target or resource.name,
            )

    def allows(
        self, principal: Principal, operation: Operation, resource: Resource, target: str = ""
    ) -> bool:
        if operation is Operation.REPLICATE:
            return principal.peer_id is not None
        if principal.listener not in CLIENT_LISTENERS:
            return False
        if operation in (Operation.CONNECT, Operation.DESCRIBE):
            return True
        if operation is Operation.PRINCIPAL:
            if target == principal.name and principal.name != ANONYMOUS:
                return True  # renew or remove one's own token
            if not self.enforced:
                # Without ACLs nobody is cluster admin, so nobody takes over another's token.
                return not self.principal_exists(target)
            return self.is_cluster_admin(principal)
        if not self.enforced:
            return True
        if principal.name in self.super_users:
            return True
        if operation is Operation.PRODUCER_ID:
            return permitted_somewhere(self.acls(), principal.name, Permission.WRITE)
        if operation is Operation.GROUP:
            return permitted(self.acls(), principal.name, Permission.READ, resource)
        return permitted(self.acls(), principal.name, NEEDS[operation], resource)

    def is_cluster_admin(self, principal: Principal) -> bool:
        return principal.name in self.super_users or permitted(
            self.acls(), principal.name, Permission.ADMIN, Resource.cluster()
        )
