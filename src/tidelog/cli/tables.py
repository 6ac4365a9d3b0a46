"""Tables the CLI prints (`status`, `cursors list`, `acl list`, ...), and `--watch`.

A column is as wide as its widest cell: nothing is ever cut. What is too long for a column (why a
hold holds, why a partition has no leader) goes on its own indented line under its row, whole."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

NOTE_INDENT = "    "


def table_lines(
    headings: Sequence[str],
    rows: Sequence[Sequence[object]],
    right: frozenset[int] = frozenset(),
    notes: Sequence[Sequence[str]] | None = None,
) -> list[str]:
    """Columns padded to their widest cell (numbers, the columns in `right`, to the right); the
    last column is not padded. notes[i]: lines printed under row i, indented."""
    cells = [[str(c) for c in headings], *([str(c) for c in row] for row in rows)]
    last = len(headings) - 1
    widths = [max(len(r[i]) for r in cells) for i in range(last)]

    def line(row: list[str]) -> str:
        padded = [
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=False))
        ]
        return "  ".join([*padded, row[last]]).rstrip()

    out = [line(cells[0])]
    for i, row in enumerate(cells[1:]):
        out.append(line(row))
        if notes is not None:
            out.extend(NOTE_INDENT + note for note in notes[i])
    return out


def add_watch_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--watch",
        nargs="?",
        type=float,
        const=2.0,
        metavar="SECONDS",
        help="print again every SECONDS (default 2) until Ctrl-C; with --json, one JSON "
        "document per line",
    )


async def show(
    render: Callable[[], Awaitable[tuple[Any, str]]], as_json: bool, watch: float | None
) -> None:
    """Print render()'s value as JSON or its text; with watch, again every `watch` seconds (on a
    terminal the screen is redrawn in place)."""
    if watch is None:
        value, text = await render()
        print(json.dumps(value, indent=2) if as_json else text)
        return
    if watch <= 0:
        raise SystemExit("--watch: SECONDS must be > 0")
    redraw = sys.stdout.isatty() and not as_json
    while True:  # until Ctrl-C: the caller's asyncio.run raises KeyboardInterrupt
        value, text = await render()
        if as_json:
            print(json.dumps(value), flush=True)
        else:
            stamp = time.strftime("%H:%M:%S")
            if redraw:
                sys.stdout.write("\x1b[H\x1b[2J")  # home, clear: redrawn in place
            print(f"every {watch:g}s, {stamp} (Ctrl-C stops)\n{text}\n", flush=True)
        await asyncio.sleep(watch)
