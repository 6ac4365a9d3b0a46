"""Nothing a client can do breaks the log (issue 9): peers are not clients, a connection's cost
is bounded, and every request gets exactly one answer, in order.

In-process nodes on real sockets here; the real-process cluster tests (forged identities,
floods measured by RSS) are further down."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

from helpers import batch_of, poll, wait_for
from test_cluster import leader_of
from test_node import running_node
from tidelog.cli.cluster import LocalCluster, free_ports
from tidelog.client.async_client import AsyncClient
from tidelog.client.sync_client import Client
from tidelog.errors import InvalidRequest
from tidelog.node.config import NodeConfig
from tidelog.node.server import Node
from tidelog.protocol import api
from tidelog.protocol.api import ApiKey
from tidelog.protocol.framing import PREFIX, Kind
from tidelog.protocol.peer_handshake import DialerHandshake, PeerAuth, PeerHelloResponse, proof
from tidelog.replication.messages import (
    BeginEpoch,
    FetchRequest,
    FetchResponse,
    VoteRequest,
    VoteResponse,
)
from tidelog.replication.replica import QuorumState, Replica, ReplicaConfig
from tidelog.storage.memory_log import MemoryLog
from wire import Wire, peer_session, replication_frame

# timed: closed within N seconds, latencies under a flood, epochs that must not move
pytestmark = [pytest.mark.process, pytest.mark.timed]  # tiers: pyproject.toml's markers

SECRET = b"s3cret-for-tests"


def node_at(
    tmp_path: Path, **options: Any
) -> AbstractAsyncContextManager[tuple[Node, AsyncClient]]:
    return running_node(tmp_path, cluster_secret=SECRET, **options)


@contextlib.asynccontextmanager
async def member_node(tmp_path: Path, **options: Any) -> AsyncIterator[Node]:
    """Node 1 of a three-voter cluster whose other members never start: its peer channel is
    what a test talks to, as node 2 or 3 would."""
    peers = {1: ("127.0.0.1", 0), 2: ("127.0.0.1", 1), 3: ("127.0.0.1", 2)}
    node = Node(
        NodeConfig(
            data_dir=tmp_path / "n1",
            node_id=1,
            listen=("127.0.0.1", 0),
            peers=peers,
            cluster_secret=SECRET,
            **options,
        )
    )
    await node.start()
    try:
        yield node
    finally:
        await node.stop()


def in_thread(fn: Any, *args: Any) -> Any:
    return asyncio.get_running_loop().run_in_executor(None, fn, *args)


# -- peers are not clients ---------------------------------------------------------------------


def test_the_client_listener_refuses_replication_and_cursor_messages(tmp_path: Path) -> None:
    async def main() -> None:
        async with node_at(tmp_path) as (node, client):
            await client.create_topic("t")
            await client.produce("t", [b"a", b"b"], partition=0)
            await client.create_cursor("c", "t", "earliest")
            group = "t/0"
            forged = [
                (
                    ApiKey.REPLICATION,
                    *replication_frame(group, FetchRequest(1, 1, 2, 1, 0, 1 << 20, 2)),
                ),
                (ApiKey.REPLICATION, *replication_frame(group, VoteRequest(99, 1, 99, 999, False))),
                (ApiKey.CURSOR, {"op": "invalidate", "name": "c", "reason": "forged"}, b""),
            ]

            def attack() -> list[bool]:
                closed = []
                for key, header, payload in forged:
                    wire = Wire(node.address)
                    wire.send(Kind.MESSAGE, key, header, payload)
                    closed.append(wire.closed_by_node())
                    wire.close()
                return closed

            assert await in_thread(attack) == [True, True, True]
            host = node.hosts[group]
            assert host.replica.epoch == 1 and host.log.log_end_offset == 2
            assert host.log.high_watermark == 2
            cursor = (await client.cursors("c"))[0]
            assert cursor["invalidated"] == ""
            status = (await client.status())[0]
            assert status["node"]["counters"]["tidelog_client_peer_messages_refused_total"] == 3

    asyncio.run(main())


def test_the_peer_channel_needs_the_secret_and_a_member_id(tmp_path: Path) -> None:
    async def main() -> None:
        async with member_node(tmp_path, peer_handshake_timeout_ms=1000) as node:
            address = node.peer_address

            def attempts() -> dict[str, Any]:
                seen: dict[str, Any] = {}
                try:
                    peer_session(address, b"wrong secret", 2, 1)
                except InvalidRequest as exc:
                    seen["wrong_secret"] = exc.message
                # A dialer that ignores the listener's proof and sends one made with a wrong
                # secret: the listener refuses it.
                liar = Wire(address)
                dialer = DialerHandshake(b"wrong secret", 2, 1)
                hello = liar.request(ApiKey.PEER_HELLO, dialer.hello())
                answer = api.decode(PeerHelloResponse, hello.header)
                bogus = proof(b"wrong secret", "dialer", 2, 1, dialer.nonce, answer.nonce)
                refused = liar.request(ApiKey.PEER_AUTH, PeerAuth(bogus))
                seen["liar"] = api.error_of(refused.header)
                seen["liar_closed"] = liar.closed_by_node()
                try:
                    peer_session(address, SECRET, 7, 1)
                except InvalidRequest as exc:
                    seen["not_a_member"] = exc.message
                try:
                    peer_session(address, SECRET, 2, 3)
                except InvalidRequest as exc:
                    seen["wrong_node"] = exc.message
                wire = Wire(address)  # a message before any handshake
                header, _ = replication_frame("__metadata/0", BeginEpoch(50, 2))
                wire.send(Kind.MESSAGE, ApiKey.REPLICATION, header)
                seen["message_first"] = wire.closed_by_node()
                wire = Wire(address)  # a handshake that never finishes
                seen["stalled_handshake"] = wire.closed_by_node(within_s=4)
                wire = Wire(address)  # a frame larger than a handshake may be
                wire.send_raw(PREFIX.pack(10_000_000, 0, ApiKey.PEER_HELLO, 1, 2) + b"{}")
                seen["oversized"] = wire.closed_by_node()
                session = peer_session(address, SECRET, 2, 1)  # the real thing works
                session.close()
                seen["member"] = True
                return seen

            seen = await in_thread(attempts)
            assert "did not prove it holds the cluster secret" in seen["wrong_secret"]
            assert isinstance(seen["liar"], InvalidRequest) and seen["liar_closed"]
            assert "did not prove" in seen["liar"].message
            assert "not a peer" in seen["not_a_member"]
            assert "not 3" in seen["wrong_node"]
            assert seen["message_first"] and seen["stalled_handshake"] and seen["oversized"]
            assert seen["member"]
            assert node.metadata_host.replica.epoch < 50
            assert node.core.counters.get("tidelog_peer_handshakes_failed_total") >= 3

    asyncio.run(main())


def test_a_peer_message_whose_embedded_id_is_not_the_senders_is_dropped() -> None:
    """The pure core: the sender is what the transport vouches for; a claim to be another
    voter (replica, candidate, voter, leader) drops the message."""
    log = MemoryLog()
    replica = Replica(ReplicaConfig(1, (1, 2, 3)), log, QuorumState(), random.Random(1))
    replica.campaign(pre_vote=False)
    replica.step(2, VoteResponse(1, 2, True, False))
    assert replica.is_leader
    replica.propose(batch_of(b"x"))
    log.flush()
    replica.on_flushed()
    replica.ready()
    leo = log.log_end_offset
    # From node 2, claiming to be replica 3, that it holds and fsynced everything:
    replica.step(2, FetchRequest(1, 3, leo, 1, 0, 1 << 20, leo))
    assert replica.progress[3].match_offset == 0 and log.high_watermark == 0
    assert replica.forged_messages == 1
    # From node 2, a vote request for candidate 3 in a later epoch: no election, no new epoch.
    replica.step(2, VoteRequest(5, 3, 1, leo, False))
    assert replica.epoch == 1 and replica.is_leader
    # From node 3, a fetch answer claiming to come from leader 2:
    replica.step(3, FetchResponse(9, 2, 0, 0, 0))
    assert replica.epoch == 1 and replica.is_leader and replica.forged_messages == 3
    # The same fetch, from node 2 as itself, counts (the check has teeth both ways).
    replica.step(2, FetchRequest(1, 2, leo, 1, 0, 1 << 20, leo))
    assert log.high_watermark == leo


# -- one answer per request, in order ---------------------------------------------------------


def test_a_thousand_pipelined_requests_get_a_thousand_answers_in_order(tmp_path: Path) -> None:
    async def main() -> None:
        async with node_at(tmp_path) as (node, client):
            await client.create_topic("t")
            await client.produce("t", [b"seed"], partition=0)
            kinds: list[tuple[int, dict[str, Any], bytes]] = [
                (ApiKey.PRODUCE, api.encode(api.ProduceRequest("t", 0, 1)), batch_of(b"p")),
                (ApiKey.METADATA, api.encode(api.MetadataRequest(["t"])), b""),
                (ApiKey.LIST_OFFSETS, api.encode(api.ListOffsetsRequest("t", 0)), b""),
                (ApiKey.FETCH, api.encode(api.FetchRequest("t", 0, 0, max_wait_ms=5)), b""),
                (ApiKey.PRODUCE, api.encode(api.ProduceRequest("t", 0, -1)), batch_of(b"q")),
                (ApiKey.API_VERSIONS, api.encode(api.ApiVersionsRequest()), b""),
                (ApiKey.PRODUCE, api.encode(api.ProduceRequest("nope", 0, 1)), batch_of(b"x")),
                (ApiKey.FETCH, api.encode(api.FetchRequest("t", 0, 10**9)), b""),
            ]

            def pipeline() -> list[int]:
                wire = Wire(node.address)
                blob = bytearray()
                for i in range(1000):
                    key, header, payload = kinds[i % len(kinds)]
                    blob += _frame(Kind.REQUEST, key, i + 1, header, payload)
                sender = threading.Thread(target=wire.send_raw, args=(bytes(blob),))
                sender.start()
                order = []
                for _ in range(1000):
                    frame = wire.frame()
                    assert frame is not None, f"closed after {len(order)} answers"
                    order.append(frame.correlation_id)
                sender.join()
                wire.close()
                return order

            order = await in_thread(pipeline)
            assert order == list(range(1, 1001))
            assert node.hosts["t/0"].log.log_end_offset == 1 + 250

    asyncio.run(main())


def _frame(kind: Kind, key: int, cid: int, header: dict[str, Any], payload: bytes) -> bytes:
    from tidelog.protocol.framing import encode_prefix

    return encode_prefix(kind, key, cid, header, len(payload)) + payload


def test_in_flight_requests_per_connection_are_bounded(tmp_path: Path) -> None:
    async def main() -> None:
        async with node_at(tmp_path, max_inflight_requests=4) as (node, client):
            await client.create_topic("t")
            waiting = api.encode(api.FetchRequest("t", 0, 0, max_wait_ms=150))

            def pipeline() -> float:
                wire = Wire(node.address)
                started = time.monotonic()
                wire.send_raw(
                    b"".join(
                        _frame(Kind.REQUEST, ApiKey.FETCH, i + 1, waiting, b"") for i in range(24)
                    )
                )
                ids = [wire.frame().correlation_id for _ in range(24)]  # type: ignore[union-attr]
                assert ids == list(range(1, 25))
                wire.close()
                return time.monotonic() - started

            elapsed = await in_thread(pipeline)
            # 24 long-polls of 150 ms, at most 4 at a time: at least 6 rounds.
            assert elapsed >= 0.8, elapsed

    asyncio.run(main())


# -- what a connection may cost ---------------------------------------------------------------


def test_deep_headers_and_bad_frames_close_the_connection_without_a_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with node_at(tmp_path) as (node, client):
            deep = b"[" * 100_000 + b"]" * 100_000

            def attack() -> bool:
                wire = Wire(node.address)
                wire.send_raw(PREFIX.pack(11 + len(deep), 0, ApiKey.METADATA, 1, len(deep)) + deep)
                closed = wire.closed_by_node()
                wire.close()
                return closed

            assert await in_thread(attack)
            await client.create_topic("ok")  # the node serves others

    caplog.set_level("WARNING")
    asyncio.run(main())
    text = caplog.text
    assert "nested too deeply" in text and "Traceback" not in text and "RecursionError" not in text


def test_slow_and_idle_connections_are_closed(tmp_path: Path) -> None:
    async def main() -> None:
        async with node_at(tmp_path, request_receive_timeout_ms=1000, idle_timeout_ms=1500) as (
            node,
            client,
        ):
            await client.create_topic("t")

            def clients() -> dict[str, float]:
                out: dict[str, float] = {}
                loris = Wire(node.address)
                frame = _frame(Kind.REQUEST, ApiKey.METADATA, 1, {}, b"")
                started = time.monotonic()
                for b in frame:  # one byte every 0.3 s: never a whole frame in time
                    try:
                        loris.send_raw(bytes([b]))
                    except OSError:
                        break
                    time.sleep(0.3)
                    if loris.closed_by_node(within_s=0.01):
                        break
                out["slow"] = time.monotonic() - started
                idle = Wire(node.address)
                started = time.monotonic()
                assert idle.closed_by_node(within_s=6)
                out["idle"] = time.monotonic() - started
                return out

            seen = await in_thread(clients)
            assert seen["slow"] < 4, seen
            assert 1.2 < seen["idle"] < 4, seen
            counters = node.core.counters.snapshot()
            assert counters['tidelog_connections_closed_total{listener="client",why="slow"}'] >= 1
            assert counters['tidelog_connections_closed_total{listener="client",why="idle"}'] >= 1

    asyncio.run(main())


def test_slow_and_silent_http_requests_are_closed(tmp_path: Path) -> None:
    """Issue 32: aiohttp waits for a request's head as long as a client trickles it, so slow-loris
    connections to /metrics stayed open past 93 s. Now a head not received within
    request.receive.timeout.ms of its first byte (or of the connection) is closed, and a
    keep-alive connection's second request is timed from its own first byte."""
    (http_port,) = free_ports(1)
    flags = ("--http-listen", f"127.0.0.1:{http_port}")
    with serve(tmp_path, "request.receive.timeout.ms=1500", flags=flags) as (proc, _):
        http = ("127.0.0.1", http_port)
        wait_for("the HTTP listener", lambda: socket.create_connection(http, 1).close() is None)

        def closed_within(sock: socket.socket, seconds: float, trickle: bytes = b"") -> float:
            """Seconds until the node closes sock, trickling a byte of it every 0.25 s."""
            started = time.monotonic()
            sock.settimeout(0.25)
            for i in range(int(seconds / 0.25)):
                if i < len(trickle):
                    try:
                        sock.sendall(trickle[i : i + 1])
                    except OSError:
                        return time.monotonic() - started
                try:
                    if sock.recv(4096) == b"":
                        return time.monotonic() - started
                except TimeoutError:
                    continue
                except OSError:
                    return time.monotonic() - started
            return float("inf")

        head = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200
        assert closed_within(socket.create_connection(http), 6, head) < 3.5
        assert closed_within(socket.create_connection(http), 6) < 3.5  # silent
        # A keep-alive connection: served, idle longer than the timeout, served again.
        with socket.create_connection(http) as sock:
            request = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
            for _ in range(2):
                sock.sendall(request)
                sock.settimeout(10)
                assert sock.recv(64).startswith(b"HTTP/1.1 200"), "served"
                time.sleep(2.0)  # past the timeout, between requests: allowed
                sock.settimeout(0.5)
                with contextlib.suppress(TimeoutError):
                    while sock.recv(65536):  # the rest of the answer
                        pass
        assert proc.poll() is None
    said = (tmp_path / "node.log").read_text()
    assert "http listener closes 127.0.0.1: request not received" in said


