"""The ``mqlog`` command: produce, consume, query and look inside a store from a shell.

Theory of operation
-------------------
One click group; each command is one small function that turns its options into calls
of the public store API (``mqlog.open`` -> ``Store``) and hands what comes back to the
output helpers at the bottom of this module. docs/CLI.md has the usage.

* ``produce`` and ``consume --commit`` open the store for writing, which takes its
  lock: while another process has it open they fail with StoreLocked, whose message
  says what to do. ``consume``, ``query``, ``inspect`` and ``stats`` open a read-only
  snapshot (no lock, no recovery, not a byte written), so they work beside a running
  writer; a key query on a snapshot reads the topic instead of the index.
  ``--config FILE`` reads the store's settings from the ``[store]`` table of a TOML file.
* ``dump`` and ``verify`` read the commit-log segments through ``engine.reader`` with
  read-only mappings: no lock, no recovery, not one byte changed, so they also work on
  a store another process has open (and on a damaged one).
* ``consume --follow`` opens the store only to find where to start (the position of the
  first wanted record), closes it, and then tails the commit-log files read-only, so a
  producer in another process can open the store meanwhile. It shows records as soon
  as they are written (a follower reads the files, not through a Store, so it does not
  wait for the committed position), and it cannot commit a group's offset.
* Errors: ``main`` runs the group in non-standalone mode and turns every failure into
  one line on stderr, ``mqlog: error: <message>``, with exit status 1 (2 for bad
  usage). ``--debug`` lets the exception through, traceback and all.
* Output: records go to stdout, one per line (consume's text format is the body alone,
  so ``produce`` then ``consume`` round-trips lines); summaries and progress bars go to
  stderr; tables are drawn by rich, and every table command has ``--json``.
"""

from __future__ import annotations

import base64
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

import click

import mqlog
from mqlog import cli_cluster, cli_repair, cli_topics
from mqlog.config import StoreConfig
from mqlog.config import load as load_config
from mqlog.engine import queries
from mqlog.engine.files import file_name
from mqlog.engine.reader import LogReader, VerifyReport
from mqlog.errors import (
    CorruptRecord,
    InvalidArgument,
    MqlogError,
    PromotionRefused,
    UnknownGroup,
)
from mqlog.ext import fallback
from mqlog.replication.messages import NUMBER_LIMIT

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
PULL_COUNT_MAX = 1024  # records asked of one pull
PULL_SIZE_BYTES_MAX = 4 << 20  # bytes asked of one pull (a bigger record still comes)
FOLLOW_BATCH_COUNT_MAX = 1024  # records one read of the tail decodes


class CommandFailed(MqlogError):
    """A command cannot do what it was asked: the log is damaged, the topic is empty..."""


@dataclass
class _State:
    debug: bool = False


