"""StrataMQ topics as Spark DataFrames: the ``stratamq`` data source and the export pipeline.

``register(spark)`` makes ``spark.read.format("stratamq")`` (and ``readStream``, ``write``,
``writeStream``) available in a session. See ``docs/SPARK.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["register"]


def register(spark: SparkSession) -> None:
    """Register the ``stratamq`` data source with ``spark``."""
    from stratamq.spark.datasource import StrataMQDataSource

    spark.dataSource.register(StrataMQDataSource)
