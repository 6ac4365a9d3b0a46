"""Readable, golden scenario scripts for the classic replication cases (etcd-raft's datadriven
tests, in our terms). A script is a list of commands, each followed by `----` and the output it
must produce:

    nodes 3
    ----
    ok

    campaign 1
    ----
    1->2 PreVote epoch=1 last=(e-1,0)
    ...

Nothing moves unless a command says so: messages wait in per-link queues until `deliver` or
`stabilize`, time passes only with `tick`. The cluster is the simulator's (the real replication
core on in-memory disks), so the same checkers run after every command.

Commands:
    nodes N [fetch-max-bytes=B] [flush=auto|manual] [fault=NAME] [directories=on]
          [learners=L] [spares=S]      N voters, then L learners (ids N+1..), then S nodes
                                     outside the group that a reassignment may move it onto
    campaign N [prevote=false]       stand for election now
    stand N                          lead now: ask a live leader to hand over, else campaign
    hand-over N                      N's node is stopping (a controlled shutdown): N takes no
                                     write and never stands again; as leader it hands over
    propose N VALUE [acks=all|1]     a producer writes VALUE to node N
    deliver A->B [count=K]           deliver queued messages on one link (all, or the first K)
    drop A->B | drop all             lose queued messages
    stabilize [N ...]                deliver and flush until quiet (only among the listed nodes)
    flush [N ...]                    finish pending fsyncs (flush=manual; auto flushes at once)
    tick K [N ...]                   K ticks on the listed nodes (default all)
    crash N / restart N              kill -9 (unflushed data lost) / start again
    wipe N                           crash, and the disk is replaced: N restarts empty (with
                                     directories=on, under a new directory id)
    partition 1 2 | 3 / heal         cut links both ways / restore them
    reassign N [N ...]               the metadata wants these voters: the leader walks there
    log-start N [OFFSET]             leader N moves its log start to OFFSET (default: its HW)
                                     and deletes what lies wholly below, as its cleaner would
    status                           every node's role, epoch, watermarks and log
    acks                             acknowledged writes so far
    check                            run the invariants now (also run after every command)
"""

from __future__ import annotations

import argparse
import difflib
import json
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tidelog.invariant import InvariantBroken
from tidelog.record.batch import BatchHeader, decode_records, iter_headers
from tidelog.replication.liveness import Heartbeat
from tidelog.replication.membership import MEMBERSHIP_CONTROL_KEY
from tidelog.replication.messages import (
    BeginEpoch,
    EpochNotice,
    FetchRequest,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    Message,
    Resign,
    TransferLeadership,
    VoteRequest,
    VoteResponse,
)
from tidelog.replication.replica import (
    LEADER_CHANGE_CONTROL_KEY,
    Ready,
    Replica,
    ReplicaConfig,
    Role,
)
from tidelog.testing.sim import SimNode, SimParams, Simulation, SimulationFailure, Waiter


@dataclass
class Queued:
    src: int
    dst: int
    message: Message
    directory: str = ""


