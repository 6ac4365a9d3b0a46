"""The checker of a transactional history taken from outside (issue 36): what Kafka clients did
(transactions, each with its writes, its outcome as the client saw it, and the consumer offsets
it sent) and what read_committed consumers were handed, during the run and in a final read of
every partition once every transaction was decided. No cluster is needed to run it; the
simulator's checker (tidelog.testing.sim.checkers.transactions) looks at one partition's
committed log from inside, this one at many partitions from the clients' side.

The anomalies, by name:
  - aborted read: a read_committed consumer was handed a record of a transaction that was
    aborted, or that is not (wholly) in the final read
  - non-atomic visibility: part of a transaction is in the final read and the rest never
    appears, or a consumer read past where one of a transaction's records sits while it was
    handed another of its records but not that one (a fractured read)
  - duplicate: one value at two offsets (in the final read, or handed to one consumer)
  - lost committed: commit_transaction returned OK but not all the transaction's records are
    in the final read
  - offsets without output / output without offsets: a consume-transform-produce group's final
    committed input offset C must say exactly which inputs have their output committed, each
    once: every input offset below C, none at or above
  - filter mismatch: what a fresh read_committed read of a partition was handed (through
    Kafka's Fetch, tidelog's own client, or librdkafka's final read) differs from what the
    partition's raw log says it must be: every record of a committed transaction or of no
    transaction, below the last stable offset, none of an aborted one (committed_view). The
    other checks see only what the clients were handed; this one holds the node's filter (its
    LSO and its list of aborted transactions) to the log under it
  - G0 (write cycle): committed transactions ordered one way in one partition and the other way
    in another. Kafka's transactions do not order concurrent writers across partitions, so a
    cycle is counted and shown, not a failure (FAILURES leaves it out).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

COMMITTED = "committed"  # commit_transaction returned
ABORTED = "aborted"  # abort_transaction returned
UNKNOWN = "unknown"  # an error on the way: either outcome is allowed, but all or nothing

ABORTED_READ = "aborted read"
NON_ATOMIC = "non-atomic visibility"
DUPLICATE = "duplicate"
LOST_COMMITTED = "lost committed"
OFFSETS_WITHOUT_OUTPUT = "offsets committed without their output"
OUTPUT_WITHOUT_OFFSETS = "output without its offsets"
FILTER_MISMATCH = "filter-mismatch"
G0 = "G0 write cycle"
ANOMALIES = (
    ABORTED_READ,
    NON_ATOMIC,
    DUPLICATE,
    LOST_COMMITTED,
    OFFSETS_WITHOUT_OUTPUT,
    OUTPUT_WITHOUT_OFFSETS,
    FILTER_MISMATCH,
    G0,
)
FAILURES = tuple(a for a in ANOMALIES if a != G0)

Partition = tuple[str, int]  # (topic, partition)
Placed = list[tuple[int, bytes]]  # (offset, value) in offset order

# A transaction marker's kind in a LogBatch (None: a data batch; OTHER_CONTROL: a control batch
# that ends no transaction)
COMMIT_MARKER, ABORT_MARKER, OTHER_CONTROL = "commit", "abort", "other control"


@dataclass(frozen=True)
class Source:
    """The input record an output record was made from, and the group that consumed it."""

    group: str
    topic: str
    partition: int
    offset: int


@dataclass
class Txn:
    """One transaction as its producer saw it. Values are unique across the run."""

    name: str
    outcome: str = UNKNOWN
    writes: list[tuple[Partition, bytes]] = field(default_factory=list)


@dataclass(frozen=True)
class LogBatch:
    """One batch of a partition's raw log (read_uncommitted, control batches included)."""

    producer_id: int
    transactional: bool
    control: str | None  # COMMIT_MARKER, ABORT_MARKER, OTHER_CONTROL; None for data
    records: tuple[tuple[int, bytes], ...]  # (offset, value)
    next_offset: int


@dataclass
class PartitionLog:
    """A partition's raw log read to its high watermark, after the run."""

    batches: list[LogBatch]
    high_watermark: int


