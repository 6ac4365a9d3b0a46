"""Kafka's classic consumer-group protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup), with
client-side assignors: the coordinator collects the members, names a leader, hands it every
member's subscription, and passes the leader's assignment on to each member.

The coordinator is the metadata log's leader (FindCoordinator names it), because a group's
committed offsets are tidelog cursors kept in the metadata log (kafka/broker.py): committing
is a metadata proposal, which only the metadata leader makes. A group's settled membership (its
generation, members, assignor and assignments) is kept in the metadata log too, before the
leader's SyncGroup is answered (as Kafka writes it to __consumer_offsets): when the metadata
leader changes, members find the new coordinator, which has loaded every group as it was, and
their heartbeats carry on in the same generation; a member that died with the old coordinator
expires as usual. A rebalance under way when the coordinator fails starts again.

Rebalance rules, as Kafka's: a join (new member, changed subscription) or a leave or a missed
session moves a stable group to PreparingRebalance; it completes when every known member has
joined again or the longest rebalance timeout passes (members that did not come are dropped);
the generation then grows by one and the group waits for the leader's SyncGroup.
"""

from __future__ import annotations

import asyncio
import base64
import enum
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tidelog.invariant import InvariantBroken
from tidelog.kafka.errors import (
    ILLEGAL_GENERATION,
    INCONSISTENT_GROUP_PROTOCOL,
    INVALID_SESSION_TIMEOUT,
    NONE,
    REBALANCE_IN_PROGRESS,
    UNKNOWN_MEMBER_ID,
)

log = logging.getLogger(__name__)

SESSION_TIMEOUT_MIN_MS = 1_000  # group.min.session.timeout.ms is 6 s in Kafka; tests need less
SESSION_TIMEOUT_MAX_MS = 1_800_000
# group.initial.rebalance.delay.ms: a new group waits this long for more members before its
# first generation, so that members starting together share one rebalance (Kafka: 3 s).
INITIAL_REBALANCE_DELAY_S = 0.3
SWEEP_INTERVAL_S = 0.25


class GroupError(Exception):
    """A group request refused with a Kafka error code."""

    def __init__(self, code: int, message: str = "") -> None:
        super().__init__(message or f"error {code}")
        self.code = code


