"""Invariants that `python -O` cannot strip.

A bare `assert` vanishes under `-O`, and with it the check that a HW never moves back or that a
log start stays at or below the HW: the node would serve on with broken state. `invariant()`
always runs, and raises `InvariantBroken`, an AssertionError, which the node's fail-stop path
(node/failstop.py) turns into a stop, as TigerBeetle's assertions do. Where a check also narrows
a type for mypy, the code says `if not ...: raise InvariantBroken(...)` instead.
"""

from __future__ import annotations


class InvariantBroken(AssertionError):
    """A rule the design depends on was broken: the process must not go on as if it held."""


def invariant(condition: object, message: str = "") -> None:
    if not condition:
        raise InvariantBroken(message or "invariant broken")
