"""``python -m mqlog.sim --layer L --seed N [--count K] [--break NAME] [--no-batches]``: L is
master_slave, raft, controller or isr.

Runs seeds N, N+1, ... N+K-1 (a random N when none is given, printed so a failure is a
one-line reproduction) through the one harness (harness.py) and prints one verdict line
per seed; exits 1 if any failed. ``master-slave`` is accepted for ``master_slave``.
``--no-batches``: the Raft and ISR clients send one record a request on every seed (the
workload before sim/partial.py's batches: the seeds found then run as they did).
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
    args = parser.parse_args(argv)
    first = args.seed if args.seed is not None else random.randrange(1 << 31)
    workload = partial.single_records() if args.no_batches else contextlib.nullcontext()
    with workload:
        failed = harness.run_seeds(args.layer, LAYERS[args.layer], first, args.count,
                                   args.test_break, args.verbose,
                                   " --no-batches" if args.no_batches else "")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
