"""Small helpers shared by tests."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
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


def wait_for(what: str, check: Any, timeout_s: float = 30.0) -> Any:
    """check()'s first truthy value, asked every 50 ms; fails after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


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