class Scenario(Simulation):
    def __init__(
        self,
        nodes: int,
        fetch_max_bytes: int,
        auto_flush: bool,
        faults: frozenset[str],
        directories: bool = False,
        learners: int = 0,
        spares: int = 0,
    ) -> None:
        self.directories = directories
        self.queue: list[Queued] = []
        self.out: list[str] = []
        self.announced: dict[int, int] = {}
        self.auto_flush = auto_flush
        super().__init__(
            SimParams(
                seed=0,
                nodes=nodes,
                fetch_max_bytes=fetch_max_bytes,
                flush_delay_max=0,
                faults=faults,
                learners=learners,
                spares=spares,
            )
        )
        self.faults_on = False

    def replica_config(self, node_id: int) -> ReplicaConfig:
        base = super().replica_config(node_id)
        # Long, fixed timeouts: in a script only `tick` and `campaign` start elections.
        return ReplicaConfig(
            node_id=base.node_id,
            voters=base.voters,
            learners=base.learners,
            election_timeout_ticks=50,
            election_jitter_ticks=0,
            fetch_max_wait_ticks=1000,
            fetch_retry_ticks=1050,
            check_quorum_ticks=100,
            replica_lag_ticks=100,
            fetch_max_bytes=base.fetch_max_bytes,
            hw_policy=base.hw_policy,
            directory_id=base.directory_id if self.directories else "",
            faults=base.faults,
        )

    # -- hooks into the simulator ---------------------------------------------------------------

    def send(self, src: int, dst: int, message: Message | Heartbeat, directory: str = "") -> None:
        if isinstance(message, Heartbeat):
            raise InvariantBroken("scripts run without liveness")
        self.checkers.votes.sent(src, dst, message, self.nodes[src].log)
        self._announce(self.nodes[src])
        self.queue.append(Queued(src, dst, message, directory if self.directories else ""))
        self.out.append(f"{src}->{dst} {format_message(message)}")

    def _announce(self, node: SimNode) -> None:
        """A new leader says so before its first message."""
        replica = node.replica
        if (
            replica is not None
            and replica.role is Role.LEADER
            and self.announced.get(node.node_id) != replica.epoch
        ):
            self.announced[node.node_id] = replica.epoch
            self.out.append(f"{node.node_id} is leader in epoch {replica.epoch}")

    def after_ready(self, node: SimNode, ready: Ready) -> None:
        self._announce(node)
        super().after_ready(node, ready)
        node.log.write_state_checkpoint()  # scripts keep the HW checkpoint current
        if self.auto_flush:
            self.complete_flushes()

    def _acknowledge(self, into: dict[bytes, int], w: Waiter) -> None:
        super()._acknowledge(into, w)
        self.out.append(f"ack acks={w.acks} {w.value.decode()}@{w.last_offset} from {w.node}")

    # -- commands -------------------------------------------------------------------------------

    def deliver(self, src: int, dst: int, count: int | None = None) -> None:
        picked = [q for q in self.queue if (q.src, q.dst) == (src, dst)]
        if count is not None:
            picked = picked[:count]
        for q in picked:
            self.queue.remove(q)
            self._deliver_one(q)

    def _deliver_one(self, q: Queued) -> None:
        node = self.nodes[q.dst]
        if (q.src, q.dst) in self.blocked or node.driver is None:
            return
        self.deliver_message(q.src, node, q.message, q.directory)

    def stabilize(self, among: set[int] | None) -> None:
        for _ in range(10_000):
            ready = [q for q in self.queue if among is None or (q.src in among and q.dst in among)]
            if not ready:
                return
            q = ready[0]
            self.queue.remove(q)
            self._deliver_one(q)
        raise SimulationFailure("stabilize did not settle in 10,000 deliveries")

    def status(self) -> list[str]:
        lines = []
        for n in self.node_ids:
            node = self.nodes[n]
            log = node.log
            if node.replica is None:
                head = f"{n}: down"
            else:
                r = node.replica
                leader = (
                    f" leader={r.leader_id}"
                    if r.leader_id >= 0 and r.role.value != "leader"
                    else ""
                )
                head = f"{n}: {r.role.value} epoch={r.epoch}{leader}"
                if r.is_observer:
                    head += " observer"
                if r.is_learner:
                    head += " learner"
                if r.leaving:
                    head += " leaving" + (" handing-over" if r.handing_over else "")
                if r.history.current.offset >= 0:
                    head += f" voters={','.join(map(str, r.voters))}"
            head += f" leo={log.log_end_offset} hw={log.high_watermark} durable={log.durable_end_offset}"
            lines.append(f"{head} log=[{format_log(log.batches())}]")
        return lines


