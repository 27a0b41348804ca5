"""The controller simulator in the default run (``python -m mqlog.sim --layer controller
--seed N``): fixed seeds, fresh seeds, determinism, what the seeds reach, and every
controller ``--break`` caught by a fixed seed; the real broker agent (host.py) runs in it,
and an agent broken on purpose is caught. Its metadata readers (sim/readers.py) read
through the real ClusterClient: a client broken on purpose is caught, and so is the
caught-up rule that answered a restarted controller's empty state. The agent alone over
a scripted IO: garbage answers, redirects, controllers that are all down."""

from __future__ import annotations

import functools
import os
import random

import pytest

from mqlog import cluster_client, errors
from mqlog.replication.controller import host
from mqlog.replication.controller.config import ControllerConfig
from mqlog.replication.controller.service import TEST_BREAKS
from mqlog.replication.controller.state import ClusterMetadata
from mqlog.sim import controller, readers
from tests.simseeds import assert_seeds_pass, fresh_seeds, verdict

_fixed = functools.lru_cache(maxsize=None)(controller.run_seed)  # (each fixed seed runs once)
run_seed = controller.run_seed

FIXED_SEEDS = list(range(1, 21))
# Seeds that once failed, with what they found (each a one-line reproduction).
REGRESSION_SEEDS = {
    838014212: "a leader died between a fence and its partition changes: ISR led by fenced",
    1229826923: "the same, after snapshots and trims",
    3000243: "the simulated broker took its previous life's registration answer: two "
             "registrations in flight, every heartbeat one broker epoch behind, forever",
    3100132: "checker: a broker's view begun from a snapshot is positioned past the last "
             "record (at a no-op) and never equalled the state although its content did",
}
# Seeds whose readers' answer checks (monotonic reads, no empty state) failed before the
# controller's caught-up rule waited for a commit its leader made in its own term.
CAUGHT_UP_SEEDS = {
    3: "readers: a restarted controller that knew its leader only from a refused Entries "
       "(nothing folded) answered describe with an empty state as if caught up; with that "
       "fixed, one whose leader had restarted too and announced commit 0 before committing "
       "in its own term did the same",
    1009: "readers: the same, a restarted controller's empty state (tick 421)",
    1011: "readers: the same (tick 254), and again after its leader's restart",
    1012: "readers: the same, after snapshots and trims",
}
FRESH_SEED_COUNT = int(os.environ.get("MQLOG_SIM_SEEDS", 5))
# (break, a fixed seed that catches it): found with `python -m mqlog.sim --layer controller
# --break NAME --count 30`
CAUGHT_BY = {"stale_working": 2, "keep_leaders": 9}
SIM_CAUGHT_BY = {"caught_up_on_leader_known": 3}  # (the simulator's own breaks)


@pytest.mark.parametrize("seed", FIXED_SEEDS)
def test_fixed_seeds_pass_every_checker(seed):
    result = _fixed(seed)
    assert not result.violations, verdict("controller", result)
    assert result.registrations > 0


@pytest.mark.parametrize("seed", sorted(REGRESSION_SEEDS))
def test_regression_seeds_pass_every_checker(seed):
    result = run_seed(seed)
    assert not result.violations, f"{REGRESSION_SEEDS[seed]}\n{verdict('controller', result)}"


@pytest.mark.parametrize("seed", sorted(CAUGHT_UP_SEEDS))
def test_caught_up_seeds_pass_the_readers_answer_checks(seed):
    result = run_seed(seed)
    assert not result.violations, f"{CAUGHT_UP_SEEDS[seed]}\n{verdict('controller', result)}"


def test_fresh_seeds_pass_every_checker(rng):
    assert_seeds_pass("controller", run_seed, fresh_seeds(rng, FRESH_SEED_COUNT))


def test_the_seeds_exercise_failover_fencing_and_snapshots():
    results = [_fixed(seed) for seed in FIXED_SEEDS]
    assert all(result.reads > 20 for result in results)  # metadata answers checked
    assert sum(result.leaders > 1 for result in results) >= 5  # controller failovers
    assert sum(result.fences > 0 for result in results) >= 5  # sessions that expired
    assert sum(result.trims > 0 for result in results) >= 2  # logs trimmed after snapshots
    assert sum(result.snapshots_pulled > 0 for result in results) >= 1