# --- the entry point ---------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    """The console script: run the command, turn any failure into one line and a status."""
    state = _State()
    if hasattr(sys.stdout, "reconfigure"):  # a terminal that cannot show a character
        sys.stdout.reconfigure(errors="backslashreplace")
    try:
        status = cli.main(args=argv, prog_name="mqlog", standalone_mode=False, obj=state)
        sys.stdout.flush()  # here, so that a closed pipe is handled below
    except click.exceptions.NoArgsIsHelpError as error:
        click.echo(error.ctx.get_help() if error.ctx else "mqlog --help")
        status = EXIT_USAGE
    except click.UsageError as error:
        status = _fail(_usage_line(error), EXIT_USAGE)
    except click.ClickException as error:
        status = _fail(error.format_message(), EXIT_ERROR)
    except (click.Abort, KeyboardInterrupt):
        status = EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader went away (`mqlog dump ... | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = EXIT_ERROR
    except (MqlogError, OSError) as error:
        if state.debug:
            raise
        status = _fail(_error_text(error), EXIT_ERROR)
    except Exception as error:  # a bug: still one line, unless asked for the traceback
        if state.debug:
            raise
        status = _fail(f"internal error: {type(error).__name__}: {error} (run again with "
                       "--debug for the traceback, and report it)", EXIT_ERROR)
    sys.exit(status if isinstance(status, int) else 0)


def _fail(message: str, status: int) -> int:
    click.echo(f"mqlog: error: {' '.join(message.split())}", err=True)
    return status


def _usage_line(error: click.UsageError) -> str:
    where = error.ctx.command_path if error.ctx else "mqlog"
    return f"{error.format_message()} (see '{where} --help')"


def _error_text(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return f"{error.filename}: {error.strerror}" if error.filename else error.strerror
    return str(error) or type(error).__name__


# --- shared options ----------------------------------------------------------------------


def _set_debug(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.ensure_object(_State).debug = True


def debug_option(function: Callable) -> Callable:
    return click.option("--debug", is_flag=True, expose_value=False, is_eager=True,
                        callback=_set_debug,
                        help="On an error, show the full traceback.")(function)


def store_dir_argument(function: Callable) -> Callable:
    return click.argument("data_dir", metavar="DATA_DIR",
                          type=click.Path(file_okay=False, path_type=Path))(function)


def config_option(function: Callable) -> Callable:
    return click.option("--config", "config_file", metavar="FILE",
                        type=click.Path(dir_okay=False, path_type=Path),
                        help="TOML file whose [store] table holds the store's settings."
                        )(function)


def store_or_cluster(function: Callable) -> Callable:
    """DATA_DIR (optional) or --bootstrap, --config and --debug: produce and consume."""
    function = click.option(
        "--bootstrap", "-b", metavar="HOST:PORT[,...]",
        help="Instead of DATA_DIR: a cluster's brokers (docs/CLUSTER.md); --queue then "
        "names the partition.")(function)
    function = click.argument("data_dir", metavar="[DATA_DIR]", required=False,
                              type=click.Path(file_okay=False, path_type=Path))(function)
    function = click.option(
        "--timeout-s", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
        help="With --bootstrap: give up on a topic, a partition or its leader after this."
    )(function)
    return click.pass_context(config_option(debug_option(function)))


def store_command(function: Callable) -> Callable:
    """DATA_DIR, --config and --debug: what every command that opens a store takes."""
    return store_dir_argument(config_option(debug_option(function)))


def topic_option(function: Callable) -> Callable:
    return click.option("--topic", "-t", required=True, help="The topic.")(function)


def format_option(function: Callable) -> Callable:
    function = click.option("--json", "as_json", is_flag=True,
                            help="Same as --format json.")(function)
    return click.option("--format", "output", type=click.Choice(["text", "json"]),
                        default="text", show_default=True,
                        help="text, or one JSON object per line.")(function)


def json_option(function: Callable) -> Callable:
    return click.option("--json", "as_json", is_flag=True,
                        help="Print JSON instead of tables.")(function)


class _Time(click.ParamType):
    """Milliseconds since the epoch, or an ISO 8601 time (UTC unless it names a zone)."""

    name = "TIME"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_time(str(value))
        except ValueError as error:
            self.fail(str(error), param, ctx)


class _TimeRange(click.ParamType):
    """BEGIN..END: two times (see _Time); either may be left out for an open end."""

    name = "BEGIN..END"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> tuple[int | None, int | None]:
        begin, dots, end = str(value).partition("..")
        if not dots:
            self.fail(f"{value!r} is not a range; write BEGIN..END (either may be empty)",
                      param, ctx)
        try:
            return (parse_time(begin) if begin.strip() else None,
                    parse_time(end) if end.strip() else None)
        except ValueError as error:
            self.fail(str(error), param, ctx)


# --- the commands ------------------------------------------------------------------------


@click.group(context_settings={"help_option_names": ["-h", "--help"],
                               "max_content_width": 100})
@click.option("--debug", is_flag=True, help="On an error, show the full traceback.")
@click.version_option(mqlog.__version__, prog_name="mqlog")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """mqlog: write to, read from and look inside an mqlog store (a directory) or a
    cluster's topics; run and drive replicated nodes (docs/CLI.md)."""
    ctx.ensure_object(_State).debug |= debug


@cli.command()
@store_or_cluster
@topic_option
@click.option("--queue", "queue_id", type=click.IntRange(min=0), default=None,
              help="Queue id (default 0); with --bootstrap the partition (default: by the "
              "key's hash, round-robin without a key).")
@click.option("--file", "-f", "source", type=click.File("rb"), default="-",
              help="Read lines from FILE instead of stdin.")
@click.option("--key", "-k", help="Key of every record.")
@click.option("--key-separator", metavar="SEP",
              help="Each line is KEY<SEP>BODY: a key per record.")
@click.option("--tags", help="Tags of every record.")
@click.option("--property", "-p", "properties", multiple=True, metavar="NAME=VALUE",
              help="A property of every record (repeatable).")
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True,
              help="Store N lines per put_batch call.")
@click.option("--sync", is_flag=True,
              help="flush_mode=sync: each put returns once its record is on disk.")
@click.option("--acks", type=click.Choice(cli_cluster.ACKS), default="all", show_default=True,
              help="With --bootstrap: Kafka's acks (all: committed by the partition's "
              "replicas; 1: its leader stored it; 0: sent, not answered).")
@json_option
def produce(ctx: click.Context, data_dir: Path | None, bootstrap: str | None,
            timeout_s: float, config_file: Path | None, topic: str, queue_id: int | None,
            source: IO[bytes], key: str | None, key_separator: str | None, tags: str | None,
            properties: tuple[str, ...], batch: int, sync: bool, acks: str,
            as_json: bool) -> None:
    """Store each line of stdin (or --file) as one record; the newline is not stored.

    Into the store DATA_DIR (created if it holds none), or with --bootstrap into a
    cluster's topic (which `mqlog topics create` made).

    Lines are stored as they are read (so `tail -f LOG | mqlog produce` works). If one
    cannot be stored (a key that is not UTF-8, a record over message_size_bytes_max, a
    full disk), the lines before it stay stored, in order, and nothing from it on is:
    the error says how many records were stored and from which line to produce again
    (with --json, the summary of those records is printed too)."""
    if key is not None and key_separator is not None:
        raise click.UsageError("use --key or --key-separator, not both")
    if batch > 1 and key_separator is not None:
        raise click.UsageError("--batch stores one key for all its records; it cannot be "
                               "combined with --key-separator")
    cli_cluster.check_target(ctx, data_dir, bootstrap, cli_cluster.STORE_ONLY_PRODUCE,
                             cli_cluster.CLUSTER_ONLY)
    if bootstrap is not None:
        cli_cluster.produce(bootstrap, topic, queue_id, _lines(source), key,
                            None if key_separator is None else key_separator.encode(),
                            tags, batch, acks, timeout_s, as_json)
        return
    assert data_dir is not None
    queue_id = queue_id or 0
    fields = dict(key=key, tags=tags, properties=_parse_properties(properties) or None)
    overrides: dict[str, Any] = {"flush_mode": "sync"} if sync else {}
    tally = _Tally(topic, queue_id)
    try:
        with _opened(data_dir, config_file, create=True, **overrides) as store:
            tally.start = store.max_offset(topic, queue_id)
            lines = _lines(source)
            try:
                if key_separator is not None:
                    _put_keyed(store, tally, lines, key_separator.encode(), fields)
                elif batch > 1:
                    _put_batches(store, tally, lines, batch, fields)
                else:
                    _put_each(store, tally, lines, fields)
            except KeyboardInterrupt:  # (counted from the queue: a put may have ended
                # between its return and its tally)
                _say_interrupted(tally, store.max_offset(topic, queue_id) - tally.start,
                                 as_json)
                raise
            tally.pending = 0
            if sync:
                store.flush()
    except KeyboardInterrupt:
        if not tally.interrupted:  # (after the last line: Ctrl-C to a pipeline ends its
            _say_interrupted(tally, tally.count, as_json)  # input too, and EOF came first)
        raise
    except (MqlogError, OSError) as error:
        if tally.count == 0 and tally.pending == 0:
            raise  # (no line handed over yet: opening the store, reading the input)
        if as_json:
            click.echo(json.dumps(tally.as_dict()))
        raise CommandFailed(tally.failure(error)) from error
    if as_json:
        click.echo(json.dumps(tally.as_dict()))
    else:
        click.echo(tally.summary(), err=True)


@cli.command()
@store_or_cluster
@topic_option
@click.option("--queue", "queue_id", type=click.IntRange(min=0),
              help="Only this queue (default: every queue of the topic); with --bootstrap "
              "the partition.")
@click.option("--from-offset", type=click.IntRange(min=0), metavar="N",
              help="Start at offset N of each queue. A queue whose records begin past N "
              "(retention deleted the older ones) starts at its first offset; one that ends "
              "at or before N starts at its end (nothing to print from it yet; --follow "
              "prints what comes), as a Kafka consumer resets an out-of-range offset and "
              "RocketMQ corrects a pull's; a note on stderr names each such queue. A "
              "--group's committed offsets are moved the same way.")
@click.option("--from-time", type=_Time(), help="Start at the first record stored at or "
              "after TIME (milliseconds since the epoch, or ISO 8601).")
@click.option("--group", "-g", help="Start at this consumer group's committed offsets.")
@click.option("--commit", is_flag=True,
              help="With --group: commit the offset after the last record printed.")
@click.option("--max", "count_max", type=click.IntRange(min=1), metavar="N",
              help="Stop after N records.")
@click.option("--tags", help="Only records with these tags: 'TagA || TagB'.")
@click.option("--follow", is_flag=True, help="Keep waiting for new records (until Ctrl-C "
              "or --timeout-ms).")
@click.option("--timeout-ms", type=click.IntRange(min=0),
              help="With --follow: stop when no record arrived for this long.")
@click.option("--poll-ms", type=click.IntRange(min=1), default=100, show_default=True,
              help="With --follow: how often to look for new records.")
@format_option
def consume(ctx: click.Context, data_dir: Path | None, bootstrap: str | None,
            timeout_s: float, config_file: Path | None, topic: str, queue_id: int | None,
            from_offset: int | None, from_time: int | None, group: str | None, commit: bool,
            count_max: int | None, tags: str | None, follow: bool, timeout_ms: int | None,
            poll_ms: int, output: str, as_json: bool) -> None:
    """Print the records of a topic, queue by queue in offset order (text: the bodies).

    From the store DATA_DIR, or with --bootstrap from a cluster's topic, partition by
    partition, each from its leader (committed records only)."""
    cli_cluster.check_target(ctx, data_dir, bootstrap, cli_cluster.STORE_ONLY_CONSUME,
                             ("timeout_s",))
    write = _record_writer("json" if as_json else output, body_only=True)
    if bootstrap is not None:
        cli_cluster.consume(bootstrap, topic, queue_id, from_offset, count_max, timeout_s,
                            write)
        return
    assert data_dir is not None
    _check_start(from_offset, from_time, group, commit, follow)
    given = [flag for name, flag in (("timeout_ms", "--timeout-ms"), ("poll_ms", "--poll-ms"))
             if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT]
    if given and not follow:
        raise click.UsageError(f"{' and '.join(given)}: only with --follow (without it, "
                               "consume prints what is there and stops)")
    with _opened(data_dir, config_file, read_only=not commit) as store:
        names = queries.parse_subscription(tags, store.config.subscription_tags_max)
        queues = _topic_queues(store, topic, queue_id, wait=follow)
        starts = {queue: _start_offset(store, topic, queue, from_offset, from_time, group)
                  for queue in queues}
        if not follow:
            _consume_queues(store, topic, starts, tags, count_max, write,
                            group if commit else None)
            return
        position = _start_position(store, topic, starts)
    _follow(LogReader(data_dir), position, _Wanted(topic, queue_id, starts, names),
            count_max, timeout_ms, poll_ms, write)


@cli.command()
@store_command
@topic_option
@click.option("--key", "-k", help="Records whose key is exactly KEY (newest first).")
@click.option("--time", "time_range", type=_TimeRange(),
              help="Records stored in BEGIN..END (with --key: narrows the key's records).")
@click.option("--max", "count_max", type=click.IntRange(min=1), default=64, show_default=True,
              metavar="N", help="At most N records.")
@format_option
def query(data_dir: Path, config_file: Path | None, topic: str, key: str | None,
          time_range: tuple[int | None, int | None] | None, count_max: int, output: str,
          as_json: bool) -> None:
    """Find records by key (the key index) or by store time."""
    if key is None and time_range is None:
        raise click.UsageError("give --key KEY, --time BEGIN..END, or both")
    begin, end = time_range or (None, None)
    write = _record_writer("json" if as_json else output, body_only=False)
    with _opened(data_dir, config_file, read_only=True) as store:
        if key is not None:
            records = store.query(topic, key, begin, end, count_max)
        else:
            records = store.query_by_time(topic, queries.TIME_MIN if begin is None else begin,
                                          queries.TIME_MAX if end is None else end, count_max)
        for record in records:
            write(record)


@cli.command()
@store_command
@json_option
def inspect(data_dir: Path, config_file: Path | None, as_json: bool) -> None:
    """Segments, positions, epochs, queues and consumer groups of a store."""
    with _opened(data_dir, config_file, read_only=True) as store:
        facts = _inspect_facts(store)
    if as_json:
        click.echo(json.dumps(facts, indent=2))
        return
    _print_tables([
        _key_value_table("Store", {**facts["store"], **facts["positions"]}),
        _rows_table("Segments", facts["segments"]),
        _rows_table("Epochs", facts["epochs"]),
        _rows_table("Queues", facts["queues"]),
        _rows_table("Consumer groups", facts["groups"]),
    ])


@cli.command()
@store_command
@json_option
def stats(data_dir: Path, config_file: Path | None, as_json: bool) -> None:
    """Record counts per topic and queue, bytes, segments, epoch."""
    with _opened(data_dir, config_file, read_only=True) as store:
        facts = _stats_facts(store)
    if as_json:
        click.echo(json.dumps(facts, indent=2))
        return
    _print_tables([_key_value_table("Store", facts["totals"]),
                   _rows_table("Topics", facts["topics"]),
                   _rows_table("Queues", facts["queues"])])


@cli.command()
@store_dir_argument
@debug_option
@click.option("--from-position", type=click.IntRange(min=0), default=0, metavar="POSITION",
              help="Start at this position (a record's first byte).")
@click.option("--max", "count_max", type=click.IntRange(min=1), metavar="N",
              help="Stop after N records.")
@format_option
def dump(data_dir: Path, from_position: int, count_max: int | None, output: str,
         as_json: bool) -> None:
    """Print the records of the commit log in position order (read-only, needs no lock)."""
    write = _record_writer("json" if as_json else output, body_only=False, dump=True)
    for count, record in enumerate(LogReader(data_dir).records(from_position), 1):
        write(record)
        if count == count_max:
            break


@cli.command()
@store_dir_argument
@debug_option
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def verify(data_dir: Path, quiet: bool) -> None:
    """CRC-check every record of every segment (read-only); exit 1 at the first damage."""
    reader = LogReader(data_dir)
    report = _verify_with_progress(reader, quiet)
    if report.problem is not None:
        position, reason = report.problem
        base = reader.segment_of(position)
        where = f"segment {file_name(base)}, " if base is not None else ""
        raise CommandFailed(f"{where}position {position}: {reason}; the "
                            f"{_count(report.record_count, 'record')} before it are intact")
    click.echo(f"ok: {_count(report.record_count, 'record')} in "
               f"{_count(report.segment_count, 'segment')}, {report.bytes_checked} bytes "
               f"checked; the log ends at position {report.end_position}")


def _register_spark_jobs() -> None:
    """``mqlog reconcile`` and ``mqlog replay`` (their Spark imports wait until run)."""
    from mqlog.spark_connector.cli import reconcile, replay

    cli.add_command(reconcile)
    cli.add_command(replay)


@cli.group()
def bench() -> None:
    """Benchmarks (from a source checkout of mqlog)."""


@bench.command("compare", context_settings={"ignore_unknown_options": True,
                                            "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench_compare(args: tuple[str, ...]) -> int:
    """mqlog beside its peers: runs benchmarks/compare.py (arguments pass through)."""
    return int(_import_compare().main(list(args)) or 0)


@cli.command()
@click.option("--config", "config_file", required=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The node's TOML file: [node] (id, listen, data_dir, layer; role, master, "
              "slaves for master_slave; voters, learners for raft; peers), [store], and "
              "[groups.NAME] tables for a broker hosting several groups.")
def node(config_file: Path) -> None:
    """Run a broker: serve its replica groups and clients until SIGTERM (docs/CLUSTER.md)."""
    from mqlog.config import BrokerConfig
    from mqlog.replication.broker import run_broker

    run_broker(BrokerConfig.load(config_file))


@cli.command()
@click.option("--listen", default="127.0.0.1:9876", show_default=True, metavar="HOST:PORT")
@click.option("--node-timeout-ms", type=click.IntRange(min=1), default=10_000,
              show_default=True, help="Drop a node from the routes after this silence.")
def registry(listen: str, node_timeout_ms: int) -> None:
    """Run a route registry (RocketMQ's NameServer) for master-slave groups."""
    from mqlog.replication.registry import run_registry

    run_registry(listen, node_timeout_ms)


@cli.group()
@click.option("--group", default=None,
              help="The replica group, on brokers hosting several (docs/CLUSTER.md); "
              "default: the broker's default group.")
@click.pass_context
def cluster(ctx: click.Context, group: str | None) -> None:
    """Replicated nodes, seen from outside."""
    ctx.meta["mqlog.group"] = group


def _group_client(address: str, timeout_s: float = 30.0) -> mqlog.Client:
    """A client of ADDRESS for the group ``mqlog cluster --group`` named."""
    return mqlog.Client(address, timeout_s=timeout_s,
                        group=click.get_current_context().meta.get("mqlog.group"))


@cluster.command("promote")
@click.argument("address")
@click.option("--role", type=click.Choice(["SYNC_MASTER", "ASYNC_MASTER"]),
              default="SYNC_MASTER", show_default=True)
@click.option("--slaves", default="", help="Comma-separated node ids it will lead.")
@click.option("--epoch", type=click.IntRange(min=0, max=NUMBER_LIMIT - 1), default=0,
              help="The new epoch; give one above every node's (mqlog cluster status shows "
              "them). Default: one above the node's own.")
@click.option("--force", is_flag=True,
              help="Promote even if another reachable node is ahead of it or a live master "
              "(what that loses is printed).")
def cluster_promote(address: str, role: str, slaves: str, epoch: int, force: bool) -> None:
    """Make the slave at ADDRESS a master, in a new epoch (the old master must be down).

    First every peer the node knows is asked where its log ends: if one is ahead (a
    newer last epoch, or the same one and a longer log) or still a master, nothing is
    done unless --force: with in_sync_slaves_min below the slave count only some slaves
    hold the last acknowledged records, and the one to promote is the one ahead."""
    from mqlog.replication.master_slave.core import promotion_risks

    with _group_client(address) as client:
        facts = client.metadata()
        others, unreachable = _peer_facts(facts.get("peers", {}))
        for name in unreachable:
            click.echo(f"{name}: unreachable, not checked (if it holds records the others "
                       "lack, they are lost when it follows)", err=True)
        risks = promotion_risks(facts, others)
        if risks and not force:
            raise PromotionRefused(f"refusing to promote {facts['node_id']}: "
                                   + "; ".join(risks))
        for risk in risks:
            click.echo(f"--force: {risk}", err=True)
        answer = client.promote(role, tuple(filter(None, slaves.split(","))), epoch)
    click.echo(f"{address}: {answer['role']} in epoch {answer['epoch']}")


def _peer_facts(peers: dict[str, str]) -> tuple[list[dict[str, Any]], list[str]]:
    """The metadata of every peer that answers, and the names of those that do not."""
    found, unreachable = [], []
    for name, peer_address in sorted(peers.items()):
        try:
            with _group_client(peer_address, timeout_s=5) as peer:
                found.append(peer.metadata())
        except MqlogError:
            unreachable.append(name)
    return found, unreachable


@cluster.command("follow")
@click.argument("address")
@click.option("--master", required=True, help="Node id of the new master.")
def cluster_follow(address: str, master: str) -> None:
    """Make the node at ADDRESS a slave of MASTER (it is truncated if it diverged)."""
    with _group_client(address) as client:
        client.follow(master)
    click.echo(f"{address}: now a slave of {master}")


@cluster.command("transfer")
@click.argument("address")
@click.option("--to", "target", required=True, help="Node id of the voter to lead next.")
def cluster_transfer(address: str, target: str) -> None:
    """Make the Raft leader at ADDRESS hand leadership to TARGET (it catches up first)."""
    with _group_client(address) as client:
        answer = client.transfer(target)
    click.echo(f"{address}: handing leadership to {answer['target']} (term {answer['term']})")


@cluster.command("membership")
@click.argument("address")
@click.option("--voters", required=True, help="Comma-separated node ids: the new voters.")
@click.option("--learners", default="", help="Comma-separated node ids: the new learners.")
@click.option("--node-address", "addresses", multiple=True, metavar="ID=HOST:PORT",
              help="Where a new member listens (repeat per new member).")
def cluster_membership(address: str, voters: str, learners: str,
                       addresses: tuple[str, ...]) -> None:
    """Make the Raft leader at ADDRESS change the group's members: one voter added or
    removed per change, and a new voter must first have caught up as a learner."""
    where = {}
    for item in addresses:
        name, _, node_address = item.partition("=")
        if not name or not node_address:
            raise click.BadParameter(f"{item!r} is not ID=HOST:PORT", param_hint="--node-address")
        where[name] = node_address
    with _group_client(address) as client:
        answer = client.change_membership(_ids(voters), _ids(learners), where)
    said = (f"{address}: voters {answer['voters']}, learners {answer['learners']}: "
            f"{answer['status']}")
    if answer["status"] != mqlog.PutStatus.PUT_OK.value:  # (stored, not committed: exit 1)
        raise CommandFailed(f"{said}: the change is stored on the leader but not committed "
                            "(it may still be, or be lost with the leader); `mqlog cluster "
                            "status` shows the voters each node uses")
    click.echo(said)


