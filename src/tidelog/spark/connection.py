"""One tidelog client per Spark process, made on first use and never pickled: PySpark unpickles
a reader for every task and runs driver-side calls in long-lived runner processes."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

from tidelog.client.sync_client import Client
from tidelog.errors import TidelogError
from tidelog.invariant import InvariantBroken
from tidelog.tls import TlsFiles

log = logging.getLogger(__name__)
T = TypeVar("T")

_clients: dict[tuple[str, TlsFiles | None, str | None], Client] = {}
_lock = threading.Lock()


def client_for(bootstrap: str, tls: TlsFiles | None = None, token: str | None = None) -> Client:
    """tls: the options tls.ca, tls.cert, tls.key; the files are read where the client is made
    (the driver and each executor), so they must be at those paths there. token: the option
    token (NAME:SECRET)."""
    with _lock:
        client = _clients.get((bootstrap, tls, token))
        if client is None:
            client = Client(bootstrap, request_timeout_ms=20_000, tls=tls, token=token)
            _clients[(bootstrap, tls, token)] = client
        return client


class Endpoint(Protocol):
    """Where and how to connect: the source's and sink's options, and each planned range."""

    @property
    def bootstrap(self) -> str: ...
    @property
    def tls(self) -> TlsFiles | None: ...
    @property
    def token(self) -> str | None: ...


def client_of(where: Endpoint) -> Client:
    return client_for(where.bootstrap, where.tls, where.token)


def with_retries(what: str, call: Callable[[], T], attempts: int = 8, delay_s: float = 0.25) -> T:
    """Driver-side calls retry transient errors themselves: an exception in latestOffset or
    commit ends the whole query at once."""
    last: TidelogError | None = None
    for attempt in range(attempts):
        try:
            return call()
        except TidelogError as exc:
            if not exc.retriable:
                raise
            last = exc
            log.warning("%s failed (%s); retrying", what, exc)
            time.sleep(delay_s * (attempt + 1))
    if last is None:
        raise InvariantBroken("last is not None")
    raise last
