"""python -m tidelog.testing --seeds N [--start S|random] [--jobs J] | --seed S [--trace]
    [--fault F] [--transactions] [--transaction-partitions P] [--delete-records]

Runs the deterministic simulator on seeds: a fixed range, a range from a start drawn at random
(printed, so any failure replays), or one seed with its trace. Every failure prints its seed,
what it broke and the command that replays it; the exit status is 1 if any seed failed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from tidelog.replication.faults import FAULTS
from tidelog.testing.sim import SimulationFailure, run_seed
from tidelog.testing.sweep import draw_start, partitions_for, sweep, transactions_for


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tidelog.testing")
    parser.add_argument("--seeds", type=int, default=100, help="how many seeds to run")
    parser.add_argument(
        "--start",
        default="0",
        help="first seed, or 'random': a start drawn at random (printed) above every fixed range",
    )
    parser.add_argument("--seed", type=int, help="replay this one seed")
    parser.add_argument(
        "--jobs", type=int, default=1, help="processes to run seeds in (0: one per core)"
    )
    parser.add_argument("--fault", action="append", default=[], choices=sorted(FAULTS))
    parser.add_argument("--trace", action="store_true", help="print the seed's events")
    parser.add_argument(
        "--transactions",
        action="store_true",
        help="run transactional producers and read_committed readers (a range runs them on "
        "odd seeds without this)",
    )
    parser.add_argument(
        "--transaction-partitions",
        type=int,
        default=1,
        metavar="P",
        help="transactions span two or three of P partitions, each its own replica group "
        "(P > 1 implies --transactions, on every seed of a range too); 1, the default: one "
        "partition",
    )
    parser.add_argument(
        "--delete-records",
        action="store_true",
        help="an operator's delete-records now and then, past undecided transactions too "
        "(implies --transactions; one partition)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.transaction_partitions < 1:
        parser.error(f"--transaction-partitions: {args.transaction_partitions} is not 1 or more")
    partitions = args.transaction_partitions
    if args.delete_records and partitions > 1:
        parser.error("--delete-records runs on one partition, not with --transaction-partitions")
    transactions = args.transactions or partitions > 1 or args.delete_records
    deletes = args.delete_records
    faults = frozenset(args.fault)
    started = time.monotonic()
    if args.seed is not None:
        return _replay(args.seed, faults, args.trace, transactions, partitions, deletes)
    if args.start == "random":
        start = draw_start()
    else:
        try:
            start = int(args.start)
        except ValueError:
            parser.error(f"--start: {args.start!r} is neither a seed nor 'random'")
    seeds = range(start, start + args.seeds)
    jobs = args.jobs or os.cpu_count() or 1
    print(f"seeds {seeds.start}..{seeds.stop - 1} ({len(seeds)}), {jobs} job(s)", flush=True)
    if jobs == 1 or args.trace:
        failures = []
        for seed in seeds:
            try:
                stats = run_seed(
                    seed,
                    faults,
                    trace=print if args.trace else None,
                    transactions=transactions_for(seed, transactions),
                    transaction_partitions=partitions_for(seed, transactions, partitions),
                    delete_records=deletes,
                )
            except SimulationFailure as exc:
                failures.append((seed, str(exc)))
                print(f"FAIL {exc}", flush=True)
                continue
            if args.trace:
                print(f"seed {seed} ok: {stats}")
    else:
        failures = sweep(
            seeds,
            faults,
            jobs,
            transactions=transactions,
            transaction_partitions=partitions,
            delete_records=deletes,
        )
    passed = len(seeds) - len(failures)
    failed = " ".join(str(seed) for seed, _ in sorted(failures))
    print(
        f"{passed}/{len(seeds)} seeds passed in {time.monotonic() - started:.1f}s "
        f"(seeds {seeds.start}..{seeds.stop - 1})" + (f"; failed: {failed}" if failed else "")
    )
    return 1 if failures else 0


def _replay(
    seed: int,
    faults: frozenset[str],
    trace: bool,
    transactions: bool,
    partitions: int,
    delete_records: bool = False,
) -> int:
    """One seed, its trace printed if asked: the exit status."""
    started = time.monotonic()
    try:
        stats = run_seed(
            seed,
            faults,
            trace=print if trace else None,
            transactions=transactions,
            transaction_partitions=partitions,
            delete_records=delete_records,
        )
    except SimulationFailure as exc:
        print(f"FAIL {exc}", flush=True)
        print(f"0/1 seeds passed in {time.monotonic() - started:.1f}s")
        return 1
    print(f"seed {seed} ok: {stats}")
    print(f"1/1 seeds passed in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
