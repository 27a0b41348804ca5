"""The ISR simulator in the default run (``python -m mqlog.sim --layer isr --seed N``):
brokers hosting real ISR and Raft partitions under the real controllers and broker agents
(sim/brokers.py, sim/isr.py). Fixed seeds and fresh ones pass every checker, the same
seed gives the same trace, the seeds reach what the checkers are for, and every ``--break``
of the layer (the ISR core's and the controller's election) is caught by a fixed seed.
The metadata readers' leader check (sim/readers.py) catches agents that learn no Raft
leader: a client's view then names a broker that does not serve the partition."""

from __future__ import annotations

import functools
import os
import random

import pytest

from mqlog.replication.controller import host
from mqlog.replication.isr import core as isr_core
from mqlog.replication.isr import decisions as isr_decisions
from mqlog.sim import isr
from tests.simseeds import (
    assert_seeds_pass,
    blind_to_epochs,
    fresh_seeds,
    verdict,
    without_batches,
    without_fetch_holds,
)

_fixed = functools.lru_cache(maxsize=None)(isr.run_seed)  # (each fixed seed runs once)
run_seed = isr.run_seed

FIXED_SEEDS = [1, 3, 5]  # (3: ISR shrinks by AlterPartition; 5: power-loss deaths)
# Seeds that once failed, with what they found (each a one-line reproduction).
REGRESSION_SEEDS = {
    1240: "checker: on a power-loss seed an acks=all write was lost to a follower's power "
          "loss two ticks BEFORE its acknowledgement (its fetch, counted by the leader, was "
          "on the way): the loss replica_ack = written allows; counted from the store tick",
    14400067: "core: a follower whose log lacked the leader's diverging epoch truncated "
              "to that epoch's end in the leader's log, inside one of its own records "
              "(InvalidPosition: the replica stopped); it truncates to the end of its own "
              "older epoch and asks again (KIP-279's next round)",
    8100019: "core: a retried expand refused as stale (its first copy accepted, not yet "
             "pulled) dropped the pending ISR; the high watermark passed the joining "
             "follower, which the controller then elected: committed records lost",
}
# Seeds whose readers' answer checks (monotonic reads, no empty state) failed before the
# controller's caught-up rule waited for a commit its leader made in its own term.
CAUGHT_UP_SEEDS = {
    2026: "readers: a restarted controller answered a state older than it had answered "
          "before its restart, its log still holding that",
    2027: "readers: a restarted controller answered describe with an empty state as if "
          "caught up (after the controller leader and a broker died at once)",
    13300081: "controller: a leader that lost power and restarted within its session led "
              "the same leader epoch again from an empty log; a follower that had fetched "
              "the lost records kept them (its epochs matched): the logs differed after "
              "healing. A registration now ends the last life's leaderships if it was "
              "not fenced yet",
}
# A seed with retention where a follower asks for what its leader let go (it starts its
# log over at the leader's log start: OFFSET_OUT_OF_RANGE). (14000021 was, before its
# client sent requests of several records: sim/partial.py; 14000046 until brokers asked
# the controllers in another order, session 26.)
RETENTION_SEED = 4
FRESH_SEED_COUNT = max(1, int(os.environ.get("MQLOG_SIM_SEEDS", 5)) // 5)
# (break, a fixed seed that catches it): found with `python -m mqlog.sim --layer isr
# --break NAME --count 30` (truncate_to_hw's seed 6 draws retention now, which it misses;
# election_outside_isr's 3 and truncate_to_hw's 8 stopped catching theirs when brokers
# asked the controllers in another order, session 26)
CAUGHT_BY = {"hw_all_replicas": 1, "election_outside_isr": 8, "truncate_to_hw": 12,
             "hw_below_min_isr": 1, "forget_stale_alter": 218,
             "partial_early": 1}  # (the driver's: PartiallyStored before the verdict)
# Seeds found before requests of several records (sim/partial.py), which catch their break
# in that workload only: run with --no-batches; and before fetches held for
# replica_fetch_min_bytes (sim/isr.py): run with --no-fetch-holds. (forget_stale_alter's
# 8100000 was both, until brokers asked the controllers in another order, session 26;
# 218 catches it in today's workload.)
FOUND_BEFORE_BATCHES: set[str] = set()
FOUND_BEFORE_FETCH_HOLDS: set[str] = set()


@pytest.mark.parametrize("seed", FIXED_SEEDS)
def test_fixed_seeds_pass_every_checker(seed):
    result = _fixed(seed)
    assert not result.violations, verdict("isr", result)
    assert result.acked_all > 0 and result.registrations > 0


def test_a_retry_too_old_to_tell_is_given_up():
    """Seed 7700000113, from a soak of fresh seeds: retention let the first copy of
    p-events-1's sequence 24 go, and the leader refused its retry with
    OutOfOrderSequence (too old to tell whether it is stored: the documented limit,
    docs/REPLICATION.md). The simulator's client let that exception end the run; it now
    gives the write up, its outcome unknown, as the Raft simulator's does (a write no
    leader stored refused so is still a violation)."""
    result = run_seed(7700000113)
    assert not result.violations, verdict("isr", result)
    assert any(line.endswith("refused as too old") for line in result.trace)


def test_a_restarted_clients_first_write_is_not_refused_as_too_old():
    """Seed 8200000978, from a soak of fresh seeds, found this: the restarted client's
    first request was refused for want of replicas, its next ones stored; the leader
    elected next rebuilt its table past the log's front (retention) and forgot the life's
    sequences below the lowest it found, so the first request's retry was refused as too
    old to tell, never stored (idempotence.py: a life the scan saw begin forgets
    nothing). That seed took another path once brokers asked the controllers in another
    order (session 26); seed 31 has a restarted client and retention again."""
    result = run_seed(31)
    assert not result.violations, verdict("isr", result)
    assert result.client_lives == 2 and result.log_starts > 0


def test_a_candidate_that_won_and_was_reset_in_one_ready_keeps_its_replica():
    """Seed 28100259, from a sweep of fresh seeds (session 28): a Raft partition's
    candidate, paused with its votes on the way, resumed to win its old term and take
    the newer leader's LogReset in one Ready; its stamp of the old term, carried out
    after the reset, stopped the replica (it never settled). Ready.start_log_over voids
    the stamp and the no-op now (test_cores has the core's side)."""
    result = run_seed(28100259)
    assert not result.violations, verdict("isr", result)


def test_regression_seeds_pass_every_checker(monkeypatch):
    without_batches(monkeypatch)  # (found before requests of several records)
    without_fetch_holds(monkeypatch)  # (and before fetches held for min bytes)
    for seed, found in sorted(REGRESSION_SEEDS.items()):
        result = run_seed(seed)
        assert not result.violations, f"{found}\n{verdict('isr', result)}"


def test_caught_up_seeds_pass_the_readers_answer_checks(monkeypatch):
    without_batches(monkeypatch)  # (found before requests of several records)
    without_fetch_holds(monkeypatch)  # (and before fetches held for min bytes)
    for seed, found in sorted(CAUGHT_UP_SEEDS.items()):
        result = run_seed(seed)
        assert not result.violations, f"{found}\n{verdict('isr', result)}"


def test_fresh_seeds_pass_every_checker(rng):
    assert_seeds_pass("isr", run_seed, fresh_seeds(rng, FRESH_SEED_COUNT))


def test_the_seeds_exercise_elections_acks_and_power_loss():
    results = [_fixed(seed) for seed in FIXED_SEEDS]
    assert all(result.elections > 3 for result in results)  # leaders moved
    assert all(result.reads > 20 for result in results)  # metadata answers checked
    assert sum(result.combined_deaths for result in results) > 0
    assert sum(result.unclean_shutdowns for result in results) > 0  # KIP-966's mark
    assert sum(result.balanced for result in results) > 0  # leader balancing moved some
    assert sum(result.acked_one for result in results) > 0  # acks=1 writes too
    assert sum(result.refused for result in results) > 0  # NotEnoughReplicas, NotLeader
    assert any(result.options.power_loss for result in results)
    assert sum(result.shrinks for result in results) > 0  # AlterPartition both ways
    assert sum(result.expands for result in results) > 0
    assert sum(result.truncations for result in results) > 0  # by leader epoch
    assert any(result.client_lives > 1 for result in results)  # a restarted client
    assert {result.fetch_min_bytes for result in results} == {1, isr.FETCH_MIN_BYTES}


def test_retention_lets_the_front_go_and_a_follower_starts_over():
    result = run_seed(RETENTION_SEED)
    assert not result.violations, verdict("isr", result)
    assert result.log_starts > 0
    assert any("started its log over" in line for line in result.trace), \
        verdict("isr", result)


@pytest.mark.parametrize("name", sorted(CAUGHT_BY))
def test_every_break_is_caught_through_the_one_command(capsys, name):
    from mqlog.sim.__main__ import main

    assert CAUGHT_BY.keys() == {*isr_core.TEST_BREAKS, *isr_decisions.TEST_BREAKS,
                                "partial_early"}
    seed = CAUGHT_BY[name]
    workload = ["--no-batches"] * (name in FOUND_BEFORE_BATCHES) + \
        ["--no-fetch-holds"] * (name in FOUND_BEFORE_FETCH_HOLDS)
    assert main(["--layer", "isr", "--seed", str(seed), "--break", name, *workload]) == 1, \
        f"--break {name} went unnoticed by seed {seed}"
    assert f"reproduce: python -m mqlog.sim --layer isr --seed {seed} --break {name}" \
        f"{''.join(' ' + option for option in workload)}" in capsys.readouterr().out


def test_the_same_seed_gives_the_same_trace():
    seed = random.Random(13).randrange(1 << 31)
    assert run_seed(seed).digest == run_seed(seed).digest


def test_lost_acknowledged_writes_are_caught_by_their_own_checker(monkeypatch):
    """With the committed-prefix and min-ISR holder checkers off, the end check alone still
    catches an election outside the ISR: acks=all writes gone from the healed log."""
    monkeypatch.setattr(isr, "check_committed", lambda prefix, node, commit: "")
    monkeypatch.setattr(isr.IsrSwarm, "_check_insync_holders", lambda *args: None)
    result = run_seed(CAUGHT_BY["election_outside_isr"], "election_outside_isr")
    assert any("acknowledged with acks=all" in line and "was lost" in line
               for line in result.violations), verdict("isr", result)


def test_a_table_blind_to_producer_epochs_is_caught(monkeypatch):
    """Seed 110's client restarts twice with its producer ids: a leader that takes the new
    lives' sequences for the first life's answers them with the old records' places
    (acks=all writes acknowledged, never stored)."""
    blind_to_epochs(monkeypatch)
    result = run_seed(110)
    assert result.client_lives > 1
    assert any("acknowledged with acks=all" in line and "was lost" in line
               for line in result.violations), verdict("isr", result)


def test_agents_that_learn_no_raft_leader_are_caught_by_the_readers(monkeypatch):
    """Agents deaf to the leaders in heartbeat answers (and to their own): every
    cluster_metadata answer shows the Raft partition led by its creation's guess; once
    another broker leads it, the readers' views never name the broker that serves it."""
    monkeypatch.setattr(host.BrokerAgent, "took_leaders", lambda agent, answer, leads: None)
    result = run_seed(8)  # (6 until brokers asked the controllers in another order)
    assert any("ledger-0 led by" in line and "serves it" in line
               for line in result.violations), verdict("isr", result)
