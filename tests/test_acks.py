"""An acknowledgement means what it says (issue 10, the hw.policy=isr loss): a produce waiting
for its batch to commit fails if its leader loses leadership, even when that happens before the
waiting coroutine first runs, and a node's high-water mark as a follower never acknowledges a
batch its own leadership appended. The production partition driver (PartitionHost) against real
replicas of the core, messages routed by hand."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from helpers import batch_of, values_in
from tidelog.config import TopicConfig
from tidelog.errors import TidelogError
from tidelog.node.config import NodeConfig
from tidelog.node.flusher import Flusher
from tidelog.node.partition import PartitionHost
from tidelog.protocol import api
from tidelog.replication.messages import BeginEpoch, Message
from tidelog.replication.replica import QuorumState, Replica, ReplicaConfig
from tidelog.storage.memory_log import MemoryLog


class Router:
    """Node 1 is a production PartitionHost; nodes 2 and 3 are bare cores on in-memory logs."""

    def __init__(self, host_factory: object) -> None:
        self.queue: list[tuple[int, int, Message]] = []
        self.cut: set[int] = set()  # nodes whose messages, both ways, are dropped
        self.cores: dict[int, Replica] = {}
        self.logs: dict[int, MemoryLog] = {}

    def send(self, src: int, dst: int, message: Message) -> None:
        if src in self.cut or dst in self.cut:
            return
        self.queue.append((src, dst, message))

    def drain(self, host: PartitionHost, rounds: int = 200) -> None:
        for _ in range(rounds):
            for n, core in self.cores.items():
                ready = core.ready()
                for out in ready.messages:
                    self.send(n, out.to, out.message)
                if ready.flush:
                    self.logs[n].flush()
                    core.on_flushed()
            if not self.queue:
                return
            batch, self.queue = self.queue, []
            for src, dst, message in batch:
                if dst == 1:
                    host.step(src, message)
                else:
                    self.cores[dst].step(src, message)


def test_leadership_lost_before_the_waiter_runs_fails_the_produce(tmp_path: Path) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        flusher = Flusher(1, loop, "t")
        node = NodeConfig(
            data_dir=tmp_path, node_id=1, peers={1: ("h", 1), 2: ("h", 2), 3: ("h", 3)}
        )
        router = Router(None)
        host = PartitionHost(
            "t",
            0,
            (1, 2, 3),
            TopicConfig(hw_policy="isr"),
            node,
            tmp_path / "t-0",
            flusher,
            lambda to, group, message: router.send(1, to, message),
        )
        for n in (2, 3):
            config = ReplicaConfig(n, (1, 2, 3), hw_policy="isr")
            router.logs[n] = MemoryLog(TopicConfig())
            router.cores[n] = Replica(config, router.logs[n], QuorumState(), random.Random(n))

        async def settle(ticks: int = 150) -> None:
            for _ in range(ticks):
                for core in router.cores.values():
                    core.tick()
                host.tick()
                router.drain(host)
                await asyncio.sleep(0.002)

        host.replica.campaign(pre_vote=False)
        host.process_ready()
        await settle()
        assert host.replica.is_leader and host.replica.epoch == 1
        first = host.replica.propose(batch_of(b"committed"))
        host.process_ready()
        await settle()
        await host.wait_for_ack(first.last_offset, api.ACKS_ALL, 5)

        # Node 1 appends a batch nobody else will ever have, and its produce starts waiting...
        router.cut = {1}
        lost = host.replica.propose(batch_of(b"lost"))
        host.process_ready()
        waiting = asyncio.ensure_future(host.wait_for_ack(lost.last_offset, api.ACKS_ALL, 5))
        # ...but before the waiter runs, node 2 wins epoch 2 and commits a batch of its own at
        # the same offset, and node 1 hears of the new leader (it loses its leadership).
        router.cut = set()
        two = router.cores[2]
        two.campaign(pre_vote=False)
        router.cut = {1}
        for _ in range(20):
            router.drain(host)
        assert two.is_leader and two.epoch >= 2
        two.propose(batch_of(b"other"))
        for _ in range(20):
            router.drain(host)
        router.cut = set()
        host.step(2, BeginEpoch(two.epoch, 2))  # heard before the waiter has run at all
        assert not host.replica.is_leader
        await settle()  # node 1 follows node 2: truncates "lost", takes "other", and its HW
        assert not host.replica.is_leader
        assert host.log.high_watermark > lost.last_offset
        chunk = host.log.read(0, 1 << 20, host.log.high_watermark)
        assert chunk is not None
        assert [v for _, v in values_in(chunk.read())] == [b"committed", b"other"]
        with pytest.raises(TidelogError) as caught:
            await asyncio.wait_for(waiting, 5)
        assert caught.value.details.get("offset", lost.last_offset) == lost.last_offset
        await host.close()
        flusher.shutdown()

    asyncio.run(main())
