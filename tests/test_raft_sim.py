"""The Raft simulator in the default run: fixed seeds, fresh seeds, determinism, what the
seeds reach (``python -m mqlog.sim --layer raft --seed N``); tests/test_sim.py proves
every ``--break`` switch is caught."""

from __future__ import annotations

import os
import random

import pytest

from mqlog.sim.raft import run_seed

FIXED_SEEDS = list(range(1, 31))
FRESH_SEED_COUNT = int(os.environ.get("MQLOG_SIM_SEEDS", 10))


def _verdict(result) -> str:
    return (f"{result.summary()}\n" + "\n".join(result.violations[:10])
            + f"\nreproduce: python -m mqlog.sim --layer raft --seed {result.seed}")


@pytest.mark.parametrize("seed", FIXED_SEEDS)
def test_fixed_seeds_pass_every_checker(seed):
    result = run_seed(seed)
    assert not result.violations, _verdict(result)
    assert result.acked > 0 and result.leaders >= 1


def test_fresh_seeds_pass_every_checker(rng):
    seeds = [rng.randrange(1 << 31) for _ in range(FRESH_SEED_COUNT)]
    print(f"running {len(seeds)} fresh seeds: {seeds}")
    for seed in seeds:
        result = run_seed(seed)
        assert not result.violations, _verdict(result)


def test_the_seeds_exercise_failover_and_retries():
    """The fixed seeds must reach what the checkers are for: new leaders, retried writes,
    retries answered from the log (not stored twice), membership changes."""
    results = [run_seed(seed) for seed in FIXED_SEEDS[:10]]
    assert sum(result.leaders > 1 for result in results) >= 3
    assert sum(result.deduplicated for result in results) > 0
    assert sum(result.retried for result in results) > 0
    assert sum(result.membership_changes for result in results) > 0


def test_the_seeds_exercise_retention_and_log_resets():
    """Some fixed seeds run retention while a follower is away long enough to need a
    LogReset (and every checker holds across the moved log starts)."""
    results = [run_seed(seed) for seed in (2, 18, 21)]
    assert sum(result.log_starts > 0 for result in results) >= 2
    assert sum(result.resets for result in results) > 0


def test_the_same_seed_gives_the_same_trace():
    seed = random.Random(11).randrange(1 << 31)
    assert run_seed(seed).digest == run_seed(seed).digest