@pytest.mark.parametrize("name", TEST_BREAKS)
def test_every_break_is_caught(name):
    assert CAUGHT_BY.keys() == set(TEST_BREAKS)
    result = run_seed(CAUGHT_BY[name], name)
    assert result.violations, f"--break {name} went unnoticed by seed {CAUGHT_BY[name]}"


@pytest.mark.parametrize("name", controller.SIM_BREAKS)
def test_every_simulator_break_is_caught_by_the_readers(name):
    """--break caught_up_on_leader_known: controllers take the caught-up rule of issue 16's
    CI failure (knowing a leader is enough); the readers see the empty state it answers."""
    assert SIM_CAUGHT_BY.keys() == set(controller.SIM_BREAKS)
    result = run_seed(SIM_CAUGHT_BY[name], name)
    assert any("answered an empty cluster state" in line for line in result.violations), \
        f"--break {name} went unnoticed\n{verdict('controller', result, name)}"


def test_the_readers_views_are_the_real_clients(monkeypatch):
    """The readers merge through ClusterClient.metadata itself: break the client's decoding
    (every answer an empty state) and a fixed seed's readers never converge."""
    assert issubclass(readers.SimClusterClient, cluster_client.ClusterClient)
    monkeypatch.setattr(cluster_client, "metadata_from", lambda answer: (ClusterMetadata(), []))
    result = run_seed(1)
    assert any("did not settle" in line and "view is at" in line
               for line in result.violations), verdict("controller", result)


def test_the_same_seed_gives_the_same_trace():
    seed = random.Random(12).randrange(1 << 31)
    assert run_seed(seed).digest == run_seed(seed).digest


# --- the real agent in the simulator, broken on purpose -----------------------------------


def _never_drops(agent):
    for name, spec in agent.assigned().items():
        agent.host.ensure_group(spec)
        agent.hosted.add(name)


def _ignores_snapshots(fold):
    def broken(agent, answer):
        fold(agent, {key: value for key, value in answer.items() if key != "snapshot"})
    return broken


@pytest.mark.parametrize("breakage, seed", [("never_drops", 2), ("ignores_snapshots", 9)])
def test_a_broken_agent_is_caught(monkeypatch, breakage, seed):
    """The simulator runs host.py's BrokerAgent itself: break it and a fixed seed fails."""
    assert controller.BrokerAgent is host.BrokerAgent
    if breakage == "never_drops":
        monkeypatch.setattr(host.BrokerAgent, "host_assigned", _never_drops)
    else:
        monkeypatch.setattr(host.BrokerAgent, "fold", _ignores_snapshots(host.BrokerAgent.fold))
    result = run_seed(seed)
    assert result.violations, f"a broken agent ({breakage}) went unnoticed by seed {seed}"


# --- the agent over a scripted IO ---------------------------------------------------------


class ScriptedIo:
    """An AgentIo whose controllers answer from ``script(address, header)``: a dict, or
    an MqlogError raised back; answers and timers wait until ``run_due`` is called."""

    def __init__(self, script):
        self.script, self.asked, self.notes = script, [], []
        self.pending, self.timers = [], []

    def request(self, address, header, done):
        self.asked.append((address, header["kind"]))
        try:
            self.pending.append((done, self.script(address, header), None))
        except errors.MqlogError as error:
            self.pending.append((done, None, error))

    def call_later(self, delay_ms, callback):
        self.timers.append((delay_ms, callback))

    def note(self, text):
        self.notes.append(text)

    def run_due(self):
        """Deliver the answers in flight (and those they cause), not the timers."""
        while self.pending:
            done, answer, error = self.pending.pop(0)
            done(answer, error)


class Host:
    broker_id, address, groups_max = "b1", "127.0.0.1:9001", 40

    def __init__(self):
        self.groups = {}

    def ensure_group(self, spec):
        self.groups[spec.name] = spec

    def drop_group(self, name, delete_data=False):
        del self.groups[name]

    def reports(self):
        return []

    def leads(self):
        return []

    def set_strays_aside(self, is_stray):
        return []

    def follow_registrations(self, addresses):
        self.registered = dict(addresses)


