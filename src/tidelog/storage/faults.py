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


def crash_point(name: str) -> None:
    """With TIDELOG_CRASH_GROUP=<pgid> the whole process group dies (a Spark helper process
    takes its driver and JVM down with it, as a machine crash would); "own" is the crashing
    process's own group (a Spark Connect server and the Python workers it forked)."""
    if _ARMED and name == _ARMED:
        group = os.environ.get("TIDELOG_CRASH_GROUP", "")
        if group:
            os.killpg(os.getpgrp() if group == "own" else int(group), signal.SIGKILL)
        os._exit(CRASH_EXIT_CODE)
