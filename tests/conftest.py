from __future__ import annotations

import os
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
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


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
