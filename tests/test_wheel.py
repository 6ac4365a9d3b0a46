"""The release as a user gets it: an sdist and a wheel built from this checkout, the wheel
installed into a fresh virtual environment outside the checkout, and tidelog run from there.

How, and why so:
- `python -m build` makes the sdist, then the wheel from that sdist, as `make dist` does: the
  wheel carries the compiled record codecs and the commit the sdist baked in. Then, as `make
  dist` does, tests/portable_wheel.py retags it manylinux (auditwheel), which pip installs on
  other Linux machines than this one.
- The fresh environment is `python -m venv --without-pip` in a temporary directory of its own
  (not under the checkout), and the repo's own pinned pip installs into it (`pip --python`): a
  fresh environment needs no pip of its own to be one, and ensurepip cost seconds here.
- `pip install <wheel>[spark]` resolves the wheel's dependencies from the package index as a
  user's install does, pinned by the wheel's own metadata. Nothing is shared with the repo's
  environment; `--no-compile` only skips byte-compiling every installed module ahead of time
  (pyspark, pandas and pyarrow hold thousands; Python compiles what it imports anyway), which
  halved the install.
- Every command then runs with the fresh environment's interpreter or its `tidelog` script, from
  a directory that is not the checkout and without PYTHONPATH, and checks that the tidelog it ran
  is the installed one.
Measured on a shared 2-core machine: 67-72 s in all with a load average of 1 to 2 (the build and
the install 31 s, the Spark read 28 s, cluster up 4 s), and 130-200 s while other work kept the
load average at 5 to 8."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from portable_wheel import make_portable
from releases import VirtualEnv
from test_cli import ports_free
from tidelog.version import __version__, checkout_commit

pytestmark = pytest.mark.process  # tiers: pyproject.toml's markers

ROOT = Path(__file__).resolve().parent.parent
CODECS = ("tidelog/record/_codec.", "tidelog/record/_scan.")
VALUES = [f"record-{i}" for i in range(20)]

CLIENT_CHECK = """
import json, sys
from tidelog import Client
import tidelog
from tidelog.record.batch import COMPILED_CODEC
from tidelog.record.validation import COMPILED_SCANNER

with Client(sys.argv[1]) as client:
    client.create_topic("wheel", partitions=1)
    client.produce("wheel", [b"record-%d" % i for i in range(20)], partition=0)
    values = [r.value.decode() for r in client.consume("wheel", 0, "earliest")]
print(json.dumps({
    "package": tidelog.__file__,
    "codec": getattr(COMPILED_CODEC, "__file__", None),
    "scanner": COMPILED_SCANNER is not None,
    "values": values,
}))
"""

SPARK_CHECK = """
import json, sys
from pathlib import Path
from tidelog.spark.session import local_spark

spark = local_spark("tidelog-wheel", master="local[1]", local_dir=Path(sys.argv[2]))
frame = spark.read.format("tidelog").option("bootstrap", sys.argv[1]).option(
    "subscribe", "wheel"
).load()
rows = frame.select("offset", "value").collect()
print(json.dumps(sorted([r["offset"], bytes(r["value"]).decode()] for r in rows)))
spark.stop()
"""


@dataclass(frozen=True)
class Install(VirtualEnv):
    """The built distributions and the fresh environment the wheel went into."""

    wheel: Path
    sdist: Path
    cwd: Path  # where every command runs: not the checkout
    commit: str  # what the checkout was at the build
    # The wheel's own pyspark must be the one found, not the checkout's.
    DROPPED: ClassVar[tuple[str, ...]] = (*VirtualEnv.DROPPED, "SPARK_HOME", "PYSPARK_PYTHON")

    def run(self, *argv: str, stdin: str = "", timeout_s: float = 60) -> str:
        done = subprocess.run(
            argv,
            input=stdin,
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        assert done.returncode == 0, f"{argv}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
        return done.stdout

    def popen(self, *argv: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            argv,
            cwd=self.cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )


def build(out: Path) -> tuple[Path, Path]:
    done = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    (wheel,) = out.glob(f"tidelog-{__version__}-*.whl")
    (sdist,) = out.glob(f"tidelog-{__version__}.tar.gz")
    return make_portable(wheel), sdist


def wheel_tags(wheel: Path) -> tuple[set[str], set[str]]:
    """The platform tags in the wheel's file name, and the tags its WHEEL file lists."""
    platforms = set(wheel.name.removesuffix(".whl").split("-")[-1].split("."))
    with zipfile.ZipFile(wheel) as archive:
        info = next(n for n in archive.namelist() if n.endswith(".dist-info/WHEEL"))
        listed = archive.read(info).decode().splitlines()
    return platforms, {line.split(": ", 1)[1] for line in listed if line.startswith("Tag: ")}