@dataclass
class History:
    txns: list[Txn] = field(default_factory=list)
    # Reads during the run: reader -> partition -> [(offset, value)] in the order handed over.
    reads: dict[str, dict[Partition, list[tuple[int, bytes]]]] = field(default_factory=dict)
    # The final read_committed read of every partition, to its end.
    final: dict[Partition, list[tuple[int, bytes]]] = field(default_factory=dict)
    # Consume-transform-produce: each output value's input, and each group's final offsets.
    sources: dict[bytes, Source] = field(default_factory=dict)
    group_offsets: dict[str, dict[Partition, int]] = field(default_factory=dict)
    # The offsets of each input partition's records, read at the end: offsets are not dense
    # (control records take some), so the invariant is about these.
    inputs: dict[Partition, list[int]] = field(default_factory=dict)
    # After the final read: each partition's raw log, and fresh read_committed reads of it by
    # way of reading (e.g. "kafka fetch", "tidelog client"); checked against each other.
    logs: dict[Partition, PartitionLog] = field(default_factory=dict)
    committed_reads: dict[str, dict[Partition, Placed]] = field(default_factory=dict)

    def read(self, reader: str, partition: Partition, offset: int, value: bytes) -> None:
        self.reads.setdefault(reader, {}).setdefault(partition, []).append((offset, value))


Found = dict[str, list[str]]


def check(history: History) -> Found:
    """Every anomaly found, by name (each name present, its list empty when none was found)."""
    found: Found = {name: [] for name in ANOMALIES}
    placed = final_places(history, found)
    txn_of = {value: txn for txn in history.txns for _, value in txn.writes}
    check_reads(history, txn_of, placed, found)
    check_transactions(history, placed, found)
    check_consume_transform_produce(history, placed, found)
    check_filter(history, found)
    found[G0] = write_cycles(history, placed)
    return found


def final_places(history: History, found: Found) -> dict[bytes, tuple[Partition, int]]:
    """Each value of the final read: where it is; one stored twice is a duplicate."""
    placed: dict[bytes, tuple[Partition, int]] = {}
    for partition, records in sorted(history.final.items()):
        for offset, value in records:
            if value in placed:
                found[DUPLICATE].append(
                    f"{value!r} at {placed[value]} and at {(partition, offset)} (final read)"
                )
                continue
            placed[value] = (partition, offset)
    return placed


def check_reads(
    history: History,
    txn_of: dict[bytes, Txn],
    placed: dict[bytes, tuple[Partition, int]],
    found: Found,
) -> None:
    """What each consumer was handed during the run: nothing aborted, nothing twice, and no
    transaction seen in part where the consumer read past the rest of it."""
    for reader, by_partition in sorted(history.reads.items()):
        furthest = {p: max(o for o, _ in records) for p, records in by_partition.items()}
        handed: dict[bytes, int] = {}
        for partition, records in sorted(by_partition.items()):
            for offset, value in records:
                if value in handed and handed[value] != offset:
                    found[DUPLICATE].append(
                        f"{reader} was handed {value!r} at offsets {handed[value]} and {offset}"
                    )
                handed[value] = offset
                txn = txn_of.get(value)
                if txn is not None and txn.outcome == ABORTED:
                    found[ABORTED_READ].append(
                        f"{reader} was handed {value!r} of aborted transaction {txn.name} "
                        f"at {partition}/{offset}"
                    )
                elif value not in placed and txn is not None and txn.outcome != COMMITTED:
                    # (a committed one's record gone at the end is a lost committed record)
                    found[ABORTED_READ].append(
                        f"{reader} was handed {value!r} at {partition}/{offset}, which never "
                        "committed (not in the final read)"
                    )
        seen_txns = {txn_of[v].name: txn_of[v] for v in handed if v in txn_of}
        for txn in seen_txns.values():
            for partition, value in txn.writes:
                where = placed.get(value)
                if value in handed or where is None or where[0] != partition:
                    continue
                if where[1] < furthest.get(partition, -1):
                    found[NON_ATOMIC].append(
                        f"{reader} saw part of transaction {txn.name} and read {partition} "
                        f"past offset {where[1]} without being handed {value!r} (fractured read)"
                    )


def check_transactions(
    history: History, placed: dict[bytes, tuple[Partition, int]], found: Found
) -> None:
    """Each transaction in the final read: all or nothing; all if it committed, nothing if it
    aborted."""
    for txn in history.txns:
        present = [v for _, v in txn.writes if v in placed]
        missing = [v for _, v in txn.writes if v not in placed]
        if txn.outcome == COMMITTED and missing:
            found[LOST_COMMITTED].append(
                f"transaction {txn.name} committed but {len(missing)} of its "
                f"{len(txn.writes)} records are not in the final read: {missing[:3]}"
            )
        elif txn.outcome == ABORTED and present:
            found[ABORTED_READ].append(
                f"transaction {txn.name} aborted but {len(present)} of its records are in the "
                f"final read_committed read: {present[:3]}"
            )
        elif present and missing:
            found[NON_ATOMIC].append(
                f"transaction {txn.name} ({txn.outcome}) is in the final read in part: "
                f"{len(present)} present, {missing[:3]} never appear"
            )


