"""Cursors (durable consumer positions that hold the log, as Kafka's committed offsets do):
create, commit, list, describe and delete through the metadata log, each as its principal may
(positions follow DESCRIBE on the cursor; changing another's needs its READ or cluster admin).
A read_committed commit moves no position forward past its partition's LSO at the leader."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable

from tidelog.acls import Resource
from tidelog.errors import (
    CursorPastStableOffset,
    InvalidRequest,
    NotAuthorized,
)
from tidelog.node.access import Access, Listener, Operation, Principal
from tidelog.node.cleaner import wall_ms
from tidelog.node.metadata_log import MetadataLog
from tidelog.node.ops.base import MetadataOps
from tidelog.node.ops.data import check_isolation_level
from tidelog.protocol import api
from tidelog.replication.metadata import (
    CURSOR_NAME,
    Cursor,
)
from tidelog.replication.metadata_commands import (
    CommitCursor,
    CreateCursor,
    DeleteCursor,
    InvalidateCursor,
    MetadataCommand,
)

log = logging.getLogger(__name__)

# How long a read_committed commit past the LSO waits for a new leader's LSO to catch up
# before it is refused, asked every SETTLE_STEP_S.
SETTLE_S = 3.0
SETTLE_STEP_S = 0.1


class CursorOps(MetadataOps):
    def __init__(
        self,
        metadata_log: MetadataLog,
        access: Access,
        check_cursor: Callable[[str, str, int], None],
        last_stable_offset: Callable[[str, int], Awaitable[int]],
    ) -> None:
        self.metadata_log = metadata_log
        self.access = access
        self._check_cursor = check_cursor  # a position a cursor may take (DataOps.check_cursor)
        # a partition's LSO at its leader now (LeaderStableOffsets.last_stable_offset)
        self._last_stable_offset = last_stable_offset

    def as_principal(self, principal: Principal, req: api.CursorRequest) -> api.CursorRequest:
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

    def scope(self, req: api.CursorRequest) -> tuple[Operation, Resource, str]:
        """Cursors are read on their topic: to create, commit, describe, delete or invalidate
        one needs read on the topic it follows (as a Kafka group's offsets need read)."""
        if req.op == "list":
            return Operation.DESCRIBE, Resource.cluster(), ""
        if req.op != "create" and req.name not in self.metadata.cursors:
            # It may exist: answered before the handler, so checked here.
            self.metadata_log.require_current(f"cursor {req.name!r}")
        topic = req.topic if req.op == "create" else self.metadata.cursor(req.name).topic
        return Operation.READ, Resource.topic(topic), ""

    async def cursor(self, req: api.CursorRequest, payload: bytes) -> api.CursorResponse:
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
            return await self.create_cursor(req)
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
            if check_isolation_level(req.isolation_level):
                await self.check_stable(cursor, positions)
            command: MetadataCommand = CommitCursor(req.name, positions, wall_ms())
        elif req.op == "delete":
            command = DeleteCursor(req.name, wall_ms())
        elif req.op == "invalidate":
            command = InvalidateCursor(req.name, req.reason or "by request", wall_ms())
        else:
            raise InvalidRequest(f"unknown cursor op {req.op!r}")
        await self.propose_metadata(command, 30.0)
        if req.op == "commit" and not self.metadata.cursor(req.name).live:
            self._check_cursor(req.name, cursor.topic, 0)  # invalidated meanwhile
        found = self.metadata.cursors.get(req.name)
        return api.CursorResponse([found.to_wire()] if found is not None else [])

    async def check_stable(self, cursor: Cursor, positions: dict[int, int]) -> None:
        """A read_committed commit moves no position forward past its partition's LSO as the
        leader has it now (CursorPastStableOffset): a read_committed reader never gets there.
        Checked before the proposal; the LSO only grows within the leader's epoch, so it still
        holds when the commit applies. A position kept or moved back is not checked (it was,
        or a rewind is the committer's to make)."""
        for p, offset in sorted(positions.items()):
            if offset <= cursor.positions.get(p, -1):
                continue
            lso = await self._last_stable_offset(cursor.topic, p)
            waited = 0.0
            while offset > lso and waited < SETTLE_S:
                # A leader elected a moment ago may not have caught its HW (and so its LSO)
                # up to what its predecessor let the reader see: it does within a round of
                # fetches, so ask again before refusing a reader that did nothing wrong.
                await asyncio.sleep(SETTLE_STEP_S)
                waited += SETTLE_STEP_S
                lso = await self._last_stable_offset(cursor.topic, p)
            if offset > lso:
                raise CursorPastStableOffset(
                    f"cursor {cursor.name!r}: a read_committed commit of {cursor.topic}/{p} at "
                    f"{offset} is past its last stable offset {lso} (a read_committed reader "
                    "never gets there; commit it read_uncommitted if it is meant)",
                    position=offset,
                    last_stable_offset=lso,
                    cursor=cursor.name,
                    topic=cursor.topic,
                    partition=p,
                )

    async def create_cursor(self, req: api.CursorRequest) -> api.CursorResponse:
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
        negative = {p: o for p, o in positions.items() if o < 0}
        if negative:
            raise InvalidRequest(
                f"a cursor's positions are offsets, 0 or more, not {negative} (partition: offset)"
            )
        if not covered:
            raise InvalidRequest(
                f"a cursor on {req.topic!r} needs a position for "
                + ("some of" if req.partial else "each of")
                + f" its {meta.partitions} partitions (and none other)"
            )
        command = CreateCursor(req.name, req.topic, positions, req.backup, req.owner, wall_ms())
        await self.propose_metadata(command, 30.0)
        return api.CursorResponse([self.metadata.cursor(req.name).to_wire()])