@pytest.fixture(scope="module")
def installed() -> Iterator[Install]:
    # A directory of its own, removed after the module: the environment is a gigabyte with
    # pyspark (pytest keeps its last three temp directories), and other pytest sessions on the
    # machine prune pytest's.
    with tempfile.TemporaryDirectory(prefix="tidelog-wheel-") as name:
        yield install_the_wheel(Path(name))


def install_the_wheel(base: Path) -> Install:
    """Build, make the fresh environment under base and install the wheel into it."""
    assert not base.resolve().is_relative_to(ROOT), "the fresh environment must be outside"
    commit = checkout_commit(ROOT)
    assert commit is not None, "the test builds from a git checkout"
    wheel, sdist = build(base / "dist")
    cwd = base / "elsewhere"
    cwd.mkdir()
    install = Install(base / "venv", wheel, sdist, cwd, commit)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(install.venv)], check=True)
    # pip runs the fresh interpreter, without PYTHONPATH: with the checkout's src/ on its path it
    # would take the checkout's metadata for an installed tidelog and skip the wheel.
    pip = [sys.executable, "-m", "pip", "--python", install.python]
    install.run(*pip, "install", "--quiet", "--no-compile", f"{wheel}[spark]", timeout_s=600)
    assert Path(install.tidelog).exists(), "the wheel's tidelog script is not installed"
    return install


def line_saying(proc: subprocess.Popen[str], words: str) -> str:
    """The first line the process prints that holds words (what it printed before, if it exits
    first)."""
    assert proc.stdout is not None
    printed = ""
    line = proc.stdout.readline()
    while words not in line:
        assert line or proc.poll() is None, f"{proc.args} exited early:\n{printed}"
        printed += line
        line = proc.stdout.readline()
    return line


@pytest.fixture(scope="module")
def node(installed: Install) -> Iterator[str]:
    """`tidelog serve` from the fresh environment on a free port: its client address."""
    # Warnings only: nothing reads the node's output once it is up, so it must not fill the pipe.
    proc = installed.popen(
        installed.tidelog,
        "serve",
        "--data",
        str(installed.cwd / "node"),
        "--listen",
        "127.0.0.1:0",
        "--log-level",
        "WARNING",
    )
    try:
        line = line_saying(proc, " listening on ")
        yield line.split(" listening on ", 1)[1].split()[0]
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (installed.cwd / "node" / "wheel-0" / ".clean-shutdown").exists()


@pytest.fixture(scope="module")
def written(installed: Install, node: str) -> dict[str, object]:
    """The Python client from the fresh environment wrote a topic and read it back: what it saw
    (where tidelog and its compiled codec were imported from, the values read)."""
    seen: dict[str, object] = json.loads(installed.run(installed.python, "-c", CLIENT_CHECK, node))
    return seen


def test_the_wheel_carries_the_compiled_codecs_and_the_commit(installed: Install) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = wheel.namelist()
        built = json.loads(wheel.read("tidelog/_build_info.json"))
    for codec in CODECS:
        assert any(n.startswith(codec) and n.endswith(".so") for n in names), (codec, names)
    assert built == {"commit": installed.commit}
    with tarfile.open(installed.sdist) as sdist:
        info = sdist.extractfile(f"tidelog-{__version__}/src/tidelog/_build_info.json")
        assert info is not None and json.loads(info.read()) == built
        sources = sdist.getnames()
    assert not [n for n in sources if n.endswith(".so")], "an sdist carries sources only"
    assert f"tidelog-{__version__}/src/tidelog/record/_wire.h" in sources


def test_the_wheel_is_tagged_manylinux_and_pip_takes_it_for_an_older_linux(
    installed: Install,
) -> None:
    """Not this machine's `linux_x86_64`, which pip elsewhere refuses: the manylinux tag
    auditwheel found the codecs need, in the name and in the WHEEL file, and pip asked to
    install for a machine of that tag's oldest glibc (2.17, manylinux2014) takes the wheel."""
    platforms, listed = wheel_tags(installed.wheel)
    assert platforms and all(p.startswith("manylinux") for p in platforms), installed.wheel.name
    assert listed == {f"cp311-cp311-{p}" for p in platforms}, listed
    oldest = min(platforms)  # manylinux2014_<arch> sorts before manylinux_2_17_<arch>
    with tempfile.TemporaryDirectory(prefix="tidelog-platform-") as target:
        pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "install"]
        pip += ["--dry-run", "--no-deps", "--only-binary=:all:", "--target", target]
        pip += ["--platform", oldest, "--python-version", "3.11", "--implementation", "cp"]
        done = subprocess.run(
            [*pip, str(installed.wheel)], capture_output=True, text=True, timeout=120
        )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Would install tidelog-{__version__}" in done.stdout, done.stdout


