"""Where the archive's objects live: a directory (file:///DIR) or an S3-compatible object store
(s3://BUCKET/PREFIX), behind one small interface of whole-object puts, ranged gets, lists and
deletes. Every call blocks: the node calls them from worker threads.

S3 goes through obstore (the Rust object_store crate's Python binding: signing, retries,
multipart and conditional puts are its, not ours; measured at ~110 MiB/s of 1 MiB puts against a
local S3 server, it adds no Python dependencies and its GIL-free calls leave the node's loop
alone). Endpoint, region and credentials come from the standard AWS environment variables
(AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN) and
the node's --archive-endpoint. A directory is written by tidelog itself so that every object is
fsynced before it counts (object_store's local store does not sync).

Store failures become the archive's named errors (errors.py): unreachable → ArchiveUnavailable
(retriable), refused credentials → ArchiveAccessDenied, no bucket → ArchiveBucketMissing.
"""

from __future__ import annotations

import builtins
import contextlib
import datetime
import fcntl
import os
import re
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tidelog.errors import (
    ArchiveAccessDenied,
    ArchiveBucketMissing,
    ArchiveError,
    ArchiveObjectMissing,
    ArchiveUnavailable,
    InvalidArchiveUrl,
)
from tidelog.invariant import InvariantBroken

ObjectMissing = ArchiveObjectMissing


class VersionConflict(Exception):
    """A conditional put lost: someone else wrote the object since it was read."""


@dataclass(frozen=True)
class Versioned:
    data: bytes
    version: str  # what a conditional put compares against ("" for an absent object)


class ArchiveStore(Protocol):
    url: str

    def put(self, key: str, data: bytes) -> None: ...

    def put_if(self, key: str, data: bytes, version: str | None) -> str:
        """Write key only if it is still at version (None: only if it does not exist), and
        return its new version; VersionConflict otherwise."""
        ...

    def get(self, key: str) -> bytes: ...

    def get_versioned(self, key: str) -> Versioned | None: ...

    def get_range(self, key: str, start: int, end: int) -> bytes: ...

    def list(self, prefix: str) -> list[str]: ...

    def list_aged(self, prefix: str) -> builtins.list[tuple[str, float]]:
        """Every object under prefix with its age in seconds, unfinished writes included (the
        archive's sweep of orphans)."""
        ...

    def delete(self, key: str) -> None: ...

    def check(self) -> None:
        """Reachable, present and permitted, or the named error."""
        ...


# S3's rules for a bucket name (general purpose buckets): 3-63 characters of lowercase letters,
# digits, dots and hyphens, beginning and ending with a letter or digit, not an IP address.
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_IP = re.compile(r"\d+\.\d+\.\d+\.\d+")


