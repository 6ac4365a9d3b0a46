"""TLS on every listener (issue 14, first part): `tidelog dev-certs`, a 3-node cluster whose
nodes replicate over mutual TLS, the Python client, the CLI and a Kafka client over TLS, and
the named errors for a client that does not speak TLS, does not trust the node, or has no
certificate where one is required."""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers import run_tidelog, wait_for, wait_for_value
from tidelog.cli.cluster import LocalCluster
from tidelog.client.sync_client import Client
from tidelog.errors import AuthenticationFailed, InvalidConfig, TidelogError
from tidelog.record import ProducerRecord
from tidelog.tls import TlsFiles

pytestmark = pytest.mark.process  # tiers: pyproject.toml's markers


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("certs")
    done = run_tidelog("dev-certs", str(where), "--client", "alice")
    assert done.returncode == 0, done.stderr
    for name in ("ca.pem", "ca.key", "node.pem", "node.key", "client-alice.pem"):
        assert (where / name).is_file(), name
    assert oct((where / "node.key").stat().st_mode & 0o777) == "0o600"
    return where


def serve_args(certs: Path, client_auth: str = "none") -> list[str]:
    return [
        "--tls-cert",
        str(certs / "node.pem"),
        "--tls-key",
        str(certs / "node.key"),
        "--tls-ca",
        str(certs / "ca.pem"),
        "--tls-client-auth",
        client_auth,
    ]


