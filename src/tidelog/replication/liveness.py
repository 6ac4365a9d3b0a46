"""Node liveness: one heartbeat per pair of nodes, so idle replica groups can quiesce.

A quiesced group sends nothing (quiescence.py): its followers stop fetching and stop their
election timers, its leader stops expecting fetches. What still tells them that a leader (or a
follower) died is this: every node sends every peer a heartbeat every `interval_ticks`, and a
peer not heard from for `timeout_ticks` is dead to this node. The cost is per pair of nodes,
not per partition (CockroachDB's node liveness, in the same role).

A heartbeat carries the sender's incarnation (new at every start): a node that restarted
faster than the timeout is still a node whose replicas forgot that they led or followed, and
the replicas quiesced on its word wake up for it.

Pure: no IO and no clock of its own. The node (or the simulator) sends the heartbeats it is
told are due, hands over those it receives, and after either (or at `next_deadline()`) asks
which peers changed, to wake the replicas that share a group with them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from tidelog.invariant import invariant

if TYPE_CHECKING:
    from tidelog.replication.clock import TickSource


@dataclass(frozen=True, slots=True)
class Heartbeat:
    node: int  # the sender (checked against the channel's authenticated node id)
    incarnation: int


class LivenessView(Protocol):
    """What a replica asks of its node's liveness."""

    def is_alive(self, node: int) -> bool: ...

    def incarnation(self, node: int) -> int: ...

    def heard_at(self, node: int) -> int | None:
        """The tick this node last heard from that one (None: never, or lost since)."""
        ...


class Liveness:
    def __init__(
        self,
        node_id: int,
        incarnation: int,
        clock: TickSource,
        interval_ticks: int,
        timeout_ticks: int,
    ) -> None:
        invariant(0 < interval_ticks < timeout_ticks, "0 < interval_ticks < timeout_ticks")
        self.node_id = node_id
        self.own_incarnation = incarnation
        self.clock = clock
        self.interval_ticks = interval_ticks
        self.timeout_ticks = timeout_ticks
        self._heard: dict[int, int] = {}  # peer -> tick last heard
        self._incarnations: dict[int, int] = {}
        self._alive: set[int] = set()  # as last reported by changed()
        self._changed: set[int] = set()
        self._sent_at: int | None = None

    # -- sending --------------------------------------------------------------------------------

    def heartbeat_due(self) -> bool:
        now = self.clock.ticks
        return self._sent_at is None or now - self._sent_at >= self.interval_ticks

    def heartbeat(self) -> Heartbeat:
        """The heartbeat to send every peer now (the caller sends it to each)."""
        self._sent_at = self.clock.ticks
        return Heartbeat(self.node_id, self.own_incarnation)

    # -- receiving ------------------------------------------------------------------------------

    def heard_from(self, sender: int) -> None:
        """Any other message from a peer we know the incarnation of: it lives (a heartbeat
        queued behind a busy stream must not make it look dead)."""
        if sender in self._alive:
            self._heard[sender] = self.clock.ticks

    def on_heartbeat(self, sender: int, heartbeat: Heartbeat) -> None:
        if heartbeat.node != sender or sender == self.node_id:
            return  # nobody speaks for another node
        self._heard[sender] = self.clock.ticks
        if self._incarnations.get(sender) != heartbeat.incarnation:
            if sender in self._incarnations:
                self._changed.add(sender)  # it restarted: what it led or followed, it forgot
            self._incarnations[sender] = heartbeat.incarnation
        if sender not in self._alive:
            self._alive.add(sender)
            self._changed.add(sender)

    # -- the replicas' view ---------------------------------------------------------------------

    def is_alive(self, node: int) -> bool:
        if node == self.node_id:
            return True
        heard = self._heard.get(node)
        return heard is not None and self.clock.ticks - heard < self.timeout_ticks

    def heard_at(self, node: int) -> int | None:
        if node == self.node_id:
            return self.clock.ticks
        return self._heard.get(node)

    def incarnation(self, node: int) -> int:
        if node == self.node_id:
            return self.own_incarnation
        return self._incarnations.get(node, -1)

    def lost(self, node: int) -> None:
        """The peer's connection closed under it (its process exited, or is restarting): dead
        now rather than after the timeout. A live peer's next heartbeat brings it back."""
        self._heard.pop(node, None)
        if node in self._alive:
            self._alive.discard(node)
            self._changed.add(node)

    def changed(self) -> set[int]:
        """Peers that came alive, died or restarted since the last call: the replicas sharing
        a group with them must act (a quiesced group wakes: quiescence.py)."""
        now = self.clock.ticks
        for peer in list(self._alive):
            if now - self._heard.get(peer, now - self.timeout_ticks) >= self.timeout_ticks:
                self._alive.discard(peer)
                self._changed.add(peer)
        changed, self._changed = self._changed, set()
        return changed

    def next_deadline(self) -> int:
        """The next tick at which a heartbeat is due or a peer may expire."""
        now = self.clock.ticks
        due = now if self._sent_at is None else self._sent_at + self.interval_ticks
        for peer in self._alive:
            due = min(due, self._heard[peer] + self.timeout_ticks)
        return max(due, now + 1)
