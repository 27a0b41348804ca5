"""``mqlog topics create|list|describe|delete|rebalance`` and ``mqlog brokers``: the cluster's
metadata, asked of the controller quorum (Kafka's kafka-topics.sh and kafka-metadata).

Each command takes ``--bootstrap HOST:PORT[,HOST:PORT...]``: any controller (a process
with role "controller" or "broker,controller"). Reads (list, describe, brokers) are
answered by the first that answers, from what it has folded (``describe`` asks the leader
first: it alone hears the Raft partitions' leaders, which their brokers report in their
heartbeats; a Raft partition's ``leader_epoch`` is its Raft term); changes go to the leader:
a controller that does not lead answers NotLeader naming the leader's address, and the
command follows it (at most ``_REDIRECTS_MAX`` times). A change is answered once its
record is committed and folded on the leader. ``create`` and ``delete`` are not safe to
repeat, so they go on to another controller only when the one asked surely did not carry
them out (its address refused the connection, NotLeader, ControllerBusy, a broker's
UnknownGroup); an
answer lost on the way (the connection cut or timed out, the leader's own "outcome
unknown") is RequestOutcomeUnknown, which says to look with ``describe`` before running
the command again. (``rebalance``'s elect_preferred is sent on: a copy only elects the
preferred leaders again, which are elected already.)
"""

from __future__ import annotations

import re
from typing import Any

import click

from mqlog import errors
from mqlog.client import Client
from mqlog.cluster_client import metadata_from
from mqlog.replication.controller.leaders import LeaderTable
from mqlog.replication.controller.records import LAYERS
from mqlog.replication.controller.state import ClusterMetadata, describe_topic

_REDIRECTS_MAX = 5


def _addresses(bootstrap: str) -> list[str]:
    found = [item.strip() for item in bootstrap.split(",") if item.strip()]
    if not found:
        raise click.UsageError("--bootstrap needs at least one HOST:PORT")
    return found


def _ask(bootstrap: str, header: dict[str, Any], *, leader: bool, timeout_s: float,
         repeatable: bool = True) -> dict[str, Any]:
    """One request, to the first controller that answers (to the leader, if ``leader``).

    A request that is not ``repeatable`` (create_topic, delete_topic) goes on to the next
    controller only after a failure that surely left it undone: the address refused the
    connection (nothing was sent), NotLeader (a follower proposes nothing),
    ControllerBusy (a leader with too many changes waiting proposes nothing), UnknownGroup
    (a broker: it hosts no controller). Any other failure once it was sent — the
    connection lost or timed out, the leader's own "outcome unknown", an error of no
    known name — may have carried it out (or may still): it raises
    RequestOutcomeUnknown, not sent again. A copy would be refused "exists already" for
    the operator's own successful create, or delete a topic created meanwhile."""
    failures, queue = [], _addresses(bootstrap)
    for _ in range(len(queue) + _REDIRECTS_MAX):
        if not queue:
            break
        address = queue.pop(0)
        try:
            client = Client(address, timeout_s=timeout_s)
        except errors.NodeUnavailable as error:  # (not connected: nothing was sent)
            failures.append(f"{address}: {error}")
            continue
        try:
            with client:
                return client.call(dict(header))[0]
        except errors.NotLeader as error:
            failures.append(f"{address}: {error}")
            if leader and error.leader_address and error.leader_address not in queue:
                queue.insert(0, error.leader_address)
        except errors.ControllerBusy as error:  # (nothing proposed: the leader is asked
            failures.append(f"{address}: {error}")  # again if another names it)
        except errors.UnknownGroup:  # a broker (it hosts no controller group) was named
            failures.append(f"{address} is not a controller (a broker? --bootstrap names "
                            "controllers: the [controller] voters of the node configs)")
        except (errors.NodeUnavailable, errors.RemoteError) as error:
            if not repeatable:
                raise _outcome_unknown(header, address, error, failures, bootstrap) from None
            failures.append(f"{address}: {error}")
    raise errors.NodeUnavailable("no controller could answer: " + "; ".join(failures))


def _outcome_unknown(header: dict[str, Any], address: str, error: errors.MqlogError,
                     failures: list[str], bootstrap: str) -> errors.RequestOutcomeUnknown:
    name = header.get("name")
    why = {"create_topic": "a copy would be refused as existing already",
           "delete_topic": "a copy could delete a topic created meanwhile"}.get(
               header["kind"], "it is not safe to repeat")
    return errors.RequestOutcomeUnknown(
        f"{header['kind']} of {name!r} sent to {address} was not answered with its outcome "
        f"({error}): it may have been carried out, or may still be, so it was not sent "
        f"again ({why}); `mqlog topics describe {name} --bootstrap {bootstrap}` shows "
        "whether it was: run the command again only if not"
        + (f" (before it: {'; '.join(failures)})" if failures else ""))


