"""``stratamq spark ...``: Spark pipelines over StrataMQ topics."""

from __future__ import annotations

import click

from stratamq.cli.app import main
from stratamq.cli.common import config_option, emit, store_config
from stratamq.cli.progress import quiet_option


@main.group()
def spark() -> None:
    """Spark pipelines (PySpark, embedded local[*] unless run under spark-submit)."""
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as exc:
        raise click.ClickException(f"Spark commands need PySpark and pyarrow, which the broker "
                                   f"does not ({exc}): pip install 'stratamq[spark]'") from None


@spark.command("export")
@click.option("--store", "store_dir", default=None, help="Store directory to read (read-only).")
@click.option("--endpoints", default=None, help="Broker host:port to read from instead.")
@click.option("--tier", default=None,
              help="Or a tier to read (a directory or s3://bucket/prefix): history that is "
                   "only in the tier.")
@click.option("--s3-endpoint", default=None, help="S3-compatible server of --tier.")
@click.option("--topics", default=None, help="Comma list or regex (default: every topic).")
@click.option("--out", required=True, help="Output directory.")
@click.option("--format", "fmt", default="parquet", show_default=True,
              type=click.Choice(["parquet", "orc", "json"]), help="Output file format.")
@click.option("--checkpoint", default=None, help="Checkpoint directory [<out>/_checkpoint].")
@click.option("--max-offsets-per-trigger", type=int, default=None,
              help="Cap messages per micro-batch.")
@click.option("--master", default=None, help="Spark master [local[*]].")
@click.option("--progress/--no-progress", default=True, help="Live progress on stderr.")
@click.option("--access-key", envvar="STRATAMQ_ACCESS_KEY", default=None,
              help="Access key to sign broker requests with (broker with aclEnable=true); "
                   "env STRATAMQ_ACCESS_KEY. Ignored with --store.")
@click.option("--secret-key", envvar="STRATAMQ_SECRET_KEY", default=None,
              help="Secret key of --access-key; env STRATAMQ_SECRET_KEY.")
@click.option("--tls", is_flag=True, default=False,
              help="Connect to the broker over TLS (trusting gRPC's default roots).")
@click.option("--tls-ca-file", default=None,
              help="PEM file of the CA(s) that signed the broker's certificate (implies --tls).")
@click.option("--tls-cert-file", default=None,
              help="PEM certificate chain to present to a broker that asks for one "
                   "(tls.server.need.client.auth; implies --tls; with --tls-key-file).")
@click.option("--tls-key-file", default=None, help="PEM private key of --tls-cert-file.")
def spark_export(store_dir: str | None, endpoints: str | None, tier: str | None,
                 s3_endpoint: str | None, topics: str | None, out: str,
                 fmt: str, checkpoint: str | None, max_offsets_per_trigger: int | None,
                 master: str | None, progress: bool, access_key: str | None,
                 secret_key: str | None, tls: bool, tls_ca_file: str | None,
                 tls_cert_file: str | None, tls_key_file: str | None) -> None:
    """Export topics to Parquet partitioned by topic and date; a second run exports only what
    is new (Spark checkpoint). Prints a JSON summary."""
    from stratamq.spark.export import (
        check_export_target,
        run_export,
        source_options,
        spark_session,
    )

    try:
        source = source_options(store_dir, endpoints, topics, max_offsets_per_trigger,
                                access_key=access_key, secret_key=secret_key, tls=tls,
                                tls_ca_file=tls_ca_file, tier=tier, s3_endpoint=s3_endpoint,
                                tls_cert_file=tls_cert_file, tls_key_file=tls_key_file)
        check_export_target(out, checkpoint)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    session = spark_session(master=master)
    try:
        emit(run_export(session, source, out, checkpoint=checkpoint, fmt=fmt,
                        progress=progress))
    finally:
        session.stop()


@spark.command("rebuild")
@click.option("--store", "store_dir", required=True, help="Store directory (its lock is taken).")
@click.option("--what", type=click.Choice(["cq", "index", "all"]), required=True,
              help="ConsumeQueues, the index, or both.")
@click.option("--store-type", type=click.Choice(["default", "defaultRocksDB"]), default=None,
              help="ConsumeQueue store to build (default: the type the store records); the "
                   "store records the new type once it is built.")
