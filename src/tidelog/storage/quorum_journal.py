"""Every replica's quorum state (epoch, vote, admitted directories, membership) on a node, in one
journal with group commit.

A replica must make its vote durable before it answers, and its epoch before it acts in it. With
a file per replica, that is a write, an fsync, a rename and a directory fsync per vote. When a
node dies, the survivors hold thousands of elections at once, and the votes' own fsyncs then
took longer than an election timeout: candidates stood again before their votes arrived, and
nobody won (measured: 1,000 partitions led by a killed node, none led again after 20 s; without
the fsyncs, all were led again in 0.8 s). Here every state written while the last batch was
being synced goes out in the next one: one append and one fdatasync for all of them, as etcd
syncs one WAL for all its entries and CockroachDB one write-ahead log for all its ranges.

    file: records, each  length (4 bytes BE) | CRC-32C of the body (4) | body
    body: {"g": KEY, "s": STATE} as JSON, STATE null for a replica that was deleted

Version 1 (tidelog 0.1.0) is records only. From version 2 (written from feature level 2), the
first record is the journal's format instead: {"format": "quorum-journal", "v": 2,
"written_by": TIDELOG VERSION}. tidelog 0.1.0 reads that record as a damaged one and does not
start: this file is opened before any partition's, so a node that goes back to 0.1.0 after the
upgrade was finalized stops before it could misread a newer checkpoint as a damaged one.

Opening replays the records (the last one for each key wins). A record cut short at the end is
a write a crash interrupted: nothing was sent on its strength (its batch never finished its
fsync), so the journal is cut back before it. A damaged record with whole records after it is
corruption: CorruptRecord, and the node does not start. When the file has grown to four times
what it holds live (and at least COMPACT_MIN_BYTES), the batch's thread rewrites it whole
(temporary file, fsync, rename, directory fsync).

No networking and no event loop: the node hands `write` a callable that runs a job on a flush
thread, and is called back (on its loop) when a batch is durable.
"""

from __future__ import annotations

import json
import logging
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import crc32c as _crc32c

from tidelog.errors import CorruptRecord
from tidelog.formats import check_version, write_version
from tidelog.storage.durable import fsync_dir, translate_os_error, write_all, write_file
from tidelog.version import __version__

log = logging.getLogger(__name__)

JOURNAL_FILE = "quorum-states"
FORMAT = "quorum-journal"
RECORD = struct.Struct(">II")
COMPACT_MIN_BYTES = 1024 * 1024

State = dict[str, Any]
Done = Callable[[BaseException | None], None]
Submit = Callable[[Callable[[], None], Done], None]


def encode_record(key: str, state: State | None) -> bytes:
    return _record({"g": key, "s": state})


def encode_format(version: int) -> bytes:
    """The record that opens a journal of version 2 and later (version 1 has none)."""
    if version < 2:
        return b""
    return _record({"format": FORMAT, "v": version, "written_by": __version__})


def journal_version(directory: Path) -> int | None:
    """The version of the directory's journal, read from its first record alone, for a reader
    that does not open it (`cluster up`, between runs of its nodes); None: no journal yet.
    UnsupportedFormatVersion for one newer than this build reads."""
    path = directory / JOURNAL_FILE
    try:
        with open(path, "rb") as f:
            head = f.read(RECORD.size)
            if len(head) < RECORD.size:
                return 1  # nothing whole in it yet: written as version 1 so far
            length, crc = RECORD.unpack(head)
            body = f.read(length)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise translate_os_error(exc, f"reading {path}") from exc
    try:
        record = json.loads(body) if len(body) == length and _crc32c.crc32c(body) == crc else {}
    except ValueError:
        record = {}  # damaged: the node that opens it says so
    version = record.get("v") if isinstance(record, dict) and "g" not in record else None
    if not isinstance(version, int) or isinstance(version, bool):
        return 1  # its first record holds a replica's state: version 1 has no format record
    return check_version(FORMAT, version, str(path))


def _record(body_json: dict[str, Any]) -> bytes:
    body = json.dumps(body_json, sort_keys=True, separators=(",", ":")).encode()
    return RECORD.pack(len(body), _crc32c.crc32c(body)) + body


