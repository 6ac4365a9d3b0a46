"""What a simulated run counts: faults injected, work done, what the core did (elections,
snapshots, membership changes). A seed's stats are its summary, and tests ask them whether the
swarm reached what users depend on."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Stats:
    proposed: int = 0
    acked_all: int = 0
    acked_one: int = 0
    failed: int = 0
    reads: int = 0
    records_read: int = 0
    crashes: int = 0
    wipes: int = 0
    readmitted: int = 0
    partitions: int = 0
    pauses: int = 0
    elections: int = 0
    cleanings: int = 0
    segments_rolled: int = 0
    invalidations: int = 0
    snapshots_taken: int = 0
    snapshots_installed: int = 0
    messages: int = 0
    heartbeats: int = 0
    dropped: int = 0
    reassignments: int = 0
    membership_changes: int = 0
    transfers: int = 0  # times a replica asked to lead (not all are granted)
    converged_after: int = -1
