"""tidelog's past releases, built from this checkout's own history, for the tests that run one
beside this build (tests/test_formats.py, tests/test_upgrade.py).

RELEASES names each release by its git tag and the commit the tag points at, and
PREVIOUS_RELEASE the one users run now, which the rolling-upgrade test upgrades from: this file
is the one place that names them (docs/releasing.md says when to change it). A release is taken
from its tag; a clone without tags (tags are not fetched by every CI or mirror) falls back to the
commit, and a tag that points at another commit than the one named here fails the test.

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
from typing import ClassVar

import pytest

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Release:
    version: str
    tag: str  # an annotated tag, `git tag -a vX.Y.Z` (docs/releasing.md)
    commit: str  # the commit the tag points at: what a clone without tags uses


RELEASES = {
    # Tagged after the fact: 0.1.0 was made before releases were tagged.
    "0.1.0": Release("0.1.0", "v0.1.0", "0070a26"),
}
# The release users run now: what tests/test_upgrade.py upgrades from.
PREVIOUS_RELEASE = "0.1.0"

CODEC_SOURCES = ("_codec.c", "_scan.c", "_wire.h")


def git(*argv: str) -> bytes:
    return subprocess.run(
        ["git", "-C", str(ROOT), *argv], capture_output=True, check=True, timeout=60
    ).stdout


def revision(version: str) -> str:
    """What git names the release by here: its tag, or its commit in a clone without the tag.
    A tag on another commit than RELEASES names is an error (a tag moved, or a typo)."""
    release = RELEASES[version]
    try:
        tagged = git("rev-parse", "--verify", "--quiet", f"refs/tags/{release.tag}^{{commit}}")
    except (OSError, subprocess.CalledProcessError):
        return release.commit
    assert tagged.decode().strip().startswith(release.commit), (
        f"tag {release.tag} points at {tagged.decode().strip()}, not at tidelog {version}'s "
        f"commit {release.commit} (tests/releases.py)"
    )
    return release.tag


def archive(version: str, dest: Path, *paths: str) -> Path:
    """The release's tree (or the given paths of it) extracted under dest; skips the test where
    the checkout holds neither the release's tag nor its commit (a shallow clone)."""
    at = revision(version)
    try:
        tar = git("archive", at, *paths)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"tidelog {version} ({at}) is not in this checkout")
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(tar)) as tree:
        tree.extractall(dest, filter="data")
    return dest


def release_source(version: str, dest: Path) -> Path:
    """The release's src/ directory (for PYTHONPATH), with this build's compiled record codecs
    copied in; skips the test if their C sources changed since the release."""
    at = revision(version)
    for name in CODEC_SOURCES:
        try:
            old = git("show", f"{at}:src/tidelog/record/{name}")
        except (OSError, subprocess.CalledProcessError):
            pytest.skip(f"tidelog {version} ({at}) is not in this checkout")
        if old != (ROOT / "src" / "tidelog" / "record" / name).read_bytes():
            pytest.skip(f"record/{name} changed since {version}: its build is not this one's")
    archive(version, dest, "src")
    for built in (ROOT / "src" / "tidelog" / "record").glob("*.so"):
        shutil.copy(built, dest / "src" / "tidelog" / "record")
    return dest / "src"


@dataclass(frozen=True)
class VirtualEnv:
    """A virtual environment tidelog was installed into from a wheel, outside the checkout."""

    venv: Path
    # What would point a command at the checkout or at the venv running the tests.
    DROPPED: ClassVar[tuple[str, ...]] = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")

    @property
    def tidelog(self) -> str:
        return str(self.venv / "bin" / "tidelog")

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    @property
    def env(self) -> dict[str, str]:
        """This process's environment without what DROPPED names."""
        return {k: v for k, v in os.environ.items() if k not in self.DROPPED}


@dataclass(frozen=True)
class Installed(VirtualEnv):
    """A release installed from its wheel into a virtual environment of its own."""

    version: str


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
    installed = Installed(venv, version)
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