def test_a_connection_flood_makes_room_for_a_working_client(tmp_path: Path) -> None:
    async def main() -> None:
        async with node_at(tmp_path, max_connections=50, max_connections_per_ip=40) as (
            node,
            client,
        ):
            await client.create_topic("t")

            def flood() -> list[socket.socket]:
                socks = []
                for _ in range(120):
                    s = socket.create_connection(node.address)
                    socks.append(s)
                return socks

            socks = await in_thread(flood)
            await asyncio.sleep(1.3)  # the flood does nothing: it may be evicted
            fresh = AsyncClient(f"127.0.0.1:{node.address[1]}", retries=5)
            started = time.monotonic()
            result = await fresh.produce("t", [b"through"], partition=0)
            assert result is not None and time.monotonic() - started < 5
            await fresh.close()
            stats = node.client_listener.stats()
            assert stats["peak_connections"] <= 50 and stats["refused"] + stats["evicted"] > 0
            assert len(node.client_listener.connections) <= 40
            for s in socks:
                s.close()

    asyncio.run(main())


# -- real processes -----------------------------------------------------------------------------


def node_status(client: Client, node_id: int, topic: str) -> dict[str, Any]:
    for entry in client.status([topic]):
        if entry["node_id"] == node_id:
            return next(p for p in entry["partitions"] if p["topic"] == topic)
    raise AssertionError(f"node {node_id} did not answer")