def open_store(url: str, endpoint: str = "") -> ArchiveStore:
    """The store an archive URL names, checked and normalised: InvalidArchiveUrl for a URL that
    names no archive a node may own (the filesystem root, a path with `..`, a bucket name S3
    refuses)."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        path = urllib.parse.unquote(parsed.path)
        if parsed.netloc not in ("", "localhost") or not path.startswith("/"):
            raise InvalidArchiveUrl(f"{url!r}: a file archive is file:///ABSOLUTE/DIR", url=url)
        _check_segments(url, path)
        root = Path("/" + "/".join(s for s in path.split("/") if s))
        if root == Path("/"):
            raise InvalidArchiveUrl(
                f"{url!r}: the filesystem root is no archive (file:///ABSOLUTE/DIR)", url=url
            )
        return FileStore(url, root)
    if parsed.scheme == "s3":
        bucket = parsed.netloc
        if not bucket:
            raise InvalidArchiveUrl(f"{url!r}: an S3 archive is s3://BUCKET/PREFIX", url=url)
        if not _BUCKET.fullmatch(bucket) or ".." in bucket or _IP.fullmatch(bucket):
            raise InvalidArchiveUrl(
                f"{url!r}: {bucket!r} is not a valid S3 bucket name (3-63 lowercase letters, "
                "digits, dots and hyphens, starting and ending with a letter or digit)",
                url=url,
            )
        _check_segments(url, parsed.path)
        prefix = "/".join(s for s in parsed.path.split("/") if s)
        return S3Store(url, bucket, prefix, endpoint)
    raise InvalidArchiveUrl(
        f"{url!r}: unknown archive scheme {parsed.scheme!r} (file:///DIR or s3://BUCKET/PREFIX)",
        url=url,
    )


# -- a directory ----------------------------------------------------------------------------------


class FileStore:
    def __init__(self, url: str, root: Path) -> None:
        self.url = url
        self.root = root

    def _path(self, key: str) -> Path:
        if key.startswith("/") or ".." in key.split("/"):
            raise InvalidArchiveUrl(f"bad object key {key!r}", url=self.url)
        return self.root / key

    def check(self) -> None:
        if not self.root.is_dir():
            raise ArchiveBucketMissing(
                f"archive directory {self.root} does not exist", url=self.url
            )
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise ArchiveAccessDenied(
                f"archive directory {self.root} is not writable", url=self.url
            )

    def put(self, key: str, data: bytes) -> None:
        self.check()
        path = self._path(key)
        with self._translated(key):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        """Read-compare-write of one key across processes (a lock file beside it)."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def put_if(self, key: str, data: bytes, version: str | None) -> str:
        self.check()
        with self._translated(key), self._locked(key):
            now = self._version(key)
            if now != version:
                raise VersionConflict(f"{key} changed (now {now}, expected {version})")
            self.put(key, data)
            written = self._version(key)
            if written is None:
                raise InvariantBroken("written is not None")
            return written

    def _version(self, key: str) -> str | None:
        """What changes whenever the file is replaced (a rename gives it a new inode)."""
        try:
            return _file_version(self._path(key).stat())
        except FileNotFoundError:
            return None

    def get(self, key: str) -> bytes:
        with self._translated(key):
            return self._path(key).read_bytes()

    def get_versioned(self, key: str) -> Versioned | None:
        try:
            with self._translated(key), open(self._path(key), "rb") as f:
                st = os.fstat(f.fileno())  # the version of exactly the bytes read
                return Versioned(f.read(), _file_version(st))
        except ObjectMissing:
            return None

    def get_range(self, key: str, start: int, end: int) -> bytes:
        with self._translated(key), open(self._path(key), "rb") as f:
            return os.pread(f.fileno(), end - start, start)

    def list(self, prefix: str) -> list[str]:
        self.check()
        base = self._path(prefix) if prefix else self.root
        if not base.exists():
            return []
        return sorted(
            str(p.relative_to(self.root))
            for p in base.rglob("*")
            if p.is_file() and not p.name.startswith(".")
        )

    def list_aged(self, prefix: str) -> builtins.list[tuple[str, float]]:
        self.check()
        base = self._path(prefix) if prefix else self.root
        if not base.exists():
            return []
        now = time.time()
        found = []
        for p in base.rglob("*"):
            # A write's temporary file (.NAME.XXXXXXXX.tmp) counts; a lock file never goes.
            if p.name.endswith(".lock") or (p.name.startswith(".") and not p.name.endswith(".tmp")):
                continue
            with contextlib.suppress(FileNotFoundError):
                st = p.stat()
                if not p.is_dir():
                    found.append((str(p.relative_to(self.root)), now - st.st_mtime))
        return sorted(found)

    def delete(self, key: str) -> None:
        with self._translated(key), contextlib.suppress(FileNotFoundError):
            self._path(key).unlink()

    @contextlib.contextmanager
    def _translated(self, key: str) -> Iterator[None]:
        try:
            yield
        except FileNotFoundError:
            if not self.root.is_dir():
                raise ArchiveBucketMissing(
                    f"archive directory {self.root} does not exist", url=self.url
                ) from None
            raise ObjectMissing(f"{self.url}: no object {key}", url=self.url, key=key) from None
        except PermissionError as exc:
            raise ArchiveAccessDenied(f"{self.url}: {key}: {exc}", url=self.url) from None
        except OSError as exc:
            raise ArchiveUnavailable(f"{self.url}: {key}: {exc}", url=self.url) from None


# -- S3 --------------------------------------------------------------------------------------------


