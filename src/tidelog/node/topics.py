"""The partitions a node hosts, kept in step with the metadata log.

Each topic-changing command (create, delete, alter, add-partitions) names its topic; the node
then makes its replicas of that topic match the metadata: opens the partitions assigned to it,
applies a changed config to the open ones, and removes the replicas of a deleted topic (their
directories go). A restored metadata snapshot does the same for every topic at once.

A partition directory records the topic id (the incarnation of the name) it was created for, in
`topic.id`. A directory left by a topic that was deleted while this node was down, then created
again under the same name, is another topic's: it is removed before the new replica opens, so
no old data comes back.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from tidelog.node.state_machine import TableMachine
from tidelog.replication.metadata import METADATA_TOPIC, MetadataState
from tidelog.storage.durable import fsync_dir, write_file

if TYPE_CHECKING:
    from tidelog.node.core import NodeCore
    from tidelog.node.partition import PartitionHost

log = logging.getLogger(__name__)

TOPIC_ID_FILE = "topic.id"
DELETED_SUFFIX = ".deleted"
PARTITION_DIR = re.compile(r"(.+)-(\d+)")


def read_topic_id(directory: Path) -> int | None:
    try:
        return int((directory / TOPIC_ID_FILE).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


class TopicReplicas:
    def __init__(self, core: NodeCore) -> None:
        self.core = core

    # -- metadata callbacks ---------------------------------------------------------------------

    def on_topic_changed(self, name: str) -> None:
        self.reconcile(name)

    def on_reset(self, state: MetadataState) -> None:
        """A metadata snapshot was installed: every topic it holds, and every one it no longer
        holds, may have changed."""
        names = set(state.topics) | {h.topic for h in self.core.hosts.values()}
        for name in sorted(names - {METADATA_TOPIC}):
            self.reconcile(name)

    # -- keeping replicas in step ---------------------------------------------------------------

    def reconcile(self, name: str) -> None:
        core = self.core
        meta = core.metadata.topics.get(name)
        for host in [h for h in core.hosts.values() if h.topic == name]:
            if (
                meta is None
                or host.topic_id != meta.topic_id
                or host.partition >= meta.partitions
                or core.node_id not in meta.assignments[host.partition]
            ):
                self.remove(host)
        if meta is None:
            return
        config = core.config.topic_defaults.with_overrides(meta.configs)
        for partition, replicas in enumerate(meta.assignments):
            if core.node_id not in replicas:
                continue
            existing = core.hosts.get(f"{name}/{partition}")
            if existing is not None:
                existing.reconfigure(config)
                continue
            directory = core.config.data_dir / f"{name}-{partition}"
            if not self.claim_directory(directory, meta.topic_id):
                continue
            machine = TableMachine() if meta.kind == "table" else None
            host = core.open_host(
                name, partition, tuple(sorted(replicas)), config, machine, meta.topic_id
            )
            if (
                replicas[0] == core.node_id
                and host.replica.epoch == 0
                and host.replica.leader_id < 0
            ):
                host.replica.campaign()  # the preferred leader of a new partition stands at once
                host.process_ready()

    def claim_directory(self, directory: Path, topic_id: int) -> bool:
        """Make directory this topic incarnation's: a directory an older incarnation left goes
        first; a new or unmarked one (from before topic ids) is marked. False: the directory
        belongs to a newer incarnation than this one (the metadata log is being replayed from
        before it was created), which must not be touched."""
        found = read_topic_id(directory)
        if found == topic_id:
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
        write_file(directory / TOPIC_ID_FILE, f"{topic_id}\n".encode())
        return True

    def remove(self, host: PartitionHost) -> None:
        """Stop serving the replica now and move its directory out of the way at once (a new
        incarnation may claim the name next); close it and delete the files in the
        background."""
        core = self.core
        core.hosts.pop(host.group, None)
        host.driver.stopped = True
        core.counters.inc("tidelog_replicas_removed_total")
        log.info("%s: replica removed (its topic was deleted)", host.group)
        gone = self._move_away(host.directory, host.topic_id)

        async def abandon_and_delete() -> None:
            await host.abandon()
            if gone is not None:
                await asyncio.get_running_loop().run_in_executor(None, shutil.rmtree, gone, True)

        core.track(asyncio.get_running_loop().create_task(abandon_and_delete()))

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
        core = self.core
        state = core.metadata
        for path in sorted(core.config.data_dir.iterdir()):
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
