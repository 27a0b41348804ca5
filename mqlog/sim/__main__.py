"""``python -m mqlog.sim --layer master_slave|raft --seed N [--count K] [--break NAME]``

Runs seeds N, N+1, ... N+K-1 (a random N when none is given, printed so a failure is a
one-line reproduction) and prints one verdict line per seed; exits 1 if any failed.
"""

from __future__ import annotations

import argparse
import random
import sys

from mqlog.sim import raft, swarm


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mqlog.sim", description=__doc__)
    parser.add_argument("--layer", choices=["master_slave", "raft"], default="master_slave")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--break", dest="test_break", default="",
                        choices=["", "ack_early", "skip_truncate", "commit_old_term",
                                 "vote_twice"],
                        help="run a deliberately broken core (the checkers must catch it)")
    parser.add_argument("--verbose", action="store_true", help="print each violation")
    args = parser.parse_args(argv)
    first = args.seed if args.seed is not None else random.randrange(1 << 31)
    failed = 0
    run_seed = raft.run_seed if args.layer == "raft" else swarm.run_seed
    for seed in range(first, first + args.count):
        result = run_seed(seed, args.test_break)
        print(result.summary(), flush=True)
        if result.violations:
            failed += 1
            for violation in result.violations[:10 if args.verbose else 1]:
                print(f"  {violation}")
            print(f"  reproduce: python -m mqlog.sim --layer {args.layer} --seed {seed}"
                  + (f" --break {args.test_break}" if args.test_break else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