def replica_log(client: Client, node_id: int, topic: str) -> list[tuple[int, bytes | None]]:
    out = []
    offset = 0
    while True:
        result = client.fetch(topic, 0, offset, replica_read=True, node_id=node_id)
        out += [(r.offset, r.value) for r in result.records]
        if result.next_offset >= result.high_watermark or result.next_offset == offset:
            return out
        offset = result.next_offset


def test_forged_replication_on_a_real_cluster_changes_nothing(tmp_path: Path) -> None:
    # Elections slow enough that freezing nodes for a second does not start one: any new
    # epoch would be the forged vote's doing.
    slow = ["--set", "election_timeout_ms=4000", "--set", "election_jitter_ms=1000"]
    with (
        LocalCluster(tmp_path, 3, serve_args=slow, log_level="WARNING") as cluster,
        Client(cluster.bootstrap) as client,
    ):
        client.create_topic("t", partitions=1, replication_factor=3)
        for i in range(5):
            client.produce("t", [b"v%d-%d" % (i, j) for j in range(10)], partition=0)
        leader = leader_of(client, "t")
        a, b = (n for n in cluster.node_ids if n != leader)
        before = node_status(client, leader, "t")
        epoch, leo, hw = before["epoch"], before["log_end_offset"], before["high_watermark"]
        secret = cluster.secret_path.read_bytes().strip()

        # The attack of the issue: a leader's fetch answer, from a plain client, injecting a
        # record into a follower while the real leader is paused.
        cluster.freeze(leader)
        try:
            injected = batch_of(b"injected")
            forged = FetchResponse(epoch, leader, leo, hw, 0, last_fetched_epoch=epoch)
            header, payload = replication_frame("t/0", forged, injected)
            wire = Wire(("127.0.0.1", cluster.ports[a]))
            wire.send(Kind.MESSAGE, ApiKey.REPLICATION, header, payload)
            assert wire.closed_by_node()
            wire = Wire(("127.0.0.1", cluster.peer_ports[a]))  # and on its peer port, unbound
            wire.send(Kind.MESSAGE, ApiKey.REPLICATION, header, payload)
            assert wire.closed_by_node()
        finally:
            cluster.resume(leader)

        # Followers frozen, the leader takes acks=1 writes it cannot commit; then an
        # authenticated peer (node a, which knows the secret) claims to be b with all of
        # them fsynced, and asks for b's election.
        cluster.freeze(a)
        cluster.freeze(b)
        try:
            client.produce("t", [b"uncommitted"], partition=0, acks=1)
            session = peer_session(("127.0.0.1", cluster.peer_ports[leader]), secret, a, leader)
            claim = FetchRequest(epoch, b, leo + 1, epoch, hw, 1 << 20, leo + 1)
            session.send(Kind.MESSAGE, ApiKey.REPLICATION, *replication_frame("t/0", claim))
            vote = VoteRequest(epoch + 5, b, epoch, leo + 1, False)
            session.send(Kind.MESSAGE, ApiKey.REPLICATION, *replication_frame("t/0", vote))
            time.sleep(0.5)
            after = node_status(client, leader, "t")
            assert after["high_watermark"] == hw, "a forged durability claim moved the HW"
            assert after["epoch"] == epoch and after["role"] == "leader"
            session.close()
        finally:
            cluster.resume(a)
            cluster.resume(b)

        client.produce("t", [b"after"], partition=0)
        # Up to 30 s for the replicas to agree at 52 records; what they hold is judged below.
        logs: dict[int, list[tuple[int, bytes | None]]] = poll(
            lambda: {n: replica_log(client, n, "t") for n in cluster.node_ids},
            30,
            accept=lambda logs: (
                len({tuple(v) for v in logs.values()}) == 1 and len(logs[leader]) == 52
            ),
            every_s=0.2,
        )
        assert len({tuple(v) for v in logs.values()}) == 1, "the replicas differ"
        values = [v for _, v in logs[leader]]
        assert b"injected" not in values and values[-2:] == [b"uncommitted", b"after"]
        for n in cluster.node_ids:
            assert node_status(client, n, "t")["epoch"] == epoch


