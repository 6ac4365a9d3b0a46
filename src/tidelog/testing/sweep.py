"""Seeds over several processes: a sweep of fresh seeds prints each failure as it comes (its
seed, what it broke and the command that replays it)."""

from __future__ import annotations

import multiprocessing
import random
import time
from collections.abc import Iterator

from tidelog.testing.sim import SimulationFailure, run_seed

RANDOM_STARTS = (1_000_000, 1_000_000_000)  # fresh seeds: far above every fixed range


def transactions_for(seed: int, asked: bool = False) -> bool:
    """A sweep runs the transactional workload on odd seeds (on every one when asked): the
    even ones replay exactly as before it existed."""
    return asked or seed % 2 == 1


def partitions_for(seed: int, asked: bool = False, partitions: int = 1) -> int:
    """The partitions a seed's transactions span: those asked for (--transaction-partitions),
    on the seeds that run transactions; 1 elsewhere."""
    return partitions if transactions_for(seed, asked) else 1


def draw_start() -> int:
    return random.SystemRandom().randrange(*RANDOM_STARTS)


def run_chunk(job: tuple[list[int], frozenset[str], bool, int, bool]) -> list[tuple[int, str]]:
    """Failures among these seeds, as (seed, the failure's text)."""
    seeds, faults, transactions, partitions, delete_records = job
    failed = []
    for seed in seeds:
        try:
            run_seed(
                seed,
                faults,
                transactions=transactions_for(seed, transactions),
                transaction_partitions=partitions_for(seed, transactions, partitions),
                delete_records=delete_records,
            )
        except SimulationFailure as exc:
            failed.append((seed, str(exc)))
        except Exception as exc:  # the simulator itself broke on this seed: report it too
            failed.append((seed, f"seed {seed}: the simulator raised {exc!r}"))
    return failed


def _chunks(seeds: range, size: int) -> Iterator[list[int]]:
    for first in range(seeds.start, seeds.stop, size):
        yield list(range(first, min(first + size, seeds.stop)))


def sweep(
    seeds: range,
    faults: frozenset[str],
    jobs: int,
    progress_every: float = 60.0,
    transactions: bool = False,
    transaction_partitions: int = 1,
    delete_records: bool = False,
) -> list[tuple[int, str]]:
    """Run the seeds over `jobs` processes; print each failure as it comes, and a progress line
    every progress_every seconds."""
    failures: list[tuple[int, str]] = []
    started = last = time.monotonic()
    done = 0
    size = max(1, min(50, len(seeds) // (jobs * 4) or 1))
    work = (
        (chunk, faults, transactions, transaction_partitions, delete_records)
        for chunk in _chunks(seeds, size)
    )
    with multiprocessing.get_context("spawn").Pool(jobs) as pool:
        for failed in pool.imap_unordered(run_chunk, work):
            done += size
            for seed, text in failed:
                failures.append((seed, text))
                print(f"FAIL {text}", flush=True)
            now = time.monotonic()
            if now - last >= progress_every:
                last = now
                print(
                    f"... {min(done, len(seeds))}/{len(seeds)} seeds, {len(failures)} failed, "
                    f"{now - started:.0f}s",
                    flush=True,
                )
    return failures
