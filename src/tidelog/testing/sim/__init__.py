"""A deterministic simulator that runs the real replication core.

One seed draws every parameter ("swarm testing": which faults, how often, how many nodes) and
every random choice after that, so a failing seed replays exactly:

    python -m tidelog.testing --seed 1234

The cluster is the production partition driver (`replication/driver.py`: the Ready loop and
the cleaner's pass, with the low-water mark decided by `replication/low_watermark.py` from
facts) over the production `Replica`, on `MemoryLog` disks that lose what was not flushed when
a node crashes and cut the log into segments as the node does; for state-machine logs (a
quarter of the seeds) the production `StateMachineDriver` applies a table, snapshots it and
installs snapshots on followers behind the log start, and the table's clients write keys and
read them through the driver's linearizable read (ReadIndex, or the lease). Around them: a
network that drops, delays, duplicates and reorders messages and can be partitioned (both ways
or one way), nodes that crash, restart and pause, nodes that come back with an empty disk under
their old id (a new directory id: they must rejoin as observers), producers with acks=1 and
acks=all, readers that read from any replica below its high-water mark, and cursors whose
consumers commit, stall and fall past cursor.max.idle.ms or cursor.max.lag.bytes (one tick is
one millisecond). In four seeds in ten the metadata gives the group new target voters now and
then (any of its nodes, some outside the group at first): its leader walks there one
membership change at a time (replication/membership.py), through all of the above.

A safety phase with faults is followed by a liveness phase with every fault healed, in which a
leader must emerge, finish any membership change, and every member must converge to the same
committed log.

Checked all the time and at the end: the properties in checkers/ (one module each).

The package, by concept: params.py (what a seed draws), nodes.py (a node, its disk and its
driver), network.py (messages in flight and partitions), cluster.py (the nodes, the network,
the clock, the driver's effects, the event log), nemesis.py (the faults), workload.py
(producers, readers, cursors' consumers; cursors.py), table_clients.py (the table's writers and
linearizable readers, and the history they saw), transactions.py (transactional producers and
read_committed readers, with SimParams.transactions), low_watermark.py (the cleaner's pass),
checkers/ (the properties), runner.py (a seed's run), failure.py (how a run fails), stats.py
(what it counts); with SimParams.transaction_partitions, transactions spanning partitions:
partitions.py (a replica group per partition, in lockstep), coordinator.py (the coordinator's
decisions and markers), spanning.py (its producers and readers); seeds.py (`run_seed`: a seed's
run, either kind).
"""

from tidelog.testing.sim.cluster import Cluster, DeliveryObserver
from tidelog.testing.sim.failure import SimulationFailure
from tidelog.testing.sim.nodes import SimLog, SimNode, Waiter
from tidelog.testing.sim.params import (
    ELECTION_TIMEOUT_TICKS,
    LIVENESS_INTERVAL_TICKS,
    LIVENESS_TIMEOUT_TICKS,
    SimParams,
)
from tidelog.testing.sim.runner import Simulation
from tidelog.testing.sim.seeds import run_seed
from tidelog.testing.sim.stats import Stats

__all__ = [
    "ELECTION_TIMEOUT_TICKS",
    "LIVENESS_INTERVAL_TICKS",
    "LIVENESS_TIMEOUT_TICKS",
    "Cluster",
    "DeliveryObserver",
    "SimLog",
    "SimNode",
    "SimParams",
    "Simulation",
    "SimulationFailure",
    "Stats",
    "Waiter",
    "run_seed",
]