class S3Store:
    def __init__(self, url: str, bucket: str, prefix: str, endpoint: str = "") -> None:
        from obstore.store import S3Store as ObS3Store

        self.url = url
        self.bucket = bucket
        endpoint = (
            endpoint
            or os.environ.get("AWS_ENDPOINT_URL_S3", "")
            or os.environ.get("AWS_ENDPOINT_URL", "")
        )
        options: dict[str, Any] = {}
        if endpoint:
            options["endpoint"] = endpoint
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if region:
            options["region"] = region
        self._store = ObS3Store(
            bucket,
            prefix=prefix or None,
            client_options={
                "allow_http": endpoint.startswith("http://"),
                "connect_timeout": "2s",
                "timeout": "30s",
            },
            # Our own loop retries with backoff and says why; the store's retries must not
            # hide an unreachable store for minutes.
            retry_config={
                "max_retries": 2,
                "retry_timeout": datetime.timedelta(seconds=5),
                "backoff": {
                    "init_backoff": datetime.timedelta(milliseconds=50),
                    "max_backoff": datetime.timedelta(seconds=1),
                    "base": 2,
                },
            },
            **options,
        )

    def check(self) -> None:
        with self._translated(""):
            import obstore

            next(iter(obstore.list(self._store, "", chunk_size=1)), None)

    def put(self, key: str, data: bytes) -> None:
        import obstore

        with self._translated(key):
            obstore.put(self._store, key, data)

    def put_if(self, key: str, data: bytes, version: str | None) -> str:
        import obstore
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        mode: Any = "create" if version is None else {"e_tag": version}
        try:
            with self._translated(key):
                result = obstore.put(self._store, key, data, mode=mode)
                return str(result.get("e_tag") or "")
        except ArchiveError as exc:
            if isinstance(exc.__cause__, AlreadyExistsError | PreconditionError):
                raise VersionConflict(f"{key} changed since it was read") from None
            raise

    def get(self, key: str) -> bytes:
        import obstore

        with self._translated(key):
            return bytes(obstore.get(self._store, key).bytes())

    def get_versioned(self, key: str) -> Versioned | None:
        import obstore

        try:
            with self._translated(key):
                result = obstore.get(self._store, key)
                data = bytes(result.bytes())
                return Versioned(data, str(result.meta.get("e_tag") or ""))
        except ObjectMissing:
            return None

    def get_range(self, key: str, start: int, end: int) -> bytes:
        import obstore

        with self._translated(key):
            return bytes(obstore.get_range(self._store, key, start=start, end=end))

    def list(self, prefix: str) -> list[str]:
        import obstore

        with self._translated(prefix):
            return sorted(
                str(meta["path"])
                for chunk in obstore.list(self._store, prefix or None)
                for meta in chunk
            )

    def list_aged(self, prefix: str) -> builtins.list[tuple[str, float]]:
        import obstore

        now = time.time()
        with self._translated(prefix):
            return sorted(
                (str(meta["path"]), now - meta["last_modified"].timestamp())
                for chunk in obstore.list(self._store, prefix or None)
                for meta in chunk
            )

    def delete(self, key: str) -> None:
        import obstore

        with self._translated(key), contextlib.suppress(FileNotFoundError):
            obstore.delete(self._store, key)

    @contextlib.contextmanager
    def _translated(self, key: str) -> Iterator[None]:
        from obstore.exceptions import (
            AlreadyExistsError,
            GenericError,
            NotFoundError,
            PermissionDeniedError,
            PreconditionError,
            UnauthenticatedError,
        )

        try:
            yield
        except (NotFoundError, FileNotFoundError) as exc:
            if s3_error_code(exc) == "NoSuchBucket":
                raise ArchiveBucketMissing(
                    f"{self.url}: bucket {self.bucket!r} does not exist", url=self.url
                ) from exc
            raise ObjectMissing(f"{self.url}: no object {key}", url=self.url, key=key) from exc
        except (PermissionDeniedError, UnauthenticatedError, PermissionError) as exc:
            raise ArchiveAccessDenied(
                f"{self.url}: access denied ({_first_line(exc)})", url=self.url
            ) from exc
        except (AlreadyExistsError, PreconditionError) as exc:
            raise ArchiveError(f"{self.url}: {key}: {_first_line(exc)}", url=self.url) from exc
        except (GenericError, OSError, RuntimeError) as exc:
            # The store's own classification first (obstore raises PermissionDenied and
            # Unauthenticated for 403 and 401); then S3's error code, the <Code> element of its
            # answer. Never a search of the whole text: it holds the URL, its port (40300),
            # object keys and timings ("114.314036ms").
            code = s3_error_code(exc)
            if code == "NoSuchBucket":
                raise ArchiveBucketMissing(
                    f"{self.url}: bucket {self.bucket!r} does not exist", url=self.url
                ) from exc
            if code in S3_ACCESS_CODES:
                raise ArchiveAccessDenied(
                    f"{self.url}: access denied ({_first_line(exc)})", url=self.url
                ) from exc
            raise ArchiveUnavailable(
                f"{self.url}: the store did not answer ({_first_line(exc)})", url=self.url
            ) from exc


def _check_segments(url: str, path: str) -> None:
    if any(segment in (".", "..") for segment in path.split("/")):
        raise InvalidArchiveUrl(f"{url!r}: an archive path may not hold '.' or '..'", url=url)
    if parsed_query := urllib.parse.urlparse(url).query:
        raise InvalidArchiveUrl(f"{url!r}: unexpected query {parsed_query!r}", url=url)


# S3 error codes that mean the credentials or policy refuse us (not retriable by waiting).
S3_ACCESS_CODES = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "AccountProblem",
    }
)
_S3_CODE = re.compile(r"<Code>([A-Za-z]+)</Code>")


def s3_error_code(exc: BaseException) -> str:
    """The error code of an S3 error answer carried by exc ("" if it carries none)."""
    found = _S3_CODE.search(str(exc))
    return found.group(1) if found else ""


def _file_version(st: os.stat_result) -> str:
    return f"{st.st_ino}:{st.st_mtime_ns}:{st.st_size}"


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
