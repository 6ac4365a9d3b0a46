"""Produce throughput with batch validation, as a ratio of a node without it (an earlier commit).

    .venv/bin/python bench/validation.py [--before REF] [--seconds 3] [--rounds 3]

Since issue 9 a leader validates every producer batch before appending it (record/validation.py:
header rules, every record parsed to the batch end, codec and inflate bound), and the client is
an idempotent producer by default (it stamps producer id and sequences, so it recomputes each
batch's CRC). This starts one node from the current tree and one from REF (default: the last
commit before validation; its source is taken with `git archive` into .bench/), alternating
rounds on the same machine, and reports, for 1 KiB and 100-byte records in batches of 100 and
1000 with 1 and 4 producers, acks=1:

    node only      the same non-idempotent client against each node
    end to end     REF's way (non-idempotent) against REF's node, today's (idempotent) against
                   today's node
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from common import median, print_table, run_producers, scratch_dir
from tidelog.cli.args import run_loop
from tidelog.cli.cluster import free_ports
from tidelog.client.async_client import AsyncClient
from tidelog.record import ProducerRecord, build_batch

ROOT = Path(__file__).resolve().parent.parent
BEFORE_VALIDATION = "b6adf26"  # the commit before issue 9's validation landed


def source_of(ref: str) -> Path:
    target = ROOT / ".bench" / f"src-{ref}"
    if not (target / "src" / "tidelog").exists():
        target.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", ref, "src"], check=True, capture_output=True
        )
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return target / "src"


class SingleNode:
    """`tidelog serve` from a source tree (None: this one), with the flags every version has."""

    def __init__(self, src: Path | None) -> None:
        port = free_ports(1)[0]
        self.bootstrap = f"127.0.0.1:{port}"
        env = dict(os.environ, **({"PYTHONPATH": str(src)} if src else {}))
        data = scratch_dir("node-")
        cmd = [sys.executable, "-m", "tidelog", "serve", "--data", str(data)]
        cmd += ["--listen", self.bootstrap, "--log-level", "WARNING"]
        self.proc = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"the node from {src} did not start") from None
                time.sleep(0.05)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def batch_of(records: int, value_bytes: int) -> bytes:
    value = os.urandom(value_bytes)
    return build_batch([ProducerRecord(None, value)] * records, now_ms=int(time.time() * 1000))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", default=BEFORE_VALIDATION)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--cases",
        default="1000x1024x1,1000x1024x4,100x1024x1,1000x100x1,1000x100x4",
        help="BATCHxVALUE_BYTESxPRODUCERS,...",
    )
    args = parser.parse_args()
    old_src = source_of(args.before)
    cases = [(int(b), int(v), int(p)) for b, v, p in (c.split("x") for c in args.cases.split(","))]
    nodes = {"before": SingleNode(old_src), "after": SingleNode(None)}
    # (case, node, idempotent client) -> records/s per round
    rates: dict[tuple[tuple[int, int, int], str, bool], list[float]] = {}
    try:
        for node in nodes.values():

            async def setup(bootstrap: str = node.bootstrap) -> None:
                async with AsyncClient(bootstrap) as c:
                    for i in range(len(cases)):
                        await c.create_topic(f"bench{i}")

            run_loop(setup())
        for round_ in range(args.rounds):
            for i, case in enumerate(cases):
                records, value_bytes, producers = case
                batch = batch_of(records, value_bytes)
                order = [("before", False), ("after", False), ("after", True)]
                if round_ % 2:
                    order.reverse()
                for name, idempotent in order:
                    sent, elapsed, _ = run_loop(
                        run_producers(
                            nodes[name].bootstrap,
                            f"bench{i}",
                            batch,
                            producers,
                            args.seconds,
                            "1",
                            idempotent,
                        )
                    )
                    rates.setdefault((case, name, idempotent), []).append(sent * records / elapsed)
    finally:
        for node in nodes.values():
            node.stop()
    rows = []
    for case in cases:
        before = median(rates[(case, "before", False)])
        after = median(rates[(case, "after", False)])
        after_idem = median(rates[(case, "after", True)])
        rows.append(
            [
                case[0],
                case[1],
                case[2],
                before,
                after,
                after / before,
                after_idem,
                after_idem / before,
            ]
        )
    print(
        f"\nproduce, acks=1, one node; median of {args.rounds} rounds of {args.seconds:.0f} s; "
        f"before = {args.before} (no validation)"
    )
    print_table(
        [
            "batch",
            "value B",
            "producers",
            "before rec/s",
            "after rec/s",
            "node only",
            "after, idempotent",
            "end to end",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