def rss_peak_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


@contextlib.contextmanager
def serve(
    tmp_path: Path, *settings: str, nofile: int | None = None, flags: tuple[str, ...] = ()
) -> Iterator[tuple[subprocess.Popen[bytes], tuple[str, int]]]:

    port = free_ports(1)[0]
    log_path = tmp_path / "node.log"

    def limit() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    cmd = [sys.executable, "-m", "tidelog", "serve", "--data", str(tmp_path / "data")]
    cmd += ["--listen", f"127.0.0.1:{port}", "--log-level", "INFO"]
    for setting in settings:
        cmd += ["--set", setting]
    cmd += flags
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, preexec_fn=limit)

    def listening() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        except OSError:
            assert proc.poll() is None, log_path.read_text()
            return False
        return True

    try:
        wait_for("the node to start", listening, 20)
        yield proc, ("127.0.0.1", port)
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def timed_requests(bootstrap: str, seconds: float) -> list[float]:
    """A well-formed client producing and reading while something else goes on."""
    latencies = []
    with Client(bootstrap, retries=5) as client:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            started = time.monotonic()
            client.produce("ok", [b"x" * 100], partition=0)
            client.fetch("ok", 0, 0, max_bytes=4096)
            latencies.append(time.monotonic() - started)
            time.sleep(0.05)
    return latencies


