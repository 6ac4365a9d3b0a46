"""The cluster's status as one row per partition: every node's own view of its replicas,
merged around the leader's. `partition_rows` gives them typed (the CLI's `status` and
`cursors list`, the demo, `partitions elect`); `merge_status` as the JSON `tidelog status
--json` prints and the console's `/api/cluster` serves."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tidelog.protocol import api


@dataclass(frozen=True)
class ReplicaRow:
    """One replica of a partition, as its own node reports it, with the leader's word on
    whether it is in sync."""

    node_id: int
    role: str
    epoch: int
    log_end_offset: int
    high_watermark: int
    log_start_offset: int
    size_bytes: int
    segment_count: int
    observer: bool
    in_sync: bool
    lag: int | None  # behind the leader's log end; None without a leader's view
    last_stable_offset: int = -1  # -1: a node from before transactions

    @property
    def is_leader(self) -> bool:
        return self.role == "leader"


@dataclass(frozen=True)
class PartitionRow:
    topic: str
    partition: int
    leader: int  # -1: none
    epoch: int
    voters: tuple[int, ...]
    replicas: Mapping[int, ReplicaRow]
    log_start_offset: int
    high_watermark: int
    log_end_offset: int
    size_bytes: int
    segment_count: int
    under_replicated: bool
    # The leader's: the LWM ({"offset", "set_by", "holds"}) and each cursor's figures.
    low_watermark: Mapping[str, Any] = field(default_factory=dict)
    cursors: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    no_leader: str = ""  # why, in words, when leader < 0
    invalid_batches: Sequence[Mapping[str, Any]] = ()
    local_log_start_offset: int = -1  # the leader's disk's first offset (archived topics)
    archive: Mapping[str, Any] = field(default_factory=dict)  # the leader's archive status
    last_stable_offset: int = -1  # the leader's LSO (-1: a node from before transactions)
    wire: Mapping[str, Any] = field(default_factory=dict, repr=False)  # the row as JSON

    @property
    def group(self) -> str:
        return f"{self.topic}/{self.partition}"

    def to_wire(self) -> dict[str, Any]:
        """The row as `tidelog status --json` prints it (what it was read from)."""
        return dict(self.wire)


async def node_status(
    ask: Callable[[api.StatusRequest], Awaitable[dict[str, Any]]], topics: list[str] | None
) -> dict[str, Any]:
    """A node's whole status (the JSON of its StatusResponse), asked page after page."""
    header = await ask(api.StatusRequest(topics))
    partitions = list(header.get("partitions", []))
    while header.get("more") and partitions:
        last = partitions[-1]
        header = await ask(api.StatusRequest(topics, str(last["topic"]), int(last["partition"])))
        partitions.extend(header.get("partitions", []))
    return {**header, "partitions": partitions, "more": False}


def merge_status(nodes: list[dict[str, Any]], topic: str | None) -> list[dict[str, Any]]:
    """One row per partition as JSON-ready dicts (partition_rows reads them typed)."""
    return _merged(nodes, topic)


def partition_rows(nodes: list[dict[str, Any]], topic: str | None) -> list[PartitionRow]:
    """One row per partition: the leader's view, with every replica's own numbers."""
    return [_typed(row) for row in _merged(nodes, topic)]


def _typed(row: dict[str, Any]) -> PartitionRow:
    return PartitionRow(
        topic=row["topic"],
        partition=int(row["partition"]),
        leader=int(row["leader"]),
        epoch=int(row["epoch"]),
        voters=tuple(int(v) for v in row.get("voters", [])),
        replicas={
            int(n): ReplicaRow(
                node_id=int(n),
                role=r["role"],
                epoch=int(r["epoch"]),
                log_end_offset=int(r["log_end_offset"]),
                high_watermark=int(r["high_watermark"]),
                log_start_offset=int(r["log_start_offset"]),
                size_bytes=int(r["size_bytes"]),
                segment_count=int(r["segment_count"]),
                observer=bool(r["observer"]),
                in_sync=bool(r["in_sync"]),
                lag=r["lag"],
                last_stable_offset=int(r.get("last_stable_offset", -1)),
            )
            for n, r in sorted(row["replicas"].items(), key=lambda kv: int(kv[0]))
        },
        log_start_offset=int(row["log_start_offset"]),
        local_log_start_offset=int(row.get("local_log_start_offset", row["log_start_offset"])),
        archive=row.get("archive") or {},
        high_watermark=int(row["high_watermark"]),
        last_stable_offset=int(row.get("last_stable_offset", -1)),
        log_end_offset=int(row["log_end_offset"]),
        size_bytes=int(row["size_bytes"]),
        segment_count=int(row["segment_count"]),
        under_replicated=bool(row["under_replicated"]),
        low_watermark=row.get("low_watermark") or {},
        cursors=row.get("cursors") or {},
        no_leader=row.get("no_leader", ""),
        invalid_batches=row.get("invalid_batches", []),
        wire=row,
    )


