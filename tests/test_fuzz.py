"""A grammar-aware fuzzer against a live node (a real `tidelog serve` process).

Frames are built the way tidelog's grammar builds them (a kind, an api key, a JSON header with
the typed fields of that api's request, a payload of record batches) and then some are mutated:
wrong types, missing and unknown fields, hostile values, batches with bytes flipped (and CRCs
fixed up, as a buggy producer would), every invalid-batch kind, lying prefixes, frames cut into
random pieces, messages only a peer may send. The weights keep most frames well-formed enough
to get deep into the core (produce, fetch, cursors, tables, topic creation). Hypothesis drives
the runs: each example is a seed (printed when it fails) and a number of frames.

Afterwards: the node never died, its peak RSS stayed bounded, every batch in every segment
passes the validator, its log holds no traceback, and a well-formed client still works.

It runs for TIDELOG_FUZZ_SECONDS (default 30, what CI runs; set it higher for a soak) and prints
its executions per second.
"""

from __future__ import annotations

import collections
import os
import random
import socket
import time
import typing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from invalid_batches import INVALID, fix_crc
from test_trust import rss_peak_kb, serve
from tidelog.client.sync_client import Client
from tidelog.protocol import api
from tidelog.protocol.api import ApiKey
from tidelog.protocol.framing import FrameDecoder, Kind, encode_prefix
from tidelog.record.batch import (
    COMPRESSION_GZIP,
    ProducerRecord,
    build_batch,
    iter_headers,
)
from tidelog.storage.scrub import check_batch

# timed: fuzzes for a set time
pytestmark = [pytest.mark.process, pytest.mark.timed]  # tiers: pyproject.toml's markers

FUZZ_SECONDS = float(os.environ.get("TIDELOG_FUZZ_SECONDS", "30"))
KEYS = [int(k) for k in ApiKey]
CLIENT_KEYS = [int(k) for k in api.REQUEST_TYPES]
HINTS = {key: typing.get_type_hints(cls) for key, cls in api.REQUEST_TYPES.items()}

# What a field usually holds, by name: values that take a request deep into the core.
NAMED: dict[str, Any] = {
    "topic": ["t", "t", "t", "cmp", "tbl", "missing"],
    "name": ["t", "c1", "c2", "n1", "tbl", "cmp"],
    "partition": [0, 0, 1, 2],
    "acks": [-1, 1, 1, 0],
    "offset": [0, 0, 0, 0, 1, 1, 2, 3, 5, 8, 13, 29],
    "before_offset": [0, 0, 0, 1, 5, -1],
    "max_wait_ms": [0, 0, 5, 20],
    "timeout_ms": [0, 100, 1000, 2000],
    "max_bytes": [1, 100, 4096, 1 << 20],
    "min_bytes": [0, 1, 1000],
    "partitions": [1, 2, 3],
    "replication_factor": [1, 1, 2],
    "op": ["create", "commit", "delete", "list", "describe", "invalidate", "get", "scan"],
    "spec": ["earliest", "latest", "timestamp"],
    "kind": ["stream", "table"],
    "key": ["", "aw==", "!!"],
    "after": ["", "aw=="],
    "cursor": ["", "", "", "c1"],
    "reason": ["", "why"],
    "limit": [1, 10, 10**9],
    # Mostly what clients send, so requests get past them and deep (a random epoch or
    # consistency is refused at once: FencedLeaderEpoch, InvalidRequest).
    "leader_epoch": [-1, -1, -1, -1, -1, -1, 0, 1, 7],
    "consistency": ["linearizable"] * 4 + ["lease", "lease", "serializable", "serializable", "x"],
}
HOSTILE: list[Any] = [
    None,
    True,
    -1,
    2**63,
    -(2**63) - 1,
    10**30,
    1.5,
    float("inf"),
    "",
    "../../etc",
    "\udcff" * 0,
    "é" * 300,
    [],
    [1, [2, [3]]],
    {},
    {"a": {"b": None}},
]


def value(rnd: random.Random, name: str, hint: Any, hostile: float) -> Any:
    if rnd.random() < hostile:
        return rnd.choice(HOSTILE)
    if name in NAMED:
        return rnd.choice(NAMED[name])
    text = str(hint)
    if "bool" in text:
        return rnd.random() < 0.5
    if "dict" in text:
        if name == "configs":
            return {
                rnd.choice(["segment.bytes", "cleanup.policy", "x"]): rnd.choice(
                    ["4096", "compact", "-5"]
                )
            }
        return {str(rnd.randrange(3)): rnd.randrange(-1, 20) for _ in range(rnd.randrange(3))}
    if "list" in text:
        return [rnd.choice(["t", "tbl", "cmp"]) for _ in range(rnd.randrange(3))]
    if "int" in text:
        return rnd.choice([-1, 0, 1, 7, 100])
    if "str" in text:
        return rnd.choice(["", "t", "x"])
    return rnd.choice(HOSTILE)


