"""Feature levels from outside (Kafka's `kafka-features.sh describe|upgrade|downgrade`): the
cluster's finalized level and each node's range, and finalizing another level through the
metadata log, where tidelog/features.py allows it."""

from __future__ import annotations

import logging
import time

from tidelog.errors import InvalidRequest
from tidelog.features import (
    FEATURE,
    LEVELS,
    check_downgrade,
    check_upgrade,
    highest_common,
    upgrade_target,
)
from tidelog.node.feature_levels import FeatureLevels
from tidelog.node.metadata_log import MetadataLog
from tidelog.node.ops.base import MetadataOps
from tidelog.protocol import api
from tidelog.replication.metadata_commands import FeatureLevel

log = logging.getLogger(__name__)

OPS = ("describe", "upgrade", "downgrade")


class FeatureOps(MetadataOps):
    def __init__(self, node_id: int, metadata_log: MetadataLog, features: FeatureLevels) -> None:
        self.node_id = node_id
        self.metadata_log = metadata_log
        self.features = features

    async def features_request(
        self, req: api.FeaturesRequest, payload: bytes
    ) -> api.FeaturesResponse:
        if req.op not in OPS:
            raise InvalidRequest(f"unknown features op {req.op!r} ({', '.join(OPS)})")
        if req.feature != FEATURE:
            raise InvalidRequest(f"unknown feature {req.feature!r}; tidelog has {FEATURE}")
        if req.op == "describe":
            return self.describe()
        # Checked against, and proposed by, the metadata leader: its state is the latest.
        self.metadata_log.require_leader()
        finalized = self.metadata.finalized_level
        ranges = self.features.ranges()
        if req.op == "upgrade":
            level = upgrade_target(finalized, req.level, ranges)
            check_upgrade(finalized, level, ranges)
        else:
            level = req.level or finalized - 1
            check_downgrade(finalized, level, ranges)
        if level == finalized:
            # Already there (asked again, or nothing higher every node supports): a success
            # that changed nothing, as a script running the same step twice expects.
            return self.describe(changed=False)
        command = FeatureLevel(FEATURE, level, False, int(time.time() * 1000))
        await self.propose_metadata(command, 30.0)
        log.warning("cluster: %s finalized at %d (%s from %d)", FEATURE, level, req.op, finalized)
        return self.describe(changed=self.metadata.finalized_level == level)

    def describe(self, changed: bool = False) -> api.FeaturesResponse:
        """The finalized level as this node applied it; each registered node's range as it
        announced it last (a node never heard: -1)."""
        state = self.metadata
        features = self.features
        nodes = []
        for node_id in sorted(features.registry.nodes()):
            said = features.last_announced(node_id)
            nodes.append(
                {
                    "node_id": node_id,
                    "min_level": said.min_level if said is not None else -1,
                    "max_level": said.max_level if said is not None else -1,
                    "live": features.range_of(node_id) is not None,
                }
            )
        return api.FeaturesResponse(
            FEATURE,
            state.finalized_level,
            FEATURE in state.features,
            [level.to_wire() for level in LEVELS.values()],
            nodes,
            highest_common(features.ranges()),
            changed,
            self.node_id,
        )