FRAME_DECLARED = 60 * 1024 * 1024
STALLED_BODY = 16 * 1024 * 1024


def test_stalled_frames_and_connection_floods_cost_bounded_memory(tmp_path: Path) -> None:
    """30 connections each declare a 60 MiB frame, send 16 MiB of it and stall (480 MiB if
    the node buffered them all); then 1,500 idle connections. The node's peak RSS stays
    bounded, a well-formed client keeps getting answers, and the stalled ones are closed."""
    with serve(tmp_path, "request.receive.timeout.ms=4000", "max.connections=1000") as (
        proc,
        address,
    ):
        bootstrap = "{}:{}".format(*address)
        with Client(bootstrap) as client:
            client.create_topic("ok")
        baseline_kb = rss_peak_kb(proc.pid)
        body = b"\x00" * STALLED_BODY
        prefix = PREFIX.pack(FRAME_DECLARED, 0, ApiKey.PRODUCE, 1, 2) + b"{}"
        stalled = []

        def stall() -> None:
            s = socket.create_connection(address)
            s.setblocking(False)
            stalled.append(s)
            data = prefix + body
            sent = 0
            deadline = time.monotonic() + 6
            while sent < len(data) and time.monotonic() < deadline:
                try:
                    sent += s.send(data[sent:])
                except BlockingIOError:
                    time.sleep(0.01)  # the node stopped reading us: back-pressure
                except OSError:
                    return

        threads = [threading.Thread(target=stall) for _ in range(30)]
        for t in threads:
            t.start()
        latencies = timed_requests(bootstrap, 5)
        for t in threads:
            t.join()
        stalled_peak_kb = rss_peak_kb(proc.pid)

        flood = []
        for _ in range(1500):
            try:
                flood.append(socket.create_connection(address, timeout=2))
            except OSError:
                break
        time.sleep(1.2)
        latencies += timed_requests(bootstrap, 3)
        flood_peak_kb = rss_peak_kb(proc.pid)
        with Client(bootstrap) as client:
            node = client.status()[0]["node"]["listeners"]["client"]
        for s in flood + stalled:
            s.close()
        assert proc.poll() is None
        growth_mb = (flood_peak_kb - baseline_kb) / 1024
        print(
            f"peak RSS: baseline {baseline_kb / 1024:.0f} MB, stalled frames "
            f"{stalled_peak_kb / 1024:.0f} MB, connection flood {flood_peak_kb / 1024:.0f} MB; "
            f"client p50 {sorted(latencies)[len(latencies) // 2] * 1000:.1f} ms, "
            f"max {max(latencies) * 1000:.0f} ms; listener {json.dumps(node)}"
        )
        assert growth_mb < 160, f"the node grew by {growth_mb:.0f} MB"
        assert max(latencies) < 3.0, max(latencies)
        assert node["peak_connections"] <= 1000
        assert node["receive_budget_peak_bytes"] <= 64 * 1024 * 1024
        assert node["receive_budget_waits"] > 0