def format_message(m: Message) -> str:
    if isinstance(m, VoteRequest):
        kind = "PreVote" if m.pre_vote else "Vote"
        return f"{kind} epoch={m.epoch} last=(e{m.last_epoch},{m.log_end_offset})"
    if isinstance(m, VoteResponse):
        kind = "PreVoteResp" if m.pre_vote else "VoteResp"
        return f"{kind} epoch={m.epoch} {'granted' if m.granted else 'rejected'}"
    if isinstance(m, BeginEpoch):
        return f"BeginEpoch epoch={m.epoch} leader={m.leader}"
    if isinstance(m, Resign):
        return f"Resign epoch={m.epoch} successor={m.successor}"
    if isinstance(m, TransferLeadership):
        return f"TransferLeadership epoch={m.epoch}"
    if isinstance(m, EpochNotice):
        return f"EpochNotice epoch={m.epoch} leader={m.leader}"
    if isinstance(m, FetchRequest):
        return (
            f"Fetch epoch={m.epoch} offset={m.fetch_offset} durable={m.durable_offset} "
            f"last_epoch={m.last_fetched_epoch} hw={m.high_watermark}"
        )
    if isinstance(m, FetchSnapshotRequest):
        return f"FetchSnapshot epoch={m.epoch} snapshot={m.snapshot_offset} position={m.position}"
    if isinstance(m, FetchSnapshotResponse):
        size = m.records.size if m.records is not None else 0
        return (
            f"FetchSnapshotResp epoch={m.epoch} snapshot={m.snapshot_offset} "
            f"position={m.position} bytes={size}/{m.size}{' error=' + m.error if m.error else ''}"
        )
    text = f"FetchResp epoch={m.epoch} hw={m.high_watermark}"
    if m.error:
        return f"{text} error={m.error}"
    if m.diverging:
        return f"{text} diverging=(e{m.diverging_epoch},{m.diverging_end_offset})"
    if m.snapshot_required:
        return f"{text} snapshot-required log_start={m.log_start_offset}"
    if m.records is not None:
        return f"{text} records=[{format_log(_batches(m.records.read()))}]"
    return text


def _batches(data: bytes) -> list[tuple[BatchHeader, bytes]]:
    return [(h, data[p : p + h.size_bytes]) for p, h in iter_headers(data)]


def format_log(batches: list[tuple[BatchHeader, bytes]]) -> str:
    items = []
    for header, batch in batches:
        for rec in decode_records(batch):
            if header.is_control and rec.key == LEADER_CHANGE_CONTROL_KEY:
                value = "<leader-change>"
            elif header.is_control and rec.key == MEMBERSHIP_CONTROL_KEY:
                m = json.loads(rec.value or b"{}")
                learners = "".join(f" +{n}" for n in m["learners"])
                value = f"<voters {','.join(map(str, m['voters']))}{learners}>"
            else:
                value = (rec.value or b"").decode("utf-8", "replace")
            items.append(f"{rec.offset}@e{header.partition_leader_epoch}:{value}")
    return " ".join(items)


def _link(text: str) -> tuple[int, int]:
    a, _, b = text.partition("->")
    return int(a), int(b)


# The commands, each a handler of (scenario, plain arguments, key=value options).
Handler = Callable[[Scenario, list[str], dict[str, str]], None]


def _new_scenario(plain: list[str], opts: dict[str, str]) -> Scenario:
    """`nodes N [fetch-max-bytes=B] [flush=auto|manual] [fault=NAME] [directories=on]
    [learners=L] [spares=S]`"""
    faults = frozenset(v for k, v in opts.items() if k == "fault")
    return Scenario(
        int(plain[0]),
        int(opts.get("fetch-max-bytes", 1 << 20)),
        opts.get("flush", "auto") == "auto",
        faults,
        opts.get("directories", "off") == "on",
        int(opts.get("learners", 0)),
        int(opts.get("spares", 0)),
    )


def _live_replica(sim: Scenario, node_id: str) -> tuple[SimNode, Replica]:
    node = sim.nodes[int(node_id)]
    if node.replica is None:
        raise InvariantBroken("node.replica is not None")
    return node, node.replica


def _campaign(sim: Scenario, plain: list[str], opts: dict[str, str]) -> None:
    node, replica = _live_replica(sim, plain[0])
    replica.campaign(pre_vote=opts.get("prevote", "true") != "false")
    sim.process_ready(node)


