"""What the simulator tests share (test_sim, test_raft_sim, test_isr_sim,
test_controller_sim): a seed's verdict, which ends with its one-line reproduction
(``python -m mqlog.sim --layer L --seed S [--break B]``), and the fresh seeds of a run.

Fresh seeds are drawn from the test's ``rng`` (conftest's seed fixture: one
MQLOG_TEST_SEED replays the draw) and printed before they run, so a failure names both
the seed that failed and the draw that found it."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

SEED_BITS = 31  # a seed is below 2**31, as the command line takes it
VIOLATIONS_SHOWN = 10  # of a failing seed's violations, in its verdict


def verdict(layer: str, result: Any, test_break: str = "") -> str:
    """A seed's summary, its first violations and the command that reproduces it."""
    again = f" --break {test_break}" if test_break else ""
    return (f"{result.summary()}\n" + "\n".join(result.violations[:VIOLATIONS_SHOWN])
            + f"\nreproduce: python -m mqlog.sim --layer {layer} --seed {result.seed}{again}")


def fresh_seeds(rng: random.Random, count: int) -> list[int]:
    seeds = [rng.randrange(1 << SEED_BITS) for _ in range(count)]
    print(f"running {len(seeds)} fresh seeds: {seeds}")
    return seeds


def assert_seeds_pass(layer: str, run_seed: Callable[[int], Any], seeds: list[int]) -> None:
    """Every seed passes every checker (the first that does not fails the test)."""
    for seed in seeds:
        result = run_seed(seed)
        assert not result.violations, verdict(layer, result)


def blind_to_epochs(monkeypatch: Any) -> None:
    """The producer table of before producer epochs (issue 17's "acknowledged but not
    stored"): every request taken as of one life, so a restarted client's sequences are
    answered as the old life's. The simulators' restarting clients must catch it."""
    from mqlog.replication.idempotence import ProducerTable

    lookup, note = ProducerTable.lookup, ProducerTable.note
    monkeypatch.setattr(ProducerTable, "lookup",
                        lambda table, producer_id, sequence, _epoch:
                        lookup(table, producer_id, sequence, 0))
    monkeypatch.setattr(ProducerTable, "note",
                        lambda table, producer_id, sequence, _epoch, stored:
                        note(table, producer_id, sequence, 0, stored))


def without_fetch_holds(monkeypatch: Any) -> None:
    """No ISR seed holds fetches for replica_fetch_min_bytes (``--no-fetch-holds``): a
    seed found before those holds, whose test tells its run, runs as it did."""
    from mqlog.sim import isr

    monkeypatch.setattr(isr, "FETCH_HOLD_SEED_SHARE", 0.0)


def without_batches(monkeypatch: Any) -> None:
    """The single-record workload of before requests of several records (sim/partial.py;
    ``--no-batches``): a seed found then, whose test tells its run, runs as it did."""
    from mqlog.sim import partial

    monkeypatch.setattr(partial, "BATCH_SEED_SHARE", 0.0)
