"""Entry point for ``spark-submit``: ``spark-submit [--master URL] job.py reconcile|replay ...``.

spark-submit runs a Python file, not a console script; this file dispatches to the same
click commands as ``mqlog reconcile`` and ``mqlog replay`` (cli.py), which then use the
master spark-submit was given.
"""

from __future__ import annotations

import click

from mqlog.spark_connector.cli import reconcile, replay


@click.group()
def main() -> None:
    """mqlog's Spark jobs."""


main.add_command(reconcile)
main.add_command(replay)

if __name__ == "__main__":
    main()