def test_exhausted_descriptors_leave_files_and_clients_working(tmp_path: Path) -> None:
    """A node with 400 descriptors: a flood of 600 connections takes only what fd.reserve
    leaves, so the node still creates topics (files) and answers a well-formed client."""
    with serve(tmp_path, "fd.reserve=128", nofile=400) as (proc, address):
        bootstrap = "{}:{}".format(*address)
        flood = []
        for _ in range(600):
            try:
                flood.append(socket.create_connection(address, timeout=2))
            except OSError:
                break
        time.sleep(1.2)
        with Client(bootstrap, retries=10) as client:
            for i in range(5):
                client.create_topic(f"files{i}", partitions=4)
                client.produce(f"files{i}", [b"x"], partition=3)
            listener = client.status()[0]["node"]["listeners"]["client"]
        for s in flood:
            s.close()
        assert proc.poll() is None
        assert listener["descriptors_free"] > 0
        assert listener["refused"] + listener["evicted"] > 0
        text = (tmp_path / "node.log").read_text()
        assert "Too many open files" not in text and "EMFILE" not in text


# -- the budget, slots and held answers, each at its edge ---------------------------------------


class _Waiter:
    """A connection as the budget sees one: open or not, and told when it is granted."""

    def __init__(self) -> None:
        self.open = True
        self.grants: list[int] = []

    def granted(self, size: int) -> None:
        self.grants.append(size)


def test_the_receive_budget_grants_any_frame_and_serves_in_order() -> None:
    from tidelog.node.listeners.base import ReceiveBudget

    budget = ReceiveBudget(1000)
    a, b, c = _Waiter(), _Waiter(), _Waiter()
    # A frame larger than the whole budget is capped to it: it gets the budget, not a wait
    # that no release could ever end.
    assert budget.reserve(a, 5000) == 1000  # type: ignore[arg-type]
    assert budget.reserve(b, 700) == 0  # type: ignore[arg-type]
    assert budget.reserve(c, 200) == 0  # type: ignore[arg-type]  (behind b: arrival order)
    # b leaves while waiting at the head: c is still behind a's reservation...
    budget.forget(b)  # type: ignore[arg-type]
    assert c.grants == []
    budget.release(1000)
    assert c.grants == [200] and budget.used_bytes == 200
    # ...and a head that leaves while there is room lets the next one in at once.
    d, e = _Waiter(), _Waiter()
    assert budget.reserve(d, 900) == 0  # type: ignore[arg-type]
    assert budget.reserve(e, 100) == 0  # type: ignore[arg-type]
    budget.forget(d)  # type: ignore[arg-type]
    assert e.grants == [100] and budget.used_bytes == 300


