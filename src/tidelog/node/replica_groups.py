"""A node's replica groups (every partition replica it hosts, and the metadata log's) and their
clock: which act when.

Time is kept as deadlines. Every replica reads one monotonic clock in ticks of `tick_ms`, says
when it next has something to do (`PartitionDriver.next_deadline`: an election timeout, a fetch
retry, a parked fetch's answer; none for a quiet group), and the tick loop sleeps until the
earliest deadline in its heap or until an event (a message, a write, a flush) marks a replica
dirty, then lets exactly those replicas act. A replica with nothing to do costs nothing. The
checkpoint loop writes the HW of the logs whose HW moved, every `checkpoint_interval_ms`.

The groups are opened by the node core (node/core.py), which hands each one its collaborators;
this module only keeps them and their clock.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import logging
import time
from collections.abc import Callable

from tidelog.errors import TidelogError
from tidelog.node.failstop import FailStop
from tidelog.node.metrics import Counters, Histograms
from tidelog.node.partition import PartitionHost
from tidelog.node.turns import Turns
from tidelog.replication.clock import MonotonicClock

log = logging.getLogger(__name__)


class ReplicaGroups:
    def __init__(
        self,
        clock: MonotonicClock,
        counters: Counters,
        histograms: Histograms,
        fail_stop: FailStop,
        checkpoint_interval_s: Callable[[], float],
    ) -> None:
        self.hosts: dict[str, PartitionHost] = {}  # by group: "topic/partition"
        self.clock = clock
        self.counters = counters
        self.histograms = histograms
        self.fail_stop = fail_stop
        self.checkpoint_interval_s = checkpoint_interval_s
        self._wake = asyncio.Event()  # set when a replica is dirtied: the tick loop wakes
        self._deadlines: list[tuple[int, int, PartitionHost]] = []  # (tick, seq, host) heap
        self._deadline_seq = 0
        self._dirty: dict[str, PartitionHost] = {}
        self._to_checkpoint: dict[str, PartitionHost] = {}  # HW moved since the last round

    def add(self, host: PartitionHost) -> None:
        """A replica just opened: it acts at the next tick, then when due or dirtied."""
        host.driver.on_dirty = functools.partial(self.dirtied, host)
        self.dirtied(host)
        self.hosts[host.group] = host

    def dirtied(self, host: PartitionHost) -> None:
        self._dirty[host.group] = host
        if not self._wake.is_set():
            self._wake.set()

    def high_watermark_moved(self, host: PartitionHost) -> None:
        self._to_checkpoint[host.group] = host

    def stored_bytes(self) -> int:
        """Bytes of every replica's segments on this node (storage.max.bytes counts these)."""
        return sum(h.log.size_bytes for h in self.hosts.values())

    def nudge_groups_with(self, peers: set[int]) -> None:
        """Wake every replica in a group with one of peers (a peer's liveness changed)."""
        for host in self.hosts.values():
            replica = host.replica
            if replica.leader_id in peers or not peers.isdisjoint(replica.history.current.members):
                host.driver.nudge()

    def halt(self) -> None:
        """No replica acts again (a fail-stop)."""
        for host in self.hosts.values():
            host.driver.stopped = True

    async def close(self) -> None:
        for host in list(self.hosts.values()):
            try:
                await host.close()
            except TidelogError as exc:
                log.error("%s: close failed: %s", host.group, exc)

    async def tick_loop(self) -> None:
        """The replicas' clock, kept as deadlines: the loop sleeps until the earliest replica
        deadline, or until an event (a message, a write, a flush) makes a replica dirty, and
        then acts, at a tick boundary, on the replicas that are due or dirty; the others cost
        nothing. A round over many replicas takes turns with everything else the loop serves
        (node/turns.py). How long rounds take, and how late the loop wakes, are measured."""
        rounds = self.histograms.get("tidelog_tick_round_seconds")
        late = self.histograms.get("tidelog_event_loop_lag_seconds")
        acted = self.counters.key("tidelog_replica_acts_total")
        clock = self.clock
        while True:
            now = clock.ticks
            if self._dirty:
                at: int | None = now + 1
            elif self._deadlines:
                at = max(self._deadlines[0][0], now + 1)
            else:
                at = None
            self._wake.clear()
            if at is None:
                await self._wake.wait()  # nothing due until an event
                continue
            wake_at = clock.time_of(at)
            delay = wake_at - time.monotonic()
            if delay > 0:
                if self._dirty:
                    await asyncio.sleep(delay)
                else:
                    try:
                        await asyncio.wait_for(self._wake.wait(), delay)
                        continue  # dirtied before the deadline: act at the next tick instead
                    except TimeoutError:
                        pass
            late.observe(max(0.0, time.monotonic() - wake_at))
            started = time.monotonic()
            turns = Turns()
            for host in self._due_hosts():
                if self.fail_stop.failed is not None:
                    return  # halted: a cancelled task runs on until its next await
                try:
                    host.tick()  # a host removed while the round yielded is stopped: a no-op
                except Exception as exc:
                    # One partition's failure must not stop the clock for the others, unless
                    # it broke an invariant: then the node stops.
                    self.fail_stop.check(exc, f"{host.group} tick")
                    log.exception("%s: tick failed", host.group)
                finally:
                    self._schedule(host)
                self.counters.add(acted)
                if turns.due():  # checked, not awaited, per replica: ticks are small
                    await turns.give()
            rounds.observe(time.monotonic() - started)

    def _due_hosts(self) -> list[PartitionHost]:
        """The replicas that act this tick: those an event made dirty since they last acted,
        and those whose deadline has come. Every other replica costs nothing this tick."""
        now = self.clock.ticks
        due = {g: h for g, h in self._dirty.items() if h.driver.dirty}
        self._dirty = {}
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            at, _, host = heapq.heappop(heap)
            if host.tick_at == at:  # else a later act rescheduled it: a stale entry
                host.tick_at = None
                due[host.group] = host
        return [h for h in due.values() if not h.closed]

    def _schedule(self, host: PartitionHost) -> None:
        at = host.driver.next_deadline()
        if at is None or host.closed:
            host.tick_at = None
        elif at != host.tick_at:  # (an equal one is in the heap already)
            host.tick_at = at
            self._deadline_seq += 1
            heapq.heappush(self._deadlines, (at, self._deadline_seq, host))

    async def checkpoint_loop(self) -> None:
        while True:
            await asyncio.sleep(self.checkpoint_interval_s())
            turns = Turns()
            changed, self._to_checkpoint = self._to_checkpoint, {}
            for host in changed.values():  # only those whose HW moved since the last round
                if host.closed:  # deleted or closed while this round gave its turn
                    continue
                try:
                    host.checkpoint()
                except (OSError, TidelogError) as exc:
                    log.error("%s: checkpoint failed: %s", host.group, exc)
                await turns.take()
