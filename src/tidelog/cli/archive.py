"""`tidelog archive verify|describe|accept-loss` and `tidelog restore`: the archive
(tidelog/archive) from outside a node, straight from the store, and as the cluster recorded it."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tidelog.archive.restore import RestorePoint, restore_topic
from tidelog.archive.store import open_store
from tidelog.archive.verify import compare_with_cluster, verify_archive
from tidelog.cli.cluster import free_ports
from tidelog.cli.connect import add_connection_options, client_of
from tidelog.client.sync_client import Client
from tidelog.errors import ArchiveError, TidelogError, TopicAlreadyExists
from tidelog.protocol import api


def add_archive_commands(sub: Any, with_bootstrap: Any) -> None:
    archive = sub.add_parser("archive", help="check an archive (file:///DIR or s3://BUCKET/PREFIX)")
    verbs = archive.add_subparsers(dest="verb", required=True)
    verify = verbs.add_parser(
        "verify",
        help="check every object's checksum and batches and every manifest's continuity",
    )
    verify.add_argument("url", help="file:///DIR or s3://BUCKET/PREFIX")
    verify.add_argument("--topic", help="only this topic")
    verify.add_argument("--archive-endpoint", default="", help="an S3-compatible store's URL")
    verify.add_argument("--json", action="store_true")
    verify.add_argument(
        "--bootstrap",
        default=None,
        help="HOST:PORT of a node of the cluster that archives there: also check that the "
        "store holds every range the cluster's metadata log records (ArchiveLost if not)",
    )
    add_connection_options(verify)
    verify.set_defaults(func=cmd_archive_verify)

    describe = with_bootstrap(
        verbs.add_parser(
            "describe",
            help="the archive as the cluster recorded it: the store's identity, each "
            "partition's archived range and the ranges the store lost",
        )
    )
    describe.add_argument("--json", action="store_true")
    describe.set_defaults(func=cmd_archive_describe)
    accept = with_bootstrap(
        verbs.add_parser(
            "accept-loss",
            help="after ArchiveLost: take the store as it is now, record every range it lost "
            "(readers of them get ArchiveLost) and let uploads go on",
        )
    )
    accept.add_argument("--json", action="store_true")
    accept.set_defaults(func=cmd_archive_accept_loss)

    restore = sub.add_parser(
        "restore",
        help="rebuild a topic from its archive, up to an offset or a time, into a new node's "
        "data directory",
    )
    restore.add_argument("--archive", required=True, help="file:///DIR or s3://BUCKET/PREFIX")
    restore.add_argument("--archive-endpoint", default="", help="an S3-compatible store's URL")
    restore.add_argument("--topic", required=True)
    point = restore.add_mutually_exclusive_group(required=True)
    point.add_argument("--to-offset", type=int, help="restore the offsets below N")
    point.add_argument(
        "--to-time",
        help="restore the records stamped at or before this ISO 8601 time (UTC if no zone)",
    )
    restore.add_argument("--data", required=True, type=Path, help="a new (empty) data directory")
    restore.add_argument(
        "--allow-outside",
        action="store_true",
        help="restore even if the point lies before the archive's first record or past its "
        "last (otherwise: RestorePointOutside, exit 1, nothing written)",
    )
    restore.set_defaults(func=cmd_restore)


def cmd_archive_verify(args: argparse.Namespace) -> int:
    store = open_store(args.url, args.archive_endpoint)
    store.check()
    report = verify_archive(store, args.topic)
    if args.bootstrap:
        from tidelog.cli.args import run_loop

        async def recorded() -> api.ArchiveResponse:
            async with client_of(args) as client:
                return await client.archive()

        answer = run_loop(recorded())
        report.problems.extend(
            compare_with_cluster(report, answer.archive_id, answer.extents, args.topic)
        )
    if args.json:
        print(
            json.dumps(
                {
                    "url": report.url,
                    "cluster_id": report.cluster_id,
                    "archive_id": report.archive_id,
                    "ok": report.ok,
                    "lost": report.lost,
                    "problems": report.problems,
                    "partitions": [vars(p) for p in report.partitions],
                },
                indent=1,
            )
        )
    else:
        print(f"archive {report.url} of cluster {report.cluster_id or '?'}")
        for partition in report.partitions:
            print(partition.line())
        for lost in report.lost:
            print(f"lost (recorded by the cluster, accepted): {lost}")
        for problem in report.problems:
            print(f"PROBLEM: {problem}")
        print("ok" if report.ok else "FAILED")
    return 0 if report.ok else 1


def cmd_archive_describe(args: argparse.Namespace) -> int:
    from tidelog.cli.args import run_loop

    async def run() -> int:
        async with client_of(args) as client:
            print_archive(await client.archive(), args.json)
        return 0

    return run_loop(run())


def cmd_archive_accept_loss(args: argparse.Namespace) -> int:
    from tidelog.cli.args import run_loop

    async def run() -> int:
        async with client_of(args) as client:
            answer = await client.accept_archive_loss()
        if args.json:
            print(json.dumps(api.encode(answer), indent=1))
            return 0
        if not answer.accepted:
            print(f"archive {answer.archive_id}: the store holds every range recorded; no loss")
        for lost in answer.accepted:
            print(
                f"{lost['name']}/{lost['partition']}: offsets [{lost['start_offset']}, "
                f"{lost['end_offset']}) recorded as lost; readers of them get ArchiveLost"
            )
        print(f"uploads go on into archive {answer.archive_id}")
        return 0

    return run_loop(run())


def print_archive(answer: api.ArchiveResponse, as_json: bool) -> None:
    if as_json:
        print(json.dumps(api.encode(answer), indent=1))
        return
    print(f"archive id {answer.archive_id or '(none recorded yet)'}")
    for e in answer.extents:
        lost = "".join(f", lost [{a}, {b})" for a, b in e.get("lost", []))
        print(
            f"{e['topic']}/{e['partition']} (topic id {e['topic_id']}): archived "
            f"[{e['start_offset']}, {e['end_offset']}){lost}"
        )


def cmd_restore(args: argparse.Namespace) -> int:
    point = RestorePoint.parse(args.to_offset, args.to_time)
    store = open_store(args.archive, args.archive_endpoint)
    store.check()
    restored = restore_topic(
        store, args.topic, point, args.data, create_topic_offline, args.allow_outside
    )
    print(f"restored {args.topic} ({point.describe()}) into {args.data}:")
    for p in restored:
        line = f"  partition {p.partition}: offsets [{p.start_offset}, {p.end_offset}), {p.records} records"
        print(line + (f" ({p.note})" if p.note else ""))
    print(f"serve it with: tidelog serve --data {args.data} --listen 127.0.0.1:7100")
    return 0


def create_topic_offline(
    data_dir: Path, topic: str, partitions: int, configs: dict[str, str]
) -> None:
    """A real node makes the directory and the topic, then stops (restore_topic's create_topic)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    port, peer_port = free_ports(2)
    log_path = data_dir.parent / f".{data_dir.name}.restore.log"
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tidelog",
                "serve",
                "--data",
                str(data_dir),
                "--listen",
                f"127.0.0.1:{port}",
                "--peers",
                f"1=127.0.0.1:{port}/{peer_port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise ArchiveError(
                    f"the node restore started exited ({proc.returncode}): "
                    + log_path.read_text(errors="replace")[-2000:]
                )
            try:
                with Client(f"127.0.0.1:{port}") as client:
                    with contextlib.suppress(TopicAlreadyExists):  # an earlier try made it
                        client.create_topic(
                            topic, partitions=partitions, replication_factor=1, configs=configs
                        )
                    client.wait_for_leaders(topic)
                    # A new cluster's first leader finalizes the highest feature level just
                    # after its election; stopped before that, the copy would stay at level 1
                    # for good (no transactions), as a node with a metadata log is no new cluster.
                    while not client.describe_features().recorded:
                        if time.monotonic() > deadline:
                            raise ArchiveError("the node restore started finalized no level")
                        time.sleep(0.1)
                break
            except (OSError, TidelogError) as exc:
                # Not listening yet, or not ready (a retriable error): again, until the deadline.
                retriable = not isinstance(exc, TidelogError) or exc.retriable
                if not retriable or time.monotonic() > deadline:
                    raise ArchiveError(
                        f"the node restore started could not create {topic}: {exc}"
                    ) from exc
                time.sleep(0.2)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    log_path.unlink(missing_ok=True)
