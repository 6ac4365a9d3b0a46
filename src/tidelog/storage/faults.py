"""Crash points for tests of crash safety (FoundationDB's BUGGIFY, reduced to one switch).

A test starts a node with TIDELOG_CRASH_AT=<name>; when that point is reached the process dies
at once (os._exit, as abruptly as SIGKILL), and the test restarts it and checks the log.
Unset, a crash point costs one comparison.
"""

from __future__ import annotations

import os
import signal

_ARMED = os.environ.get("TIDELOG_CRASH_AT", "")
CRASH_EXIT_CODE = 86


def crash_point(name: str, *, with_parent: bool = False) -> None:
    """with_parent: kill the parent too (a Spark helper process takes its JVM down with it,
    as a machine crash would)."""
    if _ARMED and name == _ARMED:
        if with_parent:
            os.kill(os.getppid(), signal.SIGKILL)
        os._exit(CRASH_EXIT_CODE)