def _merged(nodes: list[dict[str, Any]], topic: str | None) -> list[dict[str, Any]]:
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for node in nodes:
        for st in node.get("partitions", []):
            if topic is not None and st["topic"] != topic:
                continue
            _add_replica(rows, node["node_id"], st)
    return [_finished(rows[key], nodes) for key in sorted(rows)]


def _add_replica(
    rows: dict[tuple[str, int], dict[str, Any]], node_id: Any, st: dict[str, Any]
) -> None:
    """One node's status of its replica, into its partition's row: the replica's own numbers,
    and the partition's figures if it leads (the newest epoch's leader wins)."""
    key = (st["topic"], st["partition"])
    row = rows.setdefault(
        key,
        {
            "topic": st["topic"],
            "partition": st["partition"],
            "leader": -1,
            "epoch": -1,
            "replicas": {},
        },
    )
    found = row.setdefault("invalid_batches", {})
    for batch in st.get("invalid_batches", []):
        entry = found.setdefault(batch["base_offset"], {**batch, "nodes": []})
        entry["nodes"].append(node_id)
    for replaced in st.get("replaced", {}):
        row.setdefault("replaced_by", set()).add(int(replaced))
    row.setdefault("voters", st.get("voters", []))  # the leader's view wins below
    row["replicas"][str(node_id)] = {
        "observer": bool(st.get("observer", False)),
        "role": st["role"],
        "epoch": st["epoch"],
        "log_end_offset": st["log_end_offset"],
        "high_watermark": st["high_watermark"],
        "last_stable_offset": st.get("last_stable_offset", -1),
        "log_start_offset": st["log_start_offset"],
        "local_log_start_offset": st.get("local_log_start_offset", st["log_start_offset"]),
        "size_bytes": st["size_bytes"],
        "segment_count": st["segment_count"],
    }
    if st["role"] == "leader" and st["epoch"] >= row["epoch"]:
        row.update(
            leader=node_id,
            epoch=st["epoch"],
            log_start_offset=st["log_start_offset"],
            local_log_start_offset=st.get("local_log_start_offset", st["log_start_offset"]),
            high_watermark=st["high_watermark"],
            last_stable_offset=st.get("last_stable_offset", -1),
            log_end_offset=st["log_end_offset"],
            size_bytes=st["size_bytes"],
            segment_count=st["segment_count"],
            leader_view=st.get("replicas", {}),
            voters=st.get("voters", []),
            low_watermark=st.get("low_watermark", {}),
            cursors=st.get("cursors", {}),
        )
        if "archive" in st:
            row["archive"] = st["archive"]


def _finished(row: dict[str, Any], nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """A partition's row once every node's replica is in: each replica in sync or not and its
    lag as the leader sees them, whether the partition is under-replicated, and, with no
    leader, why and some replica's figures."""
    row["invalid_batches"] = [b for _, b in sorted(row.get("invalid_batches", {}).items())]
    view = row.pop("leader_view", {})
    for rid, rep in row["replicas"].items():
        lv = view.get(rid) or view.get(int(rid)) or {}
        rep["in_sync"] = bool(lv.get("in_sync", False))
        rep["lag"] = int(lv.get("lag", 0)) if lv else None
    voters = row.get("voters", [])
    in_sync = sum(1 for r in row["replicas"].values() if r.get("in_sync"))
    row["under_replicated"] = row["leader"] < 0 or in_sync < len(voters)
    replaced = row.pop("replaced_by", set())
    for rid, rep in row["replicas"].items():
        rep["observer"] = rep.get("observer", False) or int(rid) in replaced
    if row["leader"] < 0:
        row["no_leader"] = why_no_leader(row, nodes)
        any_rep = next(iter(row["replicas"].values()))
        for field in (
            "log_start_offset",
            "high_watermark",
            "last_stable_offset",
            "log_end_offset",
            "size_bytes",
            "segment_count",
        ):
            row[field] = any_rep.get(field, -1)
    return row


def answered_nodes(nodes: list[dict[str, Any]]) -> set[int]:
    """The nodes whose status came back (an unreachable one is reported with an error)."""
    return {int(n["node_id"]) for n in nodes if "error" not in n}


def why_no_leader(row: dict[str, Any], nodes: list[dict[str, Any]]) -> str:
    """In words, why no replica leads: which were re-formatted (observers until they catch
    up), which are unreachable, and that the rest cannot win a vote without them."""
    answered = answered_nodes(nodes)
    replaced = {int(r) for n in nodes for r in n.get("node", {}).get("replaced_peers", [])}
    voters = {int(v) for v in row.get("voters", [])}
    replicas = row["replicas"]
    reformatted = sorted(
        {int(r) for r, rep in replicas.items() if rep.get("observer")} | (replaced & voters)
    )
    down = sorted(v for v in voters if v not in answered and v not in reformatted)
    others = sorted(v for v in voters if v in answered and v not in reformatted)
    parts = [f"{r} was re-formatted and catches up as an observer" for r in reformatted]
    parts += [f"{r} is unreachable" for r in down]
    if others and (reformatted or down):
        names = ", ".join(str(r) for r in others)
        parts.append(f"{names} cannot win a vote without them")
    if not parts:
        return "electing"
    return "no eligible leader: " + "; ".join(parts)
