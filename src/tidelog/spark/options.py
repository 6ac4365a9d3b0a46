"""Options of the tidelog Spark source and sink, with the names and meanings of Spark's Kafka
source wherever they mean the same. Parsed once, checked once; a bad option fails the query
with a message that names it."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tidelog.errors import InvalidConfig
from tidelog.protocol.api import CONSISTENCIES, ISOLATION_LEVELS, LINEARIZABLE, READ_UNCOMMITTED
from tidelog.tls import TlsFiles

EARLIEST = -2
LATEST = -1
FETCH_BYTES_DEFAULT = 4 * 1024 * 1024

TopicPartition = tuple[str, int]


def _bool(options: Mapping[str, str], key: str, default: bool) -> bool:
    raw = options.get(key)
    if raw is None:
        return default
    value = str(raw).strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise InvalidConfig(f"option {key!r} must be true or false, got {raw!r}", key=key)


def _int(options: Mapping[str, str], key: str) -> int | None:
    raw = options.get(key)
    if raw is None or str(raw).strip() == "":
        return None
    try:
        return int(str(raw).strip())
    except ValueError:
        raise InvalidConfig(f"option {key!r} must be an integer, got {raw!r}", key=key) from None


def parse_offsets_json(text: str, key: str) -> dict[TopicPartition, int]:
    """Spark's Kafka form: {"topic": {"0": 23, "1": -2}} (-2 earliest, -1 latest)."""
    try:
        data = json.loads(text)
        out: dict[TopicPartition, int] = {}
        for topic, parts in data.items():
            for partition, offset in parts.items():
                out[(str(topic), int(partition))] = int(offset)
        return out
    except (ValueError, AttributeError, TypeError) as exc:
        raise InvalidConfig(
            f'option {key!r} must be earliest, latest or JSON like {{"topic": {{"0": 23}}}}: {exc}',
            key=key,
        ) from None


