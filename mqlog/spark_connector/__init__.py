"""mqlog's Spark connector: the ``mqlog`` data source, and the reconcile and replay jobs.

``register(spark)`` makes ``spark.read.format("mqlog")`` and
``spark.readStream.format("mqlog")`` available (datasource.py); ``reconcile`` compares
replica copies of a store (reconcile.py); ``replay`` re-reads a range into another store
or Parquet (replay.py). Everything reads stores through read-only snapshots or their
segment files, with no broker running. docs/SPARK.md has the options and examples.
pyspark and pyarrow come with the ``spark`` extra: ``pip install 'mqlog[spark]'``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["register"]


def register(spark: Any) -> None:
    """Register the ``mqlog`` data source with ``spark`` (and enable filter pushdown)."""
    from mqlog.spark_connector.datasource import register as _register

    _register(spark)