def _ids(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


@cluster.command("status")
@click.argument("addresses", nargs=-1, required=True)
@json_option
def cluster_status(addresses: tuple[str, ...], as_json: bool) -> None:
    """Role, epoch (Raft: term), leader and positions of each node at ADDRESSES
    (host:port ...): where its log starts (retention moves it) and ends, a master's slave
    acks, a Raft leader's commit and match positions, and how many messages it ignored
    (from another cluster or a non-member). A master-slave master that restarted and waits
    to hear from its slaves shows accepts_writes false."""
    rows, no_group = [], {}  # no_group: address -> what the node said (it answered)
    for address in addresses:
        try:
            with _group_client(address, timeout_s=5) as client:
                facts = client.metadata()
            acked = facts.get("slaves", facts.get("match", {}))
            rows.append({"address": address, "node": facts["node_id"], "role": facts["role"],
                         "accepts_writes": facts.get("accepts_writes", ""),
                         "epoch": facts["epoch"], "leader": facts.get("leader", ""),
                         "commit": facts.get("commit", ""),
                         "log_start": facts.get("log_start", ""), "written": facts["written"],
                         "flushed": facts["flushed"],
                         "acked": ", ".join(f"{name}={position}" for name, position
                                            in sorted(acked.items())),
                         "ignored": facts.get("ignored", 0)})
        except MqlogError as error:
            if isinstance(error, UnknownGroup):  # (it answered: not the network's fault)
                said, no_group[address] = _no_such_group(address, error)
            role = f"no such group: {said}" if address in no_group else \
                f"unreachable ({error})"
            rows.append({"address": address, "node": "-", "role": role,
                         "accepts_writes": "", "epoch": "", "leader": "", "commit": "",
                         "log_start": "", "written": "", "flushed": "", "acked": "",
                         "ignored": ""})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    else:
        _print_tables([_rows_table("Nodes", rows)])
    if all(row["node"] == "-" for row in rows):  # a script must see that nothing answered
        silent = [address for address in addresses if address not in no_group]
        failures = [f"{address} {what}" for address, what in no_group.items()]
        if silent:
            failures.append(f"no node answered at {', '.join(silent)}: check the addresses "
                            "(host:port of each node's `listen`) and that the nodes run")
        raise CommandFailed("; ".join(failures))


def _no_such_group(address: str, error: UnknownGroup) -> tuple[str, str]:
    """What a broker that hosts no group the request named (``mqlog cluster --group``, or
    none: its default group) said: the groups it hosts (its ``broker_metadata``), and as
    advice, the command that names one. Its own advice ("name one in the request") is a
    Client's, and the CLI added "no node answered", which it did."""
    named = click.get_current_context().meta.get("mqlog.group")
    advice = f"use `mqlog cluster --group NAME status {address}`"
    try:
        with mqlog.Client(address, timeout_s=5) as client:  # (no group: the broker's own)
            facts = client.call({"kind": "broker_metadata"})[0]
        hosted = sorted(facts.get("groups") or {})
    except MqlogError:  # (gone meanwhile: its first words say what it hosts)
        said = str(error).split(";")[0]
        return said, f"answered: {said}; {advice}"
    what = f"hosts no group {named!r}" if named is not None else \
        "hosts several groups and no default one" if len(hosted) > 1 else \
        "has no default group"
    said = f"{what} (it hosts {', '.join(hosted) or 'none'})"
    return said, (f"answered: broker {facts.get('broker_id')} {said}; {advice}"
                  + (f", e.g. --group {hosted[0]}" if hosted else ""))


# --- produce -----------------------------------------------------------------------------


def _say_interrupted(tally: _Tally, stored: int, as_json: bool) -> None:
    """What a produce stopped by Ctrl-C (SIGINT) stored: ``stored`` records from the
    queue's end as it opened (``tally.start``), one a line, lines 1..stored."""
    tally.interrupted = True
    first_offset = tally.start
    last = first_offset + stored - 1
    if as_json:
        click.echo(json.dumps({"topic": tally.topic, "queue_id": tally.queue_id,
                               "count": stored, "first_offset": first_offset if stored else -1,
                               "last_offset": last if stored else -1, "interrupted": True}))
    where = f"lines 1..{stored}, offsets {first_offset}..{last}" if stored else "no line"
    click.echo(f"interrupted: produced {_count(stored, 'record')} to {tally.topic!r} queue "
               f"{tally.queue_id} ({where}); to go on, produce again from line {stored + 1}",
               err=True)


class _Tally:
    """What produce stored: counts, the offset and position ranges, flush timeouts."""

    def __init__(self, topic: str, queue_id: int) -> None:
        self.topic, self.queue_id = topic, queue_id
        self.count = self.timeouts = 0
        self.pending = 0  # lines handed to the put under way (refused: none of them stored)
        self.start = 0  # the queue's end when the store opened: the first offset produced
        self.interrupted = False  # Ctrl-C came, and what was stored is said
        self.first_offset = self.last_offset = self.first_position = self.end_position = -1

    def add(self, status: Any, position: int, offset: int, count: int, end: int) -> None:
        self.pending = 0
        if self.count == 0:
            self.first_offset, self.first_position = offset, position
        self.count += count
        self.last_offset, self.end_position = offset + count - 1, end
        if status is not mqlog.PutStatus.PUT_OK:
            self.timeouts += count

    def as_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "queue_id": self.queue_id, "count": self.count,
                "first_offset": self.first_offset, "last_offset": self.last_offset,
                "first_position": self.first_position, "end_position": self.end_position,
                "not_flushed_in_time": self.timeouts}

    def summary(self) -> str:
        if self.count == 0:
            return f"produced 0 records to {self.topic!r} queue {self.queue_id}"
        text = (f"produced {_count(self.count, 'record')} to {self.topic!r} queue {self.queue_id}: "
                f"offsets {self.first_offset}..{self.last_offset}, positions "
                f"[{self.first_position}, {self.end_position})")
        if self.timeouts:
            text += f"; {self.timeouts} not flushed within flush_sync_timeout_ms"
        return text

    def failure(self, error: BaseException) -> str:
        """The message of a produce that failed part way: the error, what was stored
        (lines 1..count, each one record: a refused put stores nothing) and what not."""
        stored = self.count
        reason = f"{error.filename}: {error.strerror}" if isinstance(error, OSError) and \
            error.strerror and error.filename else str(error) or type(error).__name__
        if self.pending == 0:  # (all handed over were stored: the flush or close failed)
            return (f"{reason} (after storing {_count(stored, 'record')}, lines 1..{stored}, "
                    f"in {self.topic!r} queue {self.queue_id}: offsets {self.first_offset}.."
                    f"{self.last_offset})")
        first, last = stored + 1, stored + self.pending
        refused = f"line {first}" if first == last else f"lines {first}..{last} (one batch)"
        if stored == 0:
            return f"{refused}: {reason}; nothing was stored"
        return (f"{refused}: {reason}; the {_count(stored, 'record')} before it, lines "
                f"1..{stored}, were stored in {self.topic!r} queue {self.queue_id} (offsets "
                f"{self.first_offset}..{self.last_offset}), and nothing from line {first} "
                f"on: fix it and produce from line {first} again (e.g. tail -n +{first} "
                "FILE)")


