"""Fail-stop: a node whose invariant failed stops at once, so that the other replicas take over.

An AssertionError anywhere in the node means its state broke a rule the design depends on (a HW
that went back, a log start above the HW, a torn append). Answering an error and serving on, as
a catch-all `except Exception` would, lets a replica with broken state keep voting, acknowledging
and serving reads. TigerBeetle's rule instead: crash, and let the cluster route around the node.
Every catch-all in the node hands what it caught to check(); only invariant failures trip, and
a committed record this node cannot read (UnsupportedFormatVersion: applying the log on without
it would be a misread, as Kafka stops on a metadata record of an unknown version).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from tidelog.errors import UnsupportedFormatVersion

log = logging.getLogger(__name__)

EXIT_CODE = 70  # EX_SOFTWARE: what `tidelog serve` exits with after a fail-stop


class FailStop:
    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self.failed: BaseException | None = None
        self.where = ""
        self.on_trip: Callable[[BaseException], None] | None = None

    def check(self, exc: BaseException, where: str) -> None:
        """Trip on an invariant failure or an unreadable format version; anything else is left
        to the caller."""
        if isinstance(exc, AssertionError | UnsupportedFormatVersion):
            self.trip(exc, where)

    def trip(self, exc: BaseException, where: str) -> None:
        if self.failed is not None:
            return
        self.failed, self.where = exc, where
        what = (
            "cannot read what it must"
            if isinstance(exc, UnsupportedFormatVersion)
            else ("an invariant failed")
        )
        log.critical(
            "node %d: %s in %s: %s; the node stops now (fail-stop) so that the other "
            "replicas take over",
            self.node_id,
            what,
            where,
            exc if isinstance(exc, UnsupportedFormatVersion) else repr(exc),
            exc_info=exc,
        )
        if self.on_trip is not None:
            self.on_trip(exc)
