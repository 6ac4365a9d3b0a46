"""What the handlers share: the metadata log's applied state, its replica group and proposing to
it, and the node's config as it is now (its ports are known once its listeners are bound)."""

from __future__ import annotations

from collections.abc import Callable

from tidelog.node.config import NodeConfig
from tidelog.node.metadata_log import MetadataLog
from tidelog.node.partition import PartitionHost
from tidelog.replication.metadata import MetadataState
from tidelog.replication.metadata_commands import MetadataCommand


class MetadataOps:
    metadata_log: MetadataLog

    @property
    def metadata(self) -> MetadataState:
        return self.metadata_log.state

    @property
    def metadata_host(self) -> PartitionHost:
        return self.metadata_log.host

    async def propose_metadata(self, command: MetadataCommand, timeout_s: float) -> int:
        return await self.metadata_log.propose(command, timeout_s)


class ConfiguredOps(MetadataOps):
    _config: Callable[[], NodeConfig]

    @property
    def config(self) -> NodeConfig:
        return self._config()
