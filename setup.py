"""setuptools' build hooks: the commit a wheel or an sdist is built from is written into it
(tidelog/_build_info.json), so `tidelog --version` names it where there is no git checkout.

Everything else about the build is in pyproject.toml (metadata, the C record codecs). A wheel
built straight from a checkout gets the file from git; an sdist carries it, and a wheel built from
that sdist (what `python -m build` does) keeps it as package data. Built without git (an sdist of
an sdist aside), there is no file and tidelog says "unknown". The git lookup is tidelog.version's
own, loaded from its file: the package itself is not imported here (its dependencies are not in
the build environment)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

ROOT = Path(__file__).resolve().parent
PACKAGE = Path("src") / "tidelog"


def _version_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_tidelog_version", ROOT / PACKAGE / "version.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


VERSION = _version_module()


def write_build_info(package_dir: Path) -> None:
    """Write the checkout's commit into a package directory (nothing outside a git checkout)."""
    commit = VERSION.checkout_commit(ROOT)
    if commit is None:
        return
    package_dir.mkdir(parents=True, exist_ok=True)
    (package_dir / VERSION.BUILD_INFO).write_text(json.dumps({"commit": commit}) + "\n")


class BuildPyWithCommit(build_py):
    """build_py that also writes the commit into the built package (not into src/: the checkout
    stays as it is, and reads git itself)."""

    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            write_build_info(Path(self.build_lib) / "tidelog")


class SdistWithCommit(sdist):
    """sdist whose tree carries the commit, for the wheels built from it without git."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        write_build_info(Path(base_dir) / PACKAGE)


setup(cmdclass={"build_py": BuildPyWithCommit, "sdist": SdistWithCommit})
