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
import re
import sys
import time
from typing import Any

EXPORT_FORMATS = ("parquet", "orc", "json")


def spark_session(app_name: str = "stratamq-export", master: str | None = None):
    """A session that uses this interpreter on the workers; ``local[*]`` unless spark-submit
    (or ``master``) says otherwise. As the pipelines': errors only, no JVM logger names, and
    no Spark progress bars (``_show_progress`` is the one progress display)."""
    from stratamq.spark.pipelines.common import spark_session as pipeline_session

    return pipeline_session(app_name, master)


def run_export(spark, source: dict[str, str], out: str, *, checkpoint: str | None = None,
               fmt: str = "parquet", progress: bool = True) -> dict[str, Any]:
    """Export what is new in the topics ``source`` selects; returns a summary."""
    from pyspark.sql import functions as F

    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"--format {fmt!r}: want one of {', '.join(EXPORT_FORMATS)}")
    checkpoint = checkpoint or os.path.join(out, "_checkpoint")
    check_export_target(out, checkpoint)
    total = planned_rows(source, checkpoint) if progress else None
    reader = spark.readStream.format("stratamq").option("startingOffsets", "earliest")
    for key, value in source.items():
        reader = reader.option(key, value)
    rows = reader.load().withColumn("date", F.to_date(F.col("store_timestamp")))
    started = time.monotonic()
    query = (rows.writeStream.format(fmt).option("path", out)
             .option("checkpointLocation", checkpoint).partitionBy("topic", "date")
             .trigger(availableNow=True).outputMode("append").start())
    if progress:
        _show_progress(query, total)
    query.awaitTermination()
    batches = [p for p in query.recentProgress if p.get("batchId") is not None]
    exported = sum(p.get("numInputRows", 0) for p in batches)
    return {"exported": exported, "micro_batches": sum(1 for p in batches
                                                       if p.get("numInputRows", 0)),
            "out": out, "checkpoint": checkpoint, "format": fmt,
            "seconds": round(time.monotonic() - started, 3)}


def _local(path: str) -> str | None:
    """``path`` as a local file name, or None for another file system (hdfs://, s3a://...)."""
    if path.startswith("file:"):
        return "/" + path[len("file:"):].lstrip("/")
    return None if "://" in path else path


def check_export_target(out: str, checkpoint: str | None) -> None:
    """Refuse (ValueError naming the flags) an output another checkpoint's query wrote to.

    Spark's file sink keeps its own log of committed batches in ``<out>/_spark_metadata``; a
    query with a new checkpoint starts again at batch 0, the sink finds batch 0 already
    committed and skips it, and the checkpoint records those messages as exported: they never
    reach the output. Checked for local paths (another file system is not looked at).
    """
    checkpoint = checkpoint or os.path.join(out, "_checkpoint")
    out_dir, ckpt_dir = _local(out), _local(checkpoint)
    if out_dir is None or ckpt_dir is None:
        return
    sink_log = os.path.join(out_dir, "_spark_metadata")
    commits = os.path.join(ckpt_dir, "commits")
    if (os.path.isdir(sink_log) and os.listdir(sink_log)
            and not (os.path.isdir(commits) and os.listdir(commits))):
        raise ValueError(f"--out {out} already holds an export made with another checkpoint "
                         f"(it has _spark_metadata), and --checkpoint {checkpoint} has none: "
                         "Spark would skip this run's first batches and record them as "
                         "exported. Give the --checkpoint that export used, or a new --out")


# What a streaming query's status message says, in words; the raw message names JVM classes
# ("Getting offsets from org.apache.spark...PythonMicroBatchStream...@18204781").
_STATES = (("Initializing", "starting"), ("Getting offsets", "finding new messages"),
           ("Processing new data", "writing"), ("Waiting for data", "waiting for data"),
           ("Waiting for next trigger", "waiting"), ("Stopped", "done"))


def plain_state(message: str) -> str:
    """A streaming query's status message without JVM class names."""
    for prefix, words in _STATES:
        if message.startswith(prefix):
            return words
    return re.sub(r"\b(?:[a-z_$][\w$]*\.)+[A-Z][\w$]*(?:@[0-9a-f]+)?", "the source",
                  message) or "working"


