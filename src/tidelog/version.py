"""tidelog's version and the commit it was built from, in a module of its own so that every layer
may read them without importing the package's lazy client exports (tidelog/__init__.py).

`__version__` is the one place the version is written: pyproject.toml reads it from here at build
time (docs/releasing.md says when and how it changes). The commit is baked into a wheel or an
sdist when it is built (setup.py writes `_build_info.json` next to this module: a data file, not a
module, so that nothing imports a generated file); code run from a git checkout reads it from git;
anything else says "unknown"."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

__version__ = "0.2.0"

BUILD_INFO = "_build_info.json"
UNKNOWN_COMMIT = "unknown"
# Digits of the commit's hash shown: as many as `git log --abbrev=12`, unique in any repository
# this size.
COMMIT_DIGITS = 12
# A checkout with uncommitted changes to tracked files is not the commit it names.
MODIFIED_SUFFIX = "-modified"


def version_line() -> str:
    """What `tidelog --version` prints: `tidelog 0.2.0 (commit 1a2b3c4d5e6f)`."""
    return f"tidelog {__version__} (commit {commit()})"


def commit() -> str:
    """The commit this code was built from: baked in at build time, else read from the git
    checkout it runs from, else "unknown"."""
    return built_commit(Path(__file__).parent) or checkout_commit(checkout_root()) or UNKNOWN_COMMIT


def built_commit(package_dir: Path) -> str | None:
    """The commit a build wrote into the package (None when none did: a checkout, or a build made
    without git)."""
    try:
        info = json.loads((package_dir / BUILD_INFO).read_text())
    except (OSError, ValueError):
        return None
    found = info.get("commit") if isinstance(info, dict) else None
    return found if isinstance(found, str) and found else None


def checkout_root() -> Path:
    """Where a checkout's root would be if this module runs from one (src/tidelog/version.py)."""
    return Path(__file__).resolve().parent.parent.parent


def checkout_commit(root: Path) -> str | None:
    """The commit checked out at `root`, with MODIFIED_SUFFIX if tracked files differ from it.
    None unless `root` is itself the top of a git work tree: a package installed somewhere inside
    another repository (a virtual environment in a project's directory) must not name that
    repository's commit."""
    if not (root / ".git").exists() or not (root / "pyproject.toml").is_file():
        return None
    top = _git(root, "rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != root.resolve():
        return None
    head = _git(root, "rev-parse", f"--short={COMMIT_DIGITS}", "HEAD")
    if head is None:
        return None
    changed = _git(root, "status", "--porcelain", "--untracked-files=no")
    return head + MODIFIED_SUFFIX if changed else head


def _git(root: Path, *args: str) -> str | None:
    """A git command's output in `root`, or None if git is missing or fails."""
    try:
        done = subprocess.run(
            ["git", "-C", str(root), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None
