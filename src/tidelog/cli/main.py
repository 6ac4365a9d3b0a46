"""The `tidelog` command line."""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import logging
import os
import signal
import stat
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from tidelog.cli.access import add_access_commands
from tidelog.cli.archive import add_archive_commands
from tidelog.cli.args import at_least, parse_kv, run_loop
from tidelog.cli.cluster import add_cluster_commands
from tidelog.cli.connect import add_connection_options, add_tls_options, client_of
from tidelog.cli.demo import add_demo_command
from tidelog.cli.elect import add_partitions_command
from tidelog.cli.features import add_features_commands
from tidelog.cli.progress import Progress
from tidelog.cli.tables import add_watch_option, show, table_lines
from tidelog.cli.transactions import add_transactions_commands, name_transaction_holds
from tidelog.client.async_client import AsyncClient
from tidelog.client.producer import Producer
from tidelog.cluster_status import PartitionRow, partition_rows
from tidelog.errors import TidelogError
from tidelog.logs import FORMATS
from tidelog.logs import configure as configure_logs
from tidelog.node.failstop import EXIT_CODE as FAIL_STOP_EXIT_CODE
from tidelog.protocol.api import CONSISTENCIES, LINEARIZABLE
from tidelog.record.batch import Record
from tidelog.replication.metadata import METADATA_TOPIC
from tidelog.version import version_line

DEFAULT_BOOTSTRAP = "127.0.0.1:7100"
COMMIT_EVERY_S = 0.5  # how often `consume --cursor` commits while it reads (and after it idles)
LAST_COMMIT_S = 10.0  # how long its commit on the way out (Ctrl-C, SIGTERM, an error) may take


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    configure_logs(
        str(getattr(args, "log_level", "WARNING")), str(getattr(args, "log_format", "text"))
    )
    try:
        result = args.func(args)
        return int(result or 0)
    except TidelogError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tidelog", description="A replicated, segmented commit log."
    )
    parser.add_argument(
        "--version", action=VersionAction, help="print the version and the commit, and exit"
    )
    sub = parser.add_subparsers(dest="command")
    add_serve_command(sub)
    add_cluster_commands(sub, with_bootstrap)
    add_topic_commands(sub)
    add_record_commands(sub)
    add_cursor_commands(sub)
    add_table_commands(sub)
    add_status_commands(sub)
    add_partitions_command(sub, with_bootstrap)
    add_access_commands(sub, with_bootstrap)
    add_dev_certs_command(sub)
    add_archive_commands(sub, with_bootstrap)
    add_features_commands(sub, with_bootstrap)
    add_transactions_commands(sub, with_bootstrap)
    add_demo_command(sub)
    return parser


