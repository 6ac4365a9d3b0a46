"""The simulated clients: producers writing to whichever node leads (acks=1 and acks=all, each
waiting through the driver's ack registry), readers reading any live replica below its HW (each
batch they get goes past the checkers), the cursors' consumers committing, and in
state-machine seeds the table's clients (table_clients.py), and with SimParams.transactions
transactional producers and read_committed readers (transactions.py)."""

from __future__ import annotations

from tidelog.errors import TidelogError
from tidelog.record.batch import ProducerRecord, build_batch, read_header
from tidelog.replication.acks import ANY_EPOCH
from tidelog.replication.faults import FAULT_ACKS_REGISTERED_LATE
from tidelog.testing.sim.cluster import Cluster
from tidelog.testing.sim.cursors import commit_cursors
from tidelog.testing.sim.nodes import Waiter
from tidelog.testing.sim.params import SimParams
from tidelog.testing.sim.table_clients import TableClients
from tidelog.testing.sim.transactions import TransactionalClients


class Workload:
    def __init__(self, cluster: Cluster, params: SimParams) -> None:
        self.cluster = cluster
        self.next_value = 0
        self.late: list[tuple[int, Waiter]] = []  # acks-registered-late: (when, waiter)
        self.tables = TableClients(cluster, params, self.propose) if params.state_machine else None
        self.transactions = (
            TransactionalClients(cluster)
            if params.transactions
            and params.transaction_partitions == 1
            and not params.state_machine
            else None
        )

    def act(self) -> None:
        """This tick's clients: maybe a produce, maybe a read, and the cursors' commits."""
        cluster = self.cluster
        params, rng = cluster.params, cluster.rng
        if rng.random() < params.produce_rate:
            self.produce()
        if rng.random() < params.read_rate:
            self.read()
        if params.clean_every:
            commit_cursors(
                cluster.cursors,
                rng,
                cluster.now,
                params.cursor_stall,
                cluster.checkers.watermarks.max_declared_hw,
            )
        if self.tables is not None:
            self.tables.act()
        if self.transactions is not None:
            self.transactions.act()

    def produce(self) -> None:
        cluster = self.cluster
        leaders = [
            n.node_id
            for n in cluster.nodes.values()
            if n.replica is not None and n.paused_until <= cluster.now and n.replica.is_leader
        ]
        if not leaders:
            return
        value = b"v%d" % self.next_value
        self.next_value += 1
        acks = "all" if cluster.rng.random() < cluster.params.acks_all_share else "1"
        self.propose(cluster.rng.choice(leaders), value, acks)

    def propose(
        self, node_id: int, value: bytes, acks: str, key: bytes | None = None
    ) -> int | None:
        """A producer's request to one node: the offset it got, or None if refused."""
        cluster = self.cluster
        node = cluster.nodes[node_id]
        replica = node.replica
        if replica is None:
            return None
        if key is None and cluster.params.state_machine:
            # A table's records need keys; a few keys, so later values replace earlier ones.
            key = b"k%d" % (self.next_value % 7)
        try:
            info = replica.propose(build_batch([ProducerRecord(key, value)], now_ms=cluster.now))
        except TidelogError:
            return None
        cluster.stats.proposed += 1
        cluster.process_ready(node)
        waiter = Waiter(node.node_id, replica.epoch, info.last_offset, value, acks)
        if FAULT_ACKS_REGISTERED_LATE in cluster.params.faults:
            # The producer's wait starts when its coroutine first runs, from whatever
            # leadership there is then (the hw.policy=isr loss).
            self.late.append((cluster.now + cluster.rng.randint(0, 30), waiter))
        elif node.driver is not None and node.driver.owe(info.last_offset, acks == "1", waiter):
            cluster.acknowledge([waiter], [])
        return info.last_offset

    def acknowledged(self, acked: list[Waiter], failed: list[Waiter]) -> None:
        if self.tables is not None:
            self.tables.acknowledged(acked, failed)
        if self.transactions is not None:
            self.transactions.acknowledged(acked, failed)

    def settle(self) -> None:
        """Every tick, clients or not: what answers still owe their clients."""
        self.register_late()
        if self.tables is not None:
            self.tables.settle()

    def register_late(self) -> None:
        """The waits of acks-registered-late producers whose coroutine runs now."""
        if not self.late:
            return
        cluster = self.cluster
        due = [(t, w) for t, w in self.late if t <= cluster.now]
        self.late = [(t, w) for t, w in self.late if t > cluster.now]
        for _, w in due:
            driver = cluster.nodes[w.node].driver
            if driver is None:
                cluster.stats.failed += 1
            else:
                driver.owed.register(w.last_offset, w.acks == "1", ANY_EPOCH, w)
                driver.process_ready()

    def read(self) -> None:
        cluster = self.cluster
        live = [n for n in cluster.nodes.values() if n.alive and n.paused_until <= cluster.now]
        if not live:
            return
        node = cluster.rng.choice(live)
        log = node.log
        hw = log.high_watermark
        if hw <= log.log_start_offset:
            return
        start = cluster.rng.randint(log.log_start_offset, hw - 1)
        chunk = log.read(start, cluster.rng.choice([1, 500, 1 << 20]), hw)
        cluster.stats.reads += 1
        if chunk is None:
            return
        data = chunk.read()
        pos = 0
        while pos < len(data):
            header = read_header(data, pos)
            batch = data[pos : pos + header.size_bytes]
            cluster.checkers.read(node, header, batch, hw)
            cluster.stats.records_read += header.records_count
            pos += header.size_bytes