def _put_each(store: mqlog.Store, tally: _Tally, lines: Iterable[bytes],
              fields: dict[str, Any]) -> None:
    for body in lines:
        tally.pending = 1
        result = store.put(tally.topic, body, tally.queue_id, **fields)
        tally.add(result.status, result.position, result.offset, 1, result.end_position)


def _put_keyed(store: mqlog.Store, tally: _Tally, lines: Iterable[bytes], separator: bytes,
               fields: dict[str, Any]) -> None:
    for line in lines:
        tally.pending = 1
        key, found, body = line.partition(separator)
        if not found:
            key, body = b"", line
        try:
            text = key.decode()
        except UnicodeDecodeError:
            raise InvalidArgument("its key is not UTF-8") from None
        result = store.put(tally.topic, body, tally.queue_id, **{**fields, "key": text or None})
        tally.add(result.status, result.position, result.offset, 1, result.end_position)


def _put_batches(store: mqlog.Store, tally: _Tally, lines: Iterable[bytes], batch: int,
                 fields: dict[str, Any]) -> None:
    chunk: list[bytes] = []
    for body in lines:
        chunk.append(body)
        if len(chunk) == batch:
            _put_chunk(store, tally, chunk, fields)
            chunk = []
    if chunk:
        _put_chunk(store, tally, chunk, fields)


