"""Structured logs (`serve --log-format json`): every line a JSON object, and the events an
operator acts on named with their facts: elections, cleaner deletions and log-start moves,
cursor invalidations, StorageFull."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from helpers import wait_for
from tidelog.cli.cluster import LocalCluster
from tidelog.client.sync_client import Client
from tidelog.errors import StorageFull

pytestmark = pytest.mark.process  # tiers: pyproject.toml's markers

FAST = {"retention.check.interval.ms": "100", "file.delete.delay.ms": "0"}


def events(path: Path) -> list[dict[str, Any]]:
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    # stdout and stderr share the file: the one line on stdout says where the node listens.
    logged = [line for line in lines if not line.startswith("tidelog node 1 listening on ")]
    parsed = [json.loads(line) for line in logged]  # every log line is JSON, or this fails
    for entry in parsed:
        assert {"ts", "level", "logger", "message"} <= entry.keys(), entry
    return parsed


def named(log: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [e for e in log if e.get("event") == event]


@pytest.mark.timeout(120)
def test_json_logs_name_the_events_operators_act_on(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text("storage_max_bytes = 60000\n")
    serve = ["--config", str(config), "--log-format", "json"]
    with (
        LocalCluster(tmp_path, nodes=1, serve_args=serve, log_level="INFO") as cluster,
        Client(cluster.bootstrap) as client,
    ):
        cluster.wait_ready()
        common = {"segment.bytes": "4096", **FAST}
        client.create_topic(
            "r", configs={"retention.bytes": "8192", "cursor.max.lag.bytes": "6000", **common}
        )
        client._run(client.async_client.create_cursor("slow", "r", "earliest"))
        for _ in range(40):
            client.produce("r", [b"r" * 500], partition=0)
        wait_for(
            "the cleaner to delete segments",
            lambda: named(events(cluster.log_path(1)), "segments_deleted"),
            20,
            every_s=0.1,
        )
        client.create_topic("f", configs=common)
        with pytest.raises(StorageFull):
            for _ in range(200):
                client.produce("f", [b"z" * 1000], partition=0, timeout_ms=2000)

    log = events(cluster.log_path(1))
    elected = named(log, "leader_elected")
    assert {(e["topic"], e["partition"]) for e in elected} >= {("r", 0), ("f", 0)}
    assert all(e["epoch"] >= 1 and e["level"] == "INFO" for e in elected)
    invalidated = named(log, "cursor_invalidated")
    assert invalidated and invalidated[0]["cursor"] == "slow"
    assert "cursor.max.lag.bytes" in invalidated[0]["reason"]
    moved = named(log, "log_start_moved")
    assert moved and moved[0]["topic"] == "r"
    assert moved[0]["log_start_offset"] > moved[0]["previous_log_start_offset"]
    deleted = named(log, "segments_deleted")
    assert deleted[0]["segments"] >= 1 and deleted[0]["bytes"] > 0
    full = named(log, "storage_full")
    assert full and full[0]["limit_bytes"] == 60000 and full[0]["level"] == "WARNING"