class QuorumJournal:
    def __init__(self, directory: Path, submit: Submit) -> None:
        self.path = directory / JOURNAL_FILE
        self._submit = submit
        self.states: dict[str, State] = {}
        self.version = 1  # of the file as it is (its first record says, from version 2)
        created = not self.path.exists()
        self._size = self._replay()
        self._compacted_size = max(self._size, 1)
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            raise translate_os_error(exc, f"opening {self.path}") from exc
        if created:
            fsync_dir(directory)
        self._pending: list[tuple[bytes, Done]] = []
        # A journal in an older version than the write level is rewritten at its next write.
        self._version_wanted = max(self.version, write_version(FORMAT))
        self._writing = False
        self.batches = 0  # fdatasyncs: one per batch of states

    # -- reading ----------------------------------------------------------------------------

    def get(self, key: str) -> State | None:
        return self.states.get(key)

    def _replay(self) -> int:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return 0
        position = 0
        while position < len(raw):
            if len(raw) - position < RECORD.size:
                break  # a torn header at the end
            length, crc = RECORD.unpack_from(raw, position)
            end = position + RECORD.size + length
            if end > len(raw):
                break  # a torn body at the end
            body = raw[position + RECORD.size : end]
            if _crc32c.crc32c(body) != crc:
                if end < len(raw):
                    raise CorruptRecord(
                        f"{self.path}: record at {position} fails its CRC, with more after it"
                    )
                break  # the last record, torn
            try:
                record = json.loads(body)
                if position == 0 and "v" in record and "g" not in record:
                    self.version = self._check_format(record)
                    position = end
                    continue
                key, state = record["g"], record["s"]
            except (ValueError, KeyError, TypeError) as exc:
                raise CorruptRecord(f"{self.path}: record at {position}: {exc}") from exc
            if state is None:
                self.states.pop(key, None)
            else:
                self.states[key] = state
            position = end
        if position < len(raw):
            log.warning(
                "%s: cut %d bytes of a write a crash interrupted", self.path, len(raw) - position
            )
            os.truncate(self.path, position)
        return position

    def _check_format(self, record: dict[str, Any]) -> int:
        version = record["v"]
        if not isinstance(version, int) or isinstance(version, bool):
            raise TypeError(f"format version {version!r}")
        return check_version(FORMAT, version, str(self.path))

    # -- writing ----------------------------------------------------------------------------

    def upgrade(self, done: Done, version: int | None = None) -> None:
        """Rewrite the journal in `version` (default: what the process's feature level writes),
        then done(None). A node raising its write level does this first, and raises it for the
        other files only once done: the journal's format record, which 0.1.0 refuses, is then
        on disk before any file 0.1.0 would misread."""
        wanted = write_version(FORMAT) if version is None else version
        self._version_wanted = max(self._version_wanted, wanted)
        self._pending.append((b"", done))
        if not self._writing:
            self._start()

    def write(self, key: str, state: State | None, done: Done) -> None:
        """Queue this state (None: the replica is gone); done(None) once it is durable, or
        done(error) if it could not be made so."""
        if state is None:
            self.states.pop(key, None)
        else:
            self.states[key] = state
        self._pending.append((encode_record(key, state), done))
        if not self._writing:
            self._start()

    def _start(self) -> None:
        batch, self._pending = self._pending, []
        self._writing = True
        data = b"".join(record for record, _ in batch)
        snapshot = None
        version = self._version_wanted
        if (
            self._size + len(data) > max(COMPACT_MIN_BYTES, 4 * self._compacted_size)
            or version != self.version
        ):
            snapshot = dict(self.states)
        self._submit(
            lambda: self._append(data, snapshot, version),
            lambda error: self._finished(batch, error),
        )

    def _append(self, data: bytes, snapshot: dict[str, State] | None, version: int) -> None:
        """On a flush thread (one batch at a time)."""
        try:
            write_all(self._fd, data)
            os.fdatasync(self._fd)
        except OSError as exc:
            raise translate_os_error(exc, f"writing {self.path.name}") from exc
        self._size += len(data)
        if snapshot is not None:
            body = encode_format(version) + b"".join(
                encode_record(k, v) for k, v in sorted(snapshot.items())
            )
            write_file(self.path, body)  # temp, fsync, rename, directory fsync
            self.version = version
            old, self._fd = self._fd, os.open(self.path, os.O_WRONLY | os.O_APPEND)
            os.close(old)
            self._size = self._compacted_size = len(body)

    def _finished(self, batch: list[tuple[bytes, Done]], error: BaseException | None) -> None:
        self._writing = False
        self.batches += 1
        for _, done in batch:
            done(error)
        if self._pending:
            self._start()

    def close(self) -> None:
        os.close(self._fd)
