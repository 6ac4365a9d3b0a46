"""`tidelog principals add|list|remove` and `tidelog acl add|list|remove`: who authenticates, and
what each principal may do (tidelog/acls.py). Both live in the metadata log."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from tidelog.cli.connect import client_of
from tidelog.cli.tables import table_lines
from tidelog.node.quotas import check_limits

RESOURCE_HELP = (
    "exactly one of --topic, --topic-prefix, --group, --group-prefix, --transactional-id, "
    "--transactional-id-prefix, --cluster"
)


def add_access_commands(sub: Any, with_bootstrap: Any) -> None:
    principals = sub.add_parser(
        "principals", help="add, list and remove principals (who authenticates with a token)"
    )
    psub = principals.add_subparsers(dest="principals_command")
    padd = with_bootstrap(
        psub.add_parser(
            "add",
            help="add a principal (or give it a new token); prints its token NAME:SECRET once",
        )
    )
    padd.add_argument("name")
    padd.set_defaults(func=cmd_principals)
    plist = with_bootstrap(psub.add_parser("list", help="every principal (never a secret)"))
    plist.add_argument("--json", action="store_true")
    plist.set_defaults(func=cmd_principals)
    premove = with_bootstrap(
        psub.add_parser("remove", help="remove a principal: its token stops working")
    )
    premove.add_argument("name")
    premove.set_defaults(func=cmd_principals)

    acl = sub.add_parser(
        "acl",
        help="grant, list and revoke permissions: read, write, admin on topics, groups and "
        "transactional ids; cluster admin",
    )
    asub = acl.add_subparsers(dest="acl_command")
    for name, text in (
        ("add", "grant PRINCIPAL a permission (read, write, admin) on a resource"),
        ("remove", "revoke an ACL (named as it was added)"),
    ):
        parser = with_bootstrap(asub.add_parser(name, help=text))
        parser.add_argument(
            "principal",
            help="a token principal's name, a certificate subject (CN=...), * for every "
            "authenticated principal, or anonymous",
        )
        parser.add_argument("permission", choices=["read", "write", "admin"])
        add_resource_arguments(parser)
        parser.set_defaults(func=cmd_acl)
    alist = with_bootstrap(asub.add_parser("list", help="every ACL, or one principal's"))
    alist.add_argument("--principal")
    alist.add_argument("--json", action="store_true")
    alist.set_defaults(func=cmd_acl)

    quotas = sub.add_parser(
        "quotas",
        help="limit a principal's rates per node: over them it is slowed, not refused",
    )
    qsub = quotas.add_subparsers(dest="quotas_command")
    qset = with_bootstrap(
        qsub.add_parser("set", help="set a principal's limits (replaces the ones it had)")
    )
    qset.add_argument("principal", help="a principal, or * for every one without its own")
    qset.add_argument(
        "limits",
        nargs="+",
        metavar="KEY=RATE",
        help="producer_byte_rate=BYTES/S, consumer_byte_rate=BYTES/S, "
        "admin_request_rate=REQUESTS/S (Kafka's names)",
    )
    qset.set_defaults(func=cmd_quotas)
    qlist = with_bootstrap(qsub.add_parser("list", help="every quota"))
    qlist.add_argument("--json", action="store_true")
    qlist.set_defaults(func=cmd_quotas)
    qremove = with_bootstrap(qsub.add_parser("remove", help="remove a principal's quota"))
    qremove.add_argument("principal")
    qremove.set_defaults(func=cmd_quotas)


def cmd_principals(args: argparse.Namespace) -> int:
    from tidelog.cli.args import run_loop

    async def run() -> int:
        async with client_of(args) as client:
            if args.principals_command == "add":
                print(await client.add_principal(args.name))
                print(
                    f"principal {args.name}: keep this token; it is not shown again",
                    file=sys.stderr,
                )
            elif args.principals_command == "remove":
                acls = await client.remove_principal(args.name)
                print(
                    f"removed principal {args.name}: its token no longer works, its sessions "
                    f"ended, and its {acls} ACL{'s' if acls != 1 else ''} went with it"
                )
            else:
                found = await client.principals()
                print_listing(
                    found,
                    args.json,
                    ("PRINCIPAL", "CREATED"),
                    lambda p: (p["name"], created(p["created_ms"])),
                )
        return 0

    return run_loop(run())


def cmd_quotas(args: argparse.Namespace) -> int:
    from tidelog.cli.args import parse_kv, run_loop

    async def run() -> int:
        async with client_of(args) as client:
            if args.quotas_command == "set":
                limits = check_limits(parse_kv(args.limits, "quotas set"))
                print(json.dumps(await client.set_quota(args.principal, limits)))
            elif args.quotas_command == "remove":
                await client.remove_quota(args.principal)
            else:
                print_listing(
                    await client.quotas(),
                    args.json,
                    ("PRINCIPAL", "LIMITS"),
                    lambda q: (
                        q["principal"],
                        ", ".join(f"{k}={v:g}" for k, v in sorted(q["limits"].items())),
                    ),
                )
        return 0

    return run_loop(run())


def created(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000))


def print_listing(
    found: list[dict[str, Any]],
    as_json: bool,
    headings: tuple[str, ...],
    row: Callable[[dict[str, Any]], tuple[str, ...]],
) -> None:
    """JSON, or a table whose columns are as wide as their widest cell (nothing is cut)."""
    if as_json:
        print(json.dumps(found))
        return
    print("\n".join(table_lines(headings, [row(item) for item in found])))


def describe_acl(acl: dict[str, Any]) -> str:
    if acl["resource"] == "cluster":
        return "cluster"
    kind = acl["resource"]
    return f"{kind} {acl['name']}*" if acl["pattern"] == "prefix" else f"{kind} {acl['name']}"


def add_resource_arguments(parser: argparse.ArgumentParser) -> None:
    """What an ACL is on: exactly one resource."""
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--topic", help="one topic")
    where.add_argument("--topic-prefix", help="every topic whose name starts with this")
    where.add_argument("--group", help="one Kafka consumer group (read: use it; admin: delete it)")
    where.add_argument("--group-prefix", help="every group whose name starts with this")
    where.add_argument(
        "--transactional-id", help="one Kafka transactional id (write: use it; read: describe it)"
    )
    where.add_argument(
        "--transactional-id-prefix", help="every transactional id starting with this"
    )
    where.add_argument(
        "--cluster", action="store_true", help="the cluster (admin only: everything)"
    )


def cmd_acl(args: argparse.Namespace) -> int:
    from tidelog.cli.args import run_loop

    async def run() -> int:
        async with client_of(args) as client:
            if args.acl_command in ("add", "remove"):
                change = client.add_acl if args.acl_command == "add" else client.remove_acl
                await change(
                    args.principal,
                    args.permission,
                    args.topic,
                    prefix=args.topic_prefix,
                    cluster=args.cluster,
                    group=args.group,
                    group_prefix=args.group_prefix,
                    transactional_id=args.transactional_id,
                    transactional_id_prefix=args.transactional_id_prefix,
                )
                return 0
            print_listing(
                await client.acls(args.principal),
                args.json,
                ("PRINCIPAL", "PERMISSION", "RESOURCE"),
                lambda a: (a["principal"], a["permission"], describe_acl(a)),
            )
        return 0

    return run_loop(run())
