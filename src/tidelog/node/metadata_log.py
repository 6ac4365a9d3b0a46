"""The node's side of the metadata log (KRaft's `__cluster_metadata`): the state every node
applies from it, proposing a command and waiting until this node has applied it, and the
periodic checks' commands, proposed here when this node leads the log and sent to its leader
otherwise.

The replica group itself (`__metadata/0`) is one of the node's replica groups; this module
reads it from the shared hosts table and never opens or ticks it.
"""

from __future__ import annotations

import asyncio
import json
import logging

from tidelog.errors import NotLeader, TidelogError
from tidelog.node.background import BackgroundTasks
from tidelog.node.partition import PartitionHost
from tidelog.node.state_machine import MetadataMachine
from tidelog.node.transport import PeerSender
from tidelog.protocol import api
from tidelog.protocol.api import ApiKey
from tidelog.record.batch import ProducerRecord, build_batch
from tidelog.replication.metadata import METADATA_GROUP, MetadataState
from tidelog.replication.metadata_commands import MetadataCommand

log = logging.getLogger(__name__)

APPLIED_POLL_S = 0.01


class MetadataLog:
    def __init__(
        self,
        node_id: int,
        hosts: dict[str, PartitionHost],
        machine: MetadataMachine,
        send_to_peer: PeerSender,
        background: BackgroundTasks,
    ) -> None:
        self.node_id = node_id
        self.hosts = hosts  # the node's replica groups (shared): the metadata log's is one
        self.machine = machine
        self.send_to_peer = send_to_peer
        self.background = background
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._background_proposals: set[str] = set()

    @property
    def state(self) -> MetadataState:
        return self.machine.state

    @property
    def host(self) -> PartitionHost:
        return self.hosts[METADATA_GROUP]

    @property
    def is_leader(self) -> bool:
        return self.host.replica.is_leader

    @property
    def leader_id(self) -> int:
        return self.host.replica.leader_id

    @property
    def opened(self) -> bool:
        return METADATA_GROUP in self.hosts

    def behind(self) -> str:
        """Why this node's metadata may lack committed commands ("" if it is current: it
        leads the metadata log, or follows a leader it has heard and applied what it heard)."""
        replica = self.host.replica
        if replica.is_leader:
            return ""
        if replica.is_observer:
            return "it is rejoining the cluster after losing its disk"
        if replica.leader_id < 0:
            return "it has heard from no metadata leader (an election, or one still running)"
        applied, known = self.state.applied_offset, replica.leader_high_watermark
        if applied < known:
            return f"it has applied the metadata log to {applied} of {known}"
        return ""

    def require_started(self) -> None:
        """Listeners are bound (and a port chosen) before the metadata log is open: a request
        in between is told to come again, as one to a node that is not the leader is."""
        if not self.opened:
            raise NotLeader(f"node {self.node_id} is starting", leader_hint=-1)

    def require_current(self, what: str, partition_request: bool = False) -> None:
        """Before "no such thing" is answered from this node's metadata: when it may lack
        committed commands, the answer is retriable (NotLeader) and the client asks another
        node (a node back from a lost disk called an existing topic unknown while it caught
        up). A partition request's NotLeader hints no node (the metadata leader need not lead
        the partition): its client tries the partition's replicas in turn instead."""
        behind = self.behind()
        if behind:
            raise NotLeader(
                f"node {self.node_id} does not know {what} yet: {behind}",
                leader_hint=-1 if partition_request else self.host.leader_hint,
            )

    def require_leader(self) -> None:
        """Admin changes are checked against the metadata leader's state, not a follower's
        (which may not have applied the latest commands yet)."""
        host = self.host
        if not host.replica.is_leader:
            raise NotLeader("not the metadata leader", leader_hint=host.leader_hint)

    def release_waiters(self) -> None:
        """The metadata log's HW moved: proposals this node has now applied are answered."""
        applied = self.state.applied_offset
        keep: list[tuple[int, asyncio.Future[None]]] = []
        for offset, future in self._waiters:
            if offset < applied:
                if not future.done():
                    future.set_result(None)
            else:
                keep.append((offset, future))
        self._waiters = keep

    async def applied_past(self, offset: int, timeout_s: float) -> bool:
        """Whether this node has applied the command at offset, waiting up to timeout_s for
        its replica of the metadata log to catch up (a follower learns of commits a little
        after its leader)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.state.applied_offset <= offset:
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(APPLIED_POLL_S)
        return True

    async def propose(self, command: MetadataCommand, timeout_s: float) -> int:
        """Commit command (this node must lead the metadata log) and wait until this node has
        applied it; its offset."""
        host = self.host
        if not host.replica.is_leader:
            raise NotLeader("not the metadata leader", leader_hint=host.leader_hint)
        batch = build_batch([ProducerRecord(None, json.dumps(command.encode()).encode())])
        info = host.replica.propose(batch)
        host.process_ready()
        await host.wait_for_ack(info.last_offset, api.ACKS_ALL, timeout_s)
        if self.state.applied_offset <= info.last_offset:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append((info.last_offset, future))
            await asyncio.wait_for(future, timeout_s)
        return info.last_offset

    @property
    def proposing(self) -> frozenset[str]:
        """The keys of the background proposals under way."""
        return frozenset(self._background_proposals)

    def propose_in_background(self, key: str, command: MetadataCommand) -> None:
        """Propose a command a periodic check found due, one at a time per key: a failure is
        logged and the next check proposes it again (if it is still due)."""
        if key in self._background_proposals:
            return
        self._background_proposals.add(key)

        async def propose() -> None:
            try:
                await self.propose(command, 30.0)
                log.info("metadata: %s", key)
            except TidelogError as exc:
                log.warning("metadata: %s failed, to be proposed again: %s", key, exc)
            finally:
                self._background_proposals.discard(key)

        self.background.start(propose())

    def report(self, key: str, api_key: ApiKey, command: MetadataCommand) -> None:
        """A periodic check's finding: proposed here if this node leads the metadata log, sent
        to its leader (who proposes it) otherwise, as the header of an api_key message (the
        command's record); dropped while no leader is known (the next check reports it
        again)."""
        if self.is_leader:
            self.propose_in_background(key, command)
            return
        leader = self.leader_id
        if leader >= 0:
            self.send_to_peer(leader, api_key, command.encode(), None)
