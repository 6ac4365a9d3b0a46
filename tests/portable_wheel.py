"""The release wheel made installable on other machines: `make dist` runs this on what
`python -m build` made, and tests/test_wheel.py does the same to the wheel it tests.

setuptools tags a wheel with compiled code for the machine that built it (`linux_x86_64`), and
pip on any other Linux refuses that tag. The two compiled record codecs (`_scan`, `_codec`) link
nothing but the C library, so no library needs to travel with them: `auditwheel repair` checks
that (a wheel linking anything outside the manylinux policy is refused), finds the newest glibc
symbol version they use (GLIBC_2.14, for memcpy, as built here) and retags the wheel with the
manylinux tag that promises it (`manylinux_2_17_x86_64`, also spelled `manylinux2014_x86_64`):
pip installs it on any x86_64 Linux with glibc 2.17 or newer. The shared objects stay as they
were built (auditwheel grafts, and so patches, nothing here; it insists on finding patchelf all
the same).

A wheel built where the codecs could not be compiled (no C compiler or no Python headers: they
are optional, tidelog falls back to the same rules in pure Python) holds no compiled code;
auditwheel refuses it as no platform wheel, and it is retagged `py3-none-any` instead, which pip
installs anywhere.

    python tests/portable_wheel.py DIST_DIR     # the one tidelog-*.whl in it, replaced
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

PURE_TAGS = ("--python-tag", "py3", "--abi-tag", "none", "--platform-tag", "any")


def compiled(wheel: Path) -> bool:
    """Whether the wheel holds compiled code (a shared object)."""
    with zipfile.ZipFile(wheel) as archive:
        return any(name.endswith(".so") for name in archive.namelist())


def make_portable(wheel: Path) -> Path:
    """Retag the wheel (manylinux, or py3-none-any without compiled code) beside it, remove
    the original, and return the new one."""
    before = set(wheel.parent.glob("*.whl"))
    # auditwheel runs patchelf by name: the one the release extra installs beside it.
    tools = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": tools + os.pathsep + os.environ.get("PATH", "")}
    if compiled(wheel):
        argv = ["auditwheel", "repair", "--wheel-dir", str(wheel.parent), str(wheel)]
    else:
        argv = ["wheel", "tags", *PURE_TAGS, str(wheel)]
    done = subprocess.run(
        [sys.executable, "-m", *argv], env=env, capture_output=True, text=True, timeout=300
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{done.stdout}{done.stderr}")
    (made,) = set(wheel.parent.glob("*.whl")) - before
    wheel.unlink()
    return made


def main(argv: list[str]) -> int:
    (dist,) = argv
    (wheel,) = Path(dist).glob("tidelog-*.whl")
    print(f"{wheel.name} -> {make_portable(wheel).name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
