"""The simulator in the default run: fixed seeds, fresh seeds, determinism, and a broken
core that the checkers must catch."""

from __future__ import annotations

import os
import random

import pytest

from mqlog.sim.swarm import run_seed

FIXED_SEEDS = list(range(1, 31))
FRESH_SEED_COUNT = int(os.environ.get("MQLOG_SIM_SEEDS", 10))


@pytest.mark.parametrize("seed", FIXED_SEEDS)
def test_fixed_seeds_pass_every_checker(seed):
    result = run_seed(seed)
    assert not result.violations, f"{result.summary()}\n" + "\n".join(result.violations)
    assert result.acked > 0


def test_fresh_seeds_pass_every_checker(rng):
    seeds = [rng.randrange(1 << 31) for _ in range(FRESH_SEED_COUNT)]
    print(f"running {len(seeds)} fresh seeds: {seeds}")
    for seed in seeds:
        result = run_seed(seed)
        assert not result.violations, (f"{result.summary()}\n" + "\n".join(result.violations)
                                       + f"\nreproduce: python -m mqlog.sim --seed {seed}")


def test_the_same_seed_gives_the_same_trace():
    seed = random.Random(7).randrange(1 << 31)
    assert run_seed(seed).digest == run_seed(seed).digest


def test_a_core_that_acks_early_is_caught():
    """A SYNC_MASTER that acks before its slaves have the write breaks the sync promise;
    the seeds below run SYNC_MASTER with flushed acks, where the checker looks."""
    caught = [seed for seed in FIXED_SEEDS[:8]
              if run_seed(seed, test_break="ack_early").violations]
    assert caught, "the broken core passed every checker"


DIVERGENCE_SEED = 32  # its old master rejoins with records the promoted slave never had


def test_a_core_that_skips_truncation_is_caught():
    assert not run_seed(DIVERGENCE_SEED).violations
    assert run_seed(DIVERGENCE_SEED, test_break="skip_truncate").violations
