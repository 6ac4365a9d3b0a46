"""How a simulated run fails: a SimulationFailure names the seed, the tick, the property broken
and the command that replays it. A violation seen inside a replica's step is held until the
step is over (raising mid-step would leave the cluster half-changed, and a script could not go
on to show what follows)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

from tidelog.testing.sim.params import SimParams


class SimulationFailure(AssertionError):
    pass


class Violations:
    """Where every checker reports: at once (`fail`), or from inside the core (`defer`)."""

    def __init__(self, params: SimParams, clock: Callable[[], int]) -> None:
        self.params = params
        self.clock = clock
        self.deferred: list[str] = []  # violations seen inside the core, raised after its step

    def fail(self, why: str) -> NoReturn:
        raise SimulationFailure(
            f"seed {self.params.seed} tick {self.clock()}: {why}\n"
            f"params: {self.params}\nreplay: {self.params.replay_command()}"
        )

    def defer(self, why: str) -> None:
        self.deferred.append(why)

    def raise_deferred(self) -> None:
        """Violations seen inside a replica's step are raised once the tick (or a script's
        command) is over."""
        if self.deferred:
            why = self.deferred[0]
            self.deferred.clear()
            self.fail(why)