def _put_chunk(store: mqlog.Store, tally: _Tally, chunk: list[bytes],
               fields: dict[str, Any]) -> None:
    tally.pending = len(chunk)
    result = store.put_batch(tally.topic, chunk, tally.queue_id, **fields)
    tally.add(result.status, result.position, result.offset, result.count, result.end_position)


def _lines(source: IO[bytes]) -> Iterator[bytes]:
    for line in source:
        if line.endswith(b"\n"):
            line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
        yield line


def _parse_properties(items: tuple[str, ...]) -> dict[str, str]:
    properties = {}
    for item in items:
        name, equals, value = item.partition("=")
        if not equals or not name:
            raise click.BadParameter(f"{item!r} is not NAME=VALUE", param_hint="'--property'")
        properties[name] = value
    return properties


# --- consume -----------------------------------------------------------------------------


def _check_start(from_offset: int | None, from_time: int | None, group: str | None,
                 commit: bool, follow: bool) -> None:
    given = [name for name, value in (("--from-offset", from_offset),
                                      ("--from-time", from_time), ("--group", group))
             if value is not None]
    if len(given) > 1:
        raise click.UsageError(f"use one of --from-offset, --from-time, --group "
                               f"(got {' and '.join(given)})")
    if commit and group is None:
        raise click.UsageError("--commit needs --group")
    if commit and follow:
        raise click.UsageError("--commit cannot be used with --follow: a follower does not "
                               "hold the store open, so it cannot commit")