class VersionAction(argparse.Action):
    """`--version`: the version and the commit it was built from. The commit is looked up only
    when asked (in a checkout that runs git), not each time the parser is built."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        print(version_line())
        parser.exit()


def with_bootstrap(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """A command that talks to a cluster: where, how (TLS, a token), and its log output."""
    p.add_argument(
        "--bootstrap",
        default=os.environ.get("TIDELOG_BOOTSTRAP", DEFAULT_BOOTSTRAP),
        help="HOST:PORT[,HOST:PORT...] of any node (env TIDELOG_BOOTSTRAP)",
    )
    add_connection_options(p)
    p.add_argument("--log-level", default="WARNING")
    p.add_argument("--log-format", choices=FORMATS, default="text")
    return p


def add_serve_command(sub: Any) -> None:
    """`tidelog serve`: run a node."""
    serve = sub.add_parser("serve", help="run a node")
    serve.add_argument("--data", help="data directory")
    serve.add_argument("--listen", help="HOST:PORT for clients (default 127.0.0.1:7100)")
    serve.add_argument(
        "--kafka-listen",
        help="HOST:PORT where the node also speaks the Kafka protocol, for Kafka clients and "
        "tools (default: no Kafka listener)",
    )
    serve.add_argument(
        "--kafka-advertised",
        help="HOST:PORT Kafka clients are told to connect to (default: the --kafka-listen address)",
    )
    serve.add_argument(
        "--http-listen",
        help="HOST:PORT for Prometheus's /metrics and the web console at / (default: none; "
        "port 0 picks a free one)",
    )
    serve.add_argument(
        "--archive",
        help="where topics with remote.storage.enable=true are archived: file:///DIR or "
        "s3://BUCKET/PREFIX (credentials and region from the AWS environment variables)",
    )
    serve.add_argument(
        "--archive-endpoint",
        help="URL of an S3-compatible store for an s3:// archive (default: AWS_ENDPOINT_URL, "
        "else AWS)",
    )
    serve.add_argument(
        "--peer-listen",
        help="HOST:PORT of the peer channel, where nodes replicate (default: the --listen host, "
        "a port of its own)",
    )
    add_membership_options(serve)
    serve.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a node setting, e.g. max.connections=1000, max.connections.per.ip, "
        "queued.max.request.bytes, socket.request.max.bytes, connections.max.idle.ms, "
        "request.receive.timeout.ms, max.inflight.requests.per.connection, fd.reserve",
    )
    add_access_options(serve)
    serve.add_argument("--config", type=Path, help="TOML file with the same keys")
    serve.add_argument(
        "--event-loop",
        choices=["uvloop", "asyncio"],
        help="uvloop (default: fastest here) or asyncio (sends fetches with sendfile)",
    )
    serve.add_argument("--log-level", default="INFO")
    serve.add_argument(
        "--log-format",
        choices=FORMATS,
        default="text",
        help="json: one JSON object per line, with event names and fields for elections, "
        "truncations, cursor invalidations, cleaner deletions and StorageFull",
    )
    serve.set_defaults(func=cmd_serve)


def add_access_options(serve: argparse.ArgumentParser) -> None:
    """Who may reach the node and do what: TLS, client certificates, ACLs, super users."""
    add_tls_options(serve, env=False)
    serve.add_argument(
        "--tls-client-auth",
        choices=["none", "requested", "required"],
        help="with TLS: whether client listeners ask clients for a certificate signed by "
        "--tls-ca (Kafka's ssl.client.auth; default none). Between nodes TLS is always mutual",
    )
    serve.add_argument(
        "--authorization",
        choices=["none", "acl"],
        help="acl: every request needs a permission granted by `tidelog acl` (or a super "
        "user); none (default): every client may do everything",
    )
    serve.add_argument(
        "--super-user",
        action="append",
        help="a principal that may do everything (a token name or a certificate subject such "
        "as CN=admin; repeatable; Kafka's super.users)",
    )
    serve.add_argument(
        "--admin-token-file",
        type=Path,
        help="a file holding NAME:SECRET: a super user's token this node accepts by itself, "
        "for a new cluster's first admin",
    )
    serve.add_argument(
        "--insecure",
        action="store_true",
        help="listen beyond loopback without TLS and ACLs: anyone who can connect may do anything",
    )


def add_membership_options(serve: argparse.ArgumentParser) -> None:
    """Which node this is, which cluster it belongs to, and how it proves it."""
    serve.add_argument("--node-id", type=int)
    serve.add_argument(
        "--peers",
        help="ID=HOST:PORT[/PEER_PORT],... static cluster membership (client addresses; a "
        "fixed peer-channel port after the slash)",
    )
    serve.add_argument(
        "--join",
        metavar="HOST:PORT[,HOST:PORT...]",
        help="join a running cluster (after `tidelog cluster add-node`) through any of its "
        "nodes, instead of --peers; needed at the first start only",
    )
    serve.add_argument(
        "--cluster-id",
        help="the cluster this node belongs to: a data directory formatted for another is "
        "refused (default: the one in the data directory, or the one its peers agree on)",
    )
    serve.add_argument(
        "--cluster-secret-file",
        help="file holding the secret every node proves it knows before it may replicate "
        "(or env TIDELOG_CLUSTER_SECRET)",
    )


def add_topic_commands(sub: Any) -> None:
    """`tidelog topics create|list|describe|delete|alter|add-partitions`."""
    topics = sub.add_parser("topics", help="create, list, describe, alter, grow and delete topics")
    tsub = topics.add_subparsers(dest="topics_command")
    create = with_bootstrap(tsub.add_parser("create", help="create a topic"))
    create.add_argument("name")
    create.add_argument("--partitions", type=int, default=1)
    create.add_argument(
        "--replication-factor",
        type=int,
        default=-1,
        help="copies of each partition (default: min(3, nodes), the cluster's default)",
    )
    create.add_argument("--kind", choices=["stream", "table"], default="stream")
    create.add_argument("--config", action="append", default=[], metavar="KEY=VALUE")
    create.set_defaults(func=cmd_topics_create)
    lst = with_bootstrap(tsub.add_parser("list", help="list topics"))
    lst.set_defaults(func=cmd_topics_list)
    desc = with_bootstrap(tsub.add_parser("describe", help="describe a topic"))
    desc.add_argument("name")
    desc.set_defaults(func=cmd_topics_describe)
    delete = with_bootstrap(
        tsub.add_parser("delete", help="delete a topic: its data on every replica, its cursors")
    )
    delete.add_argument("name")
    delete.add_argument(
        "--force", action="store_true", help="delete even though backup cursors hold it"
    )
    delete.set_defaults(func=cmd_topics_delete)
    alter = with_bootstrap(tsub.add_parser("alter", help="change a topic's configs, live"))
    alter.add_argument("name")
    alter.add_argument("--config", action="append", default=[], metavar="KEY=VALUE")
    alter.add_argument(
        "--delete-config", action="append", default=[], metavar="KEY", help="back to the default"
    )
    alter.set_defaults(func=cmd_topics_alter)
    grow = with_bootstrap(
        tsub.add_parser("add-partitions", help="grow a stream topic to N partitions")
    )
    grow.add_argument("name")
    grow.add_argument("--partitions", type=int, required=True, help="the new total")
    grow.set_defaults(func=cmd_topics_add_partitions)


def add_record_commands(sub: Any) -> None:
    """`tidelog produce` and `tidelog consume`."""
    produce = with_bootstrap(
        sub.add_parser("produce", help="produce lines from stdin (or --file), one record each")
    )
    produce.add_argument("topic")
    produce.add_argument(
        "--file", type=Path, help="read lines from FILE instead of stdin (progress shows how far)"
    )
    produce.add_argument("--partition", type=int)
    produce.add_argument("--acks", default="all", choices=["0", "1", "all", "-1"])
    produce.add_argument("--key-separator", help="split each line into KEY<SEP>VALUE")
    produce.add_argument("--print-offsets", action="store_true")
    produce.add_argument("--linger-ms", type=int, default=5)
    produce.add_argument("--batch-bytes", type=int, default=256 * 1024)
    produce.set_defaults(func=cmd_produce)

    consume = with_bootstrap(sub.add_parser("consume", help="print records"))
    consume.add_argument("topic")
    consume.add_argument("--partition", type=int)
    consume.add_argument("--from", dest="start", default="earliest", help="earliest|latest|OFFSET")
    consume.add_argument("--max", type=at_least(1), dest="max_records")
    consume.add_argument("--format", choices=["text", "json"], default="text")
    consume.add_argument("--follow", action="store_true")
    consume.add_argument("--reset", choices=["earliest", "latest", "none"], default="earliest")
    consume.add_argument("--replica-read", action="store_true", help="allow reads from followers")
    consume.add_argument("--node", type=int, help="with --replica-read: read from this replica")
    consume.add_argument("--cursor", help="resume from this durable cursor and commit as it goes")
    consume.add_argument(
        "--consistent",
        action="store_true",
        help="the end (the HW when it began) and --from latest are confirmed by a majority, "
        "never a deposed leader's",
    )
    consume.add_argument(
        "--skip-invalid",
        action="store_true",
        help="pass over batches that cannot be read (see `tidelog status`) with a warning",
    )
    consume.add_argument(
        "--isolation-level",
        choices=["read_uncommitted", "read_committed"],
        default="read_uncommitted",
        help="read_committed: stop at the last stable offset and leave out what aborted "
        "transactions wrote (--from latest is the LSO)",
    )
    consume.set_defaults(func=cmd_consume)


def add_cursor_commands(sub: Any) -> None:
    """`tidelog cursors create|commit|list|describe|delete`."""
    cursors = sub.add_parser("cursors", help="durable consumer positions that hold the log")
    csub = cursors.add_subparsers(dest="cursors_command")
    ccreate = with_bootstrap(csub.add_parser("create", help="create a cursor"))
    ccreate.add_argument("name")
    ccreate.add_argument("--topic", required=True)
    ccreate.add_argument("--from", dest="start", default="earliest", help="earliest|latest|OFFSET")
    ccreate.add_argument("--backup", action="store_true", help="a backup/archive reader")
    ccreate.set_defaults(func=cmd_cursors)
    for verb in ("list", "describe", "delete"):
        c = with_bootstrap(csub.add_parser(verb, help=f"{verb} cursors"))
        if verb != "list":
            c.add_argument("name")
        if verb != "delete":
            c.add_argument("--json", action="store_true")
            add_watch_option(c)
        c.set_defaults(func=cmd_cursors)


def add_table_commands(sub: Any) -> None:
    """`tidelog table get|scan`."""
    table = sub.add_parser("table", help="read a table topic's committed state")
    tsub2 = table.add_subparsers(dest="table_command")
    tget = with_bootstrap(tsub2.add_parser("get", help="one key's committed value"))
    tget.add_argument("topic")
    tget.add_argument("key")
    tget.set_defaults(func=cmd_table)
    tscan = with_bootstrap(tsub2.add_parser("scan", help="every committed key and value"))
    tscan.add_argument("topic")
    tscan.add_argument("--json", action="store_true")
    tscan.set_defaults(func=cmd_table)
    for parser in (tget, tscan):
        parser.add_argument(
            "--consistency",
            choices=CONSISTENCIES,
            default=LINEARIZABLE,
            help="linearizable (default: the latest acknowledged write), lease (no round trip; "
            "assumes bounded clock drift) or serializable (the replica's state, maybe stale)",
        )


def add_status_commands(sub: Any) -> None:
    """`tidelog delete-records` and `tidelog status`."""
    delete = with_bootstrap(sub.add_parser("delete-records", help="move a partition's log start"))
    delete.add_argument("topic")
    delete.add_argument("--partition", type=int, required=True)
    delete.add_argument("--before", type=int, required=True, help="new log start (-1: the HW)")
    delete.add_argument("--force", action="store_true", help="invalidate cursors in the way")
    delete.set_defaults(func=cmd_delete_records)

    status = with_bootstrap(sub.add_parser("status", help="partition watermarks and sizes"))
    status.add_argument("topic", nargs="?")
    status.add_argument("--json", action="store_true")
    add_watch_option(status)
    status.set_defaults(func=cmd_status)


def add_dev_certs_command(sub: Any) -> None:
    """`tidelog dev-certs`: a local CA and certificates to try TLS with."""
    certs = sub.add_parser(
        "dev-certs",
        help="make a local CA and node/client certificates to try TLS with (not for production)",
    )
    certs.add_argument("dir", type=Path, help="where the PEM files go (the CA is reused)")
    certs.add_argument(
        "--host",
        action="append",
        help="a host name or address the node certificate is valid for (repeatable; default "
        "localhost, 127.0.0.1, ::1)",
    )
    certs.add_argument(
        "--client",
        action="append",
        help="a client certificate with subject CN=NAME (repeatable; default: admin)",
    )
    certs.set_defaults(func=cmd_dev_certs)


# -- serve --------------------------------------------------------------------------------------


def cmd_dev_certs(args: argparse.Namespace) -> int:
    from tidelog.devcerts import DEFAULT_HOSTS, client_principal, make_dev_certs

    clients = args.client or ["admin"]
    written = make_dev_certs(args.dir, args.host or DEFAULT_HOSTS, clients)
    for path in written:
        print(path)
    for name in clients:
        print(f"client-{name}.pem is principal {client_principal(name)!r}", file=sys.stderr)
    print(
        f"serve with: --tls-cert {args.dir}/node.pem --tls-key {args.dir}/node.key "
        f"--tls-ca {args.dir}/ca.pem; connect with: --tls-ca {args.dir}/ca.pem",
        file=sys.stderr,
    )
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from tidelog.node.allocator import tune_allocator
    from tidelog.node.config import load_toml, node_config_from
    from tidelog.node.server import Node

    tune_allocator()
    # Everything the node makes (logs, metadata with its token hashes, snapshots, a file://
    # archive) is its own: 0600 files in 0700 directories.
    os.umask(0o077)
    values: dict[str, Any] = load_toml(args.config) if args.config else {}
    values.update(parse_kv(args.set, "--set"))
    for key, value in (
        ("data", args.data),
        ("listen", args.listen),
        ("peer_listen", args.peer_listen),
        ("kafka_listen", args.kafka_listen),
        ("kafka_advertised", args.kafka_advertised),
        ("http_listen", args.http_listen),
        ("archive", args.archive),
        ("archive_endpoint", args.archive_endpoint),
        ("node_id", args.node_id),
        ("peers", args.peers),
        ("join", args.join),
        ("cluster_secret_file", args.cluster_secret_file),
        ("cluster_id", args.cluster_id),
        ("event_loop", args.event_loop),
        ("tls_ca", args.tls_ca),
        ("tls_cert", args.tls_cert),
        ("tls_key", args.tls_key),
        ("tls_client_auth", args.tls_client_auth),
        ("authorization", args.authorization),
        ("super_users", args.super_user),
        ("admin_token_file", args.admin_token_file),
        ("insecure", args.insecure or None),
    ):
        if value is not None:
            values[key] = value
    config = node_config_from(values)

    async def run() -> None:
        node = Node(config)
        await node.start()
        loop = asyncio.get_running_loop()
        # A second signal cuts the hand-overs short (Node.stop); the loop keeps only weak
        # references to tasks, so these are held here until done.
        stopping: set[asyncio.Task[None]] = set()

        def stop() -> None:
            task = loop.create_task(node.stop())
            stopping.add(task)
            task.add_done_callback(stopping.discard)

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop)
        print(
            f"tidelog node {node.node_id} listening on {node.address[0]}:{node.address[1]} "
            f"(peers on {node.peer_address[0]}:{node.peer_address[1]}"
            + (f", Kafka on {node.core.kafka_address}" if node.core.kafka_address else "")
            + ")",
            flush=True,
        )
        await node.serve_forever()
        if node.failed is not None:
            logging.shutdown()
            sys.stdout.flush()
            os._exit(FAIL_STOP_EXIT_CODE)  # a crash, as fail-stop means: nothing runs after it

    run_loop(run(), values.get("event_loop") or os.environ.get("TIDELOG_EVENT_LOOP", "uvloop"))
    return 0


# -- topics -------------------------------------------------------------------------------------


def cmd_topics_create(args: argparse.Namespace) -> int:
    async def run() -> None:
        async with client_of(args) as client:
            info = await client.create_topic(
                args.name,
                args.partitions,
                args.replication_factor,
                parse_kv(args.config),
                args.kind,
            )
            chosen = " (the default: min(3, nodes))" if args.replication_factor == -1 else ""
            print(
                f"created topic {info.name} with {info.partitions} partitions, "
                f"replication factor {info.replication_factor}{chosen}"
            )

    asyncio.run(run())
    return 0


def cmd_topics_list(args: argparse.Namespace) -> int:
    async def run() -> None:
        async with client_of(args) as client:
            for info in await client.list_topics():
                print(info.name)

    asyncio.run(run())
    return 0


def cmd_topics_describe(args: argparse.Namespace) -> int:
    async def run() -> None:
        async with client_of(args) as client:
            info = await client.topic(args.name, refresh=True)
            print(
                f"topic {info.name}  kind {info.kind}  partitions {info.partitions}  "
                f"replication-factor {info.replication_factor}"
            )
            if info.configs:
                print("configs " + " ".join(f"{k}={v}" for k, v in sorted(info.configs.items())))
            leaders = list(info.leaders) + [-1] * (info.partitions - len(info.leaders))
            if -1 in leaders:  # the node that answered hosts no replica of some partitions
                for row in partition_rows(await client.status([info.name]), info.name):
                    p = row.partition
                    if 0 <= p < info.partitions and leaders[p] < 0:
                        leaders[p] = row.leader
            for p, replicas in enumerate(info.assignments):
                leader = leaders[p]
                moving = f"  moving off {info.reassigning[p]}" if p in info.reassigning else ""
                print(
                    f"  partition {p}  leader {leader if leader >= 0 else 'unknown'}  "
                    f"replicas {replicas}{moving}"
                )

    asyncio.run(run())
    return 0


def cmd_topics_delete(args: argparse.Namespace) -> int:
    async def run() -> None:
        async with client_of(args) as client:
            resp = await client.delete_topic(args.name, args.force)
            cursors = f" and its cursors {', '.join(resp.deleted_cursors)}"
            print(f"deleted topic {resp.name}{cursors if resp.deleted_cursors else ''}")

    asyncio.run(run())
    return 0


def cmd_topics_alter(args: argparse.Namespace) -> int:
    async def run() -> None:
        if not args.config and not args.delete_config:
            raise TidelogError("topics alter needs --config KEY=VALUE or --delete-config KEY")
        async with client_of(args) as client:
            resp = await client.alter_topic(
                args.name, parse_kv(args.config), list(args.delete_config)
            )
            configs = " ".join(f"{k}={v}" for k, v in sorted(resp.configs.items()))
            print(f"altered topic {resp.name}: configs {configs or '(defaults)'}")

    asyncio.run(run())
    return 0


def cmd_topics_add_partitions(args: argparse.Namespace) -> int:
    async def run() -> None:
        async with client_of(args) as client:
            info = await client.add_partitions(args.name, args.partitions)
            print(f"topic {info.name} now has {info.partitions} partitions")

    asyncio.run(run())
    return 0


# -- produce / consume --------------------------------------------------------------------------


def cmd_produce(args: argparse.Namespace) -> int:
    async def run() -> int:
        async with client_of(args) as client:
            producer = Producer(
                client, acks=args.acks, linger_ms=args.linger_ms, batch_bytes=args.batch_bytes
            )
            futures = []
            total = _size_of(args.file) if args.file is not None else None
            progress = Progress(f"produce to {args.topic}", total)
            failures = 0
            sep = args.key_separator.encode() if args.key_separator else None
            async for line in _input_lines(args.file):
                text = line.rstrip(b"\n")
                key: bytes | None = None
                if sep is not None and sep in text:
                    key, text = text.split(sep, 1)
                futures.append(
                    await producer.send(args.topic, text, key=key, partition=args.partition)
                )
                progress.advance(1, len(line))
                if len(futures) >= 10_000:
                    failures += await _report(futures, args.print_offsets)
                    futures = []
            await producer.flush()
            failures += await _report(futures, args.print_offsets)
            progress.close()
            return 1 if failures else 0

    return asyncio.run(run())


def _size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError as exc:
        raise _unreadable(path, exc) from None


def _unreadable(path: Path, exc: OSError) -> TidelogError:
    return TidelogError(f"cannot read {path}: {exc.strerror}")


async def _input_lines(path: Path | None) -> AsyncIterator[bytes]:
    """Lines of the file, or of stdin."""
    if path is not None:
        try:
            with path.open("rb") as f:
                for line in f:
                    yield line
        except OSError as exc:
            raise _unreadable(path, exc) from None
        return
    mode = os.fstat(sys.stdin.fileno()).st_mode
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or sys.stdin.isatty()):
        # A file (`< records.txt`) or /dev/null: the event loop cannot watch it, and reading
        # it never waits on a writer.
        for line in sys.stdin.buffer:
            yield line
        return
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=64 * 1024 * 1024)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while True:
        line = await reader.readline()
        if not line:
            return
        yield line


async def _report(futures: list[asyncio.Future[Any]], print_offsets: bool) -> int:
    failures = 0
    for future in futures:
        try:
            meta = await future
        except TidelogError as exc:
            failures += 1
            print(f"error: {exc}", file=sys.stderr)
            continue
        if print_offsets and meta.offset >= 0:
            print(f"{meta.partition} {meta.offset}")
    sys.stdout.flush()
    return failures


def format_record(rec: Record, partition: int, fmt: str) -> str:
    if fmt == "json":
        out: dict[str, Any] = {
            "partition": partition,
            "offset": rec.offset,
            "timestamp": rec.timestamp,
        }
        out.update(_text_field("key", rec.key))
        out.update(_text_field("value", rec.value))
        if rec.headers:
            out["headers"] = {
                k: (v.decode("utf-8", "replace") if v is not None else None) for k, v in rec.headers
            }
        return json.dumps(out)
    return "" if rec.value is None else rec.value.decode("utf-8", "replace")


def _text_field(name: str, value: bytes | None) -> dict[str, Any]:
    if value is None:
        return {name: None}
    try:
        return {name: value.decode("utf-8")}
    except UnicodeDecodeError:
        return {name: None, f"{name}_base64": base64.b64encode(value).decode()}


def cmd_consume(args: argparse.Namespace) -> int:
    async def run() -> int:
        # SIGTERM ends a consume as Ctrl-C does: what it printed is committed first.
        consuming = asyncio.current_task()
        if consuming is not None:
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, consuming.cancel)
        async with client_of(args) as client:
            starts = await _consume_starts(client, args)
            positions = {p: int(start) for p, start in starts.items()} if args.cursor else {}
            out: asyncio.Queue[tuple[int, Record | TidelogError | int] | None] = asyncio.Queue(
                10_000
            )
            tasks = [
                asyncio.create_task(_read_partition(client, args, p, start, out))
                for p, start in starts.items()
            ]
            try:
                return await _print_records(client, args, out, len(tasks), positions)
            finally:
                for task in tasks:
                    task.cancel()
                # A reader cancelled while the queue is full waits to put its end (None)
                # there: take what is queued until every reader is done.
                while not all(task.done() for task in tasks):
                    while not out.empty():
                        out.get_nowait()
                    await asyncio.wait(tasks, timeout=0.05)
                for task in tasks:
                    with contextlib.suppress(asyncio.CancelledError, TidelogError):
                        await task

    try:
        return asyncio.run(run())
    except asyncio.CancelledError:  # SIGTERM
        return 128 + signal.SIGTERM


async def _consume_starts(client: AsyncClient, args: argparse.Namespace) -> dict[int, int | str]:
    """Where each partition's read starts: --from, or with --cursor the cursor's positions (the
    cursor is created at --from if it does not exist)."""
    info = await client.topic(args.topic)
    partitions = [args.partition] if args.partition is not None else list(range(info.partitions))
    if not args.cursor:
        return dict.fromkeys(partitions, args.start)
    start: str | dict[int, int] = args.start
    if args.start == "latest" and args.isolation_level == "read_committed":
        # A read_committed cursor never passes the LSO: it starts there, not at the HW.
        start = {
            p: await client.list_offsets(
                args.topic, p, "latest", isolation_level=args.isolation_level
            )
            for p in range(info.partitions)
        }
    cursor = await client.create_cursor(args.cursor, args.topic, start, if_not_exists=True)
    return {p: int(cursor["positions"][str(p)]) for p in partitions}


async def _read_partition(
    client: AsyncClient,
    args: argparse.Namespace,
    partition: int,
    start: int | str,
    out: asyncio.Queue[tuple[int, Record | TidelogError | int] | None],
) -> None:
    """One partition's records into out, each fetch's followed by the position after it (past
    transaction markers and aborted batches too: what --cursor commits), then its error if the
    read failed, then None."""
    try:
        async for fetched in client.consume_batches(
            args.topic,
            partition,
            start,
            reset=args.reset,
            follow=args.follow,
            replica_read=args.replica_read,
            prefer_node=args.node,
            cursor=args.cursor or "",
            skip_invalid=args.skip_invalid,
            consistent=args.consistent,
            isolation_level=args.isolation_level,
        ):
            for rec in fetched:
                await out.put((partition, rec))
            await out.put((partition, fetched.next_offset))
    except TidelogError as exc:
        await out.put((partition, exc))
    finally:
        await out.put(None)


class _CursorCommits:
    """`consume --cursor`'s commits of the position past what was printed (and the markers
    and aborted batches skipped): at most every COMMIT_EVERY_S, within that time when the reads
    go idle (a follower at the end), and when it stops, Ctrl-C and SIGTERM included, as a Kafka
    consumer commits on close."""

    def __init__(self, client: AsyncClient, args: argparse.Namespace, positions: dict[int, int]):
        self._client = client
        self._args = args
        self.positions = positions  # what the consume has printed or skipped
        self._committed = dict(positions)
        self._failed = False  # not tried again on the way out: it waited its time
        self._last = asyncio.get_running_loop().time()

    def idle_wait(self) -> float | None:
        """How long to wait for more before committing what is read (None: nothing to)."""
        if not self._args.cursor or self.positions == self._committed:
            return None
        return max(self._last + COMMIT_EVERY_S - asyncio.get_running_loop().time(), 0.0)

    async def commit(self, when_due: bool = False) -> None:
        loop = asyncio.get_running_loop()
        if when_due and loop.time() - self._last <= COMMIT_EVERY_S:
            return
        if self._args.cursor and self.positions != self._committed and not self._failed:
            sys.stdout.flush()  # committed only once printed
            try:
                # read_committed: the node checks no position passes the LSO (it never does)
                await self._client.commit_cursor(
                    self._args.cursor, self.positions, self._args.isolation_level
                )
            except TidelogError:
                self._failed = True
                raise
            self._committed.update(self.positions)
        self._last = loop.time()

    async def commit_on_the_way_out(self) -> None:
        """After an error, Ctrl-C or SIGTERM: bounded, and a failure is told but does not
        replace the cause (nor its exit status)."""
        try:
            await asyncio.wait_for(self.commit(), LAST_COMMIT_S)
        except (TidelogError, TimeoutError) as exc:
            print(f"warning: cursor {self._args.cursor} not committed: {exc!r}", file=sys.stderr)


async def _print_records(
    client: AsyncClient,
    args: argparse.Namespace,
    out: asyncio.Queue[tuple[int, Record | TidelogError | int] | None],
    live: int,
    positions: dict[int, int],
) -> int:
    """Print the records of `live` partition reads as they come, until every read ended or
    --max records are printed, committing with --cursor (_CursorCommits). Returns the exit
    status: 1 if a partition's read failed."""
    commits = _CursorCommits(client, args, positions)
    remaining: int | None = args.max_records
    failed = 0
    # One get() outlives the waits with a timeout: asyncio.wait_for could take an item and
    # swallow a cancellation (Ctrl-C, SIGTERM) that came at the same moment.
    getting: asyncio.Task[tuple[int, Record | TidelogError | int] | None] | None = None
    try:
        while live:
            if getting is None:
                getting = asyncio.ensure_future(out.get())
            await asyncio.wait({getting}, timeout=commits.idle_wait())
            if not getting.done():  # idle: what is read so far is committed before more comes
                await commits.commit()
                continue
            item, getting = getting.result(), None
            if item is None:
                live -= 1
                continue
            p, rec = item
            if isinstance(rec, int):  # the position after a fetch whose records are printed
                positions[p] = rec
            elif isinstance(rec, TidelogError):
                print(f"error: partition {p}: {rec}", file=sys.stderr)
                failed = 1
            else:
                sys.stdout.write(format_record(rec, p, args.format) + "\n")
                positions[p] = rec.offset + 1
                await commits.commit(when_due=True)
                if remaining is not None:
                    remaining -= 1
                    if remaining <= 0:
                        break
    except BaseException:
        if getting is not None:
            getting.cancel()
        sys.stdout.flush()
        await commits.commit_on_the_way_out()
        raise
    sys.stdout.flush()
    await commits.commit()
    return failed