def header_for(rnd: random.Random, key: int) -> dict[str, Any]:
    hints = HINTS.get(ApiKey(key)) if key in KEYS else None
    if hints is None:
        return {rnd.choice(["topic", "group", "type"]): rnd.choice(HOSTILE)}
    # Half the headers are as a client writes them, so the depth reached does not hang on how
    # many fields an api has; the other half are broken field by field, and thoroughly.
    broken = rnd.random() < 0.5
    hostile, missing = (0.15, 0.1) if broken else (0.0, 0.0)
    out = {
        name: value(rnd, name, hint, hostile)
        for name, hint in hints.items()
        if rnd.random() >= missing
    }
    if broken and rnd.random() < 0.1:
        out[rnd.choice(["extra", "__proto__", "topic"])] = rnd.choice(HOSTILE)
    return out


def record(rnd: random.Random) -> ProducerRecord:
    key = None if rnd.random() < 0.2 else rnd.randbytes(rnd.randrange(8))
    body = None if rnd.random() < 0.1 else rnd.randbytes(rnd.randrange(200))
    headers = tuple((f"h{i}", rnd.randbytes(3)) for i in range(rnd.randrange(2)))
    return ProducerRecord(key, body, headers, None)


def batches(rnd: random.Random) -> bytes:
    roll = rnd.random()
    if roll < 0.08:
        return rnd.choice(INVALID).make()
    if roll < 0.1:
        return b"" if rnd.random() < 0.5 else rnd.randbytes(rnd.randrange(100))
    records = [record(rnd) for _ in range(rnd.randrange(1, 6))]
    compression = COMPRESSION_GZIP if rnd.random() < 0.15 else 0
    batch = bytearray(build_batch(records, compression=compression))
    if roll < 0.35:  # bytes flipped, the CRC made right again (or not)
        for _ in range(rnd.randrange(1, 4)):
            batch[rnd.randrange(len(batch))] = rnd.randrange(256)
        return fix_crc(batch) if rnd.random() < 0.7 else bytes(batch)
    if roll < 0.4:
        return bytes(batch) * rnd.randrange(2, 4)
    return bytes(batch)


def frame(rnd: random.Random) -> bytes:
    roll = rnd.random()
    key = rnd.choice(CLIENT_KEYS) if roll < 0.85 else rnd.choice([*KEYS, rnd.randrange(65536)])
    kind = Kind.REQUEST if rnd.random() < 0.93 else rnd.choice([1, 2, 3, 255])
    header = header_for(rnd, key)
    payload = batches(rnd) if key == ApiKey.PRODUCE or rnd.random() < 0.05 else b""
    cid = rnd.randrange(2**32)
    try:
        data = bytearray(encode_prefix(Kind.REQUEST, key, cid, header, len(payload)) + payload)
    except (ValueError, TypeError):
        data = bytearray(encode_prefix(Kind.REQUEST, key, cid, {}, len(payload)) + payload)
    data[4] = kind
    damage = rnd.random()
    if damage < 0.02:  # a lying frame size
        data[0:4] = rnd.randrange(2**32).to_bytes(4, "big")
    elif damage < 0.04:  # a lying header size
        data[11:15] = rnd.randrange(2**32).to_bytes(4, "big")
    elif damage < 0.06:  # cut short
        del data[rnd.randrange(len(data)) :]
    return bytes(data)


class Stats:
    frames = 0
    examples = 0
    io_seconds = 0.0
    answers: collections.Counter[str] = collections.Counter()


def exchange(address: tuple[str, int], data: list[bytes], rnd: random.Random) -> None:
    """Send frames (cut into pieces now and then), then read whatever comes back until the
    node goes quiet or closes the connection."""
    with socket.create_connection(address, timeout=5) as sock:
        blob = b"".join(data)
        try:
            if rnd.random() < 0.2:
                pos = 0
                while pos < len(blob):
                    size = rnd.randrange(1, 300)
                    sock.sendall(blob[pos : pos + size])
                    pos += size
            else:
                sock.sendall(blob)
        except OSError:
            return
        sock.settimeout(0.02)
        decoder = FrameDecoder(1 << 30)
        try:
            while chunk := sock.recv(1 << 16):
                decoder.receive_data(chunk)
                while (answer := decoder.next_frame()) is not None:
                    error = answer.header.get("error")
                    name = error.get("name", "?") if isinstance(error, dict) else "ok"
                    api_name = ApiKey(answer.api).name if answer.api in KEYS else "other"
                    Stats.answers[f"{api_name}:{name}"] += 1
        except OSError:
            pass


