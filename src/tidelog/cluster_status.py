"""The cluster's status as one row per partition: every node's own view of its replicas,
merged around the leader's (the CLI's `status`, the console's `/api/cluster`)."""

from __future__ import annotations

from typing import Any


def merge_status(nodes: list[dict[str, Any]], topic: str | None) -> list[dict[str, Any]]:
    """One row per partition: the leader's view, with every replica's own numbers."""
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for node in nodes:
        for st in node.get("partitions", []):
            if topic is not None and st["topic"] != topic:
                continue
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
            node_id = node["node_id"]
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
                "log_start_offset": st["log_start_offset"],
                "size_bytes": st["size_bytes"],
                "segment_count": st["segment_count"],
            }
            if st["role"] == "leader" and st["epoch"] >= row["epoch"]:
                row.update(
                    leader=node_id,
                    epoch=st["epoch"],
                    log_start_offset=st["log_start_offset"],
                    high_watermark=st["high_watermark"],
                    log_end_offset=st["log_end_offset"],
                    size_bytes=st["size_bytes"],
                    segment_count=st["segment_count"],
                    leader_view=st.get("replicas", {}),
                    voters=st.get("voters", []),
                    low_watermark=st.get("low_watermark", {}),
                    cursors=st.get("cursors", {}),
                )
    out = []
    for key in sorted(rows):
        row = rows[key]
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
                "log_end_offset",
                "size_bytes",
                "segment_count",
            ):
                row[field] = any_rep[field]
        out.append(row)
    return out


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
