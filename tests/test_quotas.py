"""Quotas (issue 14): a principal over its produce or fetch quota is slowed to it, told how
long in throttle_time_ms, and not refused; another principal's latency stays normal."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import batch_of, run_tidelog
from tidelog.cli.cluster import LocalCluster
from tidelog.client.sync_client import Client
from tidelog.errors import InvalidRequest
from tidelog.protocol import api
from tidelog.protocol.api import ApiKey

# timed: rates measured against the quota
pytestmark = [pytest.mark.process, pytest.mark.timed]  # tiers: pyproject.toml's markers

RATE = 256 * 1024  # alice's producer_byte_rate and (x2) consumer_byte_rate
CHUNK = 64 * 1024


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("quotas"), 1, log_level="WARNING") as c:
        yield c


def throttles_ms(client: Client, address: tuple[str, int], count: int) -> list[int]:
    """The hold each of count produces of bob's was told (bench/quotas.py times them)."""
    held = []
    for i in range(count):
        header, _ = client._run(
            client._async.call(
                address, ApiKey.PRODUCE, api.ProduceRequest("bob-t", 0), batch_of(b"bob %d" % i)
            )
        )
        held.append(int(header.get("throttle_time_ms", 0)))
        time.sleep(0.02)
    return held


def test_a_principal_over_its_quota_is_slowed_to_it_and_others_are_not(
    cluster: LocalCluster,
) -> None:
    with Client(cluster.bootstrap) as admin:
        alice_token = admin.add_principal("alice")
        bob_token = admin.add_principal("bob")
        for topic in ("alice-t", "bob-t"):
            admin.create_topic(topic)
            admin.wait_for_leaders(topic)
        admin.set_quota("alice", {"producer_byte_rate": RATE, "consumer_byte_rate": 2 * RATE})
        assert admin.quotas() == [
            {
                "principal": "alice",
                "limits": {"producer_byte_rate": RATE, "consumer_byte_rate": 2 * RATE},
            }
        ]
    alice = Client(cluster.bootstrap, token=alice_token)
    bob = Client(cluster.bootstrap, token=bob_token)
    with alice, bob:
        # alice produces 24 chunks of 64 KiB (1.5 MiB) as fast as she is let.
        chunks = 24
        alice_done: list[float] = []

        def flood() -> None:
            started = time.perf_counter()
            for _ in range(chunks):
                alice.produce("alice-t", [b"a" * CHUNK], partition=0)
            alice_done.append(time.perf_counter() - started)

        flooder = threading.Thread(target=flood)
        flooder.start()
        during = throttles_ms(bob, ("127.0.0.1", cluster.ports[1]), 150)
        flooder.join(60)
        assert alice_done, "alice's produce did not finish"
        elapsed = alice_done[0]
        rate = chunks * CHUNK / elapsed
        # A second's burst, then the quota: (1.5 MiB - 256 KiB) / 256 KiB = 5 s at least.
        assert rate <= 1.3 * RATE, f"alice produced {rate / 1024:.0f} KiB/s over her quota"
        assert elapsed >= 0.8 * (chunks * CHUNK - RATE) / RATE
        # bob was never held (his latency meanwhile is bench/quotas.py's to measure).
        assert during == [0] * len(during)

        # The answer says how long alice is held (the client is not refused).
        header, _ = alice._run(
            alice._async.call(
                ("127.0.0.1", cluster.ports[1]),
                ApiKey.PRODUCE,
                api.ProduceRequest("alice-t", 0),
                batch_of(b"a" * CHUNK),
            )
        )
        assert header["throttle_time_ms"] > 0

        # Fetching is held to consumer_byte_rate: a second's burst, then the quota (the last
        # answer comes at once, with the hold that follows it).
        time.sleep(2.0)
        started = time.perf_counter()
        got = sum(len(r.value or b"") for r in alice.consume("alice-t", 0, max_bytes=CHUNK))
        fetched_s = time.perf_counter() - started
        assert got >= chunks * CHUNK
        assert fetched_s >= 0.8 * (got - 2 * RATE - 2 * CHUNK) / (2 * RATE), fetched_s


def test_quotas_through_the_cli_and_their_errors(cluster: LocalCluster, tmp_path: Path) -> None:
    boot = ["--bootstrap", cluster.bootstrap]
    done = run_tidelog("quotas", "set", "*", "admin_request_rate=50", *boot)
    assert done.returncode == 0, done.stderr
    listed = json.loads(run_tidelog("quotas", "list", "--json", *boot).stdout)
    assert {"principal": "*", "limits": {"admin_request_rate": 50.0}} in listed
    table = run_tidelog("quotas", "list", *boot).stdout
    assert "admin_request_rate=50" in table
    for bad in ("bytes_per_second=5", "producer_byte_rate=-1", "producer_byte_rate=fast"):
        refused = run_tidelog("quotas", "set", "alice", bad, *boot)
        assert refused.returncode != 0 and "InvalidRequest" in refused.stderr, bad
    assert run_tidelog("quotas", "remove", "*", *boot).returncode == 0
    gone = run_tidelog("quotas", "remove", "*", *boot)
    assert gone.returncode != 0 and "InvalidRequest" in gone.stderr
    with Client(cluster.bootstrap) as client, pytest.raises(InvalidRequest):
        client.set_quota("alice", {})
