"""A partition's last stable offset as its leader has it now, for the check of a read_committed
cursor commit at the metadata leader (node/ops/cursors.py). Read here when this node leads the
partition; else asked of its leader, as one page of that leader's STATUS for that one
partition: STATUS is the cluster's DESCRIBE, which needs no ACL, so the ask works whatever this
node's own principal may read. Within a leader's epoch the LSO only grows, so a position at or
below what the leader answered stays at or below its LSO when the commit applies."""

from __future__ import annotations

from tidelog.errors import TidelogError, Timeout
from tidelog.node.asking import NodeAsker
from tidelog.node.metadata_log import MetadataLog
from tidelog.node.ops.base import MetadataOps
from tidelog.node.partition import PartitionHost
from tidelog.protocol import api
from tidelog.protocol.api import ApiKey

ASKS = 3  # leaders followed per partition (an election may move it once or twice meanwhile)
ASK_TIMEOUT_S = 5.0


class LeaderStableOffsets(MetadataOps):
    def __init__(
        self,
        node_id: int,
        metadata_log: MetadataLog,
        hosts: dict[str, PartitionHost],
        asker: NodeAsker,
    ) -> None:
        self.node_id = node_id
        self.metadata_log = metadata_log
        self.hosts = hosts  # the node's replica groups (shared)
        self.asker = asker

    async def last_stable_offset(self, topic: str, partition: int) -> int:
        """The partition leader's LSO now; Timeout (retriable) when no leader answered."""
        host = self.hosts.get(f"{topic}/{partition}")
        if host is not None and host.replica.is_leader:
            return host.replica.last_stable_offset()
        leader = host.leader_hint if host is not None else None
        if leader is None:
            leader = self.metadata.topic(topic).assignments[partition][0]  # the preferred one
        why = "no leader known"
        for _ in range(ASKS):
            if leader == self.node_id:
                why = f"node {leader} (this one) does not lead it yet"
                break
            try:
                status = await self._status_of(leader, topic, partition)
            except TidelogError as exc:
                why = f"node {leader} did not answer: {exc}"
                break
            if status is None:
                why = f"node {leader} holds no replica of it"
                break
            if status.get("role") == "leader":
                # A leader from before transactions reports no LSO: its LSO is its HW.
                for name in ("last_stable_offset", "high_watermark"):
                    found = status.get(name, -1)
                    if isinstance(found, int) and found >= 0:
                        return found
                why = f"node {leader} reported neither its LSO nor its HW"
                break
            hint = status.get("leader", -1)
            if not isinstance(hint, int) or hint < 0 or hint == leader:
                why = f"node {leader} knows no other leader"
                break
            leader = hint
        raise Timeout(
            f"the last stable offset of {topic}/{partition} could not be learned from its "
            f"leader ({why}); try again"
        )

    async def _status_of(self, node: int, topic: str, partition: int) -> dict[str, object] | None:
        """The node's status of that one partition; None if it holds no replica of it."""
        request = api.StatusRequest([topic], topic, partition - 1, 1)
        header = await self.asker.ask(node, ApiKey.STATUS, request, ASK_TIMEOUT_S)
        for entry in api.decode(api.StatusResponse, header).partitions:
            if entry.get("topic") == topic and entry.get("partition") == partition:
                return dict(entry)
        return None