def cmd_cursors(args: argparse.Namespace) -> int:
    async def run() -> None:
        async with client_of(args) as client:
            if args.cursors_command == "create":
                cursor = await client.create_cursor(
                    args.name, args.topic, args.start, backup=args.backup
                )
                print(
                    f"created cursor {cursor['name']} on {cursor['topic']} at {cursor['positions']}"
                )
            elif args.cursors_command == "delete":
                await client.delete_cursor(args.name)
                print(f"deleted cursor {args.name}")
            else:
                name = args.name if args.cursors_command == "describe" else None

                async def render() -> tuple[Any, str]:
                    rows = await cursor_rows(client, name)
                    return rows, cursors_text(rows)

                await show(render, args.json, args.watch)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    return 0


CURSOR_HEADINGS = ("CURSOR", "TOPIC", "PART", "POSITION", "LAG", "LEAD", "IDLE_S", "STATE")


def cursors_text(rows: list[dict[str, Any]]) -> str:
    table = []
    for r in rows:
        state = "backup" if r["backup"] else "live"
        if r["invalidated"]:
            state = f"INVALIDATED: {r['invalidated']}"
        table.append(
            (
                r["name"],
                r["topic"],
                r["partition"],
                r["position"],
                r["lag"],
                r["lead"],
                r["idle_ms"] // 1000,
                state,
            )
        )
    return "\n".join(table_lines(CURSOR_HEADINGS, table, frozenset(range(2, 7))))


