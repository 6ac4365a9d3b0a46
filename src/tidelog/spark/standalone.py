"""Spark beyond one process, on one machine, from pyspark's own launchers: a standalone cluster
(a master and workers, each its own JVM, executors started by the workers in JVMs of their own)
and a Spark Connect server. What the tests and `tidelog demo --spark-master` use to show that the
tidelog source and sink share nothing with the driver but the network: no process, no working
directory, no temporary files.

Every process is started with its own working directory under `work`, bound to 127.0.0.1, and
stopped by PID (its process group) when the context exits."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tidelog.errors import TidelogError


class SparkLaunchError(TidelogError):
    """A Spark master, worker or Connect server did not come up."""


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _environment(work: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        SPARK_HOME=str(spark_home()),
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOCAL_DIRS=str(work / "local"),
        SPARK_LOG_DIR=str(work / "logs"),
        SPARK_WORKER_DIR=str(work / "worker-dirs"),
        SPARK_NO_DAEMONIZE="1",
    )
    return env


@dataclass
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path


@dataclass
class SparkProcesses:
    work: Path
    env: dict[str, str] = field(default_factory=dict)
    processes: list[_Process] = field(default_factory=list)

    def start(self, name: str, args: list[str]) -> _Process:
        directory = self.work / name
        directory.mkdir(parents=True, exist_ok=True)
        log = directory / "out.log"
        with open(log, "wb") as out:
            popen = subprocess.Popen(
                args,
                cwd=directory,
                env={**_environment(self.work), **self.env},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stopped with everything it spawned
            )
        process = _Process(name, popen, log)
        self.processes.append(process)
        return process

    def wait_for(self, process: _Process, text: str, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if text in process.log.read_text(errors="replace"):
                return
            if process.popen.poll() is not None:
                break
            time.sleep(0.2)
        tail = process.log.read_text(errors="replace")[-3000:]
        raise SparkLaunchError(f"{process.name} did not report {text!r}:\n{tail}")

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.popen.poll() is None:
                try:
                    os.killpg(process.popen.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        for process in reversed(self.processes):
            try:
                process.popen.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(process.popen.pid, signal.SIGKILL)
                process.popen.wait(5)
        self.processes.clear()


def _spark_class(*args: str) -> list[str]:
    return [str(spark_home() / "bin" / "spark-class"), *args]


@contextmanager
def standalone_cluster(
    work: Path, workers: int = 2, cores_per_worker: int = 1, memory: str = "1g"
) -> Iterator[str]:
    """A master and `workers` workers (separate JVMs); yields the master URL spark://..."""
    procs = SparkProcesses(work)
    try:
        port = _free_port()
        master = procs.start(
            "master",
            _spark_class(
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(_free_port()),
            ),
        )
        url = f"spark://127.0.0.1:{port}"
        procs.wait_for(master, "I have been elected leader")
        for i in range(workers):
            worker = procs.start(
                f"worker-{i + 1}",
                _spark_class(
                    "org.apache.spark.deploy.worker.Worker",
                    url,
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    str(cores_per_worker),
                    "--memory",
                    memory,
                    "--webui-port",
                    str(_free_port()),
                    "--work-dir",
                    str(work / f"worker-{i + 1}" / "apps"),
                ),
            )
            procs.wait_for(worker, "Successfully registered with master")
        yield url
    finally:
        procs.stop()


@contextmanager
def connect_server(
    work: Path, master: str = "local[2]", env: dict[str, str] | None = None
) -> Iterator[str]:
    """pyspark's Spark Connect server (its own JVM, its own Python workers); yields sc://...
    `env` is added to the server's environment (and so its Python workers')."""
    procs = SparkProcesses(work, env or {})
    try:
        port = _free_port()
        server = procs.start(
            "connect-server",
            [
                str(spark_home() / "bin" / "spark-submit"),
                "--class",
                "org.apache.spark.sql.connect.service.SparkConnectServer",
                "--name",
                "tidelog-connect",
                "--master",
                master,
                "--conf",
                f"spark.connect.grpc.binding.port={port}",
                "--conf",
                "spark.connect.grpc.binding.address=127.0.0.1",
                "--conf",
                "spark.driver.host=127.0.0.1",
                "--conf",
                "spark.ui.enabled=false",
                "--conf",
                f"spark.pyspark.python={sys.executable}",
                "--conf",
                "spark.sql.shuffle.partitions=4",
                "--conf",
                "spark.sql.session.timeZone=UTC",
                "spark-internal",
            ],
        )
        procs.wait_for(server, "Spark Connect server started", timeout_s=120)
        yield f"sc://127.0.0.1:{port}"
    finally:
        procs.stop()