def _topic_queues(store: mqlog.Store, topic: str, queue_id: int | None,
                  wait: bool) -> list[int]:
    present = [queue for name, queue in store.queues() if name == topic]
    if queue_id is not None:
        if queue_id not in present and not wait:
            raise CommandFailed(f"topic {topic!r} has no queue {queue_id} in "
                                f"{store.paths.root} (its queues: "
                                f"{', '.join(map(str, present)) or 'none'})")
        return [queue_id]
    if not present and not wait:
        topics = sorted({name for name, _ in store.queues()})
        raise CommandFailed(f"topic {topic!r} has no records in {store.paths.root} (topics "
                            f"there: {', '.join(topics) or 'none'})")
    return present


def _start_offset(store: mqlog.Store, topic: str, queue_id: int, from_offset: int | None,
                  from_time: int | None, group: str | None) -> int:
    """Where to start reading a queue: always within its offsets, [min, max]. Every
    queue's start is known (and checked) before anything is printed or committed; an
    offset asked for outside a queue's offsets moves to the nearest end of them, with a
    note on stderr (Kafka's auto.offset.reset, RocketMQ's corrected next offset): a
    topic's queues differ in length, and one too short for ``--from-offset`` has nothing
    to print, which is no error."""
    if from_time is not None:
        return int(store.offset_for_timestamp(topic, queue_id, from_time))
    low, high = store.min_offset(topic, queue_id), store.max_offset(topic, queue_id)
    if from_offset is not None:
        wanted, asked = from_offset, f"offset {from_offset}"
    elif group is not None and (committed := store.committed_offset(
            group, topic, queue_id)) is not None:
        wanted, asked = committed, f"{group}'s committed offset {committed}"
    else:
        return low
    start = min(max(wanted, low), high)
    if wanted < low:
        click.echo(f"mqlog: note: queue {queue_id} of {topic!r} begins at offset {low} (the "
                   f"records before it were deleted): starting there, not at {asked}",
                   err=True)
    elif wanted > high:
        click.echo(f"mqlog: note: queue {queue_id} of {topic!r} ends at offset {high}, before "
                   f"{asked}: starting at its end", err=True)
    return start


def _consume_queues(store: mqlog.Store, topic: str, starts: dict[int, int],
                    tags: str | None, count_max: int | None, write: Callable[[Any], object],
                    commit_group: str | None) -> None:
    remaining = sys.maxsize if count_max is None else count_max
    for queue_id, offset in starts.items():
        if remaining == 0:
            break
        next_offset, printed = _drain_queue(store, topic, queue_id, offset, tags, remaining,
                                            write)
        remaining -= printed
        if commit_group is not None:
            sys.stdout.flush()  # commit only what was really handed on
            store.commit_offset(commit_group, topic, queue_id, next_offset)


