"""The partitions a node hosts, kept in step with the metadata log.

Each topic-changing command (create, delete, alter, add-partitions, reassign) names its topic;
the node then makes its replicas of that topic match the metadata: opens the partitions assigned
to it, applies a changed config and target replicas to the open ones, and removes the replicas
it no longer holds (their directories go). A restored metadata snapshot does the same for every
topic at once.

A partition being moved (reassigned) keeps a replica on the nodes it leaves until its leader has
walked the replica group to the target (replication/membership.py) and committed that: the
leader then reports the move done to the metadata leader, and only that command lets the
leaving nodes delete their copy.

A partition directory records the topic id (the incarnation of the name) it was created for, in
`topic.id`. A directory left by a topic that was deleted while this node was down, then created
again under the same name, is another topic's: it is removed before the new replica opens, so
no old data comes back.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tidelog.config import TopicConfig
from tidelog.errors import StorageError
from tidelog.formats import write_version
from tidelog.node.config import NodeConfig
from tidelog.node.metadata_log import MetadataLog
from tidelog.node.metrics import Counters
from tidelog.node.partition import PartitionHost
from tidelog.node.state_machine import Machine, TableMachine
from tidelog.node.turns import Turns
from tidelog.protocol.api import ApiKey
from tidelog.replication.metadata import METADATA_TOPIC, MetadataState, TopicMeta
from tidelog.replication.metadata_commands import ReassignmentDone
from tidelog.storage import versioned_text
from tidelog.storage.durable import fsync_dir

log = logging.getLogger(__name__)

TOPIC_ID_FILE = "topic.id"
DELETED_SUFFIX = ".deleted"
PARTITION_DIR = re.compile(r"(.+)-(\d+)")


def read_topic_id(directory: Path) -> int | None:
    """The topic id the directory was claimed for; None if it has none, or one that does not
    read (unmarked, as a directory from before topic ids); UnsupportedFormatVersion if a newer
    tidelog wrote it."""
    stored = _stored_topic_id(directory)
    return None if stored is None else stored[1]


def _stored_topic_id(directory: Path) -> tuple[int, int] | None:
    """(the file's format version, the topic id) (storage/versioned_text.py)."""
    path = directory / TOPIC_ID_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        contents = versioned_text.decode(versioned_text.TOPIC_ID, raw, str(path))
        return contents.version, int(contents.value)
    except (StorageError, ValueError):
        return None  # damaged: unmarked (a file that cannot be read at all is an error)


# Opens a replica of (topic, partition, initial voters, config, state machine, topic id).
OpenReplica = Callable[[str, int, tuple[int, ...], TopicConfig, Machine | None, int], PartitionHost]


class TopicReplicas:
    def __init__(
        self,
        metadata: MetadataLog,
        hosts: dict[str, PartitionHost],
        config: Callable[[], NodeConfig],
        open_replica: OpenReplica,
        topic_changed: Callable[[str], None],
        counters: Counters,
    ) -> None:
        self.metadata = metadata
        self.hosts = hosts  # the node's replica groups (shared): opened and removed here
        self.config = config
        self.open_replica = open_replica
        self.topic_changed = topic_changed  # what the node cached about the topic is stale
        self.counters = counters
        self._moving: set[str] = set()  # groups hosted here whose partition is being moved
        # Topics being reconciled (a task each, taking turns), and those changed again meanwhile
        self._reconciling: set[str] = set()
        self._again: set[str] = set()
        self._settled = asyncio.Event()  # set while no topic is being reconciled
        self._settled.set()

    # -- metadata callbacks ---------------------------------------------------------------------

    def on_topic_changed(self, name: str) -> None:
        self.reconcile(name)

    def on_reset(self, state: MetadataState) -> None:
        """A metadata snapshot was installed: every topic it holds, and every one it no longer
        holds, may have changed."""
        names = set(state.topics) | {h.topic for h in self.hosts.values()}
        for name in sorted(names - {METADATA_TOPIC}):
            self.reconcile(name)

    # -- keeping replicas in step ---------------------------------------------------------------

    def reconcile(self, name: str) -> None:
        """Make this node's replicas of the topic match the metadata, in a task that takes
        turns with the rest of the loop: opening thousands of partitions must not stop the node
        from answering (node/turns.py). A change while it runs makes it run again."""
        self.topic_changed(name)
        if name in self._reconciling:
            self._again.add(name)
            return
        self._reconciling.add(name)
        self._settled.clear()
        self.metadata.background.start(self._reconcile(name))

    async def settled(self) -> None:
        """Until every topic change seen so far has been applied to this node's replicas (a
        node's start waits for the partitions it holds to be open)."""
        await self._settled.wait()

    async def _reconcile(self, name: str) -> None:
        try:
            while True:
                self._again.discard(name)
                await self._reconcile_once(name)
                if name not in self._again:
                    break
        finally:
            self._reconciling.discard(name)
            if not self._reconciling:
                self._settled.set()
        if not self._reconciling:
            # The replicas just opened live as long as their partitions: take them out of the
            # cycle collector's view, or every full collection walks millions of long-lived
            # objects (at 5,000 partitions a request that allocates paid ~200 ms for it one
            # time in ten). A removal unfreezes them, so that what it frees is collected.
            gc.freeze()

    async def _reconcile_once(self, name: str) -> None:
        node_config = self.config()
        node_id = node_config.node_id
        meta = self.metadata.state.topics.get(name)
        for old in [h for h in self.hosts.values() if h.topic == name]:
            if (
                meta is None
                or old.topic_id != meta.topic_id
                or old.partition >= meta.partitions
                or node_id not in meta.hosts(old.partition)
            ):
                moved = meta is not None and meta.topic_id == old.topic_id
                self.remove(old, "it moved off this node" if moved else "its topic was deleted")
        if meta is None:
            return
        config = node_config.topic_defaults.with_overrides(meta.configs)
        turns = Turns()
        for partition, replicas in enumerate(meta.assignments):
            await turns.take()
            if self.metadata.state.topics.get(name) is not meta:
                self._again.add(name)  # changed while this pass took its turns: again
                return
            if node_id not in meta.hosts(partition):
                continue
            host = self.hosts.get(f"{name}/{partition}")
            if host is not None:
                host.reconfigure(config)
            else:
                directory = node_config.data_dir / f"{name}-{partition}"
                if not self.claim_directory(directory, meta.topic_id):
                    continue
                machine = TableMachine() if meta.kind == "table" else None
                initial = tuple(sorted(meta.initial[partition]))
                host = self.open_replica(name, partition, initial, config, machine, meta.topic_id)
                if (
                    meta.initial[partition][0] == node_id
                    and host.replica.epoch == 0
                    and host.replica.leader_id < 0
                ):
                    host.replica.campaign()  # a new partition's preferred leader stands at once
            throttle = meta.throttles.get(partition, 0) * node_config.tick_ms // 1000
            host.driver.set_target(tuple(replicas), max(throttle, 1) if throttle else 0)
            host.process_ready()
            if partition in meta.retiring:
                self._moving.add(host.group)
            else:
                self._moving.discard(host.group)

    # -- moves --------------------------------------------------------------------------------

    def check_moves(self) -> None:
        """Report every move whose group this node leads and has walked to its target (often:
        a lost report is repeated on the next pass, until the metadata says done)."""
        for group in list(self._moving):
            host = self.hosts.get(group)
            meta = self.metadata.state.topics.get(host.topic) if host is not None else None
            if host is None or meta is None or host.partition not in meta.retiring:
                self._moving.discard(group)
                continue
            target = meta.assignments[host.partition]
            if self._moved(host, target):
                self._report_moved(meta, host.partition, target)

    @staticmethod
    def _moved(host: PartitionHost, target: list[int]) -> bool:
        replica = host.replica
        committed = replica.committed_membership
        return (
            replica.is_leader
            and committed == replica.history.current
            and not committed.learners
            and sorted(committed.voters) == sorted(target)
        )

    def _report_moved(self, meta: TopicMeta, partition: int, replicas: list[int]) -> None:
        command = ReassignmentDone(meta.name, meta.topic_id, partition, replicas)
        self.metadata.report(f"{meta.name}/{partition} moved", ApiKey.REASSIGNMENT, command)

    def on_moved_message(self, header: dict[str, Any], sender: int) -> None:
        """A partition leader (an authenticated peer) reports a move done; we record it if we
        lead the metadata log and it is the move the metadata still wants."""
        meta = self.metadata.state.topics.get(str(header.get("name")))
        partition = int(header.get("partition", -1))
        replicas = [int(r) for r in header.get("replicas", [])]
        if (
            meta is None
            or meta.topic_id != int(header.get("topic_id", -1))
            or partition not in meta.retiring
            or meta.assignments[partition] != replicas
            or not self.metadata.is_leader
        ):
            return
        log.info("%s/%d: node %d reports the move done", meta.name, partition, sender)
        self._report_moved(meta, partition, replicas)

    def claim_directory(self, directory: Path, topic_id: int) -> bool:
        """Make directory this topic incarnation's: a directory an older incarnation left goes
        first; a new or unmarked one (from before topic ids) is marked. False: the directory
        belongs to a newer incarnation than this one (the metadata log is being replayed from
        before it was created), which must not be touched."""
        version, found = _stored_topic_id(directory) or (0, None)
        if found == topic_id:
            if version < write_version(versioned_text.TOPIC_ID.name):
                # Claimed before this node wrote the cluster's feature level: in that level's
                # form from now on (the two say the same).
                self._mark(directory, topic_id)
            return True
        if found is not None and found > topic_id:
            return False
        if found is not None:
            log.warning(
                "%s holds topic id %d, not %d: a deleted topic's data; removing it",
                directory.name,
                found,
                topic_id,
            )
            self._discard(directory, found)
        directory.mkdir(parents=True, exist_ok=True)
        self._mark(directory, topic_id)
        return True

    @staticmethod
    def _mark(directory: Path, topic_id: int) -> None:
        """topic.id in the form of the feature level this node writes (tidelog/formats.py)."""
        versioned_text.write(versioned_text.TOPIC_ID, directory / TOPIC_ID_FILE, b"%d" % topic_id)

    def remove(self, host: PartitionHost, why: str) -> None:
        """Stop serving the replica now and move its directory out of the way at once (a new
        incarnation may claim the name next); close it and delete the files in the
        background."""
        self.hosts.pop(host.group, None)
        self.topic_changed(host.topic)
        host.driver.stopped = True
        gc.unfreeze()  # what the removed replica held is collected again (frozen next pass)
        self.counters.inc("tidelog_replicas_removed_total")
        log.info("%s: replica removed (%s)", host.group, why)
        gone = self._move_away(host.directory, host.topic_id)

        async def abandon_and_delete() -> None:
            await host.abandon()
            if gone is not None:
                await asyncio.get_running_loop().run_in_executor(None, shutil.rmtree, gone, True)

        self.metadata.background.start(abandon_and_delete())

    def _move_away(self, directory: Path, topic_id: int) -> Path | None:
        """Rename, durably, so that no restart opens it again."""
        if not directory.exists():
            return None
        gone = directory.with_name(f"{directory.name}.{topic_id}{DELETED_SUFFIX}")
        if gone.exists():
            shutil.rmtree(gone, ignore_errors=True)
        os.replace(directory, gone)
        fsync_dir(directory.parent)
        return gone

    def _discard(self, directory: Path, topic_id: int) -> None:
        gone = self._move_away(directory, topic_id)
        if gone is not None:
            asyncio.get_running_loop().run_in_executor(None, shutil.rmtree, gone, True)

    def sweep(self) -> None:
        """Directories of deleted topics, left by a crash or by a delete applied while this node
        was down: only those whose topic the metadata has seen created and no longer holds."""
        state = self.metadata.state
        for path in sorted(self.config().data_dir.iterdir()):
            if path.name.endswith(DELETED_SUFFIX) and path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
                continue
            match = PARTITION_DIR.fullmatch(path.name)
            topic_id = read_topic_id(path) if match and path.is_dir() else None
            if match is None or topic_id is None or topic_id >= state.applied_offset:
                continue  # not a partition, from before topic ids, or not applied here yet
            meta = state.topics.get(match.group(1))
            if meta is None or meta.topic_id != topic_id:
                log.info("%s: a deleted topic's directory; removing it", path.name)
                self._discard(path, topic_id)
