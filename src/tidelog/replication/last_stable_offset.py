"""The last stable offset (LSO) of a partition, from its log's transactions (docs/design.md,
"Transactions and the last stable offset"). No IO: the log derives its transactions
(storage/transactions.py); this is the rule.

A transaction is unstable until its marker is below the HW: a marker above the HW may still be
truncated away, and a reader could not yet tell commit from abort. So

    LSO = min(HW, first offset of every transaction whose marker is not below the HW)

never below the log start (a delete-records past an open transaction moves the log start
over it, as Kafka's does). Where it holds: log start <= LWM <= LSO <= HW <= LEO. read_committed
readers read below the LSO only.
"""

from __future__ import annotations

from tidelog.replication.faults import FAULT_LSO_IGNORES_OPEN_TRANSACTIONS
from tidelog.replication.log_interface import ReplicaLog


def last_stable_offset(log: ReplicaLog, faults: frozenset[str] = frozenset()) -> int:
    if FAULT_LSO_IGNORES_OPEN_TRANSACTIONS in faults:
        return log.high_watermark
    return log.transactions.stable_offset(log.high_watermark, log.log_start_offset)
