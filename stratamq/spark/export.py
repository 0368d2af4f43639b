"""The export pipeline: topics to Parquet, partitioned by topic and date, incrementally.

An ordinary PySpark application: ``python -m stratamq.spark.export --store DIR --topics T
--out PATH`` runs it on an embedded ``local[*]`` Spark, and the same module runs unchanged
under ``spark-submit --master <cluster> -m``-style submission (``spark-submit
stratamq/spark/export.py ...``), which supplies the master.

It is a streaming query with trigger ``availableNow`` over the ``stratamq`` source, writing
Parquet with a checkpoint (``<out>/_checkpoint`` unless given): each run exports what arrived
since the last one and stops, and no message is exported twice. ``date`` is the UTC date of
``store_timestamp``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

EXPORT_FORMATS = ("parquet", "orc", "json")


def spark_session(app_name: str = "stratamq-export", master: str | None = None):
    """A session that uses this interpreter on the workers; ``local[*]`` unless spark-submit
    (or ``master``) says otherwise."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name).config("spark.sql.session.timeZone", "UTC")
    if master or "PYSPARK_GATEWAY_PORT" not in os.environ:  # not launched by spark-submit
        builder = builder.master(master or "local[*]")
    spark = builder.getOrCreate()
    from stratamq.spark import register

    register(spark)
    return spark


def run_export(spark, source: dict[str, str], out: str, *, checkpoint: str | None = None,
               fmt: str = "parquet", progress: bool = True) -> dict[str, Any]:
    """Export what is new in the topics ``source`` selects; returns a summary."""
    from pyspark.sql import functions as F

    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"--format {fmt!r}: want one of {', '.join(EXPORT_FORMATS)}")
    checkpoint = checkpoint or os.path.join(out, "_checkpoint")
    reader = spark.readStream.format("stratamq").option("startingOffsets", "earliest")
    for key, value in source.items():
        reader = reader.option(key, value)
    rows = reader.load().withColumn("date", F.to_date(F.col("store_timestamp")))
    started = time.monotonic()
    query = (rows.writeStream.format(fmt).option("path", out)
             .option("checkpointLocation", checkpoint).partitionBy("topic", "date")
             .trigger(availableNow=True).outputMode("append").start())
    if progress:
        _show_progress(query)
    query.awaitTermination()
    batches = [p for p in query.recentProgress if p.get("batchId") is not None]
    exported = sum(p.get("numInputRows", 0) for p in batches)
    return {"exported": exported, "micro_batches": sum(1 for p in batches
                                                       if p.get("numInputRows", 0)),
            "out": out, "checkpoint": checkpoint, "format": fmt,
            "seconds": round(time.monotonic() - started, 3)}


def _show_progress(query) -> None:
    """A live line on stderr: micro-batches done, rows exported, current rate."""
    from rich.console import Console
    from rich.live import Live

    console = Console(stderr=True)
    with Live(console=console, refresh_per_second=4, transient=False) as live:
        while query.isActive:
            done = [p for p in query.recentProgress if p.get("numInputRows")]
            rows = sum(p["numInputRows"] for p in done)
            rate = done[-1].get("processedRowsPerSecond", 0.0) if done else 0.0
            live.update(f"[bold]export[/] {len(done)} micro-batches, {rows:,} rows "
                        f"({rate:,.0f} rows/s) - {query.status.get('message', '')}")
            time.sleep(0.25)
            query.exception()  # raises if the query failed


def source_options(store: str | None, endpoints: str | None, topics: str | None,
                   max_per_trigger: int | None = None) -> dict[str, str]:
    if bool(store) == bool(endpoints):
        raise ValueError("give exactly one of --store and --endpoints")
    opts = {"path": store} if store else {"endpoints": endpoints}
    if topics:
        opts["topics"] = topics
    if max_per_trigger:
        opts["maxOffsetsPerTrigger"] = str(max_per_trigger)
    return opts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stratamq.spark.export", description=__doc__.split(
        "\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--store", help="store directory to read (read-only)")
    where.add_argument("--endpoints", help="broker host:port to read from")
    parser.add_argument("--topics", help="comma list or regex (default: every topic)")
    parser.add_argument("--out", required=True, help="output directory (Parquet dataset)")
    parser.add_argument("--format", default="parquet", choices=EXPORT_FORMATS)
    parser.add_argument("--checkpoint", help="checkpoint directory (default <out>/_checkpoint)")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=None)
    parser.add_argument("--master", help="Spark master (default: spark-submit's, or local[*])")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    spark = spark_session(master=args.master)
    summary = run_export(spark, source_options(args.store, args.endpoints, args.topics,
                                               args.max_offsets_per_trigger),
                         args.out, checkpoint=args.checkpoint, fmt=args.format,
                         progress=not args.no_progress)
    print(json.dumps(summary), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
