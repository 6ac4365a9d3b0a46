"""Small helpers shared by tests."""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tidelog.record import ProducerRecord, build_batch, decode_records, iter_headers


def batch_of(*values: bytes, ts: int | None = 1_000, key: bytes | None = None) -> bytes:
    return build_batch([ProducerRecord(key, v, (), ts) for v in values])


def values_in(data: bytes) -> list[tuple[int, bytes | None]]:
    out = []
    for pos, header in iter_headers(data):
        if header.is_control:
            continue
        out.extend((r.offset, r.value) for r in decode_records(data, pos))
    return out


def run_tidelog(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """The CLI in a process of its own, as a user runs it: (returncode, stdout, stderr)."""
    return subprocess.run(
        [sys.executable, "-m", "tidelog", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


# -- waiting: the deadline loops of every test -----------------------------------------------
# A test waits for something it cannot be told about (a process, a replica, a file) by asking
# again until a deadline. These are the deadline loops of tests/ (test_tidy.py checks that no
# other file has one, but for loads and soaks that run for a time on purpose): each wait is one
# call that says what it waits for, and fails saying so.

Errors = tuple[type[BaseException], ...]


def _asked_until(
    probe: Callable[[], Any],
    accept: Callable[[Any], object],
    timeout_s: float,
    every_s: float,
    tolerating: Errors,
) -> tuple[bool, Any, BaseException | None]:
    """(accepted, the last value, the last tolerated error): probe() asked every every_s until
    accept() takes its value or an ask ends after timeout_s. An error in tolerating counts as
    "not yet"."""
    deadline = time.monotonic() + timeout_s
    while True:
        value, error = None, None
        try:
            value = probe()
        except tolerating as exc:
            error = exc
        else:
            if accept(value):
                return True, value, None
        if time.monotonic() >= deadline:
            return False, value, error
        time.sleep(every_s)


def wait_for(
    what: str,
    check: Callable[[], Any],
    timeout_s: float = 30.0,
    *,
    every_s: float = 0.05,
    tolerating: Errors = (),
) -> Any:
    """check()'s first truthy value, asked every every_s; fails after timeout_s naming what.
    An error in tolerating is "not yet" (the failure names the last one as its cause)."""
    done, value, error = _asked_until(check, bool, timeout_s, every_s, tolerating)
    if not done:
        raise AssertionError(f"timed out waiting for {what}") from error
    return value


def wait_for_value(
    what: str,
    probe: Callable[[], Any],
    accept: Callable[[Any], object],
    timeout_s: float = 30.0,
    *,
    every_s: float = 0.05,
    tolerating: Errors = (),
) -> Any:
    """probe()'s first value that accept() takes, asked every every_s; fails after timeout_s
    naming what and the last value probed (what the test saw instead)."""
    done, value, error = _asked_until(probe, accept, timeout_s, every_s, tolerating)
    if not done:
        raise AssertionError(f"timed out waiting for {what}; the last value: {value!r}") from error
    return value


def retry(
    what: str,
    attempt: Callable[[], Any],
    timeout_s: float = 30.0,
    *,
    every_s: float = 0.05,
    tolerating: Errors,
) -> Any:
    """attempt()'s result, once it stops raising an error in tolerating (asked every every_s);
    fails after timeout_s naming what, from the last error."""
    done, value, error = _asked_until(attempt, lambda _: True, timeout_s, every_s, tolerating)
    if not done:
        raise AssertionError(f"timed out waiting for {what}") from error
    return value


def poll(
    probe: Callable[[], Any],
    timeout_s: float,
    *,
    accept: Callable[[Any], object] = bool,
    every_s: float = 0.05,
) -> Any:
    """probe()'s first value that accept() takes (by default, its first truthy value), asked
    every every_s, or its last value once timeout_s is up: for a caller to whom "not within
    the time" is an answer, or who judges what it got by a check of its own."""
    return _asked_until(probe, accept, timeout_s, every_s, ())[1]


async def wait_for_async(
    what: str,
    check: Callable[[], Any],
    timeout_s: float = 30.0,
    *,
    every_s: float = 0.05,
) -> Any:
    """wait_for on an event loop: check() may return an awaitable (an async def's call), and
    the loop runs on between asks."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(every_s)


# -- a node's /metrics, parsed with Prometheus's own parser ----------------------------------


def scrape(url: str) -> dict[str, list[Sample]]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as answer:
        assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = answer.read().decode()
    families: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(text):
        assert family.name not in families, f"{family.name} twice"
        families[family.name] = list(family.samples)
    return families


def value(families: dict[str, list[Sample]], name: str, **labels: str) -> float:
    family = name.removesuffix("_total").removesuffix("_bucket").removesuffix("_count")
    found = [
        s.value
        for s in families.get(family, families.get(name, []))
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) == 1, f"{name} {labels}: {found}"
    return found[0]


def kafka_partitions(admin: Any, topic: str, partitions: int, timeout_s: float = 30.0) -> Any:
    """A topic's partitions as Kafka's Metadata (confluent-kafka's AdminClient.list_topics)
    describes them, once each has a leader. A node that has not applied the topic's creation, or
    whose replica has not heard from a new leader, answers without them (UNKNOWN_TOPIC_OR_PARTITION,
    LEADER_NOT_AVAILABLE), and a Kafka client asks again; so does this."""
    from confluent_kafka import KafkaException

    return wait_for_value(
        f"{partitions} partitions of {topic} with leaders in Kafka's Metadata",
        lambda: admin.list_topics(topic, timeout=10).topics[topic].partitions,
        lambda found: len(found) == partitions and all(p.leader >= 0 for p in found.values()),
        timeout_s,
        every_s=0.1,
        tolerating=(KafkaException, KeyError),
    )


def kafka_topic_config(admin: Any, topic: str, name: str, wanted: str) -> None:
    """Wait until Kafka's DescribeConfigs says the topic's setting is `wanted`: a client may ask a
    node that has not applied the AlterConfigs yet (Kafka's brokers lag the same way)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import ConfigResource

    def described() -> str:
        found = admin.describe_configs([ConfigResource("topic", topic)])
        return str(next(iter(found.values())).result(30)[name].value)

    wait_for_value(
        f"{topic}'s {name} to be {wanted} in DescribeConfigs",
        described,
        wanted.__eq__,
        30,
        every_s=0.1,
        tolerating=(KafkaException,),
    )


def topic_at_metadata_leader(client: Any, name: str) -> Any:
    """A topic's assignments and moves as the metadata leader has them (a sync Client's
    TopicInfo): read-your-writes after a move or a node's removal, which another node may not
    have applied yet. (Its partition leaders are only those the metadata leader hosts.)"""
    client.refresh_metadata([name], at_metadata_leader=True)
    return client.topic(name)
