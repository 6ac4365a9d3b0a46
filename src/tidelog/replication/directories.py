"""Which data directory of each voter a replica group has admitted (Kafka's KIP-853 / KIP-966).

A node that lost its disk comes back under its old node id with an empty log and a new directory
id (storage/identity.py). Its vote must not count: it promised to hold records it no longer has,
and with a lagging voter it could elect a leader without them. So each replica group keeps, per
voter, the directory it admitted; a voter presenting another one is an observer: it fetches and
catches up, but does not vote, does not count toward the HW, the ISR or min.insync.replicas, and
cannot lead, until the leader has seen it hold everything the leader held when it rejoined. Then
the leader admits the new directory and tells the followers in its fetch answers.

The admitted map is part of the durable quorum state (persisted before any message is sent), so
the leader never counts a replica toward the HW before it has recorded that replica's directory.
On the wire it is one string, "id=dir,id=dir", sorted; followers send its CRC so the leader
sends the map only when it differs.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping

NO_DIRECTORY = ""  # not vouched for (a test's hand-made message, an older peer)


def encode_directories(directories: Mapping[int, str]) -> str:
    return ",".join(f"{node}={d}" for node, d in sorted(directories.items()) if d)


def decode_directories(encoded: str) -> dict[int, str]:
    out: dict[int, str] = {}
    for item in encoded.split(",") if encoded else ():
        node, sep, directory = item.partition("=")
        if sep and node.lstrip("-").isdigit() and directory:
            out[int(node)] = directory
    return out


def directories_digest(encoded: str) -> int:
    return zlib.crc32(encoded.encode()) if encoded else 0
