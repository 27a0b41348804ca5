"""``mqlog reconcile`` and ``mqlog replay``: the Spark jobs as click commands.

``reconcile`` of replicas small enough to compare on the driver (reconcile.py) starts no
session at all, unless ``--master`` or spark-submit asks for Spark. Otherwise both
build their Spark session with ``session()``: ``local[*]`` unless ``--master`` says
otherwise, and, under ``spark-submit`` (which starts the Python driver itself), whatever
master spark-submit was given — so the same command runs unchanged on a cluster
(``spark-submit --master spark://host:7077 mqlog/spark_connector/job.py reconcile ...``).

Quiet by default: Spark's console progress bars are off, and a JVM this command starts
writes its log (start-up warnings included) to a file, ``JVM_LOG``, rather than to the
terminal: removed when the command succeeds, kept and named in the error line when it
fails (``session()`` called by other code, the demo or a benchmark: removed when the
process exits, unless an exception ended it; then kept, and named on stderr). One
progress line of the job's own (``Progress``, rich, on stderr) shows the step and the
running stage's tasks, read from Spark's status tracker. ``--verbose`` gives Spark's own
progress bars and log instead.

Exit statuses are the ``mqlog`` command's (mqlog/cli.py, docs/CLI.md): 0 done, 1 an
operating error (a directory that is not a store, a damaged store, Spark failed), 2 bad
usage (one line each, ``mqlog: error: ...``): reconcile of fewer than two directories,
replay with neither or both outputs, a ``--from`` or ``--to`` the source refuses, a
``--filter`` that is not a condition on the source's columns (all found before Spark
starts where possible, the filter else by Spark's analysis). Reconcile's findings are
status 3, which no error has, so a check can tell replicas that differ from a command
that failed.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from functools import wraps
from typing import Any, NoReturn

import click

from mqlog.errors import InvalidArgument, MqlogError, StoreNotFound

# The ``mqlog`` command's statuses (mqlog/cli.py: EXIT_ERROR, EXIT_USAGE), and one of
# reconcile's own that no error has.
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_FINDINGS = 3


def session(app: str, master: str | None, verbose: bool = True) -> Any:
    """A Spark session for a job (see the module docstring)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app).config(
        "spark.ui.showConsoleProgress", "true" if verbose else "false")
    if master:
        builder = builder.master(master)
    elif "PYSPARK_GATEWAY_PORT" not in os.environ:  # not under spark-submit
        builder = builder.master("local[*]")
    if verbose or SparkSession.getActiveSession() is not None:  # no JVM to start: no log
        spark = builder.getOrCreate()
    else:
        with _jvm_log():
            spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN" if verbose else "ERROR")
    for name in _PYSPARK_LOGGERS:  # (each logs a failed query's whole Java stack)
        logging.getLogger(name).disabled = not verbose
    return spark


_PYSPARK_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")


JVM_LOG = os.path.join(tempfile.gettempdir(), f"mqlog-spark-{os.getpid()}.log")


class _LogState:
    """Whether this process pointed a JVM at ``JVM_LOG`` (``opened``), whether a failure
    asked for it to be kept (``kept``), and whether stderr said where it is (``named``)."""

    opened = False
    kept = False
    named = False


