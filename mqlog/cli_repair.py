"""``mqlog repair DIR [--from REPLICA_DIR]``: mend a commit log damaged in the middle.

A store whose log is damaged with intact records after the damage refuses to open
(CorruptStore); this command does what its message says: it blanks exactly the damaged
records (keeping every queue's offsets consecutive with lost-record fillers), or copies
them from a replica whose bytes there verify, saves the bytes it replaces, and prints
what was lost; acknowledged records damaged at the log's end are copied from the
replica, or cut. The work is engine/repair.py's; this is the command line around it.
"""

from __future__ import annotations

from pathlib import Path

import click

from mqlog.engine.repair import repair as repair_store


@click.command()
@click.argument("data_dir", metavar="DATA_DIR",
                type=click.Path(file_okay=False, path_type=Path))
@click.option("--from", "replica", metavar="REPLICA_DIR",
              type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="Copy damaged records from this replica's store where its bytes verify.")
@click.option("--dry-run", is_flag=True, help="Say what would be done; change nothing.")
def repair(data_dir: Path, replica: Path | None, dry_run: bool) -> None:
    """Mend a commit log damaged in the middle (the store must be closed)."""
    report = repair_store(data_dir, replica, dry_run=dry_run)
    if report.clean:
        click.echo(f"ok: nothing to repair in {data_dir} (a damaged tail past what was "
                   "flushed, if any, is cut by the next open)")
        return
    for line in report.lines():
        click.echo(line)
    lost = sum(gap.count for gap in report.lost)
    if dry_run:
        click.echo(f"dry run: {len(report.pieces)} damaged range(s) to mend, {lost} "
                   "record(s) of known queues lost; nothing was changed")
        return
    click.echo(f"{len(report.pieces)} damaged range(s) mended, {lost} record(s) of known "
               "queues lost; the next open rebuilds the consume queues")
