"""Real processes: a node under a continuous acks=all load is SIGKILLed again and again; every
acknowledged record must survive, once, at its offset, with its bytes. And a stopped node whose
tail segment was damaged must truncate to the last valid batch and say so."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest

from helpers import wait_for
from tidelog.cli.cluster import LocalCluster
from tidelog.client.sync_client import Client
from tidelog.config import TopicConfig
from tidelog.errors import TidelogError
from tidelog.record import ProducerRecord, iter_headers
from tidelog.storage.log import SegmentedLog

pytestmark = pytest.mark.process  # tiers: pyproject.toml's markers

KILLS = 12


def produce_until(
    bootstrap: str, stop: threading.Event, acked: dict[int, bytes], errors: list[str]
) -> None:
    """acks=all in a loop; a new unique value for every attempt, no client-side retries, so an
    acknowledged value can only be in the log where its acknowledgement said."""
    rng = random.Random(1)
    attempt = 0
    with Client(bootstrap, retries=1, request_timeout_ms=2000) as client:
        while not stop.is_set():
            n = rng.randint(1, 20)
            values = [
                b"a%08d-%02d-" % (attempt, i) + rng.randbytes(rng.randint(0, 200)) for i in range(n)
            ]
            attempt += 1
            try:
                result = client.produce(
                    "crash", [ProducerRecord(None, v) for v in values], partition=0
                )
            except TidelogError as exc:
                errors.append(exc.name)
                time.sleep(0.02)
                continue
            assert result is not None
            for i, v in enumerate(values):
                acked[result.base_offset + i] = v


def read_everything(bootstrap: str, at_least: int = 0) -> dict[int, bytes]:
    """Every committed record, once the HW has reached at_least. A restarted node's HW starts
    from its last checkpoint and catches up when it commits in its new epoch."""
    with Client(bootstrap) as client:
        wait_for(
            f"the HW to come back to {at_least} after a restart",
            lambda: client.list_offsets("crash", 0, "latest") >= at_least,
            20,
            every_s=0.02,
        )
        return {r.offset: r.value or b"" for r in client.consume("crash", 0, "earliest")}


@pytest.mark.timeout(300)
def test_sigkill_under_acks_all_load_loses_nothing_acknowledged(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, nodes=1)
    cluster.start()
    cluster.wait_ready()
    try:
        with Client(cluster.bootstrap) as admin:
            admin.create_topic("crash", configs={"segment.bytes": str(64 * 1024)})
        acked: dict[int, bytes] = {}
        errors: list[str] = []
        stop = threading.Event()
        producer = threading.Thread(
            target=produce_until, args=(cluster.bootstrap, stop, acked, errors)
        )
        producer.start()
        rng = random.Random(42)
        counts = []
        try:
            for _ in range(KILLS):
                time.sleep(rng.uniform(0.3, 1.2))
                before = len(acked)
                cluster.kill(1)
                counts.append(before)
                cluster.start(1)
                cluster.wait_ready()
                # After every restart the acknowledged prefix is there, byte for byte.
                snapshot = dict(acked)
                stored = read_everything(cluster.bootstrap, max(snapshot, default=-1) + 1)
                missing = [o for o, v in snapshot.items() if stored.get(o) != v]
                assert not missing, (
                    f"acknowledged offsets lost or changed: {missing[:5]} "
                    f"stored={[stored.get(o) for o in missing[:3]]} acked={[snapshot[o] for o in missing[:3]]} "
                    f"stored_max={max(stored, default=-1)} n_stored={len(stored)}"
                )
            time.sleep(0.5)
        finally:
            stop.set()
            producer.join(timeout=30)
        assert len(acked) > counts[0] > 0, "the load kept producing across restarts"
        stored = read_everything(cluster.bootstrap, max(acked) + 1)
        for offset, value in acked.items():
            assert stored[offset] == value
        values = list(stored.values())
        assert len(set(values)) == len(values), "no record is stored twice"
    finally:
        cluster.stop_all()
    # The log validates end to end: every batch's CRC, offsets contiguous (leader-change control
    # batches fill the offsets consumers do not see), nothing truncated.
    log = SegmentedLog(tmp_path / "node-1" / "crash-0", TopicConfig())
    assert log.recovery.clean_shutdown and log.recovery.truncated_bytes == 0
    expected = 0
    for seg in log.segments:
        for _, header in seg.scan(verify=True):
            assert header.base_offset == expected
            expected = header.next_offset
    assert expected == log.log_end_offset
    log.close()


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_damaged_tail_segment_is_truncated_to_the_last_valid_batch(
    tmp_path: Path, damage: str
) -> None:
    cluster = LocalCluster(tmp_path, nodes=1)
    with cluster, Client(cluster.bootstrap) as client:
        client.create_topic("crash", configs={"segment.bytes": str(8 * 1024)})
        for i in range(60):
            client.produce("crash", [b"value-%03d" % i * 10], partition=0)
    log_dir = tmp_path / "node-1" / "crash-0"
    tail = sorted(log_dir.glob("*.log"))[-1]
    data = bytearray(tail.read_bytes())
    batches = [(pos, h) for pos, h in iter_headers(bytes(data))]
    assert len(batches) >= 3
    victim_pos, victim = batches[-2]
    if damage == "flip":
        data[victim_pos + 70] ^= 0xFF
    else:
        del data[victim_pos + victim.size_bytes - 5 :]
    tail.write_bytes(bytes(data))
    with cluster:
        stored = read_everything(cluster.bootstrap)
        assert max(stored) == victim.base_offset - 1
        assert sorted(stored) == list(range(victim.base_offset))
        with Client(cluster.bootstrap) as client:
            result = client.produce("crash", [b"after repair"], partition=0)
            assert result is not None and result.base_offset == victim.base_offset
    text = cluster.log_path(1).read_text()
    assert "truncating" in text and tail.name in text
