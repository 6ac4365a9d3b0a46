"""What one seed draws: the simulated cluster's size, its faults and how often, its workload,
its topic's settings ("swarm testing": each seed a different mix). `SimParams.from_seed` is the
draw; a seed replays exactly as long as its draws keep their order, so new ones go last."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from tidelog.config import TopicConfig

# The simulated replicas' timing, in ticks (one tick is one millisecond).
ELECTION_TIMEOUT_TICKS = 20
LIVENESS_INTERVAL_TICKS = 5
LIVENESS_TIMEOUT_TICKS = ELECTION_TIMEOUT_TICKS


@dataclass(frozen=True)
class SimParams:
    seed: int
    nodes: int = 3
    drop: float = 0.0
    duplicate: float = 0.0
    delay_max: int = 3
    partition_rate: float = 0.0
    one_way_share: float = 0.0
    crash_rate: float = 0.0
    pause_rate: float = 0.0
    wipe_rate: float = 0.0  # a crash that loses the disk: the node restarts empty
    flush_delay_max: int = 2
    produce_rate: float = 0.3
    read_rate: float = 0.2
    acks_all_share: float = 0.7
    hw_policy: str = "quorum"
    fetch_max_bytes: int = 1 << 20
    clean_every: int = 0  # ticks between cleaner passes on the leader (0: no cleaning)
    retention_bytes: int = 6000
    retention_ms: int = -1
    segment_bytes: int = 1000
    cursors: int = 1
    cursor_max_idle_ms: int = 300  # a cursor idle longer is invalidated
    cursor_max_lag_bytes: int = -1
    cursor_stall: float = 0.0  # chance per tick that a cursor's consumer stops committing
    state_machine: bool = False  # a table: applied, snapshotted, snapshots installed
    snapshot_entries: int = 20
    snapshot_catchup_entries: int = 5
    learners: int = 0  # replicas that fetch and never vote or count (a node being added)
    spares: int = 0  # nodes outside the group at first, that reassignments may move it onto
    reassign_rate: float = 0.0  # chance per tick that the group is given new target voters
    transfer_rate: float = 0.0  # chance per tick that a replica asks to lead (an operator)
    # A replica acts only when its next_deadline() has come or an event made it dirty, as on a
    # node (time kept as deadlines); False: it acts every tick.
    sparse_ticks: bool = False
    # Idle groups quiesce, and every node sends every other a liveness heartbeat (liveness.py)
    quiesce: bool = False
    replica_max_lag_ticks: int = 60
    safety_ticks: int = 1500
    liveness_ticks: int = 1500
    faults: frozenset[str] = frozenset()
    # Set by hand, never drawn: the share of table reads that use the lease (None: the table
    # clients draw it), and a paused node's clock standing still (a clock that stops breaks the
    # lease's assumption of clocks running at about one rate: read_index.py).
    lease_share: float | None = None
    clock_stops_when_paused: bool = False
    # Transactional producers and read_committed readers beside the others (transactions.py);
    # asked for (--transactions; the sweep asks on odd seeds), never drawn, so a seed's draws
    # and replay stay as they were. Out of the repr: a failure's message names it in its
    # replay command instead.
    transactions: bool = dataclasses.field(default=False, repr=False)
    # Transactions spanning this many partitions, each its own replica group on its own nodes
    # (partitions.py; --transaction-partitions N, which implies --transactions); 1: the
    # single-partition workload above. Asked for, never drawn, like transactions.
    transaction_partitions: int = dataclasses.field(default=1, repr=False)
    # An operator's delete-records now and then, on the one-partition transactional workload
    # (--delete-records, which implies --transactions): the log start may pass an undecided
    # transaction's first batches, which the LWM never does. Asked for, never drawn; its own
    # random stream, so the seed's other draws stay as they were.
    delete_records: bool = dataclasses.field(default=False, repr=False)
    # Which of those partitions' groups a cluster is (its random stream differs by it).
    partition: int = dataclasses.field(default=0, repr=False)

    @staticmethod
    def from_seed(
        seed: int,
        faults: frozenset[str] = frozenset(),
        transactions: bool = False,
        transaction_partitions: int = 1,
        delete_records: bool = False,
    ) -> SimParams:
        rng = random.Random(seed)

        def maybe(p: float, value: float) -> float:
            return value if rng.random() < p else 0.0

        params = SimParams(
            seed=seed,
            nodes=rng.choice([3, 3, 3, 5]),
            drop=maybe(0.6, rng.uniform(0.0, 0.3)),
            duplicate=maybe(0.4, rng.uniform(0.0, 0.1)),
            delay_max=rng.choice([1, 2, 3, 5, 10]),
            partition_rate=maybe(0.6, rng.uniform(0.002, 0.02)),
            one_way_share=rng.choice([0.0, 0.3, 0.6]),
            crash_rate=maybe(0.6, rng.uniform(0.001, 0.01)),
            pause_rate=maybe(0.4, rng.uniform(0.001, 0.01)),
            flush_delay_max=rng.choice([0, 1, 3, 8]),
            produce_rate=rng.uniform(0.05, 0.6),
            read_rate=rng.uniform(0.05, 0.4),
            acks_all_share=rng.uniform(0.3, 1.0),
            hw_policy=rng.choice(["quorum", "quorum", "isr"]),
            fetch_max_bytes=rng.choice([1, 1000, 4096, 1 << 20]),
            clean_every=rng.choice([0, 0, 5, 20, 50]),
            retention_bytes=rng.randint(3, 150) * 60,
            cursor_max_idle_ms=rng.choice([40, 300, 10**9]),
            cursor_stall=rng.choice([0.0, 0.002, 0.01]),
            replica_max_lag_ticks=rng.choice([30, 60, 200]),
            safety_ticks=rng.randint(800, 1800),
            liveness_ticks=3000,
            faults=faults,
            transactions=transactions or transaction_partitions > 1 or delete_records,
            delete_records=delete_records,
            transaction_partitions=transaction_partitions,
            wipe_rate=maybe(0.4, rng.uniform(0.001, 0.006)),
            # drawn last: older seeds keep the draws above
            retention_ms=rng.choice([-1, -1, 150, 600]),
            segment_bytes=rng.choice([200, 700, 3000, 1 << 30]),
            cursors=rng.choice([0, 1, 2, 3]),
            cursor_max_lag_bytes=rng.choice([-1, -1, 1500, 6000]),
            state_machine=rng.random() < 0.25,
            snapshot_entries=rng.choice([3, 20, 100]),
            snapshot_catchup_entries=rng.choice([0, 5, 50]),
            learners=rng.choice([0, 0, 0, 1]),
            spares=rng.choice([0, 1, 2]),
            reassign_rate=maybe(0.4, rng.uniform(0.002, 0.02)),
            transfer_rate=maybe(0.3, rng.uniform(0.002, 0.01)),
            sparse_ticks=rng.random() < 0.5,
            quiesce=rng.random() < 0.5,
        )
        if rng.random() < 0.15:
            # Deep retention: the log start follows the HW within a few ticks, so replicas often
            # hold no entry at all and followers start over at the leader's log start (what
            # seeds 402349 and 300028 needed hundreds of ticks of retention to reach).
            params = dataclasses.replace(
                params, retention_ms=rng.choice([5, 20, 50]), clean_every=rng.choice([1, 5])
            )
        if transaction_partitions > 1:
            # Transactions over partitions run on plain logs (a table's records need keys).
            params = dataclasses.replace(params, state_machine=False)
        return params if params.reassign_rate else dataclasses.replace(params, spares=0)

    def topic_config(self) -> TopicConfig:
        return TopicConfig(
            segment_bytes=self.segment_bytes,
            retention_ms=self.retention_ms,
            retention_bytes=self.retention_bytes,
            cursor_max_idle_ms=self.cursor_max_idle_ms,
            cursor_max_lag_bytes=self.cursor_max_lag_bytes,
            snapshot_entries=self.snapshot_entries,
            snapshot_catchup_entries=self.snapshot_catchup_entries,
        )

    def replay_command(self) -> str:
        extra = "".join(f" --fault {f}" for f in sorted(self.faults))
        if self.transactions:
            extra += " --transactions"
        if self.transaction_partitions > 1:
            extra += f" --transaction-partitions {self.transaction_partitions}"
        if self.delete_records:
            extra += " --delete-records"
        return f"python -m tidelog.testing --seed {self.seed}{extra}"