CONFIG = ControllerConfig(voters={"c1": "127.0.0.1:7001", "c2": "127.0.0.1:7002",
                                  "c3": "127.0.0.1:7003"}).validate()


def _agent(script):
    io = ScriptedIo(script)
    agent = host.BrokerAgent(Host(), CONFIG, io, rng=random.Random(5))
    agent.start()
    io.run_due()
    return agent, io


def test_a_round_registers_heartbeats_pulls_and_schedules_the_next():
    registered = []

    def script(address, header):
        if header["kind"] == "register_broker":
            registered.append(header)
            return {"broker_epoch": 3}
        if header["kind"] == "broker_heartbeat":
            return {"fenced": False, "position": 0}
        return {"records": [], "position": 0}
    agent, io = _agent(script)
    assert [kind for _, kind in io.asked] == ["register_broker", "broker_heartbeat",
                                              "metadata_since"]
    assert agent.epoch == 3 and agent.rounds == 1 and not io.notes
    assert registered[0]["address"] == Host.address  # (and how many groups it hosts:
    assert registered[0]["groups_max"] == Host.groups_max  # placement keeps within it)
    assert [delay for delay, _ in io.timers] == [CONFIG.broker_heartbeat_interval_ms]
    io.timers.pop()[1]()  # the next round: no registration, the leader asked first
    io.run_due()
    assert [kind for _, kind in io.asked[3:]] == ["broker_heartbeat", "metadata_since"]
    assert io.asked[3][0] == io.asked[0][0]


def test_not_leader_moves_the_agent_to_the_leader_it_names():
    def script(address, header):
        if address != "127.0.0.1:7003" and header["kind"] != "metadata_since":
            raise errors.NotLeader("not me", leader="c3", leader_address="127.0.0.1:7003")
        if header["kind"] == "register_broker":
            return {"broker_epoch": 1}
        return {"records": [], "position": 0, "fenced": False}
    agent, io = _agent(script)
    assert agent.epoch == 1 and agent.rounds == 1, io.notes
    heartbeat = [address for address, kind in io.asked if kind == "broker_heartbeat"]
    assert heartbeat == ["127.0.0.1:7003"]  # (the registration's answer taught it)


def test_no_controller_answering_ends_the_round_and_the_next_one_tries_again():
    def script(address, header):
        raise errors.NodeUnavailable(f"cannot reach {address}")
    agent, io = _agent(script)
    assert len(io.asked) == 3 and agent.epoch is None and agent.rounds == 1
    assert "no controller answered" in io.notes[0] and len(io.timers) == 1


@pytest.mark.parametrize("answer", [{}, {"broker_epoch": 1, "records": 7, "position": 0},
                                    {"broker_epoch": 1, "records": [[1, b"garbage"]],
                                     "position": 0}])
def test_garbage_from_a_controller_ends_the_round_typed_and_keeps_the_view(answer):
    def script(address, header):
        return answer
    agent, io = _agent(script)
    assert agent.rounds == 1 and len(io.timers) == 1  # (the next round is scheduled)
    assert agent.view.topics == {} and agent.position == 0
    assert io.notes and ("malformed" in io.notes[0] or "Invalid" in io.notes[0]
                         or "record" in io.notes[0]), io.notes


def test_a_heartbeat_refused_for_its_epoch_registers_again():
    epochs = iter([1, 2])

    def script(address, header):
        if header["kind"] == "register_broker":
            return {"broker_epoch": next(epochs)}
        if header["kind"] == "broker_heartbeat" and header["broker_epoch"] == 1:
            raise errors.MetadataChangeRefused("broker b1 heartbeats at broker epoch 1, but "
                                               "its registration is at epoch 2: register "
                                               "again")
        return {"records": [], "position": 0, "fenced": False}
    agent, io = _agent(script)
    assert agent.epoch is None and agent.rounds == 1
    io.timers.pop()[1]()
    io.run_due()
    assert agent.epoch == 2 and agent.rounds == 2