def test_a_frame_of_the_largest_size_is_served_and_does_not_block_others(tmp_path: Path) -> None:
    """queued.max.request.bytes equal to socket.request.max.bytes: one frame declaring the
    maximum holds the whole budget until it is dropped as slow, then the next is served."""
    from tidelog.config import TopicConfig

    most = 1 << 20
    options = {
        "topic_defaults": TopicConfig(max_message_bytes=256 * 1024),
        "frame_bytes_max": most,
        "queued_max_request_bytes": most,
        "request_receive_timeout_ms": 1000,
    }

    async def main() -> None:
        async with node_at(tmp_path, **options) as (node, client):
            await client.create_topic("t")

            def attack_then_produce() -> tuple[bool, dict[str, Any], float]:
                attacker = Wire(node.address)
                attacker.send_raw(PREFIX.pack(most, 0, ApiKey.METADATA, 1, 2) + b"{}")
                time.sleep(0.2)
                victim = Wire(node.address, timeout_s=10)
                started = time.monotonic()
                answer = victim.request(
                    ApiKey.PRODUCE, api.ProduceRequest("t", 0, 1), batch_of(b"x" * 200_000)
                )
                waited = time.monotonic() - started
                closed = attacker.closed_by_node()
                attacker.close()
                victim.close()
                return closed, answer.header, waited

            closed, header, waited = await in_thread(attack_then_produce)
            assert closed and api.error_of(header) is None, header
            assert waited < 5, waited
            assert node.hosts["t/0"].log.log_end_offset == 1
            await asyncio.sleep(0.1)
            assert node.client_listener.budget.used_bytes == 0

    asyncio.run(main())


def test_answers_queued_behind_a_long_poll_count_toward_in_flight(tmp_path: Path) -> None:
    """A long-poll, then 5,000 status requests pipelined behind it: the node reads no more
    than max.inflight.requests.per.connection of them while the long-poll waits."""

    async def main() -> None:
        async with node_at(tmp_path, max_inflight_requests=8) as (node, client):
            await client.create_topic("t", partitions=4)
            poll = api.encode(api.FetchRequest("t", 0, 0, max_wait_ms=1500))
            status = _frame(Kind.REQUEST, ApiKey.STATUS, 2, api.encode(api.StatusRequest()), b"")

            def attack() -> socket.socket:
                s = socket.create_connection(node.address)
                s.setblocking(False)
                blob = _frame(Kind.REQUEST, ApiKey.FETCH, 1, poll, b"") + status * 5000
                with contextlib.suppress(BlockingIOError):
                    s.send(blob)  # as much as the socket takes: the rest is not needed
                return s

            s = await in_thread(attack)
            await asyncio.sleep(0.7)
            held = [len(c._slots) for c in node.client_listener.connections]  # type: ignore[attr-defined]
            s.close()
            assert max(held) == 8, held

    asyncio.run(main())


def test_a_client_that_stops_reading_its_answers_is_closed(tmp_path: Path) -> None:
    """Answers it never reads back up into the node; after request.receive.timeout.ms of that
    the connection is closed ("not reading") and whatever it reserved is released."""

    async def main() -> None:
        async with node_at(tmp_path, request_receive_timeout_ms=1000, idle_timeout_ms=60_000) as (
            node,
            client,
        ):
            await client.create_topic("t", partitions=8)
            status = _frame(Kind.REQUEST, ApiKey.STATUS, 1, api.encode(api.StatusRequest()), b"")

            def attack() -> socket.socket:
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.connect(node.address)
                s.setblocking(False)
                blob = memoryview(status * 20_000)
                deadline = time.monotonic() + 4
                while blob and time.monotonic() < deadline:
                    try:
                        blob = blob[s.send(blob) :]
                    except BlockingIOError:
                        time.sleep(0.01)
                    except OSError:
                        break
                return s

            s = await in_thread(attack)
            labels = {"listener": "client", "why": "not reading"}
            counter = "tidelog_connections_closed_total"
            for _ in range(100):
                if node.core.counters.get(counter, **labels):
                    break
                await asyncio.sleep(0.1)
            s.close()
            assert node.core.counters.get(counter, **labels) == 1
            await asyncio.sleep(DROP_GRACE)
            assert len(node.client_listener.connections) == 1  # the test's own client
            assert node.client_listener.budget.used_bytes == 0

    asyncio.run(main())


DROP_GRACE = 1.2


def test_a_topic_whose_batches_could_not_fit_a_frame_is_refused(tmp_path: Path) -> None:
    from tidelog.errors import InvalidConfig

    async def main() -> None:
        async with node_at(tmp_path, frame_bytes_max=16 << 20) as (_node, client):
            with pytest.raises(InvalidConfig, match="does not fit this node's frames"):
                await client.create_topic("t", configs={"max.message.bytes": str(16 << 20)})
            await client.create_topic("t", configs={"max.message.bytes": str(15 << 20)})

    asyncio.run(main())


# -- peers: one bound connection per node, proofs of any shape, hints only from the leader -------