def _drain_queue(store: mqlog.Store, topic: str, queue_id: int, offset: int,
                 tags: str | None, limit: int, write: Callable[[Any], object]) -> tuple[int, int]:
    """Print up to ``limit`` records from ``offset``; (the offset to read next, count)."""
    printed = 0
    while printed < limit:
        result = store.pull(topic, queue_id, offset, min(PULL_COUNT_MAX, limit - printed),
                            PULL_SIZE_BYTES_MAX, tags)
        for record in result.records:
            write(record)
        printed += len(result.records)
        if result.next_offset == offset:
            break
        offset = result.next_offset
        if offset >= result.max_offset:
            break
    return offset, printed


def _start_position(store: mqlog.Store, topic: str, starts: dict[int, int]) -> int:
    """The position of the first record a follower wants (the log's end if none yet)."""
    position = store.committed_position
    for queue_id, offset in starts.items():
        if offset < store.max_offset(topic, queue_id):
            first = store.get(topic, queue_id, offset, 1)
            position = min(position, first[0].position)
    return int(position)


@dataclass(frozen=True)
class _Wanted:
    """Which records a follower prints."""

    topic: str
    queue_id: int | None
    starts: dict[int, int]  # first offset per queue; a queue not named starts at 0
    tags: frozenset[str] | None

    def __call__(self, record: Any) -> bool:
        return (not record.attributes & fallback.ATTR_CONTROL and record.topic == self.topic
                and (self.queue_id is None or record.queue_id == self.queue_id)
                and record.offset >= self.starts.get(record.queue_id, 0)
                and (self.tags is None or record.tags in self.tags))


def _follow(reader: LogReader, position: int, wanted: _Wanted, count_max: int | None,
            timeout_ms: int | None, poll_ms: int, write: Callable[[Any], object]) -> None:
    """Tail the commit log from ``position``. A bad record at the end is taken for one
    still being written, and read again at the next poll; one below the store's saved
    flushed position was written whole before, so it is damage: CorruptRecord, as
    without --follow (a follower stalled there for good, with no word, and with
    --timeout-ms ended with status 0, the records after it never delivered)."""
    remaining = sys.maxsize if count_max is None else count_max
    idle_since = time.monotonic()
    try:
        while remaining > 0:
            batch = reader.read_batch(position, FOLLOW_BATCH_COUNT_MAX)
            for record in batch.records:
                if wanted(record):
                    write(record)
                    remaining -= 1
                    if remaining == 0:
                        break
            sys.stdout.flush()
            if batch.next_position != position:
                position, idle_since = batch.next_position, time.monotonic()
                continue
            if batch.problem is not None and \
                    batch.problem[0] < reader.saved_flushed_position():
                raise CorruptRecord(*batch.problem)
            if timeout_ms is not None and (time.monotonic() - idle_since) * 1000 >= timeout_ms:
                break
            time.sleep(poll_ms / 1000)  # polling interval, not synchronisation
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a follower is meant to end


# --- inspect, stats, verify, bench -------------------------------------------------------


def _inspect_facts(store: mqlog.Store) -> dict[str, Any]:
    written = store.written_position
    segments = []
    for base, size in store.segments():
        segments.append({"file": file_name(base), "base_position": base, "size_bytes": size,
                         "used_bytes": max(0, min(written, base + size) - base)})
    groups = []
    for group in store.groups():
        for (topic, queue_id), lag in store.lag(group).items():
            groups.append({"group": group, "topic": topic, "queue_id": queue_id,
                           "committed_offset": store.committed_offset(group, topic,
                                                                      queue_id),
                           "lag": lag})
    return {
        "store": {"path": str(store.paths.root), "implementation": store.implementation,
                  "flush_mode": store.config.flush_mode,
                  "opened": store.recovery_report.summary()},
        "positions": {"written_position": written,
                      "flushed_position": store.flushed_position,
                      "committed_position": store.committed_position,
                      "epoch": store.epoch},
        "segments": segments,
        "epochs": [{"epoch": epoch, "first_position": start}
                   for epoch, start in store.epoch_starts()],
        "queues": _queue_rows(store),
        "groups": groups,
    }


def _queue_rows(store: mqlog.Store) -> list[dict[str, Any]]:
    rows = []
    for topic, queue_id in store.queues():
        low, high = store.min_offset(topic, queue_id), store.max_offset(topic, queue_id)
        rows.append({"topic": topic, "queue_id": queue_id, "min_offset": low,
                     "max_offset": high, "records": high - low})
    return rows


def _stats_facts(store: mqlog.Store) -> dict[str, Any]:
    queues = _queue_rows(store)
    topics: dict[str, dict[str, Any]] = {}
    for row in queues:
        entry = topics.setdefault(row["topic"], {"topic": row["topic"], "queues": 0,
                                                 "records": 0})
        entry["queues"] += 1
        entry["records"] += row["records"]
    segments = store.segments()
    bases = [base for base, _size in segments]
    first = bases[0] if bases else 0
    return {
        "totals": {"records": sum(row["records"] for row in queues), "topics": len(topics),
                   "queues": len(queues), "log_bytes": store.written_position - first,
                   "segments": len(bases),
                   "segment_bytes": sum(size for _base, size in segments),
                   "first_position": first, "written_position": store.written_position,
                   "epoch": store.epoch},
        "topics": list(topics.values()),
        "queues": queues,
    }


def _verify_with_progress(reader: LogReader, quiet: bool) -> VerifyReport:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    console = Console(stderr=True)
    if quiet or not console.is_terminal:
        return reader.verify()
    with Progress(TextColumn("verifying"), BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), TimeRemainingColumn(), console=console,
                  transient=True) as progress:
        task = progress.add_task("verify", total=reader.total_bytes())
        return reader.verify(lambda count: progress.advance(task, count))


def _import_compare() -> Any:
    """benchmarks.compare from the source checkout this mqlog was installed from."""
    try:
        from benchmarks import compare  # type: ignore[import-not-found]
        return compare
    except ModuleNotFoundError as error:
        if error.name != "benchmarks":
            raise CommandFailed(f"cannot run the comparison: {error}; install the bench "
                                "extra (pip install -e '.[bench]')") from None
    root = Path(mqlog.__file__).resolve().parent.parent
    if not (root / "benchmarks" / "compare.py").is_file():
        raise CommandFailed("`mqlog bench compare` runs from a source checkout of mqlog: "
                            "run `make bench` there")
    sys.path.insert(0, str(root))
    from benchmarks import compare
    return compare