def check_consume_transform_produce(
    history: History, placed: dict[bytes, tuple[Partition, int]], found: Found
) -> None:
    """Each group's committed input offset against the outputs in the final read."""
    outputs: dict[tuple[str, Partition], dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for value in placed:
        source = history.sources.get(value)
        if source is not None:
            key = (source.group, (source.topic, source.partition))
            outputs[key][source.offset] += 1
    attempts: dict[Source, list[str]] = defaultdict(list)  # each input's transactions
    for txn in history.txns:
        for _, value in txn.writes:
            if value in history.sources:
                attempts[history.sources[value]].append(f"{txn.name} ({txn.outcome})")
    groups = {
        (g, partition) for g, offsets in history.group_offsets.items() for partition in offsets
    }
    for group, partition in sorted(groups | set(outputs)):
        committed = history.group_offsets.get(group, {}).get(partition, 0)
        made = outputs.get((group, partition), {})
        below = [o for o in history.inputs.get(partition, []) if o < committed]
        without_output = [o for o in below if made.get(o, 0) == 0]
        if without_output:
            found[OFFSETS_WITHOUT_OUTPUT].append(
                f"group {group} committed {partition} to {committed} but the outputs of "
                f"{len(without_output)} inputs below it are missing: {without_output[:5]}; "
                f"the first was in transactions "
                f"{attempts.get(Source(group, *partition, without_output[0]), [])}"
            )
        beyond = sorted(o for o in made if o >= committed)
        if beyond:
            found[OUTPUT_WITHOUT_OFFSETS].append(
                f"group {group} committed {partition} to {committed} but inputs {beyond[:5]} "
                f"({len(beyond)} in all) at or above it have committed output; the first "
                f"was in transactions {attempts.get(Source(group, *partition, beyond[0]), [])}"
            )
        twice = sorted(o for o, n in made.items() if n > 1 and o < committed)
        if twice:
            found[DUPLICATE].append(
                f"group {group}: inputs {twice[:5]} of {partition} have output more than once"
            )


def committed_view(log: PartitionLog) -> tuple[Placed, int]:
    """What a read_committed reader must be handed from a raw log, and the last stable offset
    (LSO): the first offset of the earliest transaction with no marker yet, else the high
    watermark. A transactional batch belongs to its producer's transaction that the producer's
    next marker in the partition ends; below the LSO, records of no transaction and of committed
    transactions are handed over, wherever their marker is, and those of aborted ones are not."""
    visible: Placed = []
    open_records: dict[int, list[tuple[int, bytes]]] = {}
    open_since: dict[int, int] = {}
    for batch in log.batches:
        if batch.control is not None:
            if batch.control != OTHER_CONTROL and batch.transactional:
                ended = open_records.pop(batch.producer_id, [])
                open_since.pop(batch.producer_id, None)
                if batch.control == COMMIT_MARKER:
                    visible.extend(ended)
        elif batch.transactional:
            open_records.setdefault(batch.producer_id, []).extend(batch.records)
            if batch.records:
                open_since.setdefault(batch.producer_id, batch.records[0][0])
        else:
            visible.extend(batch.records)
    lso = min(open_since.values(), default=log.high_watermark)
    return sorted(r for r in visible if r[0] < lso), lso


def kafka_consumer_view(batches: list[LogBatch], aborted: list[tuple[int, int]]) -> Placed:
    """What a Kafka read_committed consumer hands out from a Fetch answer's batches, given the
    answer's aborted transactions (producer id, first offset), as KIP-98 has it: a producer's
    batches from an aborted transaction's first offset up to its abort marker are dropped, and
    control batches are never handed out."""
    pending = sorted(aborted, key=lambda a: a[1])
    aborting: set[int] = set()
    handed: Placed = []
    for batch in batches:
        last = batch.next_offset - 1
        while pending and pending[0][1] <= last:
            aborting.add(pending.pop(0)[0])
        if batch.control is not None:
            if batch.control == ABORT_MARKER:
                aborting.discard(batch.producer_id)
            continue
        if batch.transactional and batch.producer_id in aborting:
            continue
        handed.extend(batch.records)
    return handed


def check_filter(history: History, found: Found) -> None:
    """Each fresh read_committed read (and librdkafka's final read) against the partition's
    raw log: the same records at the same offsets, up to the LSO."""
    reads = dict(history.committed_reads)
    if history.final:
        reads["librdkafka final read"] = history.final
    for partition, log in sorted(history.logs.items()):
        expected, lso = committed_view(log)
        for how, by_partition in sorted(reads.items()):
            if how == "librdkafka final read" and partition not in by_partition:
                continue  # (the final read notes only the offsets of txn-in's records)
            got = by_partition.get(partition)
            if got is None:
                found[FILTER_MISMATCH].append(f"{how} did not read {partition}")
                continue
            difference = first_difference(expected, got)
            if difference:
                found[FILTER_MISMATCH].append(
                    f"{how} of {partition} (LSO {lso} by the raw log, {len(expected)} records "
                    f"expected, {len(got)} handed): {difference}"
                )


def markers_in(history: History) -> dict[str, int]:
    """How many commit and abort markers the raw logs hold: the filter check judged something
    only if there were aborted transactions to leave out."""
    kinds = [b.control for log in history.logs.values() for b in log.batches]
    return {COMMIT_MARKER: kinds.count(COMMIT_MARKER), ABORT_MARKER: kinds.count(ABORT_MARKER)}


def first_difference(expected: Placed, got: Placed) -> str:
    """Where two reads of a partition part, in words; empty when they are the same."""
    for i, (want, have) in enumerate(zip(expected, got, strict=False)):
        if want != have:
            return f"record {i}: expected {want!r}, handed {have!r}"
    if len(got) > len(expected):
        return f"handed {got[len(expected)]!r} beyond the {len(expected)} expected"
    if len(got) < len(expected):
        return f"not handed {expected[len(got)]!r} and {len(expected) - len(got) - 1} more"
    return ""


def write_cycles(history: History, placed: dict[bytes, tuple[Partition, int]]) -> list[str]:
    """Cycles of the order committed transactions' records have in each partition (each
    partition orders its transactions by their first record in it)."""
    txn_at: dict[Partition, list[tuple[int, str]]] = defaultdict(list)
    for txn in history.txns:
        firsts: dict[Partition, int] = {}
        for _, value in txn.writes:
            if value in placed:
                partition, offset = placed[value]
                firsts[partition] = min(offset, firsts.get(partition, offset))
        for partition, offset in firsts.items():
            txn_at[partition].append((offset, txn.name))
    after: dict[str, set[str]] = defaultdict(set)
    for ordered in txn_at.values():
        names = [name for _, name in sorted(ordered)]
        for earlier, later in pairwise(names):
            after[earlier].add(later)
    return [" -> ".join(cycle) for cycle in find_cycles(after)]


def find_cycles(after: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected component of more than one transaction
    (Tarjan's algorithm, iterative: a long run makes long chains)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in sorted(after):
        if root in index:
            continue
        work = [(root, iter(sorted(after[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        components.append(component)
            elif step not in index:
                index[step] = low[step] = len(index)
                stack.append(step)
                on_stack.add(step)
                work.append((step, iter(sorted(after.get(step, ())))))
            elif step in on_stack:
                low[node] = min(low[node], index[step])
    return [cycle_in(set(c), after) for c in components]


def cycle_in(component: set[str], after: dict[str, set[str]]) -> list[str]:
    """A cycle within a strongly connected component: walk inside it until a node repeats."""
    path = [min(component)]
    seen = {path[0]: 0}
    while True:
        step = min(n for n in after[path[-1]] if n in component)
        if step in seen:
            return [*path[seen[step] :], step]
        seen[step] = len(path)
        path.append(step)


def failures(found: Found) -> dict[str, list[str]]:
    """The anomalies that fail a run (every one but G0), with what was found of each."""
    return {name: found[name] for name in FAILURES if found[name]}


def to_json(history: History) -> dict[str, Any]:
    """The history as JSON (values as text), to keep beside a failed run's report."""

    def text(value: bytes) -> str:
        return value.decode(errors="replace")

    def where(partition: Partition) -> str:
        return f"{partition[0]}/{partition[1]}"

    return {
        "txns": [
            {
                "name": t.name,
                "outcome": t.outcome,
                "writes": [[where(p), text(v)] for p, v in t.writes],
            }
            for t in history.txns
        ],
        "reads": {
            reader: {where(p): [[o, text(v)] for o, v in records] for p, records in by.items()}
            for reader, by in history.reads.items()
        },
        "final": {where(p): [[o, text(v)] for o, v in r] for p, r in history.final.items()},
        "group_offsets": {
            g: {where(p): o for p, o in offsets.items()}
            for g, offsets in history.group_offsets.items()
        },
    }


def summary(found: Found) -> str:
    return ", ".join(f"{len(found[name])} {name}" for name in ANOMALIES)
