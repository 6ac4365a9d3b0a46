"""Every format tidelog keeps on disk or sends to a peer, with its version: the versions this
build reads, and the version it writes at each feature level (docs/formats.md has the table).

A rolling upgrade runs nodes of two releases side by side, and a node may go back to the older
binary until the upgrade is finalized. So until the cluster's feature level is raised
(tidelog/features.py), a node writes only what the previous release reads: feature level 1 is
tidelog 0.1.0's formats, byte for byte. Level 2 lets writers use the newer versions below. The
node sets the level it writes at (set_write_level) from the finalized feature level; writers
ask write_version(). Levels only go up.

A reader that meets a version newer than it knows refuses by name (check_version raises
UnsupportedFormatVersion, naming the file or peer, the version found and the versions known). It
never guesses: a checkpoint read as damaged is ignored, and an ignored partition checkpoint
loses the log start (deleted records would come back).

The peer protocol is negotiated per connection instead (its handshake says what each end
speaks; protocol/peer_handshake.py), so it needs no feature level.
"""

from __future__ import annotations

from dataclasses import dataclass

from tidelog.errors import UnsupportedFormatVersion
from tidelog.features import MAX_LEVEL, MIN_LEVEL
from tidelog.version import __version__

# The feature levels (tidelog/features.py): 1 writes tidelog 0.1.0's formats, the newest level
# this build knows writes its newest.
LEVEL_MIN = MIN_LEVEL
LEVEL_MAX = MAX_LEVEL


@dataclass(frozen=True)
class Format:
    name: str
    where: str  # the files, records or messages in this format
    version_field: str  # where a file or message says its version
    reads: tuple[int, int]  # the oldest and newest version this build reads
    writes: tuple[int, ...]  # the version written at feature level 1, 2, ...

    def written_at(self, level: int) -> int:
        return self.writes[min(max(level, LEVEL_MIN), len(self.writes)) - 1]


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format(
            "meta.properties",
            "DATA/meta.properties",
            "the `version=` line (0.1.0 does not check it)",
            (1, 1),
            (1, 1),
        ),
        Format(
            "topic.id",
            "each partition directory's topic.id",
            'a first line "# tidelog topic.id", then "version=" (none: version 1, the id alone)',
            (1, 2),
            (1, 2),
        ),
        Format(
            ".clean-shutdown",
            "each partition directory's .clean-shutdown marker",
            'a first line "# tidelog .clean-shutdown", then "version=" (none: version 1, empty)',
            (1, 2),
            (1, 2),
        ),
        Format(
            "cluster.id",
            "`tidelog cluster up`'s DIR/cluster.id",
            'a first line "# tidelog cluster.id", then "version=" (none: version 1, the id alone)',
            (1, 2),
            (1, 2),
        ),
        Format(
            "cluster.secret",
            "`tidelog cluster up`'s DIR/cluster.secret; any --cluster-secret-file",
            'a first line "# tidelog cluster.secret", then "version=" (none: version 1, the '
            "secret alone)",
            (1, 2),
            (1, 2),
        ),
        Format(
            "checkpoint",
            "partition.checkpoint, leader-epoch-checkpoint, quorum-state, producer-state, "
            "transaction-state, peer-directories, cluster.joined, node.checkpoint",
            'the envelope\'s "version"',
            (1, 2),
            (1, 2),
        ),
        Format(
            "quorum-journal",
            "DATA/quorum-states",
            'a first record {"format", "v"} (none: version 1)',
            (1, 2),
            (1, 2),
        ),
        Format(
            "snapshot",
            "snapshots/*.snapshot and the chunks a leader sends of one",
            'the magic, "TLSNAP<version>\\n"',
            (1, 2),
            (1, 2),
        ),
        Format(
            "segment",
            ".log, .index, .timeindex; the archive's objects",
            "each batch's magic (2); the indexes have none (rebuilt when they do not fit)",
            (1, 1),
            (1, 1),
        ),
        Format(
            "metadata-command",
            "the records of the metadata log (__metadata-0)",
            'the command\'s "v" (absent: 1)',
            (1, 2),
            (1, 1, 2),  # 2: the transaction coordinator's commands, only from level 3
        ),
        Format(
            "metadata-snapshot",
            "the payload of the metadata log's snapshots (MetadataState.to_snapshot)",
            '"v" in its JSON (absent: 1)',
            (1, 2),
            (1, 1, 2),  # 2: adds "transactions"
        ),
        Format(
            "peer-protocol",
            "the peer handshake and every frame after it",
            '"version" in PEER_HELLO and its answer (absent: 1), negotiated per connection',
            (1, 2),
            (2, 2),  # offered; a connection speaks the lower of its two ends' versions
        ),
        Format(
            "frame",
            "the 15-byte frame prefix (clients and peers)",
            "none: a new layout needs a new peer-protocol version first",
            (1, 1),
            (1, 1),
        ),
        Format(
            "archive-cluster",
            "the archive's cluster.json",
            '"format"',
            (1, 1),
            (1, 1),
        ),
        Format(
            "archive-manifest",
            "the archive's manifest.json and manifest-parts/*.json",
            '"format"',
            (1, 2),
            (1, 2),
        ),
    )
}


def check_version(name: str, found: int, where: str) -> int:
    """found, if this build reads that version of format name; UnsupportedFormatVersion naming
    where (a file, a record, a peer) otherwise."""
    fmt = FORMATS[name]
    low, high = fmt.reads
    if low <= found <= high:
        return found
    known = f"version {low}" if low == high else f"versions {low}-{high}"
    remedy = (
        "upgrade tidelog, or restore the data it wrote"
        if found > high
        else "it was not written by a tidelog this one can read"
    )
    raise UnsupportedFormatVersion(
        f"{where} is in {name} format version {found}; this tidelog ({__version__}) reads "
        f"{known}: {remedy}",
        format=name,
        version=found,
        reads=[low, high],
        where=where,
    )


class _WriteLevel:
    """The feature level this process writes at: one per process, as a node is one."""

    level = LEVEL_MIN


def set_write_level(level: int) -> None:
    """Write the formats of feature level `level` from now on: the cluster's finalized feature
    level (a level this build does not know writes this build's newest formats)."""
    if level < LEVEL_MIN:
        raise ValueError(f"feature level {level} is below {LEVEL_MIN}")
    _WriteLevel.level = min(level, LEVEL_MAX)


def write_level() -> int:
    return _WriteLevel.level


def write_version(name: str, level: int | None = None) -> int:
    """The version of format name to write at level (default: the process's write level)."""
    return FORMATS[name].written_at(write_level() if level is None else level)