# --- opening a store, times ----------------------------------------------------------------


@contextmanager
def _opened(data_dir: Path, config_file: Path | None, create: bool = False,
            read_only: bool = False, **overrides: Any) -> Iterator[mqlog.Store]:
    """The store in ``data_dir``, closed on exit; unless ``create``, it must exist.
    ``read_only``: a snapshot (no lock, no recovery), beside a writer if need be."""
    if not create and not (data_dir / "commitlog").is_dir():
        raise InvalidArgument(f"{data_dir} is not an mqlog store (it has no commitlog "
                              "directory)")
    config = load_config(config_file) if config_file is not None else StoreConfig()
    with mqlog.open(data_dir, config, read_only=read_only, **overrides) as store:
        yield store


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def parse_time(text: str) -> int:
    """Milliseconds since the epoch from ``text``: an integer, or ISO 8601 (UTC if no zone)."""
    text = text.strip()
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is neither milliseconds since the epoch nor an ISO 8601 "
                         "time such as 2024-05-01T12:00:00Z") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // timedelta(milliseconds=1)


def format_time(milliseconds: int) -> str:
    try:
        moment = _EPOCH + timedelta(milliseconds=milliseconds)
    except OverflowError:
        return str(milliseconds)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


# --- output ------------------------------------------------------------------------------


def _record_writer(output: str, body_only: bool, dump: bool = False) -> Callable[[Any], object]:
    """A function printing one record per line to stdout in the chosen format."""
    out = sys.stdout
    if output == "json":
        return lambda record: out.write(json.dumps(record_json(record, dump)) + "\n")
    if body_only:
        return lambda record: out.write(body_line(record) + "\n")
    return lambda record: out.write(record_line(record, dump) + "\n")


def body_line(record: Any) -> str:
    """``consume``'s text: the body, escaped; a lost record (a filler ``mqlog repair``
    put in place of a damaged one) as ``\\lost TOPIC/QUEUE offset N``, which no body
    prints as (a body's backslash is doubled)."""
    if record.lost:
        return f"\\lost {record.topic}/{record.queue_id} offset {record.offset}"
    return escape(record.body)


def record_json(record: Any, dump: bool = False) -> dict[str, Any]:
    """A record as a JSON object (the body as UTF-8 text, else base64). A lost record
    (``Record.lost``) has ``"lost": true`` and a null body (``dump``: ``lost`` always)."""
    fields: dict[str, Any] = {
        "topic": record.topic, "queue_id": record.queue_id, "offset": record.offset,
        "position": record.position, "epoch": record.epoch,
        "timestamp": record.store_timestamp, "born_timestamp": record.born_timestamp,
        "key": record.key, "tags": record.tags, "properties": _plain(record.properties),
    }
    if dump:
        fields.update(size=record.size, crc=_stored_crc(record),
                      control=bool(record.attributes & fallback.ATTR_CONTROL))
    if dump or record.lost:
        fields["lost"] = record.lost
    if record.lost:  # (its body is padding: no data)
        fields["body"] = None
        return fields
    try:
        fields["body"] = record.body.decode("utf-8")
    except UnicodeDecodeError:
        fields["body"] = base64.b64encode(record.body).decode("ascii")
        fields["body_encoding"] = "base64"
    return fields


def record_line(record: Any, dump: bool = False) -> str:
    """A record as one line of ``name: value`` pairs (kafka-dump-log's style); a lost
    record (``Record.lost``) ends with ``lost: true`` instead of a body."""
    parts = [f"position: {record.position}", f"size: {record.size}",
             f"epoch: {record.epoch}", f"topic: {record.topic}",
             f"queue_id: {record.queue_id}", f"offset: {record.offset}",
             f"timestamp: {format_time(record.store_timestamp)}"]
    if dump:
        parts.append(f"crc: {_stored_crc(record):#010x}")
        if record.attributes & fallback.ATTR_CONTROL:
            parts.append("control: true")
    if record.key is not None:
        parts.append(f"key: {escape(record.key.encode())}")
    if record.tags is not None:
        parts.append(f"tags: {escape(record.tags.encode())}")
    if record.properties:
        parts.append(f"properties: {json.dumps(_plain(record.properties))}")
    parts.append("lost: true" if record.lost else f"body: {escape(record.body)}")
    return " ".join(parts)


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _stored_crc(record: Any) -> int:
    return int.from_bytes(record.raw[8:12], "little")


# Backslash, line breaks and other control characters are escaped so one record is one
# line; bytes that are not UTF-8 (kept as surrogates by "surrogateescape") become \xNN.
_ESCAPES = {code: f"\\x{code:02x}" for code in [*range(32), 127]}
_ESCAPES.update({ord("\\"): "\\\\", ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\t"})
_ESCAPES.update({0xDC00 + byte: f"\\x{byte:02x}" for byte in range(128, 256)})


def escape(data: bytes) -> str:
    """Bytes as one line of text: UTF-8, with backslash escapes for everything else."""
    return data.decode("utf-8", "surrogateescape").translate(_ESCAPES)


def _plain(value: Any) -> Any:
    """A msgpack value as JSON can hold it (bytes become text, or base64)."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(value).decode("ascii")
    if isinstance(value, dict):
        return {str(_plain(name)): _plain(item) for name, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def _print_tables(tables: list[Any]) -> None:
    from rich.console import Console

    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=160)
    for table in tables:
        console.print(table)


def _key_value_table(title: str, facts: dict[str, Any]) -> Any:
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("name", style="bold")
    table.add_column("value")
    for name, value in facts.items():
        table.add_row(Text(name), Text(str(value)))
    return table


def _rows_table(title: str, rows: list[dict[str, Any]]) -> Any:
    from rich.table import Table
    from rich.text import Text

    if not rows:
        return Text(f"{title}: none")
    table = Table(title=title, title_justify="left")
    for name, value in rows[0].items():
        table.add_column(name, justify="right" if isinstance(value, int) else "left")
    for row in rows:
        table.add_row(*(Text("-" if value is None else str(value)) for value in row.values()))
    return table


_register_spark_jobs()
cli.add_command(cli_repair.repair)
cli.add_command(cli_topics.topics)
cli.add_command(cli_topics.brokers)


if __name__ == "__main__":
    main()