async def cursor_rows(client: AsyncClient, name: str | None) -> list[dict[str, Any]]:
    """Each cursor per partition with its lag (HW - position) and lead (position - log start,
    near zero: retention is about to overtake it, Kafka's KIP-223)."""
    cursors = await client.cursors(name)
    topics = {c["topic"] for c in cursors}
    stats = {
        (row.topic, row.partition): row
        for row in partition_rows(await client.status(sorted(topics)), None)
    }
    now_ms = int(time.time() * 1000)
    rows = []
    for c in cursors:
        for p, position in sorted(c["positions"].items(), key=lambda kv: int(kv[0])):
            st = stats.get((c["topic"], int(p)))
            hw = st.high_watermark if st is not None else position
            start = st.log_start_offset if st is not None else 0
            rows.append(
                {
                    "name": c["name"],
                    "topic": c["topic"],
                    "partition": int(p),
                    "position": position,
                    "lag": max(0, hw - position),
                    "lead": position - start,
                    "idle_ms": now_ms - int(c["committed_ms"]),
                    "backup": c["backup"],
                    "invalidated": c["invalidated"],
                }
            )
    return rows


def cmd_table(args: argparse.Namespace) -> int:
    async def run() -> int:
        async with client_of(args) as client:
            if args.table_command == "get":
                value = await client.table_get(args.topic, args.key.encode(), args.consistency)
                if value is None:
                    print(f"{args.key}: not found", file=sys.stderr)
                    return 1
                print(value.decode("utf-8", "replace"))
                return 0
            rows = await client.table_scan(args.topic, consistency=args.consistency)
            for key, value in rows:
                k, v = key.decode("utf-8", "replace"), value.decode("utf-8", "replace")
                print(json.dumps({"key": k, "value": v}) if args.json else f"{k}\t{v}")
            return 0

    return asyncio.run(run())