def offsets_to_json(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = int(offset)
    return out


def offsets_from_json(data: Mapping[str, Mapping[str, int]]) -> dict[TopicPartition, int]:
    return {(t, int(p)): int(o) for t, parts in data.items() for p, o in parts.items()}


def _tls(opts: Mapping[str, str]) -> TlsFiles | None:
    """The options tls.ca, tls.cert and tls.key (PEM file paths, as the CLI's --tls-*)."""
    return TlsFiles.of(opts.get("tls.ca"), opts.get("tls.cert"), opts.get("tls.key"))


def _lowered(options: Mapping[str, str]) -> tuple[dict[str, str], str]:
    """Spark's options are case-insensitive; both source and sink need a bootstrap."""
    opts = {str(k).lower(): str(v) for k, v in options.items()}
    bootstrap = opts.get("bootstrap", "")
    if not bootstrap:
        raise InvalidConfig(
            "option 'bootstrap' (HOST:PORT of any tidelog node) is required", key="bootstrap"
        )
    return opts, bootstrap


@dataclass(frozen=True)
class SourceOptions:
    bootstrap: str
    subscribe: tuple[str, ...] = ()
    subscribe_pattern: str = ""
    assign: tuple[TopicPartition, ...] = ()
    starting_offsets: str = "latest"
    starting_explicit: bool = False  # given by the user (else a cursor's position wins)
    ending_offsets: str = "latest"
    starting_timestamp: int | None = None
    fail_on_data_loss: bool = True
    skip_invalid_batches: bool = False  # pass over batches that cannot be read, with a warning
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    max_partitions: int | None = None
    include_headers: bool = False
    cursor: str = ""
    cursor_backup: bool = False
    table: str = ""
    consistency: str = "linearizable"  # of a table's reads (api.CONSISTENCIES)
    # read_committed: "latest" is the last stable offset, aborted transactions are left out
    isolation_level: str = READ_UNCOMMITTED
    fetch_max_bytes: int = FETCH_BYTES_DEFAULT
    tls: TlsFiles | None = None
    token: str | None = field(default=None, repr=False)  # NAME:SECRET of a principal
    # Archived ranges (remote.storage.enable) read by the executors straight from the store
    # (archive.direct, default true), an S3-compatible store's URL if not AWS_ENDPOINT_URL's.
    archive_direct: bool = True
    archive_endpoint: str = ""

    @staticmethod
    def parse(options: Mapping[str, str], streaming: bool) -> SourceOptions:
        opts, bootstrap = _lowered(options)
        return SourceOptions(
            bootstrap=bootstrap,
            **_topics(opts, streaming),
            **_offset_range(opts, streaming),
            **_read(opts, _SOURCE_OPTIONS),
        )


def _topics(opts: Mapping[str, str], streaming: bool) -> dict[str, Any]:
    """What the source reads: exactly one of subscribe, subscribePattern and assign, or a table
    topic's state (batch only)."""
    table = opts.get("table", "")
    chosen = [k for k in ("subscribe", "subscribepattern", "assign") if opts.get(k)]
    if table:
        if streaming:
            raise InvalidConfig(
                "option 'table' reads a table topic's state in batch only", key="table"
            )
    elif len(chosen) != 1:
        raise InvalidConfig(
            "exactly one of the options 'subscribe', 'subscribePattern' and 'assign' is required",
            key="subscribe",
        )
    pattern = opts.get("subscribepattern", "")
    if pattern:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise InvalidConfig(
                f"option 'subscribePattern' is not a regex: {exc}", key="subscribePattern"
            ) from None
    return {
        "table": table,
        "subscribe": tuple(t.strip() for t in opts.get("subscribe", "").split(",") if t.strip()),
        "subscribe_pattern": pattern,
        "assign": _assignment(opts),
    }


def _assignment(opts: Mapping[str, str]) -> tuple[TopicPartition, ...]:
    """The option assign: {"topic": [0, 1]}."""
    if not opts.get("assign"):
        return ()
    try:
        data = json.loads(opts["assign"])
        return tuple((str(t), int(p)) for t, ps in data.items() for p in ps)
    except (ValueError, AttributeError, TypeError):
        raise InvalidConfig(
            "option 'assign' must be JSON like {\"topic\": [0, 1]}", key="assign"
        ) from None


def _offset_range(opts: Mapping[str, str], streaming: bool) -> dict[str, Any]:
    """startingOffsets and endingOffsets (batch only): earliest, latest or per partition."""
    starting = opts.get("startingoffsets", "latest" if streaming else "earliest")
    ending = opts.get("endingoffsets", "latest")
    if streaming and "endingoffsets" in opts:
        raise InvalidConfig("option 'endingOffsets' is for batch queries only", key="endingOffsets")
    if not streaming and starting == "latest":
        raise InvalidConfig(
            "startingOffsets=latest is not allowed in a batch query", key="startingOffsets"
        )
    for key, value in (("startingOffsets", starting), ("endingOffsets", ending)):
        if value not in ("earliest", "latest"):
            parsed = parse_offsets_json(value, key)
            if key == "endingOffsets" and EARLIEST in parsed.values():
                raise InvalidConfig("endingOffsets cannot be -2 (earliest)", key=key)
    if ending == "earliest":
        raise InvalidConfig("endingOffsets cannot be earliest", key="endingOffsets")
    return {
        "starting_offsets": starting,
        "starting_explicit": "startingoffsets" in opts or "startingtimestamp" in opts,
        "ending_offsets": ending,
    }


# A reader of one option: (the lowered options, the option's name as Spark spells it, its
# default) -> the field's value. Spark's options are case-insensitive: the name is looked up
# lowered.
OptionReader = Callable[[Mapping[str, str], str, Any], Any]


@dataclass(frozen=True)
class _Option:
    field: str  # of SourceOptions
    name: str
    read: OptionReader
    default: Any = None


def _read(opts: Mapping[str, str], table: tuple[_Option, ...]) -> dict[str, Any]:
    """Each option of the table, in its order (of several bad options, the first is named)."""
    return {o.field: o.read(opts, o.name, o.default) for o in table}


def _flag(opts: Mapping[str, str], name: str, default: bool) -> bool:
    return _bool(opts, name.lower(), default)


def _integer(opts: Mapping[str, str], name: str, default: int | None) -> int | None:
    value = _int(opts, name.lower())
    return default if value is None else value


def _size(opts: Mapping[str, str], name: str, default: int) -> int:
    """A number of bytes: not given, or 0, is the default."""
    return _int(opts, name.lower()) or default


def _positive(opts: Mapping[str, str], name: str, default: int | None) -> int | None:
    value = _integer(opts, name, default)
    if value is not None and value < 1:
        raise InvalidConfig(f"option {name!r} must be positive", key=name)
    return value


def _max_partitions(opts: Mapping[str, str], name: str, default: int | None) -> int | None:
    """Positive, and not below minPartitions (read, and checked, before it)."""
    most = _positive(opts, name, default)
    least = _int(opts, "minpartitions")
    if least and most and least > most:
        raise InvalidConfig(
            f"option 'minPartitions' ({least}) is above 'maxPartitions' ({most})",
            key="maxPartitions",
        )
    return most


def _text(opts: Mapping[str, str], name: str, default: str | None) -> str | None:
    """Not given, or empty, is the default."""
    return opts.get(name.lower()) or default


def _consistency(opts: Mapping[str, str], name: str, default: str) -> str:
    """A table's reads: linearizable, lease or serializable (AsyncClient.table_get)."""
    value = opts.get(name.lower()) or default
    if value not in CONSISTENCIES:
        raise InvalidConfig(
            f"option '{name}' must be one of {', '.join(CONSISTENCIES)}, not {value!r}", key=name
        )
    return value


def _isolation_level(opts: Mapping[str, str], name: str, default: str) -> str:
    """read_uncommitted (every committed record) or read_committed (below the LSO, without
    aborted transactions), as Kafka's isolation.level."""
    value = opts.get(name.lower()) or default
    if value not in ISOLATION_LEVELS:
        raise InvalidConfig(
            f"option '{name}' must be one of {', '.join(ISOLATION_LEVELS)}, not {value!r}",
            key=name,
        )
    return value


def _tls_files(opts: Mapping[str, str], name: str, default: None) -> TlsFiles | None:
    """The options tls.ca, tls.cert and tls.key, together."""
    return _tls(opts)


# The source's options besides the topics and the offset range, with SourceOptions' defaults.
_SOURCE_OPTIONS = (
    _Option("max_offsets_per_trigger", "maxOffsetsPerTrigger", _positive),
    _Option("min_partitions", "minPartitions", _positive),
    _Option("max_partitions", "maxPartitions", _max_partitions),
    _Option("starting_timestamp", "startingTimestamp", _integer),
    _Option("fail_on_data_loss", "failOnDataLoss", _flag, True),
    _Option("skip_invalid_batches", "skipInvalidBatches", _flag, False),
    _Option("include_headers", "includeHeaders", _flag, False),
    _Option("cursor", "cursor", _text, ""),
    _Option("cursor_backup", "cursorBackup", _flag, False),
    _Option("fetch_max_bytes", "fetchMaxBytes", _size, FETCH_BYTES_DEFAULT),
    _Option("consistency", "consistency", _consistency, LINEARIZABLE),
    _Option("isolation_level", "isolationLevel", _isolation_level, READ_UNCOMMITTED),
    _Option("tls", "tls", _tls_files),
    _Option("token", "token", _text),
    _Option("archive_direct", "archive.direct", _flag, True),
    _Option("archive_endpoint", "archive.endpoint", _text, ""),
)


@dataclass(frozen=True)
class SinkOptions:
    bootstrap: str
    topic: str = ""  # for rows whose topic column is null or absent
    acks: str = "all"
    chunk_records: int = 1000
    max_in_flight: int = 5  # chunks per partition sent before the first is acknowledged
    tls: TlsFiles | None = None
    token: str | None = field(default=None, repr=False)

    @staticmethod
    def parse(options: Mapping[str, str]) -> SinkOptions:
        opts, bootstrap = _lowered(options)
        acks = opts.get("acks", "all")
        if acks != "all":
            raise InvalidConfig(
                "the tidelog sink writes with acks=all only (exactly once needs it)", key="acks"
            )
        in_flight = _int(opts, "maxinflight")
        if in_flight is not None and in_flight < 1:
            raise InvalidConfig("maxInFlight must be at least 1", key="maxInFlight")
        return SinkOptions(
            bootstrap,
            opts.get("topic", ""),
            acks,
            _int(opts, "chunkrecords") or 1000,
            in_flight or 5,
            _tls(opts),
            opts.get("token") or None,
        )
