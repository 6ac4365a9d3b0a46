"""Kafka transactions over real network partitions (issue 36): tests/netlab.py's lab of network
namespaces, each node with a Kafka listener too, the workload of tests/txn_workload.py from
the lab's namespace, and a nemesis that cuts off the transaction coordinator (the metadata
leader) or a partition's leader, both ways, or one way only between two nodes. After healing,
the history (with every partition's raw log and read_committed reads for the filter check,
tests/txn_logs.py) goes through tests/txn_anomalies.py; the report is JSON on stdout, and the
exit status 1 if an anomaly that fails a run was found. CI runs it for 40 s
(tests/test_jepsen_transactions.py); `make txn-soak` runs it longer.

    unshare -rn python tests/txn_netlab.py --seconds 60 [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

from netlab import PREFIX, Faults, Lab, leader_of, nemesis, running
from tidelog.client.sync_client import Client
from tidelog.errors import TidelogError
from txn_anomalies import ANOMALIES, COMMITTED, check, failures, markers_in, summary
from txn_workload import DATA, GROUPS, OUTPUT, PARTITIONS, TxnWorkload, create_topics

KAFKA_PORT = 9092


class KafkaLab(Lab):
    """The lab's nodes, each with a Kafka listener on its own address."""

    log_level = "WARNING"

    @property
    def kafka_bootstrap(self) -> str:
        return ",".join(f"{PREFIX}.{n}:{KAFKA_PORT}" for n in self.ids)

    def listeners(self, n: int) -> list[str]:
        return [*super().listeners(n), "--kafka-listen", f"{PREFIX}.{n}:{KAFKA_PORT}"]


def faults(lab: KafkaLab, rng: random.Random) -> Faults:
    """One round: the coordinator or a partition's leader cut off from its peers (clients still
    reach it), or a one-way cut, held longer than an election."""
    kinds = ["isolate-coordinator", "isolate-leader", "asymmetric"]

    def one_round(admin: Client, i: int) -> list[str]:
        time.sleep(rng.uniform(1.0, 2.5))
        kind = kinds[i % len(kinds)]
        try:
            if kind == "isolate-coordinator":
                victim = admin.describe_cluster(leader_only=True).metadata_leader
            else:
                victim = leader_of(admin, rng.randrange(PARTITIONS), rng.choice((DATA, OUTPUT)))
        except TidelogError:
            victim = -1
        held = rng.uniform(3.0, 6.0)
        if kind == "asymmetric" or victim <= 0:
            a, b = rng.sample(lab.ids, 2)
            lab.cut(a, b)
            time.sleep(held)
            return [f"cut {a} -> {b} only ({held:.1f} s)"]
        lab.isolate(victim)
        time.sleep(held)
        return [f"{kind} {victim} ({held:.1f} s)"]

    return one_round


def run(lab: KafkaLab, seconds: float, seed: int) -> dict[str, object]:
    began = time.monotonic()
    phases: dict[str, float] = {}

    def phase(name: str) -> None:
        phases[name] = round(time.monotonic() - began - sum(phases.values()), 1)

    create_topics(lab.bootstrap)
    work = TxnWorkload(lab.bootstrap, lab.kafka_bootstrap, seed)
    work.start()
    phase("setup")
    try:
        events = nemesis(lab, seconds, faults(lab, random.Random(seed)))
    finally:
        phase("faults")
        lab.heal()
        stuck = work.finish()
        phase("finish")
    work.final_read()
    phase("final read")
    found = check(work.history)
    return {
        "seed": seed,
        "seconds": seconds,
        "events": events,
        "faults": sum(e != "heal" for e in events),
        "transactions": len(work.history.txns),
        "committed": sum(t.outcome == COMMITTED for t in work.history.txns),
        "committed_transforms": sum(
            t.outcome == COMMITTED and t.name.startswith(GROUPS) for t in work.history.txns
        ),
        "replaced_producers": work.replaced_producers,
        "stuck": stuck,
        "client_errors": len(work.errors),
        "last_client_errors": work.errors[-5:],
        "summary": summary(found),
        "failures": {name: found[name][:5] for name in failures(found)},
        "found": {name: len(found[name]) for name in ANOMALIES},
        "partitions_checked": len(work.history.logs),
        "markers": markers_in(work.history),
        "phase_seconds": phases,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", help="copy the nodes' logs here")
    args = parser.parse_args()
    with running(KafkaLab, "quorum", args.keep) as lab:
        report = run(lab, args.seconds, args.seed)
    print(json.dumps(report))
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
