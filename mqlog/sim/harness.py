"""The one runner of every layer's simulation (TigerBeetle's VOPR shape: one harness,
a workload and its checkers per layer).

A layer's module (swarm.py: master-slave; raft.py; controller.py) defines a
``Simulation`` subclass: its options (drawn from the seed's rng by ``from_rng``), its
nodes, one tick of its safety phase (``safety_tick``: its faults, its workload, its
per-tick checks), its liveness phase and its end checks. The harness owns what they
share, so that they share it exactly:

* a seed decides everything: ``random.Random(seed)`` draws the options first, then the
  network's and every later choice, in the order the run makes them;
* the clock is a tick counter (``clock[0]``, read by the stores and the network);
* a run: ``safety_ticks`` ticks with faults, then the liveness phase (faults off: the
  nodes left up must converge, VOPR's rule), then the end checks. An assertion or a
  typed error escaping a layer's code (a core's invariant, a read the core thought
  valid) ends the run as a violation of that tick, for the layers that say so
  (``fatal``); a layer that recorded its violation itself ends the run with
  ``RunEnded``; every store still open is closed, whatever happened;
* the result: violations (empty is a pass) and a trace whose digest shows that the same
  seed gives the same run;
* the stores' batch limit (``batch_limit``, sim/partial.py: the Raft and ISR layers cut
  some requests of several records short, on some seeds);
* the faults drawn alike in several layers (a minority cut off by a partition, healed
  now and then);
* the seed loop: seeds N..N+K-1, one verdict line each, the one-line reproduction of a
  failure (``python -m mqlog.sim --layer L --seed S``).
"""

from __future__ import annotations

import hashlib
import random
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mqlog.errors import MqlogError
from mqlog.sim.network import NetworkOptions, SimNetwork

HEAL_PROBABILITY = 0.05  # per tick, while a partition stands
SIM_CLUSTER_ID = "sim"  # every simulated broker's and controller's cluster_id


class RunEnded(Exception):
    """A layer ends its run at once, having recorded the violation that says why (the
    rest of the run would only repeat it)."""


@dataclass
class SeedResult:
    """What one seed's run found (every layer): violations, and a trace whose digest
    shows that the same seed gives the same run."""

    seed: int
    options: Any
    violations: list[str] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)
    acked: int = 0

    @property
    def digest(self) -> str:
        return hashlib.sha256("\n".join(self.trace).encode()).hexdigest()[:16]

    @property
    def verdict(self) -> str:
        return "PASS" if not self.violations else f"FAIL ({len(self.violations)})"

    def summary(self) -> str:
        return f"seed {self.seed}: {self.verdict} trace={self.digest}"


class Simulation:
    """One seed's simulated group (see the module docstring); ``nodes`` are SimReplicas."""

    # What ends a run as a violation rather than as an exception (empty: nothing).
    fatal: tuple[type[BaseException], ...] = (AssertionError, MqlogError)
    prefix = "mqlog-sim-"  # of its temporary directory
    # What the simulated stores impose on a batch (partial.py: how many of ``count``
    # records a put stores); None: they store every record.
    batch_limit: Callable[[int], int] | None = None

    def __init__(self, seed: int, options_type: Any, result_type: type[SeedResult]) -> None:
        self.rng = random.Random(seed)
        self.options = options_type.from_rng(self.rng)
        self.result = result_type(seed, self.options)
        self.network = SimNetwork(self.rng, self.options.network)
        self.clock = [1]
        self.nodes: dict[str, Any] = {}

    # --- what a layer gives ---------------------------------------------------------------

    def safety_tick(self, tick: int) -> None:
        """One tick of the safety phase: faults, the workload, the checks."""
        raise NotImplementedError

    def liveness(self) -> None:
        """Faults off; the nodes left up must converge (a violation if they do not)."""
        raise NotImplementedError

    def check_end(self) -> None:
        """The checks of the converged group."""

    def finish(self) -> None:
        """Counters of the result, once the run is over."""

    # --- the run ------------------------------------------------------------------------

    def run(self) -> Any:
        try:
            for tick in range(self.options.safety_ticks):
                self.safety_tick(tick)
            self.liveness()
            self.check_end()
        except RunEnded:
            pass
        except self.fatal as error:  # an invariant, an internal check, or a read the
            # core thought valid: a bug, which ends the run
            self.result.violations.append(f"tick {self.clock[0]}: {error!r}")
        finally:
            for node in self.nodes.values():
                if node.up:
                    node.store.close()
        self.finish()
        return self.result

    def advance_clock(self) -> None:
        self.clock[0] += 1
        self.network.now = self.clock[0]

    def run_until(self, step: Callable[[], None], done: Callable[[], bool]) -> bool:
        """``step()`` up to ``liveness_ticks`` times, until ``done()``; whether it was."""
        for _ in range(self.options.liveness_ticks):
            step()
            if done():
                return True
        return False

    def calm(self) -> None:
        """The liveness phase begins: a healed, reliable network."""
        self.network.options = NetworkOptions()
        self.network.heal()

    def running(self) -> list[Any]:
        """The nodes up and not paused."""
        return [node for node in self.nodes.values() if node.up and not node.paused]

    def partition_minority(self, probability: float) -> None:
        """With ``probability``, cut a random minority off from the rest; else, while a
        partition stands, heal it now and then."""
        rng = self.rng
        if rng.random() < probability:
            names = sorted(self.nodes)
            rng.shuffle(names)
            cut = names[:rng.randint(1, len(names) // 2)]
            for a in cut:
                for b in names[len(cut):]:
                    self.network.partition(a, b)
            self.trace(f"partition {cut}")
        elif self.network.partitioned and rng.random() < HEAL_PROBABILITY:
            self.network.heal()

    # --- what the nodes (SimReplica) ask of their simulation -----------------------------

    def trace(self, text: str) -> None:
        self.result.trace.append(f"{self.clock[0]} {text}")

    def violation(self, text: str) -> None:
        self.result.violations.append(f"tick {self.clock[0]}: {text}")

    def observe(self, message: Any) -> None:
        """Every message a node sends (a layer may check it)."""

    def answered(self, node: Any, request: Any, status: Any) -> None:
        """A node's driver answered a client's request."""


def run_seed(simulation: Callable[[int, Path, str], Simulation], seed: int,
             test_break: str = "", prefix: str = "mqlog-sim-",
             directory: str | None = None) -> Any:
    """Run one seed of ``simulation`` in a temporary directory (removed after), under
    ``directory`` if given (None: the system's temporary directory)."""
    root = Path(tempfile.mkdtemp(prefix=f"{prefix}{seed}-", dir=directory))
    try:
        return simulation(seed, root, test_break).run()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_seeds(layer: str, run: Callable[[int, str], SeedResult], first: int, count: int,
              test_break: str = "", verbose: bool = False, workload: str = "") -> int:
    """Seeds ``first``..``first + count - 1``: a verdict line each (and, for a failure,
    its first violation, or ten with ``verbose``, and its reproduction, ending with
    ``workload``: the command line's options of the workload); the number that
    failed."""
    failed = 0
    for seed in range(first, first + count):
        result = run(seed, test_break)
        print(result.summary(), flush=True)
        if result.violations:
            failed += 1
            for violation in result.violations[:10 if verbose else 1]:
                print(f"  {violation}")
            print(f"  reproduce: python -m mqlog.sim --layer {layer} --seed {seed}"
                  + (f" --break {test_break}" if test_break else "") + workload)
    return failed