def cmd_delete_records(args: argparse.Namespace) -> int:
    async def run() -> None:
        async with client_of(args) as client:
            start = await client.delete_records(args.topic, args.partition, args.before, args.force)
            print(f"{args.topic}/{args.partition}: log start is now {start}")

    asyncio.run(run())
    return 0


# -- status -------------------------------------------------------------------------------------


def cmd_status(args: argparse.Namespace) -> int:
    async def run() -> None:
        async with client_of(args) as client:
            if args.topic and args.topic != METADATA_TOPIC:
                await client.topic(args.topic, refresh=True)  # UnknownTopicOrPartition, exit 1

            async def render() -> tuple[Any, str]:
                nodes = await client.status([args.topic] if args.topic else None)
                rows = partition_rows(nodes, args.topic)
                await name_transaction_holds(client, rows)
                value = {
                    "partitions": [r.to_wire() for r in rows],
                    "nodes": [
                        {
                            "node_id": n.get("node_id"),
                            "error": n.get("error"),
                            "metadata": n.get("metadata"),
                        }
                        for n in nodes
                    ],
                }
                return value, status_text(rows) + feature_levels_text(nodes)

            await show(render, args.json, args.watch)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    return 0


def feature_levels_text(nodes: list[dict[str, Any]]) -> str:
    """The cluster's finalized feature levels, as the nodes that answered applied them."""
    levels: dict[str, set[int]] = {}
    for n in nodes:
        for feature, said in dict((n.get("metadata") or {}).get("features", {})).items():
            levels.setdefault(feature, set()).add(int(said["finalized_level"]))
    return "".join(
        f"\n{feature} finalized at level {'/'.join(str(v) for v in sorted(values))}"
        for feature, values in sorted(levels.items())
    )


