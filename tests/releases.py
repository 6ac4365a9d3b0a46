"""tidelog's past releases, built from this checkout's own history, for the tests that run one
beside this build (tests/test_formats.py, tests/test_upgrade.py).

RELEASES names each release's commit (its tag, once releases are tagged), and PREVIOUS_RELEASE
the one users run now, which the rolling-upgrade test upgrades from: this file is the one place
that names them (docs/releasing.md says when to change it).

Two ways to run a release:
- `release_source`: its `src/` tree from `git archive`, with this build's compiled record codecs
  beside it (their C sources must be the same), run with PYTHONPATH: no build, for running a
  few of its functions.
- `install_release`: a wheel built from its whole tree (`git archive`, then `pip wheel
  --no-deps`, the build isolated with the release's own build requirements), installed into a
  fresh virtual environment outside the checkout with the dependencies its pyproject pins, as a
  user's install is; its `tidelog` script then runs with nothing of the checkout on its path.
  About 15 s on a quiet 2-core machine with pip's cache warm (the build 7 s, the install 8 s).
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# version -> the git commit (or tag) it was released from. 0.1.0 was not tagged when it was made.
RELEASES = {"0.1.0": "0070a26"}
# The release users run now: what tests/test_upgrade.py upgrades from.
PREVIOUS_RELEASE = "0.1.0"

CODEC_SOURCES = ("_codec.c", "_scan.c", "_wire.h")


def git(*argv: str) -> bytes:
    return subprocess.run(
        ["git", "-C", str(ROOT), *argv], capture_output=True, check=True, timeout=60
    ).stdout


def archive(version: str, dest: Path, *paths: str) -> Path:
    """The release's tree (or the given paths of it) extracted under dest; skips the test where
    the checkout does not hold the release's commit (a shallow clone)."""
    try:
        tar = git("archive", RELEASES[version], *paths)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"tidelog {version}'s commit {RELEASES[version]} is not in this checkout")
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(tar)) as tree:
        tree.extractall(dest, filter="data")
    return dest


def release_source(version: str, dest: Path) -> Path:
    """The release's src/ directory (for PYTHONPATH), with this build's compiled record codecs
    copied in; skips the test if their C sources changed since the release."""
    for name in CODEC_SOURCES:
        try:
            old = git("show", f"{RELEASES[version]}:src/tidelog/record/{name}")
        except (OSError, subprocess.CalledProcessError):
            pytest.skip(f"tidelog {version}'s commit {RELEASES[version]} is not in this checkout")
        if old != (ROOT / "src" / "tidelog" / "record" / name).read_bytes():
            pytest.skip(f"record/{name} changed since {version}: its build is not this one's")
    archive(version, dest, "src")
    for built in (ROOT / "src" / "tidelog" / "record").glob("*.so"):
        shutil.copy(built, dest / "src" / "tidelog" / "record")
    return dest / "src"


@dataclass(frozen=True)
class Installed:
    """A release installed from its wheel into a virtual environment of its own."""

    version: str
    venv: Path

    @property
    def tidelog(self) -> str:
        return str(self.venv / "bin" / "tidelog")

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    @property
    def env(self) -> dict[str, str]:
        """This process's environment without what would point at the checkout or its venv."""
        drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
        return {k: v for k, v in os.environ.items() if k not in drop}


def install_release(version: str, base: Path) -> Installed:
    """Build the release's wheel from this checkout's history and install it into a fresh
    virtual environment under base (which must be outside the checkout)."""
    assert not base.resolve().is_relative_to(ROOT), "the release's install must be outside"
    tree = archive(version, base / "tree")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    built = subprocess.run(
        [*pip, "wheel", "--no-deps", "--quiet", "--wheel-dir", str(base / "dist"), str(tree)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = (base / "dist").glob(f"tidelog-{version}-*.whl")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    installed = Installed(version, venv)
    # pip runs the fresh interpreter, without PYTHONPATH (the checkout's src/ on its path would
    # pass for an installed tidelog); the pins are the wheel's, from the release's pyproject.
    done = subprocess.run(
        [*pip, "--python", installed.python, "install", "--quiet", "--no-compile", str(wheel)],
        capture_output=True,
        text=True,
        env=installed.env,
        cwd=base,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    printed = subprocess.run(
        [installed.tidelog, "--version"], capture_output=True, text=True, env=installed.env
    )
    assert printed.stdout.split()[:2] == ["tidelog", version], printed
    return installed