def test_built_without_a_compiler_the_wheel_is_pure_python_for_any_machine(
    installed: Install,
) -> None:
    """The codecs are optional: from the sdist, with a C compiler that always fails, the wheel
    holds no compiled code, is tagged py3-none-any, and the tidelog it installs runs the pure
    Python rules."""
    with tempfile.TemporaryDirectory(prefix="tidelog-pure-") as name:
        base = Path(name)
        build_wheel = [sys.executable, "-m", "build", "--wheel", "--outdir", str(base / "dist")]
        done = subprocess.run(
            [*build_wheel, str(installed.sdist)],
            env={**os.environ, "CC": "/bin/false"},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
        (built,) = (base / "dist").glob("tidelog-*.whl")
        wheel = make_portable(built)
        assert wheel.name == f"tidelog-{__version__}-py3-none-any.whl"
        assert wheel_tags(wheel)[1] == {"py3-none-any"}
        target = base / "site"
        pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "install"]
        installed.run(*pip, "--quiet", "--no-deps", "--target", str(target), str(wheel))
        # The dependencies are this environment's; tidelog is the one just installed.
        check = (
            "import json, tidelog\n"
            "from tidelog.record.batch import COMPILED_CODEC\n"
            "from tidelog.record.validation import COMPILED_SCANNER\n"
            "print(json.dumps([tidelog.__file__, COMPILED_CODEC is None, COMPILED_SCANNER]))"
        )
        done = subprocess.run(
            [sys.executable, "-c", check],
            env={**installed.env, "PYTHONPATH": str(target)},
            cwd=installed.cwd,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        package, pure_codec, scanner = json.loads(done.stdout)
        assert Path(package).is_relative_to(target) and pure_codec and scanner is None


def test_version_names_the_version_and_the_commit(installed: Install) -> None:
    printed = installed.run(installed.tidelog, "--version")
    assert printed == f"tidelog {__version__} (commit {installed.commit})\n"


def test_serve_and_the_client_from_the_wheel_use_the_compiled_codec(
    installed: Install, written: dict[str, object]
) -> None:
    assert Path(str(written["package"])).is_relative_to(installed.venv), written
    assert Path(str(written["codec"])).is_relative_to(installed.venv), written
    assert written["scanner"] is True
    assert written["values"] == VALUES


@pytest.mark.spark
def test_the_spark_source_from_the_wheel_reads_a_topic(
    installed: Install, node: str, written: dict[str, object]
) -> None:
    scratch = str(installed.cwd / "spark")
    printed = installed.run(installed.python, "-c", SPARK_CHECK, node, scratch, timeout_s=180)
    assert json.loads(printed) == [[offset, value] for offset, value in enumerate(VALUES)]


def test_cluster_up_from_the_wheel_starts_three_nodes_and_stops_them(installed: Install) -> None:
    base = next(b for b in random.sample(range(20_000, 30_000, 3), 200) if ports_free(b, 3))
    data = installed.cwd / "cluster"
    proc = installed.popen(
        installed.tidelog,
        "cluster",
        "up",
        "--nodes",
        "3",
        "--data",
        str(data),
        "--base-port",
        str(base),
    )
    try:
        bootstrap = line_saying(proc, "cluster of 3 nodes up").rsplit(" ", 1)[-1].strip()
        installed.run(installed.tidelog, "topics", "create", "t", "--bootstrap", bootstrap)
        installed.run(
            installed.tidelog, "produce", "t", "--bootstrap", bootstrap, stdin="a\nb\nc\n"
        )
        consumed = installed.run(
            installed.tidelog, "consume", "t", "--from", "earliest", "--bootstrap", bootstrap
        )
        assert consumed.split() == ["a", "b", "c"]
        proc.send_signal(signal.SIGINT)
        assert "cluster stopped" in proc.communicate(timeout=30)[0]
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    for n in (1, 2, 3):
        assert (data / f"node-{n}" / "t-0" / ".clean-shutdown").exists()