def _show_progress(query, total: int | None = None) -> None:
    """Progress on stderr: micro-batches done, rows exported, current rate. A live line on a
    terminal; otherwise (a log file, or spark-submit, which merges the app's stderr into its
    stdout) one whole line per finished micro-batch, so the JSON summary printed after it
    always starts a line of its own."""
    from rich.console import Console
    from rich.live import Live

    console = Console(stderr=True)

    started = time.monotonic()

    def text() -> str:
        recent = query.recentProgress
        done = [p for p in recent if p.get("numInputRows")]
        rows = sum(p["numInputRows"] for p in done)
        rate = done[-1].get("processedRowsPerSecond", 0.0) if done else 0.0
        state = plain_state(query.status.get("message", "")) if query.isActive else "done"
        if total:
            elapsed = time.monotonic() - started
            left = (f", about {elapsed * (total - rows) / rows:.0f} s left"
                    if 0 < rows < total else "")
            return (f"export {rows:,} of {total:,} rows ({rows / total:.0%}{left}; "
                    f"{len(done)} micro-batches, {rate:,.0f} rows/s) - {state}")
        return f"export {len(done)} micro-batches, {rows:,} rows ({rate:,.0f} rows/s) - {state}"

    if not console.is_terminal:
        seen = -1
        while query.isActive:
            finished = sum(1 for p in query.recentProgress if p.get("numInputRows"))
            if finished != seen:
                seen = finished
                console.print(text(), markup=False, highlight=False, soft_wrap=True)
            time.sleep(0.25)
            query.exception()  # raises if the query failed
        query.exception()
        console.print(text(), markup=False, highlight=False, soft_wrap=True)
        return
    with Live(console=console, refresh_per_second=4, transient=False) as live:
        while query.isActive:
            live.update(text())
            time.sleep(0.25)
            query.exception()  # raises if the query failed
        query.exception()
        live.update(text())  # the final counts, not the last poll's


def planned_rows(source: dict[str, str], checkpoint: str) -> int | None:
    """Rows this run will export, known before it starts: from the offsets the checkpoint's last
    committed micro-batch ended at (the queues' beginnings for a first run) to the queues'
    ends now (the run reads what is there when it begins). None if it cannot be told."""
    from stratamq.spark.datasource import StreamReader

    try:
        reader = StreamReader({**source, "startingOffsets": "earliest"})
        bounds = reader.queue_bounds()
    except Exception:  # a broker that is not reachable yet: the run itself will say so
        return None
    done = _committed_offsets(checkpoint)
    return sum(max(0, high - done.get(f"{t}/{q}", low)) for (t, q), (low, high) in bounds.items())


def _committed_offsets(checkpoint: str) -> dict[str, int]:
    """``topic/queue -> offset`` where the checkpoint's last committed batch ended ({} if none).
    Spark's checkpoint: ``commits/<id>`` per committed batch, ``offsets/<id>`` whose last line is
    the source's end offset for that batch."""
    local = _local(checkpoint)
    if local is None:
        return {}
    try:
        commits = [int(n) for n in os.listdir(os.path.join(local, "commits")) if n.isdigit()]
        if not commits:
            return {}
        with open(os.path.join(local, "offsets", str(max(commits))), encoding="utf-8") as fh:
            parsed = json.loads(fh.read().strip().splitlines()[-1])
    except (OSError, ValueError, IndexError):
        return {}
    if not isinstance(parsed, dict):
        return {}
    return {f"{t}/{q}": int(o) for t, qs in parsed.items() for q, o in qs.items()}


