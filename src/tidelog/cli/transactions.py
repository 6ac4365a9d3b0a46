"""`tidelog transactions list|describe|abort|producers`: what the transaction coordinator knows,
what a partition's leader knows of its producers, and ending a hanging transaction (Kafka's
kafka-transactions.sh, KIP-664). A hanging transaction is
one left open by a producer that will not end it: it holds the last stable offset (LSO) of every
partition it wrote to, so read_committed readers wait. `abort` ends it through the coordinator,
at a new epoch (which fences its producer), and returns once every partition holds its ABORT
marker."""

from __future__ import annotations

import argparse
import datetime
import json
import time
from collections.abc import Callable
from typing import Any

from tidelog.cli.args import at_least
from tidelog.cli.connect import client_of
from tidelog.cli.tables import table_lines
from tidelog.client.async_client import AsyncClient
from tidelog.cluster_status import PartitionRow
from tidelog.errors import TidelogError

STATES = ("Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort")


def add_transactions_commands(
    sub: Any, with_bootstrap: Callable[[argparse.ArgumentParser], argparse.ArgumentParser]
) -> None:
    transactions = sub.add_parser(
        "transactions", help="transactions: list, describe, abort a hanging one"
    )
    verbs = transactions.add_subparsers(dest="verb", required=True)
    listing = with_bootstrap(
        verbs.add_parser("list", help="the transactional ids the coordinator knows")
    )
    listing.add_argument(
        "--state", action="append", choices=STATES, default=[], help="only these (repeatable)"
    )
    listing.add_argument(
        "--min-age-ms",
        type=at_least(0),
        default=-1,
        metavar="MS",
        help="only transactions open at least this long (hanging ones)",
    )
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=cmd_transactions_list)
    describe = with_bootstrap(
        verbs.add_parser("describe", help="one transactional id: its transaction and partitions")
    )
    describe.add_argument("transactional_id")
    describe.add_argument("--json", action="store_true")
    describe.set_defaults(func=cmd_transactions_describe)
    abort = with_bootstrap(
        verbs.add_parser(
            "abort",
            help="abort a hanging transaction (fences its producer; cluster admin)",
            description="Abort the open transaction of a transactional id through the "
            "coordinator: at a new epoch, which fences its producer, with an ABORT marker in "
            "every partition it wrote to. Returns once every marker is in, when the LSO of "
            "those partitions has moved on.",
        )
    )
    abort.add_argument("transactional_id")
    abort.add_argument("--no-wait", action="store_true", help="return once the abort is decided")
    abort.add_argument("--json", action="store_true")
    abort.set_defaults(func=cmd_transactions_abort)
    producers = with_bootstrap(
        verbs.add_parser(
            "producers",
            help="a partition's producers and their open transactions (its leader's view)",
        )
    )
    producers.add_argument("topic")
    producers.add_argument("partition", type=int)
    producers.add_argument("--json", action="store_true")
    producers.set_defaults(func=cmd_transactions_producers)


def cmd_transactions_list(args: argparse.Namespace) -> int:
    from tidelog.cli.args import run_loop

    async def run() -> list[dict[str, Any]]:
        async with client_of(args) as client:
            return await client.list_transactions(args.state, args.min_age_ms)

    listed = run_loop(run())
    if args.json:
        print(json.dumps([{**t, "open_for_ms": open_for_ms(t)} for t in listed], indent=1))
        return 0
    if not listed:
        print("no transactions")
        return 0
    rows = [
        (t["transactional_id"], t["producer_id"], t["epoch"], t["state"], age(t), partitions(t))
        for t in listed
    ]
    headings = ("TRANSACTIONAL ID", "PRODUCER", "EPOCH", "STATE", "OPEN FOR", "PARTITIONS")
    for line in table_lines(headings, rows, frozenset({1, 2})):
        print(line)
    return 0


def cmd_transactions_describe(args: argparse.Namespace) -> int:
    from tidelog.cli.args import run_loop

    async def run() -> dict[str, Any]:
        async with client_of(args) as client:
            return await client.describe_transaction(args.transactional_id)

    print_transaction(run_loop(run()), args.json)
    return 0


