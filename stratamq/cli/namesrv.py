"""``stratamq namesrv start``: RocketMQ's NameServer for remoting clients (4.x SDKs, ali-ons,
mqadmin), until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys

import click

from stratamq.cli.app import main
from stratamq.cli.broker import _check_listen


@main.group()
def namesrv() -> None:
    """The NameServer RocketMQ 4.x clients find brokers through (brokers register with it
    through namesrvAddr)."""


@namesrv.command("start")
@click.option("--listen", default="127.0.0.1:9876", show_default=True, callback=_check_listen,
              help="HOST:PORT to serve on (RocketMQ's default port 9876; port 0 picks one).")
def namesrv_start(listen: str) -> None:
    """Serve routes until SIGINT/SIGTERM. Prints the address once serving."""
    from stratamq.remoting.namesrv import NameServer

    host, _, port = listen.rpartition(":")
    host = host.strip("[]")

    async def serve() -> None:
        server = NameServer()
        try:
            bound = await server.start(host, int(port))
        except OSError as exc:
            raise click.ClickException(f"cannot listen on {listen}: {exc.strerror or exc}"
                                       ) from None
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        shown = f"[{host}]:{bound}" if ":" in host else f"{host}:{bound}"
        click.echo(f"StrataMQ NameServer listening on {shown}")
        sys.stdout.flush()
        await stop.wait()
        await server.close()
        click.echo("stopped cleanly")

    asyncio.run(serve())