def _stand(sim: Scenario, plain: list[str], opts: dict[str, str]) -> None:
    node, replica = _live_replica(sim, plain[0])
    replica.stand()
    sim.process_ready(node)


def _hand_over(sim: Scenario, plain: list[str], opts: dict[str, str]) -> None:
    node, _ = _live_replica(sim, plain[0])
    if node.driver is None:
        raise InvariantBroken("node.driver is not None")
    under_way = node.driver.hand_over()
    sim.out.append(f"{plain[0]} {'is handing over' if under_way else 'has nothing to hand over'}")


def _propose(sim: Scenario, plain: list[str], opts: dict[str, str]) -> None:
    offset = sim.propose(int(plain[0]), plain[1].encode(), opts.get("acks", "all"))
    sim.out.append(f"appended at {offset}" if offset is not None else "refused: not the leader")


def _deliver(sim: Scenario, plain: list[str], opts: dict[str, str]) -> None:
    src, dst = _link(plain[0])
    sim.deliver(src, dst, int(opts["count"]) if "count" in opts else None)


def _drop(sim: Scenario, plain: list[str], opts: dict[str, str]) -> None:
    if plain[0] == "all":
        dropped = len(sim.queue)
        sim.queue.clear()
    else:
        src, dst = _link(plain[0])
        before = len(sim.queue)
        sim.queue = [q for q in sim.queue if (q.src, q.dst) != (src, dst)]
        dropped = before - len(sim.queue)
    sim.out.append(f"dropped {dropped}")


def _stabilize(sim: Scenario, plain: list[str], opts: dict[str, str]) -> None:
    sim.stabilize({int(p) for p in plain} or None)


def _flush(sim: Scenario, plain: list[str], opts: dict[str, str]) -> None:
    targets = {int(p) for p in plain} or set(sim.node_ids)
    for n in sorted(targets):
        node = sim.nodes[n]
        if node.flush is not None and node.driver is not None:
            job, _ = node.flush
            node.flush = None
            node.log.complete_flush(job)
            sim.out.append(f"{n} flushed to {node.log.durable_end_offset}")
            node.driver.flushed()


def _tick(sim: Scenario, plain: list[str], opts: dict[str, str]) -> None:
    count = int(plain[0])
    ticked = [int(p) for p in plain[1:]] or sim.node_ids
    for _ in range(count):
        sim.now += 1
        for n in ticked:
            node = sim.nodes[n]
            if node.driver is not None:
                node.driver.tick()


def _crash(sim: Scenario, plain: list[str], opts: dict[str, str]) -> None:
    sim.crash(int(plain[0]))
    sim.queue = [q for q in sim.queue if q.dst != int(plain[0])]
    sim.out.append(f"{plain[0]} crashed")


def _wipe(sim: Scenario, plain: list[str], opts: dict[str, str]) -> None:
    sim.wipe(int(plain[0]))


def _restart(sim: Scenario, plain: list[str], opts: dict[str, str]) -> None:
    sim.restart(int(plain[0]))


def _partition(sim: Scenario, plain: list[str], opts: dict[str, str]) -> None:
    left, _, right = " ".join(plain).partition("|")
    a = [int(x) for x in left.split()]
    b = [int(x) for x in right.split()]
    for x in a:
        for y in b:
            sim.blocked.update({(x, y), (y, x)})
    sim.out.append(f"partitioned {a} | {b}")


def _heal(sim: Scenario, plain: list[str], opts: dict[str, str]) -> None:
    sim.blocked.clear()
    sim.out.append("healed")


def _reassign(sim: Scenario, plain: list[str], opts: dict[str, str]) -> None:
    sim.set_target(tuple(sorted(int(p) for p in plain)))
    sim.out.append(f"target voters {','.join(plain)}")


