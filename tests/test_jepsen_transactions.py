"""Kafka transactions under faults, Jepsen-style (issue 36): confluent-kafka transactional
writers, consume-transform-produce loops (send_offsets_to_transaction) and read_committed
consumers (tests/txn_workload.py) against a 3-node cluster's Kafka ports, while a nemesis
SIGKILLs and restarts, and SIGSTOPs and resumes, partition leaders and the transaction
coordinator (the metadata leader). tests/txn_anomalies.py then judges the history: no aborted
read, no transaction visible in part, no duplicate, no lost committed record, and every
group's committed offsets say exactly which inputs have their output.

Every partition is then read raw (read_uncommitted, markers included) and read_committed again
through Kafka's Fetch and tidelog's own client (tests/txn_logs.py): what the node's filter
handed out must be what the raw log says (a filter-mismatch otherwise).

The same workload runs over real network partitions (tests/txn_netlab.py, in network
namespaces): the coordinator or a partition's leader cut off from its peers, or a one-way cut
between two nodes, TIDELOG_TXN_NETNS_SECONDS (default 40) of them in CI.

CI runs TIDELOG_TXN_SOAK_SECONDS (default 25) of kills and pauses; `make txn-soak` runs both
longer (TXN_SOAK_SECONDS)."""

from __future__ import annotations

import json
import os
import random
import threading
import time
from pathlib import Path

import pytest

from helpers import wait_for_value
from test_cluster import leader_of
from test_network_partitions import namespaces_work, run_lab
from tidelog.cli.cluster import LocalCluster
from tidelog.client.sync_client import Client
from tidelog.errors import TidelogError
from tidelog.features import TRANSACTIONS_LEVEL
from txn_anomalies import ANOMALIES, COMMITTED, check, failures, markers_in, summary, to_json

pytestmark = [pytest.mark.process, pytest.mark.timed]  # tiers: pyproject.toml's markers

pytest.importorskip("confluent_kafka")

from txn_workload import DATA, OUTPUT, PARTITIONS, TxnWorkload, create_topics  # noqa: E402

SECONDS = float(os.environ.get("TIDELOG_TXN_SOAK_SECONDS", "25"))
SEED = int(os.environ.get("TIDELOG_TXN_SEED", "1"))
NETNS_SECONDS = float(os.environ.get("TIDELOG_TXN_NETNS_SECONDS", "40"))
TXN_LAB = Path(__file__).with_name("txn_netlab.py")
FAULTS = ("kill-leader", "kill-coordinator", "pause-leader", "pause-coordinator")


def coordinator(admin: Client) -> int:
    return admin.describe_cluster(leader_only=True).metadata_leader


def fault_once(cluster: LocalCluster, admin: Client, rng: random.Random, kind: str) -> str:
    """One fault, held for a while and healed: a partition leader's or the coordinator's."""
    try:
        if kind.endswith("coordinator"):
            victim = coordinator(admin)
        else:
            victim = leader_of(admin, rng.choice((DATA, OUTPUT)), rng.randrange(PARTITIONS), 5)
    except (AssertionError, TidelogError):
        victim = rng.choice(cluster.node_ids)
    held = rng.uniform(0.5, 3.0)
    if kind.startswith("kill"):
        cluster.kill(victim)
        time.sleep(held)
        cluster.start(victim)
        cluster.wait_ready(node_ids=[victim])
    else:
        cluster.freeze(victim)
        time.sleep(held)
        cluster.resume(victim)
    return f"{kind} {victim} ({held:.1f} s)"


def nemesis(cluster: LocalCluster, stop: threading.Event, seed: int) -> list[str]:
    """Faults in turn until stop is set, with a quiet spell between them; what was done, with
    the second of the run each began at."""
    rng = random.Random(seed)
    began = time.monotonic()
    events: list[str] = []
    with Client(cluster.bootstrap, retries=3, request_timeout_ms=2000) as admin:
        while not stop.wait(rng.uniform(1.0, 3.0)):
            at = time.monotonic() - began
            events.append(f"{at:.1f}s {fault_once(cluster, admin, rng, rng.choice(FAULTS))}")
    return events


@pytest.mark.timeout(900)
def test_transactions_stay_atomic_under_kills_and_pauses(tmp_path: Path) -> None:
    with (
        LocalCluster(tmp_path, 3, kafka=True, log_level="WARNING") as cluster,
        Client(cluster.bootstrap) as admin,
    ):
        wait_for_value(
            "feature level 3",
            lambda: admin.describe_features().finalized_level,
            TRANSACTIONS_LEVEL.__eq__,
        )
        create_topics(cluster.bootstrap)
        work = TxnWorkload(cluster.bootstrap, cluster.kafka_bootstrap, SEED)
        work.start()
        stop = threading.Event()
        threading.Timer(SECONDS, stop.set).start()
        try:
            events = nemesis(cluster, stop, SEED)
        finally:
            stop.set()
            for n in cluster.node_ids:
                cluster.resume(n)
                if not cluster.alive(n):
                    cluster.start(n)
            cluster.wait_ready()
            stuck = work.finish()
        assert not stuck, f"clients stuck after the faults: {stuck}; {work.errors[-10:]}"
        work.final_read()
    found = check(work.history)
    committed = sum(t.outcome == COMMITTED for t in work.history.txns)
    report = {
        "seed": SEED,
        "seconds": SECONDS,
        "events": events,
        "transactions": len(work.history.txns),
        "committed": committed,
        "replaced_producers": work.replaced_producers,
        "client_errors": len(work.errors),
        "last_client_errors": work.errors[-5:],
        "markers": markers_in(work.history),
        "found": {name: found[name][:5] for name in ANOMALIES if found[name]},
    }
    print(json.dumps(report, indent=1))
    print(summary(found))
    if failures(found):
        kept = tmp_path / "history.json"  # beside the nodes' data and logs, for the post-mortem
        kept.write_text(json.dumps({"report": report, "history": to_json(work.history)}))
        print(f"history kept in {kept}")
    assert failures(found) == {}, failures(found)
    assert len(work.history.logs) == 3 * PARTITIONS, "every partition's filter checked"
    assert report["markers"]["abort"] > 0, report  # (so the filter had something to leave out)
    assert committed > 20, report
    assert any(t.name.startswith("ctp") and t.outcome == COMMITTED for t in work.history.txns)


@pytest.mark.skipif(not namespaces_work(), reason="no user/network namespaces (unshare -rn)")
@pytest.mark.timeout(NETNS_SECONDS + 400)  # (run_lab gives the lab NETNS_SECONDS + 240)
def test_transactions_stay_atomic_over_network_partitions(tmp_path: Path) -> None:
    """tests/txn_netlab.py for NETNS_SECONDS: rounds of the coordinator cut off from its peers,
    a partition's leader cut off from the majority, a one-way cut between two nodes, each
    healed; then the same checks (the node's filter too), nothing stuck."""
    report = run_lab(NETNS_SECONDS, "--seed", str(SEED), "--keep", str(tmp_path), lab=TXN_LAB)
    faults = [e for e in report["events"] if e != "heal"]
    assert report["faults"] == len(faults) > 0, report
    kinds = {e.split()[0] for e in faults}
    assert {"isolate-coordinator", "isolate-leader", "cut"} <= kinds or len(faults) < 3, report
    assert report["failures"] == {}, report
    assert report["partitions_checked"] == 3 * PARTITIONS, report
    assert report["markers"]["abort"] > 0, report
    assert not report["stuck"], report
    assert report["committed"] > 20 and report["committed_transforms"] > 0, report
