"""`tidelog features describe|upgrade|downgrade`: the cluster's finalized feature level and each
node's supported range, and finalizing another level (Kafka's kafka-features.sh; the rules are
tidelog/features.py's, the procedure docs/operations.md's "Feature levels and upgrades")."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from tidelog.cli.connect import client_of
from tidelog.cli.tables import table_lines
from tidelog.protocol import api


def exit_status_epilog(verb: str) -> str:
    """What a script reads from `upgrade` and `downgrade` (docs/operations.md says the same)."""
    return (
        "Exit status 0 when the cluster is finalized at the level asked for afterwards, "
        'whether this command finalized it (--json: "changed": true) or it already was '
        f"(\"changed\": false, and it says 'nothing to {verb}'), so the step can be run "
        "again; 1 when it is refused (a node not live or not supporting the level, a level "
        "that allows no downgrade, a level that does not exist)."
    )


def add_features_commands(
    sub: Any, with_bootstrap: Callable[[argparse.ArgumentParser], argparse.ArgumentParser]
) -> None:
    features = sub.add_parser(
        "features", help="the cluster's feature levels: describe, upgrade, downgrade"
    )
    verbs = features.add_subparsers(dest="verb", required=True)
    describe = with_bootstrap(
        verbs.add_parser(
            "describe",
            help="the finalized level of tidelog.version and the range each node supports",
        )
    )
    describe.add_argument("--json", action="store_true")
    describe.set_defaults(func=cmd_features_describe)
    upgrade = with_bootstrap(
        verbs.add_parser(
            "upgrade",
            help="finalize a higher level, once every node is live and supports it",
            description="Finalize a higher level of tidelog.version, once every registered "
            "node is live and supports it.",
            epilog=exit_status_epilog("upgrade"),
        )
    )
    upgrade.add_argument(
        "--to",
        type=int,
        default=0,
        metavar="N",
        help="the level (default: the highest every node supports)",
    )
    upgrade.add_argument("--json", action="store_true")
    upgrade.set_defaults(func=cmd_features_update, downgrade=False)
    downgrade = with_bootstrap(
        verbs.add_parser(
            "downgrade",
            help="finalize a lower level, where every level passed over allows it (level 2 "
            "does not: downgrade binaries before finalizing instead)",
            description="Finalize a lower level of tidelog.version, where every level passed "
            "over allows going back (level 2 does not: downgrade binaries before finalizing "
            "instead).",
            epilog=exit_status_epilog("downgrade"),
        )
    )
    downgrade.add_argument(
        "--to", type=int, default=0, metavar="N", help="the level (default: one lower)"
    )
    downgrade.add_argument("--json", action="store_true")
    downgrade.set_defaults(func=cmd_features_update, downgrade=True)


def cmd_features_describe(args: argparse.Namespace) -> int:
    from tidelog.cli.args import run_loop

    async def run() -> api.FeaturesResponse:
        async with client_of(args) as client:
            return await client.describe_features()

    print_features(run_loop(run()), args.json)
    return 0


def cmd_features_update(args: argparse.Namespace) -> int:
    from tidelog.cli.args import run_loop

    async def run() -> api.FeaturesResponse:
        async with client_of(args) as client:
            return await client.update_features(args.to, args.downgrade)

    answer = run_loop(run())
    if not args.json:
        if answer.changed:
            verb = "downgraded" if args.downgrade else "upgraded"
            print(f"{answer.feature} {verb}: finalized at {answer.finalized_level}")
        else:
            verb = "downgrade" if args.downgrade else "upgrade"
            print(
                f"{answer.feature} is already finalized at level {answer.finalized_level}; "
                f"nothing to {verb}"
            )
    print_features(answer, args.json)
    return 0  # also when nothing changed: the cluster is where it was asked to be


def print_features(answer: api.FeaturesResponse, as_json: bool) -> None:
    if as_json:
        print(json.dumps(api.encode(answer), indent=1))
        return
    recorded = "" if answer.recorded else " (no level recorded: a cluster from before levels)"
    print(f"{answer.feature} finalized at level {answer.finalized_level}{recorded}")
    rows = [
        (
            n["node_id"],
            f"{n['min_level']}-{n['max_level']}" if n["max_level"] >= 0 else "unknown",
            "yes" if n["live"] else "NO",
        )
        for n in answer.nodes
    ]
    for line in table_lines(("NODE", "SUPPORTS", "LIVE"), rows, frozenset({0})):
        print(line)
    if answer.upgradable_to > answer.finalized_level:
        print(f"every node supports level {answer.upgradable_to}: `tidelog features upgrade`")
    print("levels:")
    for level in answer.levels:
        back = "" if level["downgrade_safe"] else " (no downgrade from it)"
        print(f"  {level['level']}: {level['meaning']}{back}")