def _state(answer: dict[str, Any]) -> ClusterMetadata:
    """The answer's state, with the Raft partitions' reported leaders laid over it."""
    state, leaders = metadata_from(answer)
    table = LeaderTable()
    table.merge_all(leaders)
    return table.overlay(state)


def _described(bootstrap: str, timeout_s: float) -> ClusterMetadata:
    """The metadata from the controller leader, the one that hears the Raft partitions'
    leaders reported; from any controller if none leads now (its leaders may be stale)."""
    try:
        return _state(_ask(bootstrap, {"kind": "describe_cluster", "require_leader": True},
                           leader=True, timeout_s=timeout_s))
    except errors.NodeUnavailable:
        return _state(_ask(bootstrap, {"kind": "describe_cluster"}, leader=False,
                           timeout_s=timeout_s))


bootstrap_option = click.option(
    "--bootstrap", "-b", required=True, metavar="HOST:PORT[,...]",
    help="Controllers to ask (any of them; changes are sent on to the leader).")
timeout_option = click.option("--timeout-s", type=click.FloatRange(min=0.1), default=10.0,
                              show_default=True, help="Give up on a controller after this.")


@click.group()
def topics() -> None:
    """Create, list, describe, rebalance and delete the cluster's topics."""


@topics.command()
@click.argument("name")
@click.option("--partitions", type=click.IntRange(min=1), required=True)
@click.option("--replication-factor", type=click.IntRange(min=1), required=True)
@click.option("--layer", type=click.Choice(LAYERS), default="raft", show_default=True,
              help="How each partition is replicated.")
@click.option("--config", "settings", multiple=True, metavar="KEY=VALUE",
              help="A topic setting (repeatable): min_insync_replicas=N (isr topics, "
                   "1..the replication factor; default: the [controller] value).")
@click.option("--min-insync-replicas", type=click.IntRange(min=1), default=None,
              help="Same as --config min_insync_replicas=N.")
@bootstrap_option
@timeout_option
def create(name: str, partitions: int, replication_factor: int, layer: str,
           settings: tuple[str, ...], min_insync_replicas: int | None, bootstrap: str,
           timeout_s: float) -> None:
    """Create topic NAME: its replicas are placed as Kafka places them."""
    config = _topic_config(settings)
    if min_insync_replicas is not None:
        config["min_insync_replicas"] = min_insync_replicas
    header = {"kind": "create_topic", "name": name, "partitions": partitions,
              "replication_factor": replication_factor, "layer": layer}
    if config:
        header["config"] = config
    answer = _ask(bootstrap, header, leader=True, timeout_s=timeout_s, repeatable=False)
    click.echo(f"created topic {name}: {_count(partitions, 'partition')} x "
               f"{_count(replication_factor, 'replica')} ({layer})"
               + "".join(f", {key}={value}" for key, value in sorted(config.items())))
    for index, replicas in enumerate(answer.get("assignment", ())):
        click.echo(f"  {index}: {','.join(replicas)}")


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _topic_config(settings: tuple[str, ...]) -> dict[str, Any]:
    """--config KEY=VALUE items as a map (integer values as ints); the controller checks
    the names and the values."""
    found: dict[str, Any] = {}
    for item in settings:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--config")
        text = value.strip()
        # (ASCII digits, one sign: "--2" and "²" passed isdigit and int() raised)
        found[key.strip()] = int(text) if re.fullmatch(r"-?[0-9]+", text) else text
    return found


@topics.command()
@click.argument("name")
@bootstrap_option
@timeout_option
def delete(name: str, bootstrap: str, timeout_s: float) -> None:
    """Delete topic NAME from the cluster's metadata."""
    _ask(bootstrap, {"kind": "delete_topic", "name": name}, leader=True, timeout_s=timeout_s,
         repeatable=False)
    click.echo(f"deleted topic {name}")


@topics.command(name="list")
@bootstrap_option
@timeout_option
def list_topics(bootstrap: str, timeout_s: float) -> None:
    """The topics, one a line: name, layer, partitions, replication factor."""
    state = _state(_ask(bootstrap, {"kind": "describe_cluster"}, leader=False,
                        timeout_s=timeout_s))
    for name in sorted(state.topics):
        topic = state.topics[name]
        factor = max((len(part.replicas) for part in topic.partitions), default=0)
        click.echo(f"{name}\t{topic.layer}\t{len(topic.partitions)}\t{factor}")