def _log_start(sim: Scenario, plain: list[str], opts: dict[str, str]) -> None:
    node = sim.nodes[int(plain[0])]
    if not (node.replica is not None and node.driver is not None):
        raise InvariantBroken("node.replica is not None and node.driver is not None")
    before = node.log.log_start_offset
    target = int(plain[1]) if len(plain) > 1 else node.log.high_watermark
    node.replica.advance_log_start(target)
    node.log.delete_segments_below_log_start()
    sim.process_ready(node)
    sim.out.append(f"log start {before} -> {node.log.log_start_offset} on {plain[0]}")


def _status(sim: Scenario, plain: list[str], opts: dict[str, str]) -> None:
    sim.out.extend(sim.status())


def _acks(sim: Scenario, plain: list[str], opts: dict[str, str]) -> None:
    for value, offset in sorted(sim.acked.items(), key=lambda kv: kv[1]):
        sim.out.append(f"acks=all {value.decode()}@{offset}")
    for value, offset in sorted(sim.acked_one.items(), key=lambda kv: kv[1]):
        sim.out.append(f"acks=1 {value.decode()}@{offset}")


def _check(sim: Scenario, plain: list[str], opts: dict[str, str]) -> None:
    for node in sim.nodes.values():
        if node.replica is not None:
            sim.checkers.check_node(node)
    sim.checkers.check_log_matching()
    sim.out.append("invariants hold")


COMMANDS: dict[str, Handler] = {
    "campaign": _campaign,
    "stand": _stand,
    "hand-over": _hand_over,
    "propose": _propose,
    "deliver": _deliver,
    "drop": _drop,
    "stabilize": _stabilize,
    "flush": _flush,
    "tick": _tick,
    "crash": _crash,
    "wipe": _wipe,
    "restart": _restart,
    "partition": _partition,
    "heal": _heal,
    "reassign": _reassign,
    "log-start": _log_start,
    "status": _status,
    "acks": _acks,
    "check": _check,
}


def run_command(sim: Scenario | None, line: str) -> tuple[Scenario | None, list[str]]:
    words = shlex.split(line)
    cmd, args = words[0], words[1:]
    opts = dict(a.split("=", 1) for a in args if "=" in a)
    plain = [a for a in args if "=" not in a]
    if cmd == "nodes":
        return _new_scenario(plain, opts), ["ok"]
    if sim is None:
        raise InvariantBroken("the first command must be `nodes`")
    sim.out = []
    try:
        handler = COMMANDS.get(cmd)
        if handler is None:
            raise ValueError(f"unknown command {cmd!r}")
        handler(sim, plain, opts)
        sim.raise_deferred()
    except (SimulationFailure, AssertionError) as exc:
        first = str(exc).split("\n")[0]
        sim.out.append(f"VIOLATION: {first.split(': ', 1)[-1] if 'tick' in first else first}")
    return sim, sim.out or ["ok"]


def run_script(text: str) -> str:
    """Run a script and return it with every command's actual output (the golden form)."""
    out: list[str] = []
    sim: Scenario | None = None
    blocks = text.strip("\n").split("\n\n")
    for block in blocks:
        lines = block.split("\n")
        comments = [line for line in lines if line.startswith("#")]
        body = [line for line in lines if not line.startswith("#")]
        if not body:
            out.append("\n".join(comments))
            continue
        command = body[0]
        sim, result = run_command(sim, command)
        out.append("\n".join([*comments, command, "----", *result]))
    return "\n\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tidelog.testing.scenario")
    parser.add_argument("scripts", nargs="+", type=Path)
    parser.add_argument(
        "--rewrite", action="store_true", help="write actual outputs as the golden ones"
    )
    args = parser.parse_args(argv)
    status = 0
    for path in args.scripts:
        expected = path.read_text()
        actual = run_script(expected)
        if args.rewrite:
            path.write_text(actual)
        elif actual != expected:
            status = 1
            sys.stdout.writelines(
                difflib.unified_diff(
                    expected.splitlines(True), actual.splitlines(True), str(path), "actual"
                )
            )
    return status


if __name__ == "__main__":
    sys.exit(main())
