"""``mqlog topics`` and ``mqlog brokers`` (cli_topics.py): following NotLeader to the
leader, printing what a controller answers, and failing with one line when none answers.
(A real cluster runs them in tests/test_controller_cluster.py.)"""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from mqlog import cli_topics, errors
from mqlog.replication.controller import records
from mqlog.replication.controller.records import RegisterBroker
from mqlog.replication.controller.state import fold


class FakeClient:
    """Stands in for mqlog.Client: each address answers as ``ANSWERS`` says."""

    answers: dict[str, Any] = {}
    asked: list[tuple[str, str]] = []
    headers: list[dict] = []

    def __init__(self, address: str, timeout_s: float = 0) -> None:
        self.address = address

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        pass

    def call(self, header: dict) -> tuple[dict, bytes]:
        self.asked.append((self.address, header["kind"]))
        self.headers.append(dict(header))
        answer = self.answers[self.address]
        if isinstance(answer, Exception):
            raise answer
        return answer, b""


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> type[FakeClient]:
    monkeypatch.setattr(cli_topics, "Client", FakeClient)
    FakeClient.answers, FakeClient.asked, FakeClient.headers = {}, [], []
    return FakeClient


def _described() -> dict:
    state = fold([RegisterBroker("b1", 3, "127.0.0.1:9001"),
                  records.UnfenceBroker("b1", 3), RegisterBroker("b2", 1, "127.0.0.1:9002"),
                  records.CreateTopic("orders", "raft", (("b1", "b2"), ("b2", "b1")))])
    return {"snapshot": records.encode(state.snapshot()), "position": 10, "leader": "c1"}


def test_changes_follow_not_leader_to_the_leader(fake: type[FakeClient]) -> None:
    fake.answers = {"h:1": errors.NotLeader("not me", leader="c2", leader_address="h:2"),
                    "h:2": {"assignment": [["b1", "b2"]]}}
    result = CliRunner().invoke(cli_topics.topics, ["create", "t", "--partitions", "1",
                                                    "--replication-factor", "2", "-b", "h:1"])
    assert result.exit_code == 0, result.output
    assert fake.asked == [("h:1", "create_topic"), ("h:2", "create_topic")]
    assert "created topic t: 1 partition x 2 replicas (raft)\n  0: b1,b2" in result.output


def test_reads_print_the_state(fake: type[FakeClient]) -> None:
    fake.answers = {"h:1": errors.NodeUnavailable("down"), "h:2": _described()}
    runner = CliRunner()
    listed = runner.invoke(cli_topics.topics, ["list", "-b", "h:1,h:2"])
    assert listed.output == "orders\traft\t2\t2\n"  # (name, layer, partitions, RF)
    described = runner.invoke(cli_topics.topics, ["describe", "orders", "-b", "h:2"])
    assert described.output.splitlines()[0] == "orders layer=raft partitions=2"
    # (a Raft partition has no ISR: b2's broker is fenced, its metadata's isr says b1,b2)
    assert "0 leader=b1 leader_epoch=0 partition_epoch=0 replicas=b1,b2\n" in described.output
    shown = runner.invoke(cli_topics.brokers, ["-b", "h:2"])
    assert shown.output == ("b1\tepoch=3\t127.0.0.1:9001\tlive\n"
                            "b2\tepoch=1\t127.0.0.1:9002\tfenced\n")
    missing = runner.invoke(cli_topics.topics, ["describe", "nope", "-b", "h:2"])
    assert isinstance(missing.exception, errors.InvalidArgument)


def test_no_controller_answering_is_one_error(fake: type[FakeClient]) -> None:
    fake.answers = {"h:1": errors.NodeUnavailable("refused"),
                    "h:2": errors.NotLeader("no leader yet")}
    result = CliRunner().invoke(cli_topics.brokers, ["-b", "h:1,h:2"])
    assert isinstance(result.exception, errors.NodeUnavailable)
    assert "h:1: refused; h:2: no leader yet" in str(result.exception)


def test_the_installed_command_has_them() -> None:
    from mqlog.cli import cli
    assert {"topics", "brokers"} <= set(cli.commands)


def test_create_sends_the_topic_config(fake: type[FakeClient]) -> None:
    fake.answers = {"h:1": {"assignment": [["b1", "b2"]]}}
    asked = fake.headers
    result = CliRunner().invoke(cli_topics.topics, [
        "create", "t", "--partitions", "1", "--replication-factor", "2", "--layer", "isr",
        "--config", "min_insync_replicas=2", "-b", "h:1"])
    flag = CliRunner().invoke(cli_topics.topics, [
        "create", "t", "--partitions", "1", "--replication-factor", "2", "--layer", "isr",
        "--min-insync-replicas", "1", "-b", "h:1"])
    bad = CliRunner().invoke(cli_topics.topics, [
        "create", "t", "--partitions", "1", "--replication-factor", "2",
        "--config", "min_insync_replicas", "-b", "h:1"])
    assert result.exit_code == 0, result.output
    assert "(isr), min_insync_replicas=2" in result.output
    assert asked[0]["config"] == {"min_insync_replicas": 2}
    assert flag.exit_code == 0 and asked[1]["config"] == {"min_insync_replicas": 1}
    assert bad.exit_code != 0 and "is not KEY=VALUE" in bad.output and len(asked) == 2
    for odd in ("--2", "\u00b2"):  # (not ints: sent as text, for the controller to refuse;
        # int() of them raised a ValueError, "internal error")
        sent = CliRunner().invoke(cli_topics.topics, [
            "create", "t", "--partitions", "1", "--replication-factor", "2", "--layer", "isr",
            "--config", f"min_insync_replicas={odd}", "-b", "h:1"])
        assert sent.exit_code == 0, sent.output
        assert asked[-1]["config"] == {"min_insync_replicas": odd}


def test_a_busy_leader_proposed_nothing_and_is_asked_again(fake: type[FakeClient]) -> None:
    """ControllerBusy (requests_waiting_max changes wait on the leader) says nothing was
    proposed: a create goes on (here a follower names the leader, asked again), where an
    answer of unknown outcome would stop it (RequestOutcomeUnknown)."""
    answers = iter([errors.ControllerBusy("busy"), {"assignment": [["b1"]]}])

    class BusyOnce(FakeClient):
        def call(self, header: dict) -> tuple[dict, bytes]:
            if self.address == "h:1":
                self.asked.append((self.address, header["kind"]))
                answer = next(answers)
                if isinstance(answer, Exception):
                    raise answer
                return answer, b""
            return super().call(header)

    cli_topics.Client = BusyOnce  # (the fixture's monkeypatch restores it)
    fake.answers = {"h:2": errors.NotLeader("not me", leader="c1", leader_address="h:1")}
    result = CliRunner().invoke(cli_topics.topics, ["create", "t", "--partitions", "1",
                                                    "--replication-factor", "1",
                                                    "-b", "h:1,h:2"])
    assert result.exit_code == 0, result.output
    assert fake.asked == [("h:1", "create_topic"), ("h:2", "create_topic"),
                          ("h:1", "create_topic")]
