"""python -m tidelog.testing --seeds N | --seed S [--fault NAME] [--trace]"""

from __future__ import annotations

import argparse
import sys
import time

from tidelog.replication.replica import FAULTS
from tidelog.testing.sim import SimulationFailure, run_seed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tidelog.testing")
    parser.add_argument("--seeds", type=int, default=100, help="how many seeds to run")
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--seed", type=int, help="replay this one seed")
    parser.add_argument("--fault", action="append", default=[], choices=sorted(FAULTS))
    parser.add_argument("--trace", action="store_true", help="print the seed's events")
    args = parser.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else range(args.start, args.start + args.seeds)
    faults = frozenset(args.fault)
    failures = 0
    started = time.monotonic()
    for seed in seeds:
        try:
            stats = run_seed(seed, faults, trace=print if args.trace else None)
        except SimulationFailure as exc:
            failures += 1
            print(f"FAIL {exc}", flush=True)
            continue
        if args.seed is not None or args.trace:
            print(f"seed {seed} ok: {stats}")
    total = len(seeds)
    print(f"{total - failures}/{total} seeds passed in {time.monotonic() - started:.1f}s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
