"""``stratamq namesrv start``: RocketMQ's NameServer for remoting clients (4.x SDKs, ali-ons,
mqadmin), until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import TYPE_CHECKING

import click

from stratamq.cli.app import main
from stratamq.cli.broker import _check_listen

if TYPE_CHECKING:
    from stratamq.remoting.etcd_routes import EtcdRoutes


@main.group()
def namesrv() -> None:
    """The NameServer RocketMQ 4.x clients find brokers through (brokers register with it
    through namesrvAddr)."""


@namesrv.command("start")
@click.option("--listen", default="127.0.0.1:9876", show_default=True, callback=_check_listen,
              help="HOST:PORT to serve on (RocketMQ's default port 9876; port 0 picks one).")
@click.option("--etcd", default=None,
              help="etcdEndpoints of a cluster on etcd (comma-separated URLs): routes come "
                   "from it, so every NameServer answers alike.")
@click.option("--cluster", "cluster_name", default="DefaultCluster", show_default=True,
              help="brokerClusterName of that cluster.")
@click.option("--etcd-prefix", default="",
              help="etcdPrefix, if the brokers set one (default /stratamq/<cluster>).")
def namesrv_start(listen: str, etcd: str | None, cluster_name: str, etcd_prefix: str) -> None:
    """Serve routes until SIGINT/SIGTERM. Prints the address once serving."""
    from stratamq.remoting.namesrv import NameServer

    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    routes = _etcd_routes(etcd, cluster_name, etcd_prefix) if etcd else None

    async def serve() -> None:
        server = NameServer(cluster=routes)
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


def _etcd_routes(etcd: str, cluster_name: str, etcd_prefix: str) -> EtcdRoutes:
    from stratamq.cli.cluster import _etcd
    from stratamq.cluster.routes import RouteTable
    from stratamq.remoting.etcd_routes import EtcdRoutes

    coord, prefix = _etcd(etcd, cluster_name, etcd_prefix)
    table = RouteTable(coord, prefix).start()
    if not table.wait_loaded(10):
        click.echo(f"warning: etcd at {etcd} did not answer yet; routes come once it does",
                   err=True)
    return EtcdRoutes(table, cluster_name, coord)