def test_a_peer_that_reconnects_replaces_its_older_connection(tmp_path: Path) -> None:
    async def main() -> None:
        async with member_node(tmp_path) as node:

            def reconnect() -> tuple[bool, bool]:
                first = peer_session(node.peer_address, SECRET, 2, 1)
                second = peer_session(node.peer_address, SECRET, 2, 1)
                replaced = first.closed_by_node(within_s=3)
                kept = not second.closed_by_node(within_s=0.5)
                first.close()
                second.close()
                return replaced, kept

            assert await in_thread(reconnect) == (True, True)

    asyncio.run(main())


def test_a_proof_that_is_not_hex_is_refused_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with member_node(tmp_path) as node:

            def attack() -> bool:
                wire = Wire(node.peer_address)
                dialer = DialerHandshake(b"guess", 2, 1)
                wire.request(ApiKey.PEER_HELLO, dialer.hello())
                wire.send(Kind.REQUEST, ApiKey.PEER_AUTH, api.encode(PeerAuth("\u00e9" * 64)))
                return wire.closed_by_node()

            assert await in_thread(attack)
            await asyncio.sleep(0.1)
            assert node.core.counters.get("tidelog_peer_handshakes_failed_total") == 1

    caplog.set_level("WARNING")
    asyncio.run(main())
    assert "Traceback" not in caplog.text


def test_a_leader_is_learned_only_from_the_leader_itself() -> None:
    """A voter's higher epoch is real (it moves everyone on), but its word on who leads it is
    hearsay: only the leader's own messages name a leader."""
    from tidelog.replication.messages import FETCH_NOT_LEADER, EpochNotice

    replica = Replica(ReplicaConfig(1, (1, 2, 3)), MemoryLog(), QuorumState(), random.Random(1))
    replica.campaign(pre_vote=False)
    replica.step(2, VoteResponse(1, 2, True, False))
    assert replica.is_leader
    replica.step(3, FetchResponse(9, 2, 0, 0, 0, error=FETCH_NOT_LEADER))
    assert replica.epoch == 9 and not replica.is_leader and replica.leader_id != 2
    replica.step(3, EpochNotice(20, 3, 2))
    assert replica.epoch == 20 and replica.leader_id != 2
    replica.step(2, EpochNotice(21, 2, 2))  # the leader, about itself
    assert replica.epoch == 21 and replica.leader_id == 2


def test_a_replay_of_an_older_batch_is_answered_with_its_own_offsets() -> None:
    from tidelog.record.batch import BatchHeader
    from tidelog.storage.producer_state import ProducerState

    state = ProducerState()
    headers = []
    for i in range(6):
        header = BatchHeader(10 * i, 61, 0, 2, 0, 0, 0, 1_000, 1_000, 7, 0, i, 1)
        state.record(header)
        headers.append(header)
    for i in range(1, 6):
        entry = state.is_duplicate(headers[i])
        assert entry is not None and entry.base_offset == 10 * i
    # Older than what is kept: still a replay (never appended twice), answered with the newest.
    oldest = state.is_duplicate(headers[0])
    assert oldest is not None and oldest.base_offset == 50


def test_what_a_node_writes_is_its_own(tmp_path: Path) -> None:
    """Data, metadata (token hashes included) and snapshots were 0644 in 0755 directories:
    a node makes every file 0600 and every directory 0700."""
    with serve(tmp_path) as (_proc, address), Client("{}:{}".format(*address)) as client:
        client.create_topic("private", partitions=1)
        client.produce("private", [b"secret"], partition=0)
    made = [p for p in (tmp_path / "data").rglob("*")]
    assert len(made) > 5
    loose = [(str(p), oct(p.stat().st_mode & 0o777)) for p in made if p.stat().st_mode & 0o077]
    assert not loose, loose


def test_nodes_of_a_cluster_without_a_secret_refuse_to_start_and_say_what_to_add(
    tmp_path: Path,
) -> None:
    """Issue 32: three nodes started as the README shows but without --cluster-secret-file
    each formatted a cluster id of their own and refused each other forever; `topics create`
    answered NotLeader until the user gave up. Now such a node refuses to start and names the
    flag; with the secret, or the same --cluster-id, the same command works."""
    from helpers import run_tidelog

    ports = free_ports(3)
    peers = ",".join(f"{i + 1}=127.0.0.1:{p}" for i, p in enumerate(ports))
    serve = ["serve", "--node-id", "1", "--listen", f"127.0.0.1:{ports[0]}", "--peers", peers]
    refused = run_tidelog(*serve, "--data", str(tmp_path / "n1"))
    assert refused.returncode != 0
    assert "InvalidConfig" in refused.stderr and "--cluster-secret-file" in refused.stderr
    assert "token_hex" in refused.stderr  # how to make one
    assert not (tmp_path / "n1" / "meta.properties").exists()  # nothing formatted
