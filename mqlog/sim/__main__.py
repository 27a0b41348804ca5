"""``python -m mqlog.sim --layer L --seed N [--count K] [--break NAME] [--no-batches]
[--no-fetch-holds]``: L is master_slave, raft, controller or isr.

Runs seeds N, N+1, ... N+K-1 (a random N when none is given, printed so a failure is a
one-line reproduction) through the one harness (harness.py) and prints one verdict line
per seed; exits 1 if any failed. ``master-slave`` is accepted for ``master_slave``.
``--no-batches``: the Raft and ISR clients send one record a request on every seed (the
workload before sim/partial.py's batches: the seeds found then run as they did).
``--no-fetch-holds``: no ISR seed holds followers' fetches for replica_fetch_min_bytes
(sim/isr.py: the seeds found before those holds run as they did).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
from collections.abc import Callable

from mqlog.replication import driver
from mqlog.replication.controller import service as controller_service
from mqlog.replication.isr import core as isr_core
from mqlog.replication.master_slave import core as ms_core
from mqlog.replication.raft import core as raft_core
from mqlog.sim import controller, harness, isr, partial, raft, swarm

# Each layer: its workload and checkers (a Simulation), run one seed at a time.
LAYERS: dict[str, Callable[[int, str], harness.SeedResult]] = {
    "master_slave": swarm.run_seed, "raft": raft.run_seed, "controller": controller.run_seed,
    "isr": isr.run_seed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mqlog.sim", description=__doc__)
    parser.add_argument("--layer", type=lambda text: text.replace("-", "_"),
                        choices=sorted(LAYERS), default="master_slave")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--count", type=int, default=1)
    breaks = sorted({*driver.TEST_BREAKS, *raft_core.TEST_BREAKS, *ms_core.TEST_BREAKS,
                     *controller_service.TEST_BREAKS,
                     *controller_service.DECISION_BREAKS, *isr_core.TEST_BREAKS,
                     *controller.SIM_BREAKS})
    parser.add_argument("--break", dest="test_break", default="", choices=["", *breaks],
                        help="run a deliberately broken driver or core (the checkers must "
                             "catch it)")
    parser.add_argument("--verbose", action="store_true", help="print each violation")
    parser.add_argument("--no-batches", action="store_true",
                        help="one record a request on every seed (the workload of before "
                             "requests of several records)")
    parser.add_argument("--no-fetch-holds", action="store_true",
                        help="no ISR seed holds fetches for replica_fetch_min_bytes (the "
                             "workload of before those holds)")
    args = parser.parse_args(argv)
    first = args.seed if args.seed is not None else random.randrange(1 << 31)
    with contextlib.ExitStack() as workload:
        if args.no_batches:
            workload.enter_context(partial.single_records())
        if args.no_fetch_holds:
            workload.enter_context(isr.without_fetch_holds())
        options = "".join(f" --{name}" for name in ("no-batches", "no-fetch-holds")
                          if getattr(args, name.replace("-", "_")))
        failed = harness.run_seeds(args.layer, LAYERS[args.layer], first, args.count,
                                   args.test_break, args.verbose, options)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