def source_options(store: str | None, endpoints: str | None, topics: str | None,
                   max_per_trigger: int | None = None, *, access_key: str | None = None,
                   secret_key: str | None = None, tls: bool = False,
                   tls_ca_file: str | None = None, tier: str | None = None,
                   s3_endpoint: str | None = None, tls_cert_file: str | None = None,
                   tls_key_file: str | None = None) -> dict[str, str]:
    """The ``stratamq`` source options for the export's flags; ValueError names a bad flag.

    The credentials and TLS flags are for ``--endpoints``. With ``--store`` the keys are
    ignored (they may come from STRATAMQ_ACCESS_KEY / STRATAMQ_SECRET_KEY set for other
    commands), while ``--tls`` / ``--tls-ca-file`` / ``--tls-cert-file`` are refused as a
    mistake.
    """
    if sum(map(bool, (store, endpoints, tier))) != 1:
        raise ValueError("give exactly one of --store, --endpoints and --tier")
    if s3_endpoint and not tier:
        raise ValueError("--s3-endpoint is for --tier")
    if tier:  # a tier (a directory or s3://...): its history, read from its files
        opts_tier: dict[str, str] = {"path": tier}
        if s3_endpoint:
            opts_tier["tieredStoreS3Endpoint"] = s3_endpoint
        if topics:
            opts_tier["topics"] = topics
        if max_per_trigger:
            opts_tier["maxOffsetsPerTrigger"] = str(max_per_trigger)
        return opts_tier
    if endpoints and bool(access_key) != bool(secret_key):
        raise ValueError("--access-key and --secret-key must be given together "
                         "(or STRATAMQ_ACCESS_KEY and STRATAMQ_SECRET_KEY)")
    if store and (tls or tls_ca_file or tls_cert_file or tls_key_file):
        raise ValueError("--tls, --tls-ca-file and --tls-cert-file/--tls-key-file are for "
                         "--endpoints, not --store")
    if endpoints and bool(tls_cert_file) != bool(tls_key_file):
        raise ValueError("--tls-cert-file and --tls-key-file must be given together")
    opts: dict[str, str] = {"path": store} if store else {"endpoints": endpoints or ""}
    if topics:
        opts["topics"] = topics
    if max_per_trigger:
        opts["maxOffsetsPerTrigger"] = str(max_per_trigger)
    if endpoints:
        if access_key and secret_key:
            opts["accessKey"], opts["secretKey"] = access_key, secret_key
        if tls or tls_ca_file or tls_cert_file:
            opts["tls"] = "true"
        if tls_ca_file:
            opts["tlsCaFile"] = tls_ca_file
        if tls_cert_file and tls_key_file:
            opts["tlsCertFile"], opts["tlsKeyFile"] = tls_cert_file, tls_key_file
    return opts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stratamq.spark.export", description=__doc__.split(
        "\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--store", help="store directory to read (read-only)")
    where.add_argument("--endpoints", help="broker host:port to read from")
    where.add_argument("--tier", help="tier (directory or s3://bucket/prefix) to read from")
    parser.add_argument("--s3-endpoint", help="S3-compatible server of --tier")
    parser.add_argument("--topics", help="comma list or regex (default: every topic)")
    parser.add_argument("--out", required=True, help="output directory (Parquet dataset)")
    parser.add_argument("--format", default="parquet", choices=EXPORT_FORMATS)
    parser.add_argument("--checkpoint", help="checkpoint directory (default <out>/_checkpoint)")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=None)
    parser.add_argument("--master", help="Spark master (default: spark-submit's, or local[*])")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--access-key", default=os.environ.get("STRATAMQ_ACCESS_KEY"),
                        help="access key to sign broker requests with (aclEnable=true); "
                             "env STRATAMQ_ACCESS_KEY")
    parser.add_argument("--secret-key", default=os.environ.get("STRATAMQ_SECRET_KEY"),
                        help="secret key of --access-key; env STRATAMQ_SECRET_KEY")
    parser.add_argument("--tls", action="store_true", help="connect to the broker over TLS")
    parser.add_argument("--tls-ca-file", help="PEM file of the CA(s) to trust (implies --tls)")
    parser.add_argument("--tls-cert-file", help="PEM certificate chain to present to a broker "
                        "that asks for one (implies --tls; with --tls-key-file)")
    parser.add_argument("--tls-key-file", help="PEM private key of --tls-cert-file")
    args = parser.parse_args(argv)
    try:
        source = source_options(args.store, args.endpoints, args.topics,
                                args.max_offsets_per_trigger, access_key=args.access_key,
                                secret_key=args.secret_key, tls=args.tls,
                                tls_ca_file=args.tls_ca_file, tier=args.tier,
                                s3_endpoint=args.s3_endpoint, tls_cert_file=args.tls_cert_file,
                                tls_key_file=args.tls_key_file)
        check_export_target(args.out, args.checkpoint)
    except ValueError as exc:
        parser.error(str(exc))
    spark = spark_session(master=args.master)
    summary = run_export(spark, source, args.out, checkpoint=args.checkpoint, fmt=args.format,
                         progress=not args.no_progress)
    print(json.dumps(summary), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