def test_grammar_aware_fuzzing_never_breaks_a_live_node(tmp_path: Path) -> None:
    with serve(tmp_path, "request.receive.timeout.ms=2000") as (proc, address):
        bootstrap = "{}:{}".format(*address)
        keeper = Client(bootstrap)
        topics: dict[str, dict[str, Any]] = {
            "t": {"partitions": 2},
            "cmp": {"configs": {"cleanup.policy": "compact", "segment.bytes": "4096"}},
            "tbl": {"kind": "table"},
        }

        def keep_topics() -> None:
            """An anonymous client may delete topics (permissions come with principals and
            ACLs) and the fuzzer sometimes does: put them back, so it keeps getting deep."""
            present = {info.name for info in keeper.list_topics()}
            for name, options in topics.items():
                if name not in present:
                    keeper.create_topic(name, **options)
                    if name == "t":
                        keeper.create_cursor("c1", "t", if_not_exists=True)
                        keeper.produce("t", [b"before"], partition=0)

        keep_topics()
        baseline_kb = rss_peak_kb(proc.pid)
        started = time.monotonic()

        @settings(
            max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        @given(st.integers(0, 2**64), st.integers(1, 12))
        def one(seed: int, count: int) -> None:
            if time.monotonic() - started > FUZZ_SECONDS:
                return
            rnd = random.Random(seed)  # a failure prints the seed that replays it
            data = [frame(rnd) for _ in range(count)]
            t0 = time.monotonic()
            exchange(address, data, rnd)
            Stats.io_seconds += time.monotonic() - t0
            Stats.frames += count
            Stats.examples += 1
            assert proc.poll() is None, "the node died"
            keep_topics()

        while time.monotonic() - started < FUZZ_SECONDS:
            one()
        elapsed = time.monotonic() - started
        assert proc.poll() is None
        peak_kb = rss_peak_kb(proc.pid)
        time.sleep(0.5)  # requests the fuzzer left in flight (a delete, say) finish
        keep_topics()
        keeper.close()
        with Client(bootstrap) as client:  # a well-formed client still works
            client.produce("t", [b"after"], partition=0)
            values = [r.value for r in client.consume("t", 0, "earliest", skip_invalid=False)]
            assert values[-1] == b"after"
            client.produce("tbl", [ProducerRecord(b"k", b"v")])
            assert client.table_get("tbl", b"k") == b"v"
            scan = client.table_scan("tbl")
            assert (b"k", b"v") in scan
        ok = sum(v for k, v in Stats.answers.items() if k.endswith(":ok"))
        answered = sum(Stats.answers.values())
        deep = sorted({k.split(":")[0] for k in Stats.answers if k.endswith(":ok")})
        answered = sum(Stats.answers.values())
        deep = sorted({k.split(":")[0] for k in Stats.answers if k.endswith(":ok")})
        print("ANSWERED", answered, "OK", ok, "DEEP", deep)
        print(
            f"fuzzer: {Stats.examples} examples, {Stats.frames} frames in {elapsed:.0f} s = "
            f"{Stats.frames / elapsed:.0f} frames/s ({answered} answered, {ok} ok, by "
            f"{len(deep)} apis); peak RSS "
            f"{baseline_kb / 1024:.0f} -> {peak_kb / 1024:.0f} MB; answers: "
            + ", ".join(f"{k} {v}" for k, v in Stats.answers.most_common(25))
        )
        assert (peak_kb - baseline_kb) / 1024 < 200
        # It got deep: many apis reached their handlers and succeeded. (Counted over answers, not
        # frames: how many answers arrive before a broken frame closes the connection is luck.)
        assert "PRODUCE" in deep, deep
        assert len(deep) >= 12 and ok > answered // 8
    text = (tmp_path / "node.log").read_text()
    assert "Traceback" not in text and "internal error" not in text
    for segment in sorted((tmp_path / "data").rglob("*.log")):
        data = segment.read_bytes()
        for pos, header in iter_headers(data):
            error = check_batch(data[pos : pos + header.size_bytes])
            assert error is None, f"{segment}: batch at {header.base_offset}: {error}"
