"""The cleaner on the simulated nodes: each pass runs the production driver's `clean` (the LWM
decided by replication/low_watermark.py) from facts gathered here as a node's `Cleaner.facts`
gathers them: log start, HW, segments, the topic's config, the time, every cursor, the newest
snapshot, every unstable transaction. A log start that moves goes past the cursor checker."""

from __future__ import annotations

import functools

from tidelog.replication.low_watermark import CursorFact, LowWatermarkFacts, transaction_facts
from tidelog.testing.sim.cluster import Cluster
from tidelog.testing.sim.nodes import SimNode


def facts(cluster: Cluster, node: SimNode) -> LowWatermarkFacts:
    log = node.log
    machine = node.machine
    return LowWatermarkFacts(
        log.log_start_offset,
        log.high_watermark,
        log.segments,
        cluster.config,
        cluster.now,
        cursors=tuple(
            CursorFact(
                c.name,
                c.position,
                c.committed_ms,
                log.bytes_from(c.position),
                c.backup,
                c.invalidated,
            )
            for c in cluster.cursors
        ),
        snapshot_offset=machine.snapshot_offset if machine is not None else None,
        state_machine=machine is not None,
        transactions=transaction_facts(log.transactions, log.high_watermark, cluster.now),
    )


def clean(cluster: Cluster) -> None:
    """A cleaner pass on every live leader, as the node's cleaner runs it."""
    for node in cluster.nodes.values():
        if node.driver is None or node.paused_until > cluster.now:
            continue
        before = node.log.log_start_offset
        lso = node.replica.last_stable_offset() if node.replica is not None else before
        lwm = node.driver.clean(functools.partial(facts, cluster, node))
        if lwm is not None:
            cluster.checkers.watermarks.check_low_watermark(node, lwm, lso)
        node.log.delete_segments_below_log_start()
        if node.log.log_start_offset > before:
            cluster.stats.cleanings += 1
            cluster.log_event(
                f"log start {before} -> {node.log.log_start_offset} on {node.node_id}"
            )
            cluster.checkers.cursors.check_log_start(node, cluster.cursors)
