"""What several CLI commands parse and run the same way: KEY=VALUE lists, TOPIC/PARTITION,
counts, and the event loop a command runs on."""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from tidelog.errors import InvalidRequest, TidelogError

T = TypeVar("T")


def run_loop(main: Coroutine[Any, Any, T], event_loop: str = "uvloop") -> T:
    """asyncio.run, on uvloop's loop unless asyncio's is asked for (or uvloop is missing)."""
    if event_loop not in ("uvloop", "asyncio"):
        raise TidelogError(f"event_loop must be asyncio or uvloop, not {event_loop!r}")
    if event_loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            logging.getLogger(__name__).warning("uvloop is not installed; using asyncio's loop")
        else:
            return uvloop.run(main)
    return asyncio.run(main)


def at_least(low: int) -> Callable[[str], int]:
    """An argparse type: a whole number, low or more (argparse names the flag in its error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be {low} or more, not {value}")
        return value

    return parse


def parse_kv(items: list[str], flag: str = "--config") -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise TidelogError(f"{flag} expects KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def parse_partition(text: str) -> tuple[str, int]:
    topic, sep, part = text.rpartition("/")
    if not sep or not topic or not part.isdigit():
        raise InvalidRequest(f"expected TOPIC/PARTITION (e.g. events/0), got {text!r}")
    return topic, int(part)