@config_option
@click.option("--master", default=None, help="Spark master [local[*]].")
@quiet_option
def spark_rebuild(store_dir: str, what: str, store_type: str | None, master: str | None,
                  quiet: bool) -> None:
    """Rebuild ConsumeQueues and/or the index from the CommitLog in parallel (equal to what
    the store's dispatcher builds), then swap them in. Prints a JSON summary."""
    from stratamq.spark.pipelines.common import PipelineError, spark_session
    from stratamq.spark.pipelines.rebuild import run_rebuild

    config = store_config(store_dir)
    session = spark_session("stratamq-rebuild", master, quick_jit=True)
    try:
        emit(run_rebuild(session, store_dir, what, store_type, config=config,
                         progress=not quiet))
    except PipelineError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        session.stop()


@spark.command("offload")
@click.option("--store", "store_dir", required=True, help="Store directory to offload (read "
              "only): a retired StrataMQ broker's, or one Apache RocketMQ wrote.")
@click.option("--tier", required=True, help="Tier: a directory (posix) or s3://bucket/prefix.")
@click.option("--topics", default=None, help="Comma list of topics (default: every topic).")
@click.option("--master", default=None, help="Spark master [local[*]].")
@click.option("--config", "config_file", default=None, type=click.Path(dir_okay=False),
              help="broker.conf of the broker that will serve the tier: its brokerClusterName, "
                   "brokerName, tier file sizes, index geometry and tieredStoreS3Endpoint.")
@click.option("--cluster", default=None, help="Cluster name in the tier [DefaultCluster].")
@click.option("--broker-name", default=None,
              help="Broker whose tier this becomes [broker-a]; the serving broker must have it.")
@click.option("--s3-endpoint", default=None,
              help="S3-compatible server, http://host:port (tieredStoreS3Endpoint).")
@click.option("--partition-mb", type=click.FloatRange(min=0.0625), default=64.0,
              show_default=True, help="MiB of records one write task owns (and the size of "
                                      "each queue's tier files, at most).")
@quiet_option
def spark_offload(store_dir: str, tier: str, topics: str | None, master: str | None,
                  config_file: str | None, cluster: str | None, broker_name: str | None,
                  s3_endpoint: str | None, partition_mb: float, quiet: bool) -> None:
    """Move a store's whole history into a tier in parallel, registered so that a broker
    with that tier and an empty store serves it. A rerun is a no-op. Prints a JSON summary."""
    from stratamq.cli.common import read_conf
    from stratamq.spark.pipelines.common import PipelineError, spark_session
    from stratamq.spark.pipelines.offload import run_offload

    store_cfg = None
    if config_file:
        conf = read_conf(config_file)
        store_cfg = conf.store
        cluster = cluster or conf.broker.broker_cluster_name
        broker_name = broker_name or conf.broker.broker_name
    names = [t.strip() for t in topics.split(",") if t.strip()] if topics else None
    session = spark_session("stratamq-offload", master, quick_jit=True)
    try:
        emit(run_offload(session, store_dir, tier, names, config=store_cfg, cluster=cluster,
                         broker=broker_name, s3_endpoint=s3_endpoint, progress=not quiet,
                         partition_bytes=int(partition_mb * 2**20)))
    except PipelineError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        session.stop()


@spark.command("compact")
@click.option("--store", "store_dir", required=True, help="Store directory (its lock is taken).")
@click.option("--topic", required=True, help="Compaction topic (cleanup.policy=COMPACTION).")
@config_option
@click.option("--master", default=None, help="Spark master [local[*]].")
@quiet_option
def spark_compact(store_dir: str, topic: str, master: str | None, quiet: bool) -> None:
    """Compact a compaction topic as a distributed reduce over its keys (no OffsetMap limit):
    the latest record per key, tombstones dropped per the topic's delete.retention.ms. Prints a
    JSON summary with one report per queue."""
    from stratamq.spark.pipelines.common import PipelineError, spark_session
    from stratamq.spark.pipelines.compact import run_compact

    config = store_config(store_dir)
    session = spark_session("stratamq-compact", master)
    try:
        emit(run_compact(session, store_dir, topic, config=config, progress=not quiet))
    except PipelineError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        session.stop()
