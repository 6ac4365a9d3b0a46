"""Prometheus's /metrics on a live node (--http-listen): scraped over HTTP and parsed with
Prometheus's own parser; the offsets it reports are the ones status reports, the hold that sets
the LWM and each cursor's lag are there, and what the node counted (requests, bytes, fsyncs,
elections) moves as clients work. Also /api/status, and the exposure rule for --http-listen."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import scrape, value, wait_for
from tidelog.cli.cluster import LocalCluster
from tidelog.client.sync_client import Client
from tidelog.cluster_status import merge_status
from tidelog.errors import InvalidConfig
from tidelog.node.config import NodeConfig
from tidelog.record import ProducerRecord

pytestmark = pytest.mark.process  # tiers: pyproject.toml's markers

FAST = {"retention.check.interval.ms": "100", "file.delete.delay.ms": "0"}


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[LocalCluster, Client]]:
    """One node with an HTTP listener, and a client of it."""
    with (
        LocalCluster(tmp_path, nodes=1, http=True, log_level="WARNING") as cluster,
        Client(cluster.bootstrap) as client,
    ):
        cluster.wait_ready()
        yield cluster, client


@pytest.mark.timeout(120)
def test_a_scrape_reports_what_status_reports(node: tuple[LocalCluster, Client]) -> None:
    cluster, client = node
    url = cluster.http_url(1)
    # Everything is past retention at once: only the cursor holds the log.
    client.create_topic(
        "m", partitions=2, configs={"segment.bytes": "2048", "retention.ms": "1", **FAST}
    )
    client._run(client.async_client.create_cursor("etl", "m", "earliest"))
    for i in range(40):
        client.produce("m", [b"r%03d" % i + b"." * 60], partition=0)
    # Read while the cursor still holds offset 0: once it commits 15 the cleaner (every 100
    # ms) may delete below 15 before a read from the earliest offset gets there.
    got = [r.value for r in client.consume("m", 0, "earliest", max_records=40)]
    assert len(got) == 40
    client._run(client.async_client.commit_cursor("etl", {0: 15}))

    labels = {"topic": "m", "partition": "0"}
    # The cursor's figures come from the cleaner's last pass (cached per pass): wait for
    # the pass after the one that moved the log start up to the cursor.
    families = wait_for(
        "the cleaner's pass to see the cursor's commit",
        lambda: (
            (f := scrape(url))
            and value(f, "tidelog_cursor_lag_records", cursor="etl", **labels) == 25
            and value(f, "tidelog_cursor_lead_records", cursor="etl", **labels) == 0
            and f
        ),
    )
    row = merge_status(client.status(["m"]), "m")[0]
    start = row["log_start_offset"]
    assert value(families, "tidelog_partition_high_watermark", **labels) == 40
    assert value(families, "tidelog_partition_log_end_offset", **labels) == 40
    # no transaction: the LSO is the HW (test_read_committed.py has one that holds it back)
    assert value(families, "tidelog_partition_last_stable_offset", **labels) == 40
    assert row["last_stable_offset"] == 40
    assert value(families, "tidelog_partition_log_start_offset", **labels) == start == 15
    assert value(families, "tidelog_partition_high_watermark", topic="m", partition="1") == 0
    assert row["high_watermark"] == 40 and row["segment_count"] > 1
    assert value(families, "tidelog_partition_segments", **labels) == row["segment_count"]
    assert value(families, "tidelog_partition_size_bytes", **labels) == row["size_bytes"]
    assert value(families, "tidelog_partition_is_leader", **labels) == 1
    assert value(families, "tidelog_partition_leader", **labels) == 1
    assert value(families, "tidelog_partition_in_sync_replicas", **labels) == 1
    assert value(families, "tidelog_partition_under_replicated", **labels) == 0
    assert value(families, "tidelog_partition_under_min_isr", **labels) == 0
    assert value(families, "tidelog_cursor_lead_records", cursor="etl", **labels) == 0
    assert value(families, "tidelog_cursor_invalidated", cursor="etl", topic="m") == 0
    # The cursor at 15 is what keeps the LWM there (nothing else holds below the HW).
    sets = [
        s
        for s in families["tidelog_partition_low_watermark_hold_offset"]
        if s.labels["set_by"] == "1" and s.labels["partition"] == "0"
    ]
    assert len(sets) == 1 and sets[0].labels["kind"] == "cursor"
    assert sets[0].labels["name"] == "etl" and sets[0].value == 15
    assert value(families, "tidelog_partition_low_watermark", **labels) == 15

    # What the node counted: 40 produce requests answered, their bytes, fsyncs, elections.
    produce = {"listener": "client", "request": "produce"}
    assert value(families, "tidelog_request_seconds_count", **produce) >= 40
    buckets = [
        s
        for s in families["tidelog_request_seconds"]
        if s.name == "tidelog_request_seconds_bucket"
        and s.labels["request"] == "produce"
        and s.labels["listener"] == "client"
    ]
    counts = [s.value for s in buckets]
    assert counts == sorted(counts) and buckets[-1].labels["le"] == "+Inf"
    assert value(families, "tidelog_request_bytes_total", **produce) >= 40 * 60
    fetch = {"listener": "client", "request": "fetch"}
    assert value(families, "tidelog_response_bytes_total", **fetch) >= 40 * 60
    assert value(families, "tidelog_fsync_seconds_count") > 0
    assert value(families, "tidelog_leader_elections_won_total") >= 3  # metadata + 2
    assert value(families, "tidelog_disk_free_bytes") > 0
    before = value(families, "tidelog_request_seconds_count", **produce)
    client.produce("m", [b"one more"], partition=0)
    after = scrape(url)
    assert value(after, "tidelog_request_seconds_count", **produce) == before + 1
    assert value(after, "tidelog_partition_high_watermark", **labels) == 41

    # /api/status: the node's own status, as `tidelog status --json` gets it.
    with urllib.request.urlopen(url + "/api/status", timeout=10) as answer:
        status = json.loads(answer.read())
    assert status["node_id"] == 1
    mine = [p for p in status["partitions"] if p["topic"] == "m" and p["partition"] == 0]
    assert mine[0]["high_watermark"] == 41
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(url + "/console/../../etc/passwd", timeout=10)
    assert info.value.code == 404
    # The console never in a frame, no type sniffing, its own files only (issue 32).
    with urllib.request.urlopen(url + "/", timeout=10) as answer:
        assert answer.headers["X-Frame-Options"] == "DENY"
        assert answer.headers["X-Content-Type-Options"] == "nosniff"
        assert "frame-ancestors 'none'" in answer.headers["Content-Security-Policy"]
    # DNS rebinding: a page of another site whose name resolves to this node sends that
    # name as Host; it is refused (421), while IP literals and localhost are served.
    port = url.rsplit(":", 1)[1]
    for host, served in (("evil.example", False), (f"evil.example:{port}", False),
                         ("localhost", True), (f"127.0.0.1:{port}", True)):  # fmt: skip
        request = urllib.request.Request(url + "/api/status", headers={"Host": host})
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                assert served and answer.status == 200, host
        except urllib.error.HTTPError as exc:
            assert not served and exc.code == 421, (host, exc.code)
            assert "http.allowed.hosts" in exc.read().decode()


@pytest.mark.timeout(120)
def test_compaction_is_measured(node: tuple[LocalCluster, Client]) -> None:
    cluster, client = node
    client.create_topic(
        "k",
        configs={
            "cleanup.policy": "compact",
            "segment.bytes": "2048",
            "min.cleanable.dirty.ratio": "0.01",
            **FAST,
        },
    )
    for round_ in range(6):
        for key in range(10):
            client.produce("k", [ProducerRecord(b"key%d" % key, b"v%d" % round_)], partition=0)
    labels = {"topic": "k", "partition": "0"}
    families = wait_for(
        "a compaction",
        lambda: (
            (f := scrape(cluster.http_url(1)))
            and value(f, "tidelog_partition_compactions_total", **labels) >= 1
            and f
        ),
    )
    ratio = value(families, "tidelog_partition_compaction_ratio", **labels)
    before = value(families, "tidelog_compaction_bytes_before_total")
    after = value(families, "tidelog_compaction_bytes_after_total")
    assert 0 < ratio < 1 and 0 < after < before
    assert value(families, "tidelog_compaction_records_removed_total") > 0
    # No transaction here: nothing aborted to remove, no marker (the counters are shown anyway).
    assert value(families, "tidelog_compaction_aborted_records_removed_total") == 0
    assert value(families, "tidelog_compaction_markers_removed_total") == 0
    # Each producer's newest batch is in the active segment, which compaction leaves alone.
    assert value(families, "tidelog_compaction_empty_batches_kept_total") == 0


def test_http_listen_beyond_loopback_needs_tls_and_acls() -> None:
    with pytest.raises(InvalidConfig) as info:
        NodeConfig(node_id=1, data_dir=Path("/nonexistent"), http_listen=("0.0.0.0", 0))
    assert "--http-listen 0.0.0.0" in str(info.value) and info.value.details["key"] == "insecure"
