"""Access control lists: who may read, write or administer which topics, and who administers the
cluster. Stored in the metadata log (put_acl / remove_acl), so every node decides alike, for
tidelog's protocol and the Kafka port.

An ACL grants; nothing denies. A principal may do what one of its ACLs (or an ACL for `*`, every
authenticated principal) allows, and a super user (a node's --super-user, or the principal of its
--admin-token-file) may do everything. Cluster admin implies every permission on every topic:
whoever may grant ACLs could grant themselves any of them anyway.

Permissions on a topic, by what they let a principal do:
  read   fetch, list offsets, table reads; cursors and consumer groups on the topic
  write  produce
  admin  create, delete, alter configs, add partitions, reassign, elect leaders, delete records
Admin on a topic does not imply read or write: deleting a topic's records is not reading them.

Permissions on a Kafka consumer group (Kafka's GROUP resource), by name or prefix:
  read   join, sync, heartbeat, leave, commit and fetch its offsets, describe and list it
  admin  delete it
A member also needs read on each topic whose offsets it commits or fetches, as in Kafka.

Permissions on a transactional id (Kafka's TRANSACTIONAL_ID resource), by name or prefix:
  write  use it: InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn
         (Kafka's WRITE; it implies describe, as Kafka's does)
  read   describe it: DescribeTransactions, ListTransactions (Kafka's DESCRIBE)
The producer also needs write on each topic it produces to, and its offsets read on the group
and the topics, as in Kafka.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tidelog.errors import InvalidRequest

EVERY_PRINCIPAL = "*"  # every authenticated principal (Kafka's User:*); not anonymous
ANONYMOUS = "anonymous"  # Kafka's User:ANONYMOUS: grant to it explicitly, if at all


class Permission(enum.Enum):
    READ = "read"
    WRITE = "write"
    ADMIN = "admin"


class ResourceKind(enum.Enum):
    TOPIC = "topic"
    CLUSTER = "cluster"
    GROUP = "group"  # a Kafka consumer group
    TRANSACTIONAL_ID = "transactional_id"  # a Kafka transactional producer's id


class Pattern(enum.Enum):
    LITERAL = "literal"  # the topic of that name
    PREFIX = "prefix"  # every topic whose name starts with it (Kafka's PREFIXED)


@dataclass(frozen=True)
class Resource:
    """What a request acts on: a topic by name, or the cluster."""

    kind: ResourceKind
    name: str = ""

    @staticmethod
    def topic(name: str) -> Resource:
        return Resource(ResourceKind.TOPIC, name)

    @staticmethod
    def cluster() -> Resource:
        return Resource(ResourceKind.CLUSTER)

    @staticmethod
    def group(name: str) -> Resource:
        return Resource(ResourceKind.GROUP, name)

    @staticmethod
    def transactional_id(name: str) -> Resource:
        return Resource(ResourceKind.TRANSACTIONAL_ID, name)

    def __str__(self) -> str:
        return (
            "cluster" if self.kind is ResourceKind.CLUSTER else f"{self.kind.value} {self.name!r}"
        )


PRINCIPAL_NAME = re.compile(r"[^\x00-\x1f\x7f]{1,400}")  # subjects carry '=', ',' and spaces


@dataclass(frozen=True)
class Acl:
    principal: str
    permission: Permission
    kind: ResourceKind
    name: str = ""  # the topic or prefix; "" for the cluster
    pattern: Pattern = Pattern.LITERAL

    def __post_init__(self) -> None:
        if not PRINCIPAL_NAME.fullmatch(self.principal):
            raise InvalidRequest(f"invalid principal {self.principal!r} in an ACL")
        if self.kind is ResourceKind.CLUSTER:
            if self.permission is not Permission.ADMIN or self.name:
                raise InvalidRequest("the cluster has one permission: admin (no name)")
            if self.pattern is not Pattern.LITERAL:
                raise InvalidRequest("the cluster has no prefix")
        elif not self.name or len(self.name) > 249:
            raise InvalidRequest(
                f"a {self.kind.value} ACL names a {self.kind.value} or a prefix (1..249 characters)"
            )
        elif self.kind is ResourceKind.GROUP and self.permission is Permission.WRITE:
            raise InvalidRequest("a group has two permissions: read (use it), admin (delete it)")
        elif self.kind is ResourceKind.TRANSACTIONAL_ID and self.permission is Permission.ADMIN:
            raise InvalidRequest(
                "a transactional id has two permissions: write (use it), read (describe it)"
            )

    @staticmethod
    def of(
        principal: str,
        permission: str,
        topic: str | None = None,
        prefix: str | None = None,
        cluster: bool = False,
        group: str | None = None,
        group_prefix: str | None = None,
        transactional_id: str | None = None,
        transactional_id_prefix: str | None = None,
    ) -> Acl:
        """An ACL as a user names it: a permission on a topic, on every topic starting with a
        prefix, on a consumer group or every group starting with a prefix, on a transactional
        id or every one starting with a prefix, or admin on the cluster (exactly one)."""
        given = (topic, prefix, group, group_prefix, transactional_id, transactional_id_prefix)
        if sum(g is not None for g in given) + cluster != 1:
            raise InvalidRequest(
                "an ACL is on one of: a topic, a topic prefix, a group, a group prefix, "
                "a transactional id, a transactional id prefix, the cluster"
            )
        try:
            granted = Permission(permission)
        except ValueError:
            raise InvalidRequest(
                f"unknown permission {permission!r}: read, write or admin"
            ) from None
        if cluster:
            return Acl(principal, granted, ResourceKind.CLUSTER)
        if group is not None:
            return Acl(principal, granted, ResourceKind.GROUP, group)
        if group_prefix is not None:
            return Acl(principal, granted, ResourceKind.GROUP, group_prefix, Pattern.PREFIX)
        if transactional_id is not None:
            return Acl(principal, granted, ResourceKind.TRANSACTIONAL_ID, transactional_id)
        if transactional_id_prefix is not None:
            kind = ResourceKind.TRANSACTIONAL_ID
            return Acl(principal, granted, kind, transactional_id_prefix, Pattern.PREFIX)
        if prefix is not None:
            return Acl(principal, granted, ResourceKind.TOPIC, prefix, Pattern.PREFIX)
        return Acl(principal, granted, ResourceKind.TOPIC, str(topic))

    def covers(self, permission: Permission, resource: Resource) -> bool:
        if self.kind is ResourceKind.CLUSTER:
            return True  # cluster admin: everything
        if resource.kind is not self.kind:
            return False
        # Using a transactional id implies describing it, as Kafka's WRITE implies DESCRIBE.
        implied = (
            self.kind is ResourceKind.TRANSACTIONAL_ID
            and permission is Permission.READ
            and self.permission is Permission.WRITE
        )
        if permission is not self.permission and not implied:
            return False
        if self.pattern is Pattern.PREFIX:
            return resource.name.startswith(self.name)
        return resource.name == self.name

    def applies_to(self, principal: str) -> bool:
        return self.principal == principal or (
            self.principal == EVERY_PRINCIPAL and principal != ANONYMOUS
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "principal": self.principal,
            "permission": self.permission.value,
            "resource": self.kind.value,
            "name": self.name,
            "pattern": self.pattern.value,
        }

    @staticmethod
    def from_wire(data: dict[str, Any]) -> Acl:
        try:
            return Acl(
                principal=str(data["principal"]),
                permission=Permission(str(data["permission"])),
                kind=ResourceKind(str(data.get("resource", "topic"))),
                name=str(data.get("name", "")),
                pattern=Pattern(str(data.get("pattern", "literal"))),
            )
        except (KeyError, ValueError) as exc:
            raise InvalidRequest(f"invalid ACL {data!r}: {exc}") from None

    def __str__(self) -> str:
        if self.kind is ResourceKind.CLUSTER:
            return f"{self.principal}: cluster admin"
        kind = self.kind.value
        where = f"{kind}s {self.name}*" if self.pattern is Pattern.PREFIX else f"{kind} {self.name}"
        return f"{self.principal}: {self.permission.value} on {where}"


def permitted(
    acls: Iterable[Acl], principal: str, permission: Permission, resource: Resource
) -> bool:
    return any(a.applies_to(principal) and a.covers(permission, resource) for a in acls)


def permitted_somewhere(acls: Iterable[Acl], principal: str, permission: Permission) -> bool:
    """Whether principal holds permission on some topic (or is cluster admin): what Kafka's
    group membership (read) and producer ids (write), which name no topic, need."""
    return any(
        a.applies_to(principal) and (a.kind is ResourceKind.CLUSTER or a.permission is permission)
        for a in acls
    )