@pytest.fixture(scope="module")
def cluster(certs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(
        tmp_path_factory.mktemp("tls-cluster"),
        3,
        serve_args=serve_args(certs),
        log_level="WARNING",
        kafka=True,
        http=True,
    ) as c:
        yield c


def test_a_cluster_replicates_over_mutual_tls_and_clients_verify_it(
    cluster: LocalCluster, certs: Path, tmp_path: Path
) -> None:
    tls = TlsFiles.of(ca=certs / "ca.pem")
    with Client(cluster.bootstrap, tls=tls) as client:
        client.create_topic("secure", partitions=1, replication_factor=3)
        for i in range(10):
            client.produce("secure", [ProducerRecord(b"k", b"v%d" % i)], partition=0, acks="all")
        got = [r.value for r in client.consume("secure", 0, "earliest")]
        assert got == [b"v%d" % i for i in range(10)]
        # acks=all needed a second replica: the peers replicated over their mutual-TLS channel.
        status = client.status(["secure"])
        assert status, status

    # Plain TCP to a TLS listener: refused, nothing written.
    plain = Client(cluster.bootstrap, retries=1, request_timeout_ms=3000)
    with plain, pytest.raises(TidelogError):
        plain.produce("secure", [b"plain"], partition=0, acks="all")
    # A CA that did not sign the node's certificate: AuthenticationFailed, by name.
    other = tmp_path / "other"
    assert run_tidelog("dev-certs", str(other)).returncode == 0
    stranger = Client(cluster.bootstrap, retries=1, tls=TlsFiles.of(ca=other / "ca.pem"))
    with stranger, pytest.raises(AuthenticationFailed, match="does not verify"):
        stranger.produce("secure", [b"stranger"], partition=0, acks="all")
    with Client(cluster.bootstrap, tls=tls) as client:
        assert client.list_offsets("secure", 0) == 10

    # The CLI, with the CA from its options (or TIDELOG_TLS_CA).
    base = ["--bootstrap", cluster.bootstrap, "--tls-ca", str(certs / "ca.pem")]
    done = run_tidelog("produce", "secure", "--partition", "0", *base, stdin="cli-1\ncli-2\n")
    assert done.returncode == 0, done.stderr
    done = run_tidelog("consume", "secure", "--from", "earliest", "--format", "json", *base)
    assert done.returncode == 0, done.stderr
    values = [json.loads(line)["value"] for line in done.stdout.splitlines() if line.strip()]
    assert values[-2:] == ["cli-1", "cli-2"], values
    refused = run_tidelog(
        "status", "--bootstrap", cluster.bootstrap, "--tls-ca", str(other / "ca.pem")
    )
    assert refused.returncode != 0 and "AuthenticationFailed" in refused.stderr


def test_kafka_clients_speak_tls_to_the_kafka_port(cluster: LocalCluster, certs: Path) -> None:
    kafka = pytest.importorskip("kafka")
    options = {
        "bootstrap_servers": cluster.kafka_bootstrap,
        "security_protocol": "SSL",
        "ssl_cafile": str(certs / "ca.pem"),
        "ssl_check_hostname": True,
    }
    producer = kafka.KafkaProducer(acks="all", **options)
    for i in range(5):
        producer.send("via-kafka-tls", key=b"k", value=b"kafka-%d" % i).get(timeout=30)
    producer.close()
    consumer = kafka.KafkaConsumer(
        "via-kafka-tls", auto_offset_reset="earliest", consumer_timeout_ms=5000, **options
    )
    got = [m.value for m in consumer]
    consumer.close()
    assert got == [b"kafka-%d" % i for i in range(5)]

    # confluent-kafka (librdkafka) verifies the node's certificate and host name the same way.
    confluent = pytest.importorskip("confluent_kafka")
    tls_config = {
        "bootstrap.servers": cluster.kafka_bootstrap,
        "security.protocol": "SSL",
        "ssl.ca.location": str(certs / "ca.pem"),
    }
    producer = confluent.Producer({**tls_config, "enable.idempotence": True})
    for i in range(5):
        producer.produce("via-kafka-tls", key=b"c", value=b"confluent-%d" % i)
    assert producer.flush(30) == 0
    reader = confluent.Consumer(
        {**tls_config, "group.id": "tls-group", "auto.offset.reset": "earliest"}
    )
    reader.subscribe(["via-kafka-tls"])
    seen: list[bytes] = []

    def read_on() -> bool:
        m = reader.poll(0.5)
        if m is not None and m.error() is None:
            seen.append(m.value())
        return len(seen) >= 10

    try:
        wait_for("10 records through the TLS Kafka port", read_on, 60, every_s=0)
    finally:
        reader.close()
    assert seen == got + [b"confluent-%d" % i for i in range(5)]


def test_a_listener_that_requires_client_certificates(certs: Path, tmp_path: Path) -> None:
    with LocalCluster(
        tmp_path / "node", 1, serve_args=serve_args(certs, "required"), log_level="WARNING"
    ) as one:
        ca = certs / "ca.pem"
        anonymous = Client(one.bootstrap, retries=1, tls=TlsFiles.of(ca=ca))
        with anonymous, pytest.raises(AuthenticationFailed):
            anonymous.create_topic("t", replication_factor=1)
        alice = TlsFiles.of(ca, certs / "client-alice.pem", certs / "client-alice.key")
        with Client(one.bootstrap, tls=alice) as client:
            client.create_topic("t", replication_factor=1)
            client.produce("t", [b"from alice"], partition=0)
            assert [r.value for r in client.consume("t", 0)] == [b"from alice"]


def test_tls_settings_are_checked_by_name(certs: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidConfig) as caught:
        TlsFiles.of(cert=certs / "node.pem")
    assert caught.value.details["key"] == "tls.key"
    with pytest.raises(InvalidConfig) as caught:
        TlsFiles.of(ca=tmp_path / "missing.pem")
    assert caught.value.details["key"] == "tls.ca"
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    with pytest.raises(InvalidConfig):
        TlsFiles.of(garbage, certs / "node.pem", certs / "node.key").server_context("required")
    with pytest.raises(InvalidConfig, match=r"tls\.client\.auth"):
        TlsFiles.of(cert=certs / "node.pem", key=certs / "node.key").server_context("required")
    done = run_tidelog(
        "serve", "--data", str(tmp_path / "d"), "--listen", "127.0.0.1:0", "--tls-client-auth",
        "required",
    )  # fmt: skip
    assert done.returncode != 0 and "tls.client.auth" in done.stderr


@pytest.mark.spark
def test_the_spark_source_and_sink_over_tls(
    cluster: LocalCluster, certs: Path, spark_session: Any
) -> None:
    tls = TlsFiles.of(ca=certs / "ca.pem")
    with Client(cluster.bootstrap, tls=tls) as client:
        client.create_topic("spark-in", partitions=2, replication_factor=3)
        client.create_topic("spark-out", partitions=2, replication_factor=3)
        for p in range(2):
            client.produce("spark-in", [b"in-%d-%d" % (p, i) for i in range(50)], partition=p)
    spark = spark_session
    options = {"bootstrap": cluster.bootstrap, "tls.ca": str(certs / "ca.pem")}
    df = spark.read.format("tidelog").options(subscribe="spark-in", **options).load()
    assert df.count() == 100
    df.select("key", "value").write.format("tidelog").options(topic="spark-out", **options).mode(
        "append"
    ).save()
    with Client(cluster.bootstrap, tls=tls) as client:
        copied = sorted(r.value for p in range(2) for r in client.consume("spark-out", p))
        assert copied == sorted(b"in-%d-%d" % (p, i) for p in range(2) for i in range(50))


def test_metrics_and_the_console_are_served_over_tls(cluster: LocalCluster, certs: Path) -> None:
    context = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    url = cluster.http_url(1)
    assert url.startswith("https://")
    with urllib.request.urlopen(url + "/metrics", context=context, timeout=10) as answer:
        names = {f.name for f in text_string_to_metric_families(answer.read().decode())}
    assert "tidelog_partition_high_watermark" in names
    with urllib.request.urlopen(url + "/", context=context, timeout=10) as answer:
        assert b"tidelog" in answer.read()
    # Plain HTTP to the TLS listener, and a client that does not trust its CA: refused.
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(url.replace("https", "http") + "/metrics", timeout=10).read()
    with pytest.raises(urllib.error.URLError) as info:
        urllib.request.urlopen(url + "/metrics", context=ssl.create_default_context(), timeout=10)
    assert "CERTIFICATE_VERIFY_FAILED" in str(info.value)


@pytest.mark.timed  # a client served within 10 s of the flood
def test_silent_tls_handshakes_count_against_the_limits_and_time_out(
    certs: Path, tmp_path: Path
) -> None:
    """Issue 32: connections still in their TLS handshake escaped max.connections, the
    per-address limit and fd.reserve (asyncio's TLS server hands a connection over only once
    its handshake is done): 1,000 silent ones locked clients out. Now a connection is admitted
    from its first byte and starts TLS itself: 120 silent sockets from one address hold at most
    max.connections.per.ip places, a TLS client still gets in, and handshakes not done within
    request.receive.timeout.ms are closed."""
    import socket

    from test_trust import serve
    from tidelog.cli.cluster import free_ports

    settings = ("max.connections.per.ip=40", "request.receive.timeout.ms=2000")
    (http_port,) = free_ports(1)
    flags = (*serve_args(certs), "--http-listen", f"127.0.0.1:{http_port}")
    with serve(tmp_path, *settings, flags=flags) as (proc, address):
        silent = [socket.create_connection(address) for _ in range(120)]
        # The HTTPS listener too: its silent handshakes are held to the same limits.
        silent += [socket.create_connection(("127.0.0.1", http_port)) for _ in range(60)]
        time.sleep(1.3)  # they do nothing: they may make room
        started = time.monotonic()
        with Client("{}:{}".format(*address), tls=TlsFiles.of(ca=certs / "ca.pem")) as client:
            client.create_topic("through", partitions=1)
            client.produce("through", [ProducerRecord(None, b"x")], partition=0)
        assert time.monotonic() - started < 10
        context = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        with urllib.request.urlopen(
            f"https://127.0.0.1:{http_port}/metrics", timeout=10, context=context
        ) as page:
            assert page.status == 200  # 40 of the 60 silent ones held places: one made room

        def how_many_open() -> int:
            still = 0
            for s in silent:
                s.setblocking(False)
                try:
                    still += s.recv(1) != b""
                except BlockingIOError:
                    still += 1  # nothing yet: still open
                except OSError:
                    pass  # reset: closed by the node
            return still

        wait_for_value(
            "the node to close every silent handshake (the value: how many are open)",
            how_many_open,
            lambda still: still == 0,
            10,
            every_s=0.5,
        )
        assert proc.poll() is None
    for s in silent:
        s.close()
    said = (tmp_path / "node.log").read_text()
    assert "max.connections.per.ip=40" in said or "to make room" in said
    assert "TLS handshake not done" in said
    assert "http listener closes 127.0.0.1 (still in its TLS handshake) to make room" in said
    assert "http listener closes 127.0.0.1: TLS handshake not done" in said
