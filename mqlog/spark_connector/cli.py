"""``mqlog reconcile`` and ``mqlog replay``: the Spark jobs as click commands.

Both build their Spark session with ``session()``: ``local[*]`` unless ``--master`` says
otherwise, and, under ``spark-submit`` (which starts the Python driver itself), whatever
master spark-submit was given — so the same command runs unchanged on a cluster
(``spark-submit --master spark://host:7077 mqlog/spark_connector/job.py reconcile ...``).
Operating errors print one line, ``mqlog: error: ...``, and exit with status 1.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any

import click

from mqlog.errors import InvalidArgument, MqlogError


def session(app: str, master: str | None) -> Any:
    """A Spark session for a job (see the module docstring)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app)
    if master:
        builder = builder.master(master)
    elif "PYSPARK_GATEWAY_PORT" not in os.environ:  # not under spark-submit
        builder = builder.master("local[*]")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _errors(function: Callable[..., Any]) -> Callable[..., Any]:
    @wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except (MqlogError, OSError) as error:
            click.echo(f"mqlog: error: {error}", err=True)
            sys.exit(1)
        except ImportError as error:
            click.echo(f"mqlog: error: {error}; install the spark extra: "
                       "pip install 'mqlog[spark]'", err=True)
            sys.exit(1)
    return run


_MASTER = click.option("--master", default=None,
                       help="Spark master (default local[*]; under spark-submit, its own).")


@click.command()
@click.argument("directories", nargs=-1, required=True,
                type=click.Path(exists=True, file_okay=False))
@click.option("--out", type=click.Path(), default=None,
              help="Write every finding to this Parquet directory.")
@_MASTER
@_errors
def reconcile(directories: tuple[str, ...], out: str | None, master: str | None) -> None:
    """Compare replica copies of a store (the first is the reference): missing, extra,
    divergent and corrupt records per queue, and the common prefix."""
    from mqlog.spark_connector.reconcile import format_summary
    from mqlog.spark_connector.reconcile import reconcile as run

    if len(directories) < 2:
        raise InvalidArgument("reconcile needs at least two store directories")
    spark = session("mqlog reconcile", master)
    found = run(spark, list(directories))
    click.echo(format_summary(found.summary_rows()))
    total = found.findings.count()
    click.echo(f"{total} finding(s)")
    if out:
        found.findings.write.mode("overwrite").parquet(out)
        click.echo(f"findings written to {out}")
    sys.exit(0 if total == 0 else 2)


@click.command()
@click.argument("source", type=click.Path(exists=True, file_okay=False))
@click.option("--from", "start", default=None,
              help="earliest, an offset, Kafka JSON offsets, or time:<ms>.")
@click.option("--to", "end", default=None,
              help="latest, an offset (exclusive), Kafka JSON offsets, or time:<ms>.")
@click.option("--filter", "where", default=None, help="A Spark SQL condition on the rows.")
@click.option("--topics", default=None, help="Comma-separated topics (default: all).")
@click.option("--to-store", type=click.Path(file_okay=False), default=None)
@click.option("--to-parquet", type=click.Path(), default=None)
@_MASTER
@_errors
def replay(source: str, start: str | None, end: str | None, where: str | None,
           topics: str | None, to_store: str | None, to_parquet: str | None,
           master: str | None) -> None:
    """Re-read a range of SOURCE in queue order into another store or into Parquet."""
    from mqlog.spark_connector import replay as jobs

    if (to_store is None) == (to_parquet is None):
        raise InvalidArgument("give exactly one of --to-store DIR or --to-parquet DIR")
    spark = session("mqlog replay", master)
    frame = jobs.select(spark, source, start, end, where, topics)
    if to_parquet:
        count = jobs.to_parquet(frame, to_parquet)
        click.echo(f"{count} record(s) written to {to_parquet}")
        return
    assert to_store is not None
    result = jobs.to_store(frame, source, to_store)
    click.echo(f"{result.selected} selected, {result.written} written "
               f"({result.batches} batch(es)), "
               f"{result.skipped} already there")
