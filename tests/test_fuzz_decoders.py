"""Coverage-guided fuzzing of every decoder a node runs on outside bytes (tidelog.testing.fuzz:
atheris/libFuzzer), then its corpus sent to a live node on every listener.

The fuzzer runs every Kafka api and version ApiVersions announces, tidelog's framing and every
client request type, the peer handshake and replication messages, SCRAM, producer batches, and
HTTP requests as the HTTP listener parses them.
Any exception but a named refusal, or a crash (a native decoder aborting: how one 20-byte
Kafka request used to kill a node) fails the run; libFuzzer keeps the input as crash-*. Then the
inputs that reached new code go to a real `tidelog serve` on its client, Kafka and peer ports:
it must answer or close each, stay alive, stay bounded, and serve a well-formed client after.
(HTTP inputs go to its HTTP port.)

TIDELOG_DECODER_FUZZ_SECONDS (default 20) sets the fuzzing time; `make fuzz` runs it longer.
"""

from __future__ import annotations

import os
import re
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from test_trust import rss_peak_kb, serve
from tidelog.cli.cluster import free_ports
from tidelog.client.sync_client import Client
from tidelog.protocol import api
from tidelog.protocol.framing import Frame, Kind, encode_frame
from tidelog.testing.fuzz import corpus_inputs, kafka_wire

# timed: fuzzes for a set time
pytestmark = [pytest.mark.process, pytest.mark.timed]  # tiers: pyproject.toml's markers

atheris = pytest.importorskip("atheris")
SECONDS = int(os.environ.get("TIDELOG_DECODER_FUZZ_SECONDS", "20"))
FUZZ = [sys.executable, "-m", "tidelog.testing.fuzz"]


def fuzz(workdir: Path, seconds: int) -> dict[str, int]:
    done = subprocess.run(
        [*FUZZ, "--seconds", str(seconds), "--corpus", str(workdir / "corpus")],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=seconds + 600,
    )
    findings = sorted(workdir.glob("crash-*")) + sorted(workdir.glob("oom-*"))
    assert done.returncode == 0 and not findings, (
        f"the fuzzer found an input no decoder may fail on ({findings}); replay it with "
        f"`python -m tidelog.testing.fuzz --replay FILE`:\n{done.stderr[-4000:]}"
    )
    stats = {k: int(v) for k, v in re.findall(r"stat::(\w+):\s+(\d+)", done.stderr)}
    coverage = re.findall(r" cov: (\d+) ft: (\d+)", done.stderr)
    if coverage:  # libFuzzer's last progress line: edges covered, and features
        stats["coverage_edges"], stats["coverage_features"] = map(int, coverage[-1])
    return stats


def send(address: tuple[str, int], data: bytes) -> None:
    """One connection: the bytes, then end of input; whatever comes back until it closes."""
    try:
        with socket.create_connection(address, timeout=3.0) as sock:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):
                pass
    except OSError:
        pass  # refused, reset or timed out: the node decides how it turns bytes away


def sasl_wire(data: bytes) -> bytes:
    """SaslHandshake v1 (SCRAM-SHA-256) and SaslAuthenticate v2 with the input as its bytes."""

    def frame(api_key: int, version: int, body: bytes, flexible: bool) -> bytes:
        head = struct.pack(">hhih", api_key, version, 1, 4) + b"fuzz" + (b"\0" if flexible else b"")
        return struct.pack(">i", len(head) + len(body)) + head + body

    mechanism = b"SCRAM-SHA-256"
    first, _, _ = data[1:].partition(b"\xff")
    auth = bytes([len(first) + 1]) + first if len(first) < 127 else b"\x01"
    return frame(17, 1, struct.pack(">h", len(mechanism)) + mechanism, False) + frame(
        36, 2, auth + b"\0", True
    )


@pytest.mark.timeout(SECONDS + 600)  # (make fuzz runs it for 600 s and more)
def test_coverage_guided_fuzzing_of_every_decoder_and_a_live_node_takes_the_corpus(
    tmp_path: Path,
) -> None:
    stats = fuzz(tmp_path, SECONDS)
    inputs = corpus_inputs(tmp_path / "corpus")
    print(
        f"\nfuzzed {SECONDS} s: {stats.get('number_of_executed_units')} inputs, "
        f"{stats.get('average_exec_per_sec')} a second, {stats.get('new_units_added')} new "
        f"units, corpus {len(inputs)}, coverage {stats.get('coverage_edges')} edges / "
        f"{stats.get('coverage_features')} features, fuzzer peak RSS {stats.get('peak_rss_mb')} MB"
    )
    assert stats.get("number_of_executed_units", 0) > 1000
    kafka_port, peer_port, http_port = free_ports(3)
    flags = (
        *("--kafka-listen", f"127.0.0.1:{kafka_port}", "--peer-listen", f"127.0.0.1:{peer_port}"),
        *("--http-listen", f"127.0.0.1:{http_port}"),
    )
    with serve(tmp_path, "request.receive.timeout.ms=2000", flags=flags) as (proc, address):
        with Client("{}:{}".format(*address)) as client:
            client.create_topic("t", partitions=1)
        baseline_kb = rss_peak_kb(proc.pid)
        kafka, peer = ("127.0.0.1", kafka_port), ("127.0.0.1", peer_port)
        http = ("127.0.0.1", http_port)

        def one(item: tuple[str, bytes]) -> None:
            target, data = item
            if target == "kafka":
                send(kafka, kafka_wire(data))
            elif target == "sasl":
                send(kafka, sasl_wire(data))
            elif target == "peer":
                send(peer, data)
            elif target == "client":
                send(address, data)
            elif target == "http":
                send(http, data)
            else:  # a producer's batches, in a produce request
                header = {"topic": "t", "partition": 0, "acks": 1}
                send(
                    address,
                    encode_frame(Frame(Kind.REQUEST, int(api.ApiKey.PRODUCE), 1, header, data)),
                )

        started = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(one, inputs))
        elapsed = time.monotonic() - started
        assert proc.poll() is None, "the node died on the fuzzer's corpus"
        grown_mb = (rss_peak_kb(proc.pid) - baseline_kb) / 1024
        print(
            f"live node: {len(inputs)} inputs in {elapsed:.1f} s, peak RSS grew {grown_mb:.0f} MB"
        )
        assert grown_mb < 512
        with Client("{}:{}".format(*address)) as client:
            # (the corpus holds every client request, a topic deletion among them)
            client.create_topic("after", partitions=1)
            written = client.produce("after", [b"after"], partition=0)
            assert written is not None
            got = client.fetch("after", 0, written.base_offset)
            assert [r.value for r in got.records][:1] == [b"after"]
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10) as page:
            assert page.status == 200  # the HTTP listener serves after the corpus too
    log = (tmp_path / "node.log").read_text()
    assert "Traceback" not in log, log[-3000:]
