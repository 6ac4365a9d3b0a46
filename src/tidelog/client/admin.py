"""Administering the cluster: topics and their moves, nodes and leaders, cursors, principals,
ACLs, quotas, the archive record and feature levels. Changes go through the metadata log's leader (routing's
`to_metadata_leader`), and so do the reads that must see them (read-your-writes); waits poll
the metadata leader until the change is done."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from tidelog.acls import Acl
from tidelog.client.consume import Reader
from tidelog.client.metadata import ClusterInfo, NodeInfo, TopicInfo
from tidelog.client.routing import Router
from tidelog.cluster_status import node_status
from tidelog.errors import TidelogError, Timeout, UnknownNode
from tidelog.principals import new_token
from tidelog.protocol import api
from tidelog.protocol.api import ApiKey
from tidelog.scram import credentials

POLL_S = 0.2  # between two looks at a change that is under way
LEADERS_WAIT_S = 30.0  # how long a new topic's or partition's leaders are waited for


class Admin:
    def __init__(self, router: Router, reader: Reader) -> None:
        self._router = router
        self._reader = reader  # offsets: a cursor's start, a leader that answers

    async def _to_metadata_leader(self, key: ApiKey, request: Any) -> dict[str, Any]:
        return await self._router.to_metadata_leader(key, request)

    # -- topics -----------------------------------------------------------------------------------

    async def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        configs: dict[str, str] | None,
        kind: str,
        wait_for_leaders: bool,
    ) -> TopicInfo:
        request = api.CreateTopicRequest(
            name, partitions, replication_factor, dict(configs or {}), kind
        )
        await self._to_metadata_leader(ApiKey.CREATE_TOPIC, request)
        await self._router.refresh_metadata([name], at_metadata_leader=True)
        info = await self._router.topic(name)
        if wait_for_leaders:
            await self.wait_for_leaders(name, LEADERS_WAIT_S)
        return info

    async def delete_topic(self, name: str, force: bool) -> api.DeleteTopicResponse:
        request = api.DeleteTopicRequest(name, force)
        header = await self._to_metadata_leader(ApiKey.DELETE_TOPIC, request)
        self._router.metadata.topics.pop(name, None)
        return api.decode(api.DeleteTopicResponse, header)

    async def alter_topic(
        self, name: str, configs: dict[str, str] | None, delete_configs: list[str] | None
    ) -> api.AlterTopicResponse:
        request = api.AlterTopicRequest(name, dict(configs or {}), list(delete_configs or []))
        header = await self._to_metadata_leader(ApiKey.ALTER_TOPIC, request)
        return api.decode(api.AlterTopicResponse, header)

    async def add_partitions(self, name: str, partitions: int, wait_for_leaders: bool) -> TopicInfo:
        request = api.CreatePartitionsRequest(name, partitions)
        await self._to_metadata_leader(ApiKey.CREATE_PARTITIONS, request)
        info = await self._router.topic(name, refresh=True)
        if wait_for_leaders:
            await self.wait_for_leaders(name, LEADERS_WAIT_S)
        return info

    async def reassign_partition(
        self,
        topic: str,
        partition: int,
        replicas: list[int],
        throttle_bytes: int,
        wait: bool,
        timeout_s: float,
    ) -> api.ReassignPartitionResponse:
        request = api.ReassignPartitionRequest(topic, partition, list(replicas), throttle_bytes)
        header = await self._to_metadata_leader(ApiKey.ALTER_PARTITION_REASSIGNMENTS, request)
        response = api.decode(api.ReassignPartitionResponse, header)
        if wait:
            await self.wait_for_reassignment(topic, partition, timeout_s)
        return response

    async def wait_for_reassignment(
        self, topic: str, partition: int, timeout_s: float
    ) -> TopicInfo:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            await self._router.refresh_metadata([topic], at_metadata_leader=True)
            info = await self._router.topic(topic)
            if partition not in info.reassigning:
                return info
            if loop.time() > deadline:
                raise Timeout(
                    f"{topic}/{partition} still moving off nodes {info.reassigning[partition]} "
                    f"after {timeout_s}s"
                )
            await asyncio.sleep(POLL_S)

    async def wait_for_leaders(self, topic: str, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        cache = self._router.metadata
        while True:
            info = await self._router.topic(topic, refresh=True)
            missing = [p for p in range(info.partitions) if (topic, p) not in cache.leaders]
            if not missing:
                return
            for p in list(missing):
                with contextlib.suppress(TidelogError):
                    await self._reader.list_offsets(topic, p, "latest")
                    missing.remove(p)  # a leader answered (one the metadata node may not know)
            if not missing:
                return
            if loop.time() > deadline:
                raise Timeout(f"no leader for {topic} partitions {missing} after {timeout_s}s")
            if any((topic, p) not in cache.leaders for p in missing):
                await asyncio.sleep(0.05)

    async def delete_records(
        self, topic: str, partition: int, before_offset: int, force: bool
    ) -> int:
        request = api.DeleteRecordsRequest(topic, partition, before_offset, force)
        header, _ = await self._router.to_leader(topic, partition, ApiKey.DELETE_RECORDS, request)
        return api.decode(api.DeleteRecordsResponse, header).log_start_offset

    # -- the cluster's nodes and leaders ----------------------------------------------------------

    async def describe_cluster(self, leader_only: bool) -> ClusterInfo:
        request = api.DescribeClusterRequest(leader_only)
        if leader_only:
            header = await self._to_metadata_leader(ApiKey.DESCRIBE_CLUSTER, request)
        else:
            header, _ = await self._router.any_node(ApiKey.DESCRIBE_CLUSTER, request)
        resp = api.decode(api.DescribeClusterResponse, header)
        return ClusterInfo(
            resp.cluster_id,
            resp.metadata_leader,
            [NodeInfo.of_wire(n) for n in resp.nodes],
            list(resp.metadata_voters),
            list(resp.metadata_learners),
            list(resp.metadata_base_voters),
            list(resp.removed_nodes),
            dict(resp.finalized_features),
        )

    async def add_node(
        self, node_id: int, host: str, port: int, peer_port: int, wait: bool, timeout_s: float
    ) -> NodeInfo:
        request = api.AddNodeRequest(node_id, host, port, peer_port)
        await self._to_metadata_leader(ApiKey.ADD_NODE, request)
        return await self.wait_for_node(node_id, "voter" if wait else "", timeout_s)

    async def remove_node(
        self, node_id: int, throttle_bytes: int, wait: bool, timeout_s: float
    ) -> int:
        request = api.RemoveNodeRequest(node_id, throttle_bytes)
        header = await self._to_metadata_leader(ApiKey.REMOVE_NODE, request)
        moves = int(api.decode(api.NodeChangeResponse, header).moves)
        if wait:
            await self.wait_for_node(node_id, "removed", timeout_s)
        return moves

    async def wait_for_node(self, node_id: int, state: str, timeout_s: float) -> NodeInfo:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        last: NodeInfo | None = None
        while True:
            info = await self.describe_cluster(leader_only=True)
            node = info.node(node_id)
            last = node or last
            if node is None and node_id in info.removed_nodes:
                if state == "removed":
                    return last or NodeInfo(node_id, "", 0, 0, True, "")
                raise UnknownNode(f"node {node_id} was removed from the cluster", node_id=node_id)
            if node is not None and state in ("", node.metadata_role):
                return node
            if loop.time() > deadline:
                now = "gone" if node is None else node.metadata_role or "not a member"
                raise Timeout(f"node {node_id} is {now}, not {state}, after {timeout_s}s")
            await asyncio.sleep(POLL_S)

    async def elect_leaders(
        self, node_id: int, topic: str, partition: int, unclean: bool, campaign: bool
    ) -> api.ElectLeadersResponse:
        address = (await self._router.nodes()).get(node_id)
        if address is None:  # a node added since we last asked?
            await self._router.refresh_metadata([])
            address = self._router.node_address(node_id)
        if address is None:
            raise UnknownNode(f"no node {node_id} in this cluster", node_id=node_id)
        request = api.ElectLeadersRequest(topic, partition, unclean, campaign)
        header, _ = await self._router.call(address, ApiKey.ELECT_LEADERS, request, timeout_s=10.0)
        return api.decode(api.ElectLeadersResponse, header)

    async def elect_preferred_leader(
        self, topic: str, partition: int, node_id: int, timeout_s: float
    ) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            resp = await self.elect_leaders(node_id, topic, partition, False, True)
            if resp.role == "leader":
                return
            if loop.time() > deadline:
                raise Timeout(
                    f"node {node_id} does not lead {topic}/{partition} after {timeout_s}s "
                    f"(leader {resp.leader})"
                )
            await asyncio.sleep(POLL_S)

    async def status(self, topics: list[str] | None) -> list[dict[str, Any]]:
        nodes = await self._router.nodes()

        async def one(node_id: int, address: tuple[str, int]) -> dict[str, Any]:
            async def page(request: api.StatusRequest) -> dict[str, Any]:
                header, _ = await self._router.call(address, ApiKey.STATUS, request, timeout_s=5.0)
                return header

            try:
                return await node_status(page, topics)
            except TidelogError as exc:
                return {
                    "node_id": node_id,
                    "error": exc.to_wire(),
                    "partitions": [],
                    "metadata": {},
                }

        return list(await asyncio.gather(*(one(n, a) for n, a in sorted(nodes.items()))))

    # -- cursors ----------------------------------------------------------------------------------

    async def create_cursor(
        self,
        name: str,
        topic: str,
        start: int | str | dict[int, int],
        backup: bool,
        if_not_exists: bool,
    ) -> dict[str, Any]:
        info = await self._router.topic(topic)
        if isinstance(start, dict):
            positions = {str(p): int(o) for p, o in start.items()}
        else:
            positions = {
                str(p): await self._reader.resolve_start(topic, p, start)
                for p in range(info.partitions)
            }
        request = api.CursorRequest(
            "create", name, topic, positions, backup=backup, if_not_exists=if_not_exists
        )
        header = await self._to_metadata_leader(ApiKey.CURSOR, request)
        return dict(api.decode(api.CursorResponse, header).cursors[0])

    async def commit_cursor(
        self, name: str, positions: dict[int, int], isolation_level: str = api.READ_UNCOMMITTED
    ) -> dict[str, Any]:
        request = api.CursorRequest(
            "commit",
            name,
            positions={str(p): o for p, o in positions.items()},
            isolation_level=isolation_level,
        )
        header = await self._to_metadata_leader(ApiKey.CURSOR, request)
        return dict(api.decode(api.CursorResponse, header).cursors[0])

    async def delete_cursor(self, name: str) -> None:
        await self._to_metadata_leader(ApiKey.CURSOR, api.CursorRequest("delete", name))

    async def cursors(self, name: str | None) -> list[dict[str, Any]]:
        request = api.CursorRequest("describe" if name else "list", name or "")
        # Read-your-writes: a position just committed (or a cursor just created) may not have
        # reached a follower yet, and a Spark driver's restart or two CLI calls ask anew.
        header = await self._to_metadata_leader(ApiKey.CURSOR, request)
        return list(api.decode(api.CursorResponse, header).cursors)

    # -- principals, ACLs and quotas --------------------------------------------------------------

    async def add_principal(self, name: str) -> str:
        token, encoded = new_token(name)
        scram = credentials(token.partition(":")[2])  # for Kafka clients' SASL/SCRAM
        request = api.PrincipalsRequest("add", name, encoded, scram)
        await self._to_metadata_leader(ApiKey.PRINCIPALS, request)
        return token

    async def principals(self) -> list[dict[str, Any]]:
        header = await self._to_metadata_leader(ApiKey.PRINCIPALS, api.PrincipalsRequest("list"))
        return list(api.decode(api.PrincipalsResponse, header).principals)

    async def remove_principal(self, name: str) -> int:
        request = api.PrincipalsRequest("remove", name)
        header = await self._to_metadata_leader(ApiKey.PRINCIPALS, request)
        return api.decode(api.PrincipalsResponse, header).acls_removed

    async def change_acl(self, op: str, acl: Acl) -> dict[str, Any]:
        header = await self._to_metadata_leader(ApiKey.ACLS, api.AclsRequest(op, acl.to_wire()))
        return dict(api.decode(api.AclsResponse, header).acls[0])

    async def acls(self, principal: str | None) -> list[dict[str, Any]]:
        request = api.AclsRequest("list", principal=principal or "")
        header = await self._to_metadata_leader(ApiKey.ACLS, request)  # read-your-writes
        return list(api.decode(api.AclsResponse, header).acls)

    async def set_quota(self, principal: str, limits: dict[str, float]) -> dict[str, Any]:
        request = api.QuotasRequest("set", principal, dict(limits))
        header = await self._to_metadata_leader(ApiKey.QUOTAS, request)
        return dict(api.decode(api.QuotasResponse, header).quotas[0])

    async def quotas(self) -> list[dict[str, Any]]:
        header = await self._to_metadata_leader(ApiKey.QUOTAS, api.QuotasRequest("list"))
        return list(api.decode(api.QuotasResponse, header).quotas)

    async def remove_quota(self, principal: str) -> None:
        await self._to_metadata_leader(ApiKey.QUOTAS, api.QuotasRequest("remove", principal))

    # -- the archive ------------------------------------------------------------------------------

    async def archive(self) -> api.ArchiveResponse:
        header = await self._to_metadata_leader(ApiKey.ARCHIVE, api.ArchiveRequest("describe"))
        return api.decode(api.ArchiveResponse, header)

    async def accept_archive_loss(self) -> api.ArchiveResponse:
        request = api.ArchiveRequest("accept_loss")
        header = await self._to_metadata_leader(ApiKey.ARCHIVE, request)
        return api.decode(api.ArchiveResponse, header)

    # -- feature levels ---------------------------------------------------------------------------

    async def describe_features(self) -> api.FeaturesResponse:
        request = api.FeaturesRequest("describe")
        header = await self._to_metadata_leader(ApiKey.FEATURES, request)  # read-your-writes
        return api.decode(api.FeaturesResponse, header)

    async def update_features(self, level: int, downgrade: bool) -> api.FeaturesResponse:
        request = api.FeaturesRequest("downgrade" if downgrade else "upgrade", level)
        header = await self._to_metadata_leader(ApiKey.FEATURES, request)
        return api.decode(api.FeaturesResponse, header)
