"""Deliberately broken rules (`--fault NAME` in the simulator, ReplicaConfig.faults), used only by
tests to prove the simulator's checkers can fail: each one is a bug some system shipped or this
one had, switched back on."""

from __future__ import annotations

FAULT_COMMIT_OLD_EPOCH = "commit-old-epoch-by-counting"
FAULT_TRUNCATE_TO_HW = "truncate-to-local-hw-on-follow"
FAULT_IGNORE_DIRECTORIES = "votes-from-replaced-disks"  # before KIP-853: any directory counts
FAULT_DISCARD_PAST_SNAPSHOT = "follow-log-start-past-own-snapshot"
# Membership changes without waiting for the previous one (and the leader's own epoch) to commit.
FAULT_UNCOMMITTED_CHANGES = "membership-changes-without-waiting"
# Not the core's: the simulator's producers wait from their first run, released by any HW
# (before replication/acks.py: the hw.policy=isr loss).
FAULT_ACKS_REGISTERED_LATE = "acks-registered-late"
# Quiesced followers trust their leader for good: no liveness heartbeat tells them it died.
FAULT_QUIESCE_WITHOUT_LIVENESS = "quiesce-without-liveness"
# A log that holds no entry (its start moved to its end, or it started over at a leader's log
# start) claims epoch -1 in elections, as before prefix epochs (simulator seeds 402349, 300028).
FAULT_EMPTY_LOG_FORGETS_EPOCH = "empty-log-forgets-its-epoch"
# Table reads answered at once from the leader's state, as before ReadIndex (read_index.py):
# a deposed leader, or a new one whose HW lags, answers stale values (issue 34's finding).
FAULT_READ_WITHOUT_INDEX = "reads-without-read-index"
# The LSO is the HW, as if no transaction were open: read_committed readers see records of
# transactions not yet decided (and later aborted).
FAULT_LSO_IGNORES_OPEN_TRANSACTIONS = "lso-ignores-open-transactions"
# Not the core's: the simulator's transaction coordinator (sim/coordinator.py) considers a
# transaction spanning partitions done once its first partition has the marker, and asks no
# other: the rest stay open, their LSO stuck below them, while the first shows its records.
FAULT_MARKER_TO_FIRST_PARTITION_ONLY = "marker-to-first-partition-only"
FAULTS = frozenset(
    {
        FAULT_MARKER_TO_FIRST_PARTITION_ONLY,
        FAULT_LSO_IGNORES_OPEN_TRANSACTIONS,
        FAULT_READ_WITHOUT_INDEX,
        FAULT_ACKS_REGISTERED_LATE,
        FAULT_COMMIT_OLD_EPOCH,
        FAULT_TRUNCATE_TO_HW,
        FAULT_IGNORE_DIRECTORIES,
        FAULT_DISCARD_PAST_SNAPSHOT,
        FAULT_UNCOMMITTED_CHANGES,
        FAULT_QUIESCE_WITHOUT_LIVENESS,
        FAULT_EMPTY_LOG_FORGETS_EPOCH,
    }
)