@contextlib.contextmanager
def _jvm_log() -> Iterator[None]:
    """Standard error pointed at ``JVM_LOG`` while a JVM may be started: the JVM (and the
    Python workers it starts) keep that file as theirs; this process gets its own back.
    The file is removed when this process exits (unless kept: ``keep_jvm_log``, or an
    exception ends the process), or before by ``discard_jvm_log``."""
    if not _LogState.opened:
        _LogState.opened = True
        atexit.register(_jvm_log_at_exit)  # (before the JVM's own: so it runs after them)
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(JVM_LOG, "ab") as log:
            os.dup2(log.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def keep_jvm_log() -> str | None:
    """Keep Spark's log (a failure it may explain): its path, or None when this process
    started no JVM that writes it."""
    if not (_LogState.opened and os.path.exists(JVM_LOG)):
        return None
    _LogState.kept = True
    return JVM_LOG


def discard_jvm_log() -> None:
    """Remove Spark's log now (the job succeeded), unless a failure kept it. (The JVM
    may still hold it open: what it writes after goes to the removed file, freed when
    the JVM exits.) Only a log this process pointed a JVM at is removed."""
    if _LogState.opened and not _LogState.kept:
        with contextlib.suppress(FileNotFoundError):
            os.remove(JVM_LOG)


def _name_kept_log() -> None:
    """Keep Spark's log and say where it is on stderr, if no error line did."""
    log = keep_jvm_log()
    if log and not _LogState.named:
        _LogState.named = True
        print(f"mqlog: Spark's log: {log}", file=sys.stderr, flush=True)


def _jvm_log_at_exit() -> None:
    """At exit: an uncaught exception ended the process (the default hook set
    ``sys.last_value``): keep the log and say where it is; else remove it, unless a
    failure kept it."""
    if getattr(sys, "last_exc", None) or getattr(sys, "last_value", None):
        _name_kept_log()
    discard_jvm_log()


class Progress:
    """One line on stderr (rich): the job's step, and the tasks of the stages running,
    polled from Spark's status tracker by a thread while the job runs."""

    POLL_SECONDS = 0.25

    def __init__(self, spark: Any, enabled: bool) -> None:
        self.tracker: Any = spark.sparkContext.statusTracker() if enabled else None
        self.step = ""
        self.done = threading.Event()
        self.status: Any = None

    def __enter__(self) -> Progress:
        if self.tracker is not None:
            from rich.console import Console

            self.status = Console(stderr=True).status(self.step)
            self.status.start()
            self.thread = threading.Thread(target=self._poll, daemon=True)
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        if self.status is not None:
            self.thread.join()
            self.status.stop()

    def show(self, step: str) -> None:
        self.step = step

    def _poll(self) -> None:
        while not self.done.wait(self.POLL_SECONDS):
            stages = []
            for stage_id in self.tracker.getActiveStageIds():
                info = self.tracker.getStageInfo(stage_id)
                if info is not None:
                    stages.append(f"stage {stage_id}: {info.numCompletedTasks}/"
                                  f"{info.numTasks} tasks")
            self.status.update(" - ".join([self.step, *stages]))


def _errors(function: Callable[..., Any]) -> Callable[..., Any]:
    """A job's errors as one line and a status (see the module docstring); Spark's log
    removed when the job succeeds (status 0, or reconcile's findings), else kept."""
    @wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        succeeded = False
        try:
            result = function(*args, **kwargs)
            succeeded = True
            return result
        except SystemExit as done:
            succeeded = done.code in (None, 0, EXIT_FINDINGS)
            raise
        except (MqlogError, OSError) as error:
            _exit(str(error), EXIT_ERROR)
        except ImportError as error:
            _exit(f"{error}; install the spark extra: pip install 'mqlog[spark]'", EXIT_ERROR)
        except Exception as error:
            if not _from_spark(error):
                raise
            _exit(f"Spark failed: {_first_line(error)}", EXIT_ERROR)
        finally:
            if succeeded:
                discard_jvm_log()
            else:  # (_exit named it in its line; a bug or Ctrl-C: a line of its own)
                _name_kept_log()
    return run


def _exit(message: str, status: int) -> NoReturn:
    """One error line (naming Spark's log, kept, if a JVM writes one) and ``status``."""
    log = keep_jvm_log()
    _LogState.named = _LogState.named or log is not None
    click.echo(f"mqlog: error: {message}" + (f"; Spark's log: {log}" if log else ""),
               err=True)
    sys.exit(status)


def _stores(directories: tuple[str, ...]) -> None:
    """A directory that is not a store (a typo, an unmounted disk) is an operating error,
    as in every store command, found before any Spark session starts."""
    for directory in directories:
        if not os.path.isfile(os.path.join(directory, "meta.json")):
            raise StoreNotFound(f"{directory} is not an mqlog store (it has no meta.json); "
                                "check the path")


def _from_spark(error: BaseException) -> bool:
    return type(error).__module__.split(".")[0] in ("pyspark", "py4j")


def _first_line(error: BaseException) -> str:
    text = getattr(error, "getMessage", lambda: str(error))() or str(error)
    return " ".join(text.strip().splitlines()[:1])


_MASTER = click.option("--master", default=None,
                       help="Spark master (default local[*]; under spark-submit, its own).")
_VERBOSE = click.option("--verbose", is_flag=True, default=False,
                        help="Spark's own progress bars and log instead of one line.")


@click.command()
@click.argument("directories", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--out", type=click.Path(), default=None,
              help="Write every finding to this Parquet directory.")
@click.option("--driver-bytes-max", type=click.IntRange(min=0), default=None,
              help="Compare on the driver when the replicas hold at most this many bytes "
                   "of records together (default 16 MiB; 0: always by Spark shuffles).")
@_MASTER
@_VERBOSE
@_errors
def reconcile(directories: tuple[str, ...], out: str | None, driver_bytes_max: int | None,
              master: str | None, verbose: bool) -> None:
    """Compare replica copies of a store (the first is the reference): missing, extra,
    divergent and corrupt records per queue, and the common prefix. Replicas holding at
    most --driver-bytes-max are compared in this process, with no Spark session (unless
    --master or spark-submit asks for Spark)."""
    from mqlog.spark_connector.planner import held_bytes
    from mqlog.spark_connector.reconcile import DRIVER_BYTES_MAX, format_counts, format_summary
    from mqlog.spark_connector.reconcile import reconcile as run

    if len(directories) < 2:
        raise click.UsageError("reconcile needs at least two store directories")
    _stores(directories)
    limit = DRIVER_BYTES_MAX if driver_bytes_max is None else driver_bytes_max
    if master is None and "PYSPARK_GATEWAY_PORT" not in os.environ and \
            held_bytes(list(directories)) <= limit:  # compared on the driver: no session
        found = run(None, list(directories), limit)
        if out:
            found.write_parquet(out)
    else:
        spark = session("mqlog reconcile", master, verbose)
        with Progress(spark, not verbose) as progress:
            progress.show(f"reconcile: reading and comparing {len(directories)} replicas")
            found = run(spark, list(directories), limit)
            if out:
                progress.show(f"reconcile: writing the findings to {out}")
                found.write_parquet(out)
    click.echo(format_summary(found.summary_rows()))
    click.echo(format_counts(found))
    if out:
        click.echo(f"findings written to {out}")
    sys.exit(0 if found.total() == 0 else EXIT_FINDINGS)


@click.command()
@click.argument("source", type=click.Path(file_okay=False))
@click.option("--from", "start", default=None,
              help="earliest, an offset, Kafka JSON offsets, or time:<ms>.")
@click.option("--to", "end", default=None,
              help="latest, an offset (exclusive), Kafka JSON offsets, or time:<ms>.")
@click.option("--filter", "where", default=None, help="A Spark SQL condition on the rows.")
@click.option("--topics", default=None, help="Comma-separated topics (default: all).")
@click.option("--to-store", type=click.Path(file_okay=False), default=None)
@click.option("--to-parquet", type=click.Path(), default=None)
@_MASTER
@_VERBOSE
@_errors
def replay(source: str, start: str | None, end: str | None, where: str | None,
           topics: str | None, to_store: str | None, to_parquet: str | None,
           master: str | None, verbose: bool) -> None:
    """Re-read a range of SOURCE in queue order into another store or into Parquet."""
    from mqlog.spark_connector import options
    from mqlog.spark_connector import replay as jobs

    if (to_store is None) == (to_parquet is None):
        raise click.UsageError("give exactly one of --to-store DIR or --to-parquet DIR")
    _stores((source,))
    for flag, bounds in (("--from", (start, None)), ("--to", (None, end))):
        given = {"path": source, **jobs.range_options(*bounds)}  # (checked before Spark)
        for name in ("startingOffsets", "endingOffsets"):  # (select() expands a number)
            if given.get(name, "").lstrip("-").isdigit():
                given[name] = "{}"
        try:
            options.parse(given)
        except InvalidArgument as error:
            _usage_error(f"{flag}: {error}")
    try:
        jobs.check_filter(where)
    except InvalidArgument as error:
        _usage_error(str(error))
    spark = session("mqlog replay", master, verbose)
    with Progress(spark, not verbose) as progress:
        progress.show(f"replay: selecting from {source}")
        frame = _selection(jobs, spark, source, start, end, where, topics)
        if to_parquet:
            progress.show(f"replay: writing {to_parquet}")
            result = jobs.write_parquet(frame, to_parquet)
        else:
            assert to_store is not None
            progress.show(f"replay: writing into {to_store}")
            result = jobs.to_store(frame, source, to_store)
    lost = f", {result.lost} lost record(s) left out" if result.lost else ""
    if to_parquet:
        click.echo(f"{result.written} record(s) written to {to_parquet}{lost}")
        return
    click.echo(f"{result.selected} selected, {result.written} written "
               f"({result.batches} batch(es)), "
               f"{result.skipped} already there{lost}")


def _selection(jobs: Any, spark: Any, *args: Any) -> Any:
    """``replay.select``, with Spark's analysis errors (a bad ``--filter``) as usage
    errors."""
    from pyspark.errors import AnalysisException

    try:
        return jobs.select(spark, *args)
    except AnalysisException as error:
        _usage_error(f"--filter: {_first_line(error)}")


def _usage_error(message: str) -> NoReturn:
    _exit(message, EXIT_USAGE)
