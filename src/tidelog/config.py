"""Topic (log) configuration with Kafka's names wherever a setting means what Kafka's means.

Values arrive as strings from the CLI, TOML or the wire; `TopicConfig.from_mapping` parses and
checks them once and raises InvalidConfig naming the key, so nothing downstream re-validates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tidelog.errors import InvalidConfig

MiB = 1024 * 1024

__all__ = ["InvalidConfig", "TopicConfig"]


@dataclass(frozen=True)
class TopicConfig:
    segment_bytes: int = 1024 * MiB
    segment_ms: int = 7 * 24 * 3600 * 1000
    index_interval_bytes: int = 4096
    retention_ms: int = 7 * 24 * 3600 * 1000
    retention_bytes: int = -1
    retention_check_interval_ms: int = 300_000
    cleanup_policy: str = "delete"
    delete_retention_ms: int = 24 * 3600 * 1000
    min_cleanable_dirty_ratio: float = 0.5
    file_delete_delay_ms: int = 60_000
    max_message_bytes: int = 8 * MiB
    # Kafka's window for producer timestamps (KIP-937; after.max.ms defaults to an hour as in
    # Kafka 4): a record stamped further in the past or future than this is InvalidRecord.
    # -1: no bound.
    message_timestamp_before_max_ms: int = -1
    message_timestamp_after_max_ms: int = 3_600_000
    # 1 = fsync before acknowledging (group commit); larger values trade durability for speed
    # exactly as Kafka's flush.messages does.
    flush_messages: int = 1
    flush_ms: int = -1
    min_insync_replicas: int = 1
    producer_id_expiration_ms: int = 86_400_000  # an idempotent producer is forgotten after
    replica_lag_time_max_ms: int = 30_000
    replica_max_lag_ms: int = 600_000
    hw_policy: str = "quorum"
    cursor_max_lag_bytes: int = -1
    cursor_max_idle_ms: int = 7 * 24 * 3600 * 1000
    cursors_hold: bool = True
    snapshot_entries: int = 10_000
    snapshot_retain: int = 3
    snapshot_catchup_entries: int = 1000
    # The archive (tidelog/archive, KIP-405's names): with remote.storage.enable the leader
    # copies closed segments below the HW to the node's --archive store; local.retention.*
    # then bound what stays on each node's disk (-2: the same as retention.*), retention.* the
    # whole log, archive included.
    remote_storage_enable: bool = False
    local_retention_ms: int = -2
    local_retention_bytes: int = -2
    # What stays local waiting for the archive (bytes from the archived end to the log end)
    # may not exceed this (-1: no bound but the disk's): archive.lag.policy=refuse refuses
    # produce (ArchiveLagExceeded), release lets the local cleaner go on without the archive,
    # leaving a gap in it, loudly.
    archive_max_lag_bytes: int = -1
    archive_lag_policy: str = "refuse"

    @property
    def effective_local_retention_ms(self) -> int:
        return self.retention_ms if self.local_retention_ms == -2 else self.local_retention_ms

    @property
    def effective_local_retention_bytes(self) -> int:
        if self.local_retention_bytes == -2:
            return self.retention_bytes
        return self.local_retention_bytes

    @property
    def fsync_before_ack(self) -> bool:
        return self.flush_messages <= 1

    def to_mapping(self) -> dict[str, str]:
        return {_dotted(f.name): _render(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def overrides(self) -> dict[str, str]:
        """Only what differs from the defaults: what a user set."""
        base = TopicConfig()
        return {
            _dotted(f.name): _render(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(base, f.name)
        }

    def with_overrides(self, values: Mapping[str, Any]) -> TopicConfig:
        return TopicConfig.from_mapping(values, base=self)

    @staticmethod
    def from_mapping(values: Mapping[str, Any], base: TopicConfig | None = None) -> TopicConfig:
        base = base or TopicConfig()
        fields = {f.name: f for f in dataclasses.fields(TopicConfig)}
        changes: dict[str, Any] = {}
        for key, raw in values.items():
            name = key.replace(".", "_")
            if name not in fields:
                raise InvalidConfig(f"unknown config {key!r}", key=key)
            changes[name] = _parse(key, fields[name].type, raw)
        config = dataclasses.replace(base, **changes)
        config.check()
        return config

    def check(self) -> None:
        def need(ok: bool, key: str, why: str) -> None:
            if not ok:
                raise InvalidConfig(f"{key}: {why}", key=key)

        need(self.segment_bytes >= 1024, "segment.bytes", "must be at least 1024")
        need(self.segment_ms >= 1, "segment.ms", "must be positive")
        need(self.index_interval_bytes >= 0, "index.interval.bytes", "must be >= 0")
        need(self.retention_ms >= -1, "retention.ms", "must be -1 (unlimited) or >= 0")
        need(self.retention_bytes >= -1, "retention.bytes", "must be -1 (unlimited) or >= 0")
        need(self.retention_check_interval_ms >= 1, "retention.check.interval.ms", "must be > 0")
        need(
            self.cleanup_policy in ("delete", "compact", "compact,delete", "delete,compact"),
            "cleanup.policy",
            "must be delete, compact or compact,delete",
        )
        need(self.max_message_bytes >= 128, "max.message.bytes", "must be at least 128")
        for key, value in (
            ("message.timestamp.before.max.ms", self.message_timestamp_before_max_ms),
            ("message.timestamp.after.max.ms", self.message_timestamp_after_max_ms),
        ):
            need(value >= -1, key, "must be -1 (no bound) or >= 0")
        need(self.flush_messages >= 1, "flush.messages", "must be >= 1")
        need(self.min_insync_replicas >= 1, "min.insync.replicas", "must be >= 1")
        need(self.producer_id_expiration_ms >= 1, "producer.id.expiration.ms", "must be > 0")
        need(self.hw_policy in ("quorum", "isr"), "hw.policy", "must be quorum or isr")
        need(0.0 <= self.min_cleanable_dirty_ratio <= 1.0, "min.cleanable.dirty.ratio", "in [0, 1]")
        need(self.snapshot_entries >= 2, "snapshot.entries", "must be >= 2")
        need(self.snapshot_retain >= 1, "snapshot.retain", "must be >= 1")
        for key, value, whole in (
            ("local.retention.ms", self.local_retention_ms, self.retention_ms),
            ("local.retention.bytes", self.local_retention_bytes, self.retention_bytes),
        ):
            need(value >= -2, key, "must be -2 (as retention), -1 (unlimited) or >= 0")
            # Kafka's rule: what stays local is part of the whole log, never more than it.
            need(
                value in (-2, -1) or whole == -1 or value <= whole,
                key,
                f"must not exceed {key.removeprefix('local.')} ({whole})",
            )
        need(self.archive_max_lag_bytes >= -1, "archive.max.lag.bytes", "must be -1 or >= 0")
        need(
            self.archive_lag_policy in ("refuse", "release"),
            "archive.lag.policy",
            "must be refuse or release",
        )
        need(
            not self.remote_storage_enable or self.cleanup_policy == "delete",
            "remote.storage.enable",
            "needs cleanup.policy=delete (compacted topics are not archived, as in Kafka)",
        )


def _dotted(name: str) -> str:
    return name.replace("_", ".")


def _render(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _parse(key: str, type_name: Any, raw: Any) -> Any:
    text = str(raw).strip()
    try:
        if type_name in ("int", int):
            if isinstance(raw, bool):
                raise ValueError
            return int(text)
        if type_name in ("float", float):
            return float(text)
        if type_name in ("bool", bool):
            if text.lower() in ("true", "1", "yes"):
                return True
            if text.lower() in ("false", "0", "no"):
                return False
            raise ValueError
    except ValueError:
        raise InvalidConfig(f"{key}: cannot parse {raw!r} as {type_name}", key=key) from None
    return text


def parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidConfig(f"address {text!r} is not HOST:PORT", key="address")
    return host, int(port)