def cmd_transactions_abort(args: argparse.Namespace) -> int:
    from tidelog.cli.args import run_loop

    async def run() -> dict[str, Any]:
        async with client_of(args) as client:
            return await client.abort_transaction(args.transactional_id, not args.no_wait)

    txn = run_loop(run())
    if not args.json:
        done = "aborted" if txn["state"] == "CompleteAbort" else "abort decided"
        print(f"transactional id {txn['transactional_id']!r}: {done} (now epoch {txn['epoch']})")
    print_transaction(txn, args.json)
    return 0


def cmd_transactions_producers(args: argparse.Namespace) -> int:
    from tidelog.cli.args import run_loop

    async def run() -> list[dict[str, Any]]:
        async with client_of(args) as client:
            return await client.describe_producers(args.topic, args.partition)

    found = run_loop(run())
    if args.json:
        print(json.dumps(found, indent=1))
        return 0
    if not found:
        print(f"no producers in {args.topic}/{args.partition}")
        return 0
    now = int(time.time() * 1000)
    rows = [
        (
            p["producer_id"],
            p["producer_epoch"],
            p["last_sequence"],
            f"{max(0, now - int(p['last_timestamp_ms'])) / 1000:.1f}s",
            p["txn_start_offset"] if p["txn_start_offset"] >= 0 else "-",
        )
        for p in found
    ]
    headings = ("PRODUCER", "EPOCH", "LAST SEQUENCE", "LAST WRITE", "OPEN TRANSACTION FROM")
    for line in table_lines(headings, rows, frozenset({0, 1, 2, 4})):
        print(line)
    return 0


def open_for_ms(txn: dict[str, Any]) -> int | None:
    """How long its transaction has been open (by this machine's clock); None: nothing open."""
    started = int(txn.get("started_ms", 0))
    if not started or txn["state"] not in ("Ongoing", "PrepareCommit", "PrepareAbort"):
        return None
    return max(0, int(time.time() * 1000) - started)


def age(txn: dict[str, Any]) -> str:
    ms = open_for_ms(txn)
    return "-" if ms is None else f"{ms / 1000:.1f}s"


def partitions(txn: dict[str, Any]) -> str:
    named = [f"{t}/{p}" for t, ps in sorted(txn["partitions"].items()) for p in ps]
    return ", ".join(named) if named else "-"


def print_transaction(txn: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps({**txn, "open_for_ms": open_for_ms(txn)}, indent=1))
        return
    started = int(txn.get("started_ms", 0))
    began = (
        datetime.datetime.fromtimestamp(started / 1000, tz=datetime.UTC).isoformat()
        if started
        else "-"
    )
    print(f"transactional id  {txn['transactional_id']}")
    print(f"producer          {txn['producer_id']} epoch {txn['epoch']}")
    print(f"state             {txn['state']} (open for {age(txn)})")
    print(f"began             {began}")
    print(f"timeout           {txn['timeout_ms']} ms")
    print(f"owner             {txn.get('owner') or '-'}")
    print(f"partitions        {partitions(txn)}")
    for name, entry in sorted(txn.get("pending_offsets", {}).items()):
        positions = ", ".join(f"{p}: {o}" for p, o in sorted(entry["positions"].items()))
        print(f"pending cursor    {name} on {entry['topic']}: {positions}")


async def name_transaction_holds(client: AsyncClient, rows: list[PartitionRow]) -> None:
    """Give each `transaction` hold of the rows the transactional id whose open transaction it
    is (`transactional_id`): a partition leader knows only the producer id, and `tidelog
    transactions abort` takes the transactional id. Left out where the coordinator does not
    say (a transactional id this principal may not read, or a cluster before transactions)."""
    holds = [
        hold
        for row in rows
        for hold in row.low_watermark.get("holds", [])
        if hold.get("kind") == "transaction"
    ]
    if not holds:
        return
    try:
        known = await client.list_transactions()
    except TidelogError:
        return  # status still shows the producer id
    by_producer = {str(txn["producer_id"]): str(txn["transactional_id"]) for txn in known}
    for hold in holds:
        producer_id = str(hold.get("name", "")).removeprefix("producer ")
        if producer_id in by_producer:
            hold["transactional_id"] = by_producer[producer_id]
