from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

settings.register_profile(
    "ci",
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

# `make quick` (TIDELOG_QUICK=1): the in-process tier. A test it runs that starts a process or
# opens a network socket fails, so that the tiers stay what pyproject.toml's markers say.
QUICK = os.environ.get("TIDELOG_QUICK") == "1"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules that start Spark first, each module's tests kept together and in their
    order. `make test` runs the process tests two at a time, a module to a worker (pytest-xdist's
    loadscope): these are the long ones (a JVM or several each), and one of them handed out
    last would keep a worker busy alone while the other has nothing left to take."""
    spark_modules = {i.nodeid.split("::")[0] for i in items if i.get_closest_marker("spark")}
    items.sort(key=lambda i: i.nodeid.split("::")[0] not in spark_modules)  # (a stable sort)


@pytest.fixture(autouse=True)
def _quick_tier_stays_in_process(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not QUICK or request.node.get_closest_marker("process") is not None:
        return

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(
            f"{request.node.nodeid} starts a process or opens a socket: mark it "
            "@pytest.mark.process (tiers: pyproject.toml's markers)"
        )

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "bind", refuse)


@pytest.fixture(scope="session")
def spark_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One local Spark for every test that needs one in-process (a JVM takes ~10 s to start):
    2 threads, 2 attempts per task; its scratch files in pytest's temp directory, not /tmp."""
    pytest.importorskip("pyspark")
    from tidelog.spark.session import local_spark

    session = local_spark(
        "tidelog-tests", master="local[2,2]", local_dir=tmp_path_factory.mktemp("spark-local")
    )
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _formats_written_at_the_default_level() -> Iterator[None]:
    """A node in this process raises the formats' write level to its cluster's finalized feature
    level (one per process, as a node is one: tidelog/formats.py); the next test starts at 1."""
    yield
    from tidelog import formats

    formats.set_write_level(formats.LEVEL_MIN)