class State(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_s: float
    rebalance_timeout_s: float
    protocol_type: str
    protocols: list[tuple[str, bytes]]  # (assignor name, subscription), in preference order
    last_seen: float = field(default_factory=time.monotonic)
    assignment: bytes = b""
    joining: asyncio.Future[dict[str, Any]] | None = None
    syncing: asyncio.Future[dict[str, Any]] | None = None

    def metadata_for(self, protocol: str) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        return b""


@dataclass
class Group:
    group_id: str
    state: State = State.EMPTY
    generation: int = 0
    protocol_type: str = ""
    protocol: str = ""
    leader: str = ""
    members: dict[str, Member] = field(default_factory=dict)
    rebalance: asyncio.TimerHandle | None = None
    initial_delay: bool = False  # a new group's first rebalance waits out its short delay


Persist = Callable[[str, dict[str, Any] | None], Awaitable[None]]


async def _forget(group_id: str, record: dict[str, Any] | None) -> None:
    return None


class GroupCoordinator:
    """persist(group_id, record) keeps a group's settled membership (None: it has none) where
    the next coordinator finds it (the metadata log); load() takes those records back."""

    def __init__(self, persist: Persist = _forget) -> None:
        self.groups: dict[str, Group] = {}
        self.persist = persist
        self._sweeper: asyncio.Task[None] | None = None
        self._persisting: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    def close(self) -> None:
        """This node stops being the coordinator (or stops): members will find the new one."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        for task in self._persisting:
            task.cancel()
        for group in self.groups.values():
            self._fail_waiters(group)
        self.groups.clear()

    def reset(self) -> None:
        """The metadata leader moved: this node's membership state is no longer the truth."""
        for group in self.groups.values():
            self._fail_waiters(group)
        self.groups.clear()

    def _fail_waiters(self, group: Group) -> None:
        if group.rebalance is not None:
            group.rebalance.cancel()
        for member in group.members.values():
            for future in (member.joining, member.syncing):
                if future is not None and not future.done():
                    future.set_exception(GroupError(16, "the coordinator moved"))

    # -- JoinGroup ------------------------------------------------------------------------------

    async def join(
        self,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        client_id: str,
        client_host: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
    ) -> dict[str, Any]:
        if not SESSION_TIMEOUT_MIN_MS <= session_timeout_ms <= SESSION_TIMEOUT_MAX_MS:
            raise GroupError(
                INVALID_SESSION_TIMEOUT,
                f"session timeout {session_timeout_ms} ms outside "
                f"[{SESSION_TIMEOUT_MIN_MS}, {SESSION_TIMEOUT_MAX_MS}]",
            )
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = Group(group_id)
        if member_id and member_id not in group.members:
            raise GroupError(UNKNOWN_MEMBER_ID, f"member {member_id} is not in group {group_id}")
        if not protocols or (group.members and protocol_type != group.protocol_type):
            raise GroupError(INCONSISTENT_GROUP_PROTOCOL, "protocol type differs from the group's")
        if group.members and not self._common_protocols(group, member_id, protocols):
            raise GroupError(INCONSISTENT_GROUP_PROTOCOL, "no assignor in common with the group")
        if not member_id:
            member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
        member = group.members.get(member_id)
        loop = asyncio.get_running_loop()
        rebalance_s = max(rebalance_timeout_ms, session_timeout_ms) / 1000
        if member is None:
            member = Member(
                member_id,
                group_instance_id,
                client_id,
                client_host,
                session_timeout_ms / 1000,
                rebalance_s,
                protocol_type,
                protocols,
            )
            group.members[member_id] = member
            if not group.leader:
                group.leader = member_id
        else:
            member.protocols = protocols
            member.session_timeout_s = session_timeout_ms / 1000
            member.rebalance_timeout_s = rebalance_s
        member.last_seen = time.monotonic()
        group.protocol_type = protocol_type
        if member.joining is not None and not member.joining.done():
            member.joining.set_exception(GroupError(UNKNOWN_MEMBER_ID, "joined again"))
        joining: asyncio.Future[dict[str, Any]] = loop.create_future()
        member.joining = joining
        self._prepare_rebalance(group, f"member {member_id} joined")
        self._maybe_complete_join(group)
        return await joining

    @staticmethod
    def _common_protocols(
        group: Group, member_id: str, protocols: list[tuple[str, bytes]]
    ) -> set[str]:
        names = {name for name, _ in protocols}
        for other in group.members.values():
            if other.member_id != member_id:
                names &= {name for name, _ in other.protocols}
        return names

    def _prepare_rebalance(self, group: Group, why: str) -> None:
        if group.state is State.PREPARING_REBALANCE:
            return
        log.info("group %s: rebalancing (%s)", group.group_id, why)
        for member in group.members.values():  # a sync waiting for the old generation ends
            if member.syncing is not None and not member.syncing.done():
                member.syncing.set_exception(GroupError(REBALANCE_IN_PROGRESS))
        initial = group.state is State.EMPTY
        group.state = State.PREPARING_REBALANCE
        delay = (
            INITIAL_REBALANCE_DELAY_S
            if initial
            else max((m.rebalance_timeout_s for m in group.members.values()), default=0.0)
        )
        loop = asyncio.get_running_loop()
        group.rebalance = loop.call_later(delay, self._complete_join, group, True)
        group.initial_delay = initial

    def _maybe_complete_join(self, group: Group) -> None:
        """Everyone known has joined again: no need to wait out the timeout (except a new
        group's short initial delay, which waits for members starting together)."""
        if group.state is not State.PREPARING_REBALANCE:
            return
        if group.initial_delay:
            return
        if all(m.joining is not None and not m.joining.done() for m in group.members.values()):
            if group.rebalance is not None:
                group.rebalance.cancel()
            self._complete_join(group, False)

    def _complete_join(self, group: Group, timed_out: bool) -> None:
        if (
            group.state is not State.PREPARING_REBALANCE
            or self.groups.get(group.group_id) is not group
        ):
            return
        group.initial_delay = False
        group.rebalance = None
        for member in list(group.members.values()):
            if member.joining is None or member.joining.done():
                log.info(
                    "group %s: member %s did not rejoin in time", group.group_id, member.member_id
                )
                del group.members[member.member_id]
        if not group.members:
            group.state = State.EMPTY
            group.leader = ""
            group.generation += 1
            return
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        leader = group.members[group.leader]
        common = self._common_protocols(group, group.leader, leader.protocols)
        group.protocol = next(name for name, _ in leader.protocols if name in common)
        group.generation += 1
        group.state = State.COMPLETING_REBALANCE
        log.info(
            "group %s: generation %d, %d member(s), leader %s, assignor %s",
            group.group_id,
            group.generation,
            len(group.members),
            group.leader,
            group.protocol,
        )
        everyone = [
            {
                "member_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "metadata": m.metadata_for(group.protocol),
            }
            for m in group.members.values()
        ]
        for member in group.members.values():
            member.assignment = b""
            member.last_seen = time.monotonic()
            if member.joining is None:
                raise InvariantBroken("member.joining is not None")
            member.joining.set_result(
                {
                    "error_code": NONE,
                    "generation_id": group.generation,
                    "protocol_type": group.protocol_type,
                    "protocol_name": group.protocol,
                    "leader": group.leader,
                    "member_id": member.member_id,
                    "members": everyone if member.member_id == group.leader else [],
                }
            )
            member.joining = None

    # -- SyncGroup, Heartbeat, LeaveGroup ---------------------------------------------------------

    def check_member(self, group_id: str, member_id: str, generation: int) -> tuple[Group, Member]:
        group = self.groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None:
            raise GroupError(UNKNOWN_MEMBER_ID, f"member {member_id} is not in group {group_id}")
        member.last_seen = time.monotonic()
        if generation != group.generation:
            raise GroupError(
                ILLEGAL_GENERATION, f"generation {generation} is not {group.generation}"
            )
        return group, member

    async def sync(
        self, group_id: str, member_id: str, generation: int, assignments: dict[str, bytes]
    ) -> dict[str, Any]:
        group, member = self.check_member(group_id, member_id, generation)
        if group.state is State.PREPARING_REBALANCE:
            raise GroupError(REBALANCE_IN_PROGRESS)
        if group.state is State.STABLE:
            return self._sync_answer(group, member)
        if member_id == group.leader:
            for m in group.members.values():
                m.assignment = assignments.get(m.member_id, b"")
            generation = group.generation
            # Kept before anyone is answered, as Kafka writes the group to __consumer_offsets
            # before answering SyncGroup: a coordinator that fails now loses no assignment.
            await self.persist(group.group_id, record_of(group))
            if group.generation != generation or group.state is not State.COMPLETING_REBALANCE:
                raise GroupError(REBALANCE_IN_PROGRESS)  # changed while it was being kept
            group.state = State.STABLE
            for m in group.members.values():
                if m.syncing is not None and not m.syncing.done():
                    m.syncing.set_result(self._sync_answer(group, m))
                m.syncing = None
            return self._sync_answer(group, member)
        if member.syncing is None or member.syncing.done():
            member.syncing = asyncio.get_running_loop().create_future()
        return await member.syncing

    @staticmethod
    def _sync_answer(group: Group, member: Member) -> dict[str, Any]:
        return {
            "error_code": NONE,
            "protocol_type": group.protocol_type,
            "protocol_name": group.protocol,
            "assignment": member.assignment,
        }

    def heartbeat(self, group_id: str, member_id: str, generation: int) -> None:
        group, _ = self.check_member(group_id, member_id, generation)
        if group.state is State.PREPARING_REBALANCE:
            raise GroupError(REBALANCE_IN_PROGRESS)

    def leave(self, group_id: str, member_id: str) -> int:
        group = self.groups.get(group_id)
        if group is None or member_id not in group.members:
            return UNKNOWN_MEMBER_ID
        self._remove(group, member_id, "left")
        return NONE

    def _remove(self, group: Group, member_id: str, why: str) -> None:
        member = group.members.pop(member_id)
        for future in (member.joining, member.syncing):
            if future is not None and not future.done():
                future.set_exception(GroupError(UNKNOWN_MEMBER_ID, why))
        if group.leader == member_id:
            group.leader = next(iter(group.members), "")
        if not group.members:
            if group.rebalance is not None:
                group.rebalance.cancel()
                group.rebalance = None
            group.state = State.EMPTY
            group.generation += 1
            task = asyncio.get_running_loop().create_task(self._forget(group.group_id))
            self._persisting.add(task)
            task.add_done_callback(self._persisting.discard)
            return
        self._prepare_rebalance(group, f"member {member_id} {why}")
        self._maybe_complete_join(group)

    async def _forget(self, group_id: str) -> None:
        try:
            await self.persist(group_id, None)
        except Exception as exc:  # the next coordinator loads members that will not come back
            log.info("group %s: its empty state was not kept: %s", group_id, exc)

    def load(self, records: Mapping[str, Mapping[str, Any]]) -> None:
        """Become the coordinator of the groups kept by the one before: each is Stable in its
        generation, its members' sessions restarted now (a member that is gone expires)."""
        now = time.monotonic()
        for group_id, record in records.items():
            if group_id in self.groups:
                continue
            group = Group(
                group_id,
                State.STABLE,
                int(record["generation"]),
                str(record["protocol_type"]),
                str(record["protocol"]),
                str(record["leader"]),
            )
            for m in record["members"]:
                member = Member(
                    str(m["member_id"]),
                    m.get("group_instance_id"),
                    str(m["client_id"]),
                    str(m["client_host"]),
                    float(m["session_timeout_s"]),
                    float(m["rebalance_timeout_s"]),
                    group.protocol_type,
                    [(str(n), base64.b64decode(d)) for n, d in m["protocols"]],
                    now,
                    base64.b64decode(m["assignment"]),
                )
                group.members[member.member_id] = member
            self.groups[group_id] = group
        if records:
            log.info("coordinator: loaded %d group(s) from the metadata log", len(records))

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            now = time.monotonic()
            for group in list(self.groups.values()):
                for member in list(group.members.values()):
                    waiting = any(
                        f is not None and not f.done() for f in (member.joining, member.syncing)
                    )
                    if not waiting and now - member.last_seen > member.session_timeout_s:
                        log.info(
                            "group %s: member %s's session expired",
                            group.group_id,
                            member.member_id,
                        )
                        self._remove(group, member.member_id, "session expired")

    # -- describing -------------------------------------------------------------------------------

    def describe(self, group_id: str) -> dict[str, Any]:
        group = self.groups.get(group_id)
        if group is None:
            return {"group_id": group_id, "group_state": "Dead", "protocol_type": "", "members": []}
        return {
            "group_id": group_id,
            "group_state": group.state.value,
            "protocol_type": group.protocol_type,
            "protocol_data": group.protocol,
            "members": [
                {
                    "member_id": m.member_id,
                    "group_instance_id": m.group_instance_id,
                    "client_id": m.client_id,
                    "client_host": m.client_host,
                    "member_metadata": m.metadata_for(group.protocol),
                    "member_assignment": m.assignment,
                }
                for m in group.members.values()
            ],
        }

    def delete(self, group_id: str) -> None:
        group = self.groups.get(group_id)
        if group is not None and group.members:
            raise GroupError(68, f"group {group_id} has members")  # NON_EMPTY_GROUP
        self.groups.pop(group_id, None)


def record_of(group: Group) -> dict[str, Any]:
    """A settled group as the metadata log keeps it (JSON)."""
    return {
        "generation": group.generation,
        "protocol_type": group.protocol_type,
        "protocol": group.protocol,
        "leader": group.leader,
        "members": [
            {
                "member_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "session_timeout_s": m.session_timeout_s,
                "rebalance_timeout_s": m.rebalance_timeout_s,
                "protocols": [[n, base64.b64encode(d).decode()] for n, d in m.protocols],
                "assignment": base64.b64encode(m.assignment).decode(),
            }
            for m in group.members.values()
        ],
    }
