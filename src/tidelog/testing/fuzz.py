"""Coverage-guided fuzzing of every decoder a node runs on bytes from outside (atheris: libFuzzer
over CPython's coverage).

    python -m tidelog.testing.fuzz --seconds 60 [--corpus DIR] [--only kafka|client|peer|sasl|batch|http]

Targets, each given the fuzzer's bytes:
  - kafka: a request of every api and version ApiVersions announces (the input picks which),
    through the Kafka listener's own decoder (kafka/codec.py: the bounds check, then kio);
  - client: tidelog's framing (protocol/framing.py) over the bytes, then every frame's header as
    the typed request of its api key (protocol/api.py), as the client listener decodes them;
  - peer: the peer handshake's requests and every replication message (replication_codec);
  - sasl: SASL/PLAIN and SCRAM client messages (kafka/sasl.py's parsing, scram.py);
  - batch: a producer's payload through the batch validator and the record decoders;
  - http: a request as the HTTP listener reads it (aiohttp's Python parser, the same grammar as
    its C one), then its Host header through the listener's DNS-rebinding guard.

A decoder may refuse bad bytes only with a named tidelog error (TidelogError). Anything else, an
allocation that outgrows --rss-mb, or a crash of the process (a native decoder aborting) is a
finding: libFuzzer writes the input to crash-* in the working directory and exits non-zero.
Inputs that reached new code are kept in the corpus, which tests/test_fuzz.py then sends to a
live node. A first corpus of well-formed requests (kio's own strategies for every Kafka request
version; one of each tidelog request) is written when the corpus is empty.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import io
import struct
import sys
import traceback
from pathlib import Path
from typing import Any

TARGETS = ("kafka", "client", "peer", "sasl", "batch", "http")


def _served() -> list[tuple[int, int]]:
    from tidelog.kafka.codec import SUPPORTED_VERSIONS

    return [
        (k, v)
        for k, (low, high) in sorted(SUPPORTED_VERSIONS.items())
        for v in range(low, high + 1)
    ]


def kafka_frame(api_key: int, version: int, body: bytes, correlation_id: int = 1) -> bytes:
    """A request frame after its size: the header kio expects for this version, then body."""
    from kio.index import load_request_schema

    flexible = load_request_schema(api_key, version).__header_schema__.__flexible__
    header = struct.pack(">hhih", api_key, version, correlation_id, 4) + b"fuzz"
    return header + (b"\x00" if flexible else b"") + body


class Targets:
    """The decoders, each a function of bytes that may raise only TidelogError."""

    def __init__(self) -> None:
        from tidelog.errors import TidelogError
        from tidelog.protocol import api

        self.refusal: type[Exception] = TidelogError
        self.served = _served()
        self.client_types = dict(api.REQUEST_TYPES)

    def run(self, target: str, data: bytes) -> None:
        try:
            getattr(self, target)(data)
        except self.refusal:
            pass

    def kafka(self, data: bytes) -> None:
        from tidelog.kafka.codec import parse_request

        if len(data) < 2:
            return
        pick = int.from_bytes(data[:2], "big")
        if pick & 0x8000:  # now and then the header too is the fuzzer's
            parse_request(data[2:])
            return
        api_key, version = self.served[pick % len(self.served)]
        parse_request(kafka_frame(api_key, version, data[2:]))

    def client(self, data: bytes) -> None:
        from tidelog.protocol import api
        from tidelog.protocol.framing import FrameDecoder

        decoder = FrameDecoder(1 << 20)
        decoder.receive_data(data)
        while (frame := decoder.next_frame()) is not None:
            request_type = self.client_types.get(frame.api)  # type: ignore[call-overload]
            if request_type is not None:
                api.decode(request_type, frame.header)

    def peer(self, data: bytes) -> None:
        from tidelog.protocol import api
        from tidelog.protocol.api import ApiKey
        from tidelog.protocol.framing import FrameDecoder
        from tidelog.protocol.peer_batch import decode_peer_batch
        from tidelog.protocol.peer_handshake import ListenerHandshake, PeerAuth, PeerHello
        from tidelog.protocol.replication_codec import decode_message

        decoder = FrameDecoder(1 << 20)
        decoder.receive_data(data)
        handshake = ListenerHandshake(b"s" * 32, 1, frozenset({1, 2, 3}), "cluster")
        while (frame := decoder.next_frame()) is not None:
            if frame.api == 0:
                handshake.hello(api.decode(PeerHello, frame.header))
            elif frame.api == 1:
                handshake.auth(api.decode(PeerAuth, frame.header))
            elif frame.api == ApiKey.PEER_BATCH:
                for key, header, payload in decode_peer_batch(frame.header, bytes(frame.payload)):
                    if key == ApiKey.REPLICATION:
                        decode_message(header, payload)
            else:
                decode_message(frame.header, bytes(frame.payload))

    def sasl(self, data: bytes) -> None:
        from tidelog.scram import ScramExchange, credentials

        mechanism = "SCRAM-SHA-256" if data[:1] != b"\x01" else "SCRAM-SHA-512"
        first, _, final = data[1:].partition(b"\xff")
        stored = credentials("secret", iterations=1)[mechanism]
        exchange = ScramExchange(mechanism)
        exchange.first(first, lambda user: stored if user == "u" else None)
        exchange.final(final)
        parts = data.split(b"\0")  # SASL/PLAIN's framing, as kafka/sasl.py splits it
        if len(parts) == 3:
            "".join(p.decode(errors="replace") for p in parts)

    def batch(self, data: bytes) -> None:
        """What a producer sends (the node validates it), and the same bytes through the record
        and column decoders unverified (their C code must refuse, never crash)."""
        from tidelog.record.batch import decode_records, iter_headers
        from tidelog.record.columns import batch_items, decode_columns
        from tidelog.record.validation import BatchRules, validate_produced

        try:
            validate_produced(data, BatchRules(1 << 20), now_ms=0)
        except self.refusal:
            pass
        for position, _ in iter_headers(data, verify=False):
            try:
                decode_records(data, position)
            except self.refusal:
                pass
        decode_columns([item for _, item in batch_items(data, verify=False)], True)

    def http(self, data: bytes) -> None:
        from aiohttp.base_protocol import BaseProtocol
        from aiohttp.http_exceptions import HttpProcessingError
        from aiohttp.http_parser import HttpRequestParserPy

        from tidelog.node.listeners.http import host_allowed

        loop = asyncio.get_event_loop()
        parser = HttpRequestParserPy(BaseProtocol(loop), loop, 2**16)
        try:
            messages, _, _ = parser.feed_data(data)
        except HttpProcessingError:
            return  # aiohttp answers 400 and closes
        for message, _ in messages:
            host_allowed(message.headers.get("Host", ""), ("console.example",), ("node1",))


def seed_corpus(directory: Path, examples_per_version: int = 3) -> int:
    """Well-formed inputs for every target: every Kafka request version kio can write, one of
    each tidelog request, a handshake, a SCRAM exchange, a few batches."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from kio.index import load_request_schema
    from kio.serial import entity_writer
    from kio.static.primitive import Records

    from tidelog.protocol.framing import Frame, Kind, encode_frame
    from tidelog.record.batch import ProducerRecord, build_batch

    st.register_type_strategy(Records, st.binary(max_size=64).map(Records))
    directory.mkdir(parents=True, exist_ok=True)
    written = 0

    def keep(target: str, data: bytes) -> None:
        nonlocal written
        tag = TARGETS.index(target).to_bytes(1, "big")
        name = hashlib.sha1(tag + data).hexdigest()
        (directory / name).write_bytes(tag + data)
        written += 1

    served = _served()
    for index, (api_key, version) in enumerate(served):
        schema = load_request_schema(api_key, version)
        write = entity_writer(schema)
        bodies: list[bytes] = []

        @settings(
            max_examples=examples_per_version,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(st.from_type(schema))
        def collect(body: Any) -> None:
            out = io.BytesIO()
            write(out, body)  # noqa: B023
            bodies.append(out.getvalue())  # noqa: B023

        collect()
        for body in bodies:
            keep("kafka", index.to_bytes(2, "big") + body)
    for key in sorted(Targets().client_types):
        frame = Frame(Kind.REQUEST, int(key), 1, {"topic": "t", "partition": 0}, b"")
        keep("client", encode_frame(frame))
    hello = {"node_id": 2, "to": 1, "nonce": "00" * 16, "cluster_id": "cluster"}
    keep("peer", encode_frame(Frame(Kind.REQUEST, 0, 1, hello, b"")))
    keep("sasl", b"\x00n,,n=u,r=abc\xffc=biws,r=abc,p=AAAA")
    batch = build_batch([ProducerRecord(b"k", b"v"), ProducerRecord(None, b"w" * 40)])
    keep("batch", batch)
    keep("http", b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n")
    keep("http", b"POST /api/status HTTP/1.1\r\nHost: [::1]\r\nContent-Length: 3\r\n\r\nabc")
    keep(
        "http",
        b"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    )
    return written


def _limit_memory(rss_mb: int) -> None:
    import resource

    limit = rss_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tidelog.testing.fuzz")
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--corpus", type=Path, default=Path(".fuzz-corpus"))
    parser.add_argument("--only", choices=TARGETS, help="fuzz one target (default: all of them)")
    parser.add_argument(
        "--rss-mb", type=int, default=4096, help="address space beyond which an input is a finding"
    )
    parser.add_argument("--runs", type=int, default=-1, help="stop after this many inputs")
    parser.add_argument(
        "--replay", type=Path, nargs="+", help="run these inputs (e.g. crash-*) once, and say how"
    )
    args, rest = parser.parse_known_args(argv)
    if args.replay:
        return replay(args.replay, TARGETS.index(args.only) if args.only else None)
    try:
        import atheris
    except ImportError:
        print("atheris is not installed: .venv/bin/pip install -e '.[dev]'", file=sys.stderr)
        return 2
    if not args.corpus.exists() or not any(args.corpus.iterdir()):
        print(f"seeding {args.corpus}: {seed_corpus(args.corpus)} inputs", flush=True)
    with atheris.instrument_imports(include=["tidelog", "kio", "aiohttp"]):
        targets = Targets()
        for name in TARGETS:  # import every decoder now, instrumented
            try:
                targets.run(name, b"")
            except Exception:
                pass
    only = TARGETS.index(args.only) if args.only else None
    asyncio.set_event_loop(asyncio.new_event_loop())  # some decoders look for a loop

    def one_input(data: bytes) -> None:
        if not data:
            return
        which = only if only is not None else data[0] % len(TARGETS)
        targets.run(TARGETS[which], data[1:])

    _limit_memory(args.rss_mb)
    libfuzzer = [
        sys.argv[0],
        f"-max_total_time={args.seconds}",
        f"-runs={args.runs}",
        "-print_final_stats=1",
        "-timeout=20",
        *rest,
        str(args.corpus),
    ]
    atheris.Setup(libfuzzer, one_input)
    atheris.Fuzz()
    return 0


def replay(paths: list[Path], only: int | None) -> int:
    """Each input through its target, outside libFuzzer: a finding shows its traceback."""
    targets = Targets()
    failed = 0
    for path in paths:
        data = path.read_bytes()
        if not data:
            continue
        target = TARGETS[only if only is not None else data[0] % len(TARGETS)]
        try:
            targets.run(target, data[1:])
        except Exception:
            failed += 1
            print(f"{path} ({target}): FINDING", flush=True)
            traceback.print_exc()
        else:
            print(f"{path} ({target}): refused or decoded", flush=True)
    return 1 if failed else 0


def corpus_inputs(directory: Path) -> list[tuple[str, bytes]]:
    """Every kept input as (target, its bytes), for replaying against a live node."""
    out = []
    for path in sorted(directory.iterdir()):
        data = path.read_bytes()
        if data:
            out.append((TARGETS[data[0] % len(TARGETS)], data[1:]))
    return out


def kafka_wire(data: bytes) -> bytes:
    """A kafka target's input as the frame (size included) the node would have received."""
    if len(data) < 2:
        return struct.pack(">i", len(data)) + data
    pick = int.from_bytes(data[:2], "big")
    if pick & 0x8000:
        frame = data[2:]
    else:
        served = _served()
        api_key, version = served[pick % len(served)]
        frame = kafka_frame(api_key, version, data[2:])
    return struct.pack(">i", len(frame)) + frame


if __name__ == "__main__":
    sys.exit(main())
