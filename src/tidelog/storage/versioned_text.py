"""The small text files beside the data: a partition directory's `topic.id` and
`.clean-shutdown`, and `cluster up`'s `cluster.id` and `cluster.secret`, in the two forms
tidelog/formats.py knows them by.

Version 1 is tidelog 0.1.0's bare form, byte for byte: the value and a newline (`topic.id`,
`cluster.id`, `cluster.secret`), or nothing at all (`.clean-shutdown`). It names no version, so a
reader could not tell a later layout from damage. Version 2, written once the cluster is
finalized at feature level 2, names it, in the style of meta.properties:

    # tidelog topic.id
    version=2
    written.by=0.2.0
    topic.id=17

A file whose first line is `# tidelog <its name>` is in the versioned form; any other is version
1 (a cluster secret an operator made by hand included). A versioned file of a version this build
does not read is refused by name (UnsupportedFormatVersion, naming the file and the versions);
one without a version, or without its value, is damaged (StorageError).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tidelog.errors import StorageError
from tidelog.formats import check_version, write_version
from tidelog.invariant import invariant
from tidelog.storage.durable import write_file
from tidelog.version import __version__


@dataclass(frozen=True)
class TextFile:
    name: str  # the file's name, which is also its format's (tidelog/formats.py)
    key: str  # the value's key in the versioned form; "" for a marker, which holds none

    @property
    def header(self) -> bytes:
        return f"# tidelog {self.name}".encode()


TOPIC_ID = TextFile("topic.id", "topic.id")
CLEAN_SHUTDOWN = TextFile(".clean-shutdown", "")
CLUSTER_ID = TextFile("cluster.id", "cluster.id")
CLUSTER_SECRET = TextFile("cluster.secret", "secret")


@dataclass(frozen=True)
class Contents:
    version: int
    value: bytes  # b"" for a marker


def encode(file: TextFile, value: bytes, version: int) -> bytes:
    """The file's bytes in a version (1: exactly what tidelog 0.1.0 writes)."""
    invariant(b"\n" not in value and value == value.strip(), "a one-line value, unpadded")
    if version == 1:
        return value + b"\n" if file.key else b""
    lines = [file.header, b"version=%d" % version, b"written.by=" + __version__.encode()]
    if file.key:
        lines.append(file.key.encode() + b"=" + value)
    return b"\n".join(lines) + b"\n"


def decode(file: TextFile, raw: bytes, where: str) -> Contents:
    """What a file holds, in either form."""
    lines = raw.splitlines()
    if not lines or lines[0].strip() != file.header:
        return Contents(1, raw.strip())
    values: dict[bytes, bytes] = {}
    for line in lines[1:]:
        key, equals, value = line.strip().partition(b"=")
        if equals and not key.startswith(b"#"):
            values[key.strip()] = value.strip()
    try:
        version = int(values[b"version"])
    except (KeyError, ValueError):
        raise StorageError(f"{where} is damaged (no version=N line after its header)") from None
    check_version(file.name, version, where)
    value = values.get(file.key.encode(), b"")
    if file.key and not value:
        raise StorageError(f"{where} is damaged (no {file.key}= line)")
    return Contents(version, value)


def read(file: TextFile, path: Path) -> Contents | None:
    """None if the file does not exist."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StorageError(f"cannot read {path}: {exc.strerror or exc}") from exc
    return decode(file, raw, str(path))


def write(
    file: TextFile,
    path: Path,
    value: bytes = b"",
    version: int | None = None,
    *,
    mode: int = 0o644,
    exclusive: bool = False,
) -> None:
    """Write the file whole (durable.write_file) in `version` (default: what the process's
    feature level writes)."""
    if version is None:
        version = write_version(file.name)
    write_file(path, encode(file, value, version), mode=mode, exclusive=exclusive)