@topics.command()
@click.argument("names", nargs=-1)
@bootstrap_option
@timeout_option
def describe(names: tuple[str, ...], bootstrap: str, timeout_s: float) -> None:
    """Partitions of NAMES (all topics if none): leader, epochs, replicas, ISR, ELR."""
    state = _described(bootstrap, timeout_s)
    missing = [name for name in names if name not in state.topics]
    if missing:
        raise errors.InvalidArgument(f"no topic {', '.join(missing)} (`mqlog topics list` "
                                     "shows the topics there are)")
    for name in names or sorted(state.topics):
        for line in describe_topic(state.topics[name]):
            click.echo(line[2:])


@topics.command()
@click.argument("names", nargs=-1)
@bootstrap_option
@timeout_option
def rebalance(names: tuple[str, ...], bootstrap: str, timeout_s: float) -> None:
    """Move each partition of NAMES (all topics if none) to its preferred leader.

    Kafka's preferred-leader election: a partition's first replica is its preferred
    leader (the assignment spreads first replicas over the brokers, so leaders spread
    too). Each Raft partition whose reported leader is another broker, while the preferred
    one is live, is asked to hand leadership over (a Raft transfer: the leader catches the
    target up first, then tells it to campaign; it gives up after an election timeout).
    Each ISR partition is handed over by the controller when its preferred replica is
    live and in the ISR. (The controller does both on its own every
    leader_imbalance_check_interval_ms unless auto_leader_rebalance_enable is false.)
    """
    state = _described(bootstrap, timeout_s)
    missing = [name for name in names if name not in state.topics]
    if missing:
        raise errors.InvalidArgument(f"no topic {', '.join(missing)} (`mqlog topics list` "
                                     "shows the topics there are)")
    asked = failed = elected = 0
    chosen = names or tuple(sorted(state.topics))
    isr = [name for name in chosen if state.topics[name].layer == "isr"]
    if isr:
        answer = _ask(bootstrap, {"kind": "elect_preferred", "topics": isr}, leader=True,
                      timeout_s=timeout_s)
        for topic, index, why in answer.get("results", ()):
            click.echo(f"{topic} {index}: " + (why or "elected its preferred leader"))
            elected += not why
    for name in chosen:
        if name in isr:
            continue
        for index, reason, move in _moves(state, name):
            if move is None:
                click.echo(f"{name} {index}: {reason}")
                continue
            try:
                with Client(move[0], timeout_s=timeout_s, group=f"{name}-{index}") as client:
                    client.transfer(move[1])
            except errors.MqlogError as error:
                failed += 1
                click.echo(f"{name} {index}: {reason}: failed: {error}")
                continue
            asked += 1
            click.echo(f"{name} {index}: {reason}: transferring")
    click.echo(f"{asked} transfers asked, {failed} failed, {elected} ISR partitions moved "
               "(`mqlog topics describe` shows the leaders once their brokers report them, "
               "within a heartbeat interval)")
    if failed:
        raise SystemExit(1)


def _moves(state: ClusterMetadata, name: str) -> list[tuple[int, str, tuple[str, str] | None]]:
    """(partition, why, (leader's address, preferred broker) or None: nothing to do)."""
    topic = state.topics[name]
    found: list[tuple[int, str, tuple[str, str] | None]] = []
    for index, part in enumerate(topic.partitions):
        preferred = part.replicas[0]
        info = state.brokers.get(preferred)
        leader = state.brokers.get(part.leader)
        if topic.layer != "raft":
            reason = f"layer {topic.layer}: the controller moves its master once the " \
                "master's broker is fenced (auto_failover), not by rebalancing"
        elif part.leader == preferred:
            reason = f"led by its preferred leader {preferred}"
        elif info is None or info.fenced:
            reason = f"its preferred leader {preferred} is not live"
        elif leader is None:
            reason = "no leader is reported now; retry after an election"
        else:
            found.append((index, f"{part.leader} -> {preferred}",
                          (leader.address, preferred)))
            continue
        found.append((index, reason, None))
    return found


@click.command()
@bootstrap_option
@timeout_option
def brokers(bootstrap: str, timeout_s: float) -> None:
    """The registered brokers: id, broker epoch, address, state (live or fenced)."""
    state = _state(_ask(bootstrap, {"kind": "describe_cluster"}, leader=False,
                        timeout_s=timeout_s))
    for name in sorted(state.brokers):
        info = state.brokers[name]
        click.echo(f"{name}\tepoch={info.broker_epoch}\t{info.address}\t"
                   + ("fenced" if info.fenced else "live")
                   + ("\tunclean_shutdown" if info.unclean_shutdown else ""))