STATUS_HEADINGS = (
    "TOPIC",
    "PART",
    "LEADER",
    "EPOCH",
    "LOG_START",
    "LWM",
    "LSO",
    "HW",
    "LEO",
    "BYTES",
    "SEGS",
    "REPLICAS",
)


def status_text(rows: list[PartitionRow]) -> str:
    """One line per partition, then what holds its LWM, its cursors, why it has no leader and
    the batches nobody can read, each on a line of its own."""
    table, notes = [], []
    for r in rows:
        reps = " ".join(
            f"{n}:{'leader' if rep.is_leader else rep.role[:4]}{'' if rep.in_sync else '(out)'}"
            for n, rep in sorted(r.replicas.items())
        )
        if r.under_replicated and len(r.replicas) > 1:
            reps += "  UNDER-REPLICATED"
        lwm = r.low_watermark
        table.append(
            (
                r.topic,
                r.partition,
                r.leader,
                r.epoch,
                r.log_start_offset,
                lwm.get("offset", "-"),
                r.last_stable_offset if r.last_stable_offset >= 0 else "-",
                r.high_watermark,
                r.log_end_offset,
                r.size_bytes,
                r.segment_count,
                reps,
            )
        )
        lines = []
        if lwm:
            lines.append(f"LWM set by {lwm.get('set_by')}")
        for hold in lwm.get("holds", []):
            if hold.get("kind") == "transaction":  # what holds the LSO (and read_committed)
                named = (
                    f"; transactional id {hold['transactional_id']}"
                    if hold.get("transactional_id")
                    else ""
                )
                lines.append(
                    f"transaction {hold['name']} from offset {hold['offset']}: "
                    f"{hold['detail']}{named}"
                )
        for name, c in sorted(r.cursors.items()):
            lines.append(
                f"cursor {name}: position {c['position']}, lag {c['lag']}, lead {c['lead']}"
            )
        if r.archive:
            a = r.archive
            line = (
                f"archive {a['url']}: offsets [{a['start_offset']}, {a['archived_end_offset']}) "
                f"in {a['objects']} objects; local log start {r.local_log_start_offset}; "
                f"{a['lag_bytes']} bytes waiting"
            )
            if a.get("error"):
                line += f"; {a['error']}: {a.get('error_message', '')}"
            lines.append(line)
        if r.no_leader:
            lines.append(r.no_leader)
        for b in r.invalid_batches:
            lines.append(
                f"INVALID batch at offsets {b['base_offset']}..{b['last_offset']}"
                f" ({b['error']}: {b['reason']}) on nodes {b['nodes']}; readers pass over "
                "it with --skip-invalid"
            )
        notes.append(lines)
    numbers = frozenset(range(1, 11))
    return "\n".join(table_lines(STATUS_HEADINGS, table, numbers, notes))


if __name__ == "__main__":
    sys.exit(main())
