"""``stratamq broker start``: run the gRPC broker until SIGINT/SIGTERM."""

from __future__ import annotations

import signal
import sys
import threading
from dataclasses import replace

import click

from stratamq.cli.app import main


@main.group()
def broker() -> None:
    """Run the gRPC broker the official RocketMQ 5 clients talk to."""


@broker.command("start")
@click.option("--config", "config_file", default=None, type=click.Path(dir_okay=False),
              help="broker.conf (key=value, RocketMQ key names).")
@click.option("--store", "store_dir", default=None,
              help="Store root (overrides storePathRootDir; default ./data).")
@click.option("--listen", default=None,
              help="HOST:PORT to serve gRPC on (default 0.0.0.0:<listenPort>, 10911; "
                   "port 0 picks a free port).")
def broker_start(config_file: str | None, store_dir: str | None, listen: str | None) -> None:
    """Serve until SIGINT/SIGTERM, then stop accepting, finish in-flight requests, flush,
    write the checkpoint and remove ``abort``. Prints the endpoint once serving."""
    from stratamq.broker.server import Broker
    from stratamq.config import load_broker_conf
    from stratamq.store.message_store import StoreLocked

    try:
        store_cfg, broker_cfg, unknown = load_broker_conf(config_file)
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"cannot read config {config_file}: {exc}") from None
    if unknown:
        # Reported, never silently ignored: a typo must not leave a setting at its default.
        raise click.ClickException(
            f"unknown settings in {config_file}: {', '.join(unknown)} "
            "(see stratamq/config.py for every key)")
    if store_dir is not None:
        store_cfg = replace(store_cfg, store_path_root_dir=store_dir)
    try:
        b = Broker(store_cfg, broker_cfg, listen)
        endpoint = b.start()
    except StoreLocked as exc:
        raise click.ClickException(str(exc)) from None
    except (OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    click.echo(f"StrataMQ broker {broker_cfg.broker_name} listening on {endpoint} "
               f"(store: {store_cfg.store_path_root_dir})")
    sys.stdout.flush()
    while not stop.wait(1.0):
        pass
    click.echo("stopping: finishing in-flight requests, flushing, writing the checkpoint")
    b.stop()
    click.echo("stopped cleanly")
