"""``stratamq broker start``: run the gRPC broker until SIGINT/SIGTERM."""

from __future__ import annotations

import gc
import ipaddress
import os
import signal
import socket
import sys
from dataclasses import replace
from pathlib import Path

import click

from stratamq.cli.app import main, os_error_text
from stratamq.cli.common import read_conf, warn

MAX_PORT = 65535


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _check_listen(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """HOST:PORT with a port 0..65535: gRPC would take 70000 modulo 65536 and serve on 4464."""
    if value is None:
        return None
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise click.BadParameter(f"must be HOST:PORT, not {value!r}")
    if int(port) > MAX_PORT:
        raise click.BadParameter(f"port {port} is out of range 0..{MAX_PORT} (in {value!r})")
    return value


def _bind_refusal(host: str, port: int) -> str | None:
    """Why binding ``host:port`` fails (``Address already in use``), or None if it does not.

    gRPC's own error says only "Failed to bind" and logs the reason in a line of its own; one
    bind of our own, made after gRPC's failed, learns the reason for the error line.
    """
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as exc:
        return f"cannot resolve {host!r}: {exc}"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        # As gRPC binds: SO_REUSEADDR, so a port left in TIME_WAIT is not reported as in use.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


# Allocations between young-generation collections while serving (CPython's default: 700).
SERVING_GC_THRESHOLD = 10_000


def _tune_gc_for_serving() -> None:
    """The process is the broker's: keep the cyclic collector off what start-up built.

    Requests in flight live for milliseconds (longer under SYNC_FLUSH, waiting for the group
    commit), long enough to outlive young collections and be promoted, and every few
    promotions a full collection walked the whole heap: the store's indexes, gRPC and
    protobuf's modules, topics. Profiles of a SYNC_FLUSH broker under load put 9% of the event
    loop's samples in the collector. ``gc.freeze()`` moves what exists once serving into a
    generation the collector never walks (garbage among it is never freed, a one-off cost),
    and a larger young-generation threshold lets most requests die, by reference counting,
    before a collection sees them. Only here, where the CLI owns the process: an application
    that embeds the store keeps its own collector settings."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(SERVING_GC_THRESHOLD, *gc.get_threshold()[1:])


@main.group()
def broker() -> None:
    """Run the gRPC broker the official RocketMQ 5 clients talk to."""


@broker.command("start")
@click.option("--config", "config_file", default=None, type=click.Path(dir_okay=False),
              help="broker.conf (key=value, RocketMQ key names).")
@click.option("--store", "store_dir", default=None,
              help="Store root (overrides storePathRootDir; default ./data).")
@click.option("--listen", default=None, callback=_check_listen,
              help="HOST:PORT to serve gRPC on (default 127.0.0.1:<listenPort>, 10911; "
                   "0.0.0.0:PORT for every interface; "
                   "port 0 picks a free port).")
def broker_start(config_file: str | None, store_dir: str | None, listen: str | None) -> None:
    """Serve until SIGINT/SIGTERM, then stop accepting, finish in-flight requests, flush,
    write the checkpoint and remove ``abort``. Prints the endpoint once serving."""
    from stratamq.broker.server import Broker, BrokerStopError
    from stratamq.store.message_store import StoreLocked
    from stratamq.tiered.drivers import TierIOError

    conf = read_conf(config_file)
    store_cfg, broker_cfg = conf.store, conf.broker
    if store_dir is not None:
        store_cfg = replace(store_cfg, store_path_root_dir=store_dir)
    root = Path(store_cfg.store_path_root_dir)
    if root.exists() and not root.is_dir():
        raise click.ClickException(f"store directory {root} is a file")
    try:
        b = Broker(store_cfg, broker_cfg, listen)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        endpoint = b.start()
    except StoreLocked as exc:
        raise click.ClickException(str(exc)) from None
    except TierIOError as exc:  # set-up errors of the tier (a missing bucket) name themselves
        raise click.ClickException(f"cannot use the tier: {exc}") from None
    except OSError as exc:
        if exc.errno is None and str(exc).startswith("cannot listen on"):  # Broker's, no errno
            host, port = b.listen_host, b.listen_port
            reason = _bind_refusal(host, port)
            if reason is None:
                raise click.ClickException(str(exc)) from None
            address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            raise click.ClickException(f"cannot listen on {address}: {reason}") from None
        raise click.ClickException(
            f"cannot open store {root}: {os_error_text(exc, root)}") from None
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    _tune_gc_for_serving()
    if not _is_loopback(b.listen_host) and not broker_cfg.acl_enable:
        warn(f"listening on {b.listen_host}, reachable from other machines, with ACL off: "
             "anyone who can reach it may read, write and delete topics (aclEnable=true)")
    stop_signals = _StopSignals()
    try:
        click.echo(f"StrataMQ broker {broker_cfg.broker_name} listening on {endpoint} "
                   f"(store: {store_cfg.store_path_root_dir})")
        if b.replication is not None:
            click.echo(f"replication: {b.replication.describe()}")
        if b.remoting is not None:
            shared = (f", shared with gRPC (relayed to 127.0.0.1:{b.grpc_port})"
                      if b.grpc_port != b.advertised[1]
                      else "")
            click.echo(f"remoting (RocketMQ 4.x clients) on port {b.remoting.port}{shared}")
        sys.stdout.flush()
        stop_signals.wait()
        click.echo("stopping: finishing in-flight requests, flushing, writing the checkpoint")
    finally:
        # Even when stdout is gone (a closed pipe): the store must still close cleanly.
        try:
            stopped = b.stop()
        except BrokerStopError as exc:
            raise click.ClickException(f"stopping failed: {exc}") from None
    if not stopped:
        # gRPC's worker threads are wedged: the interpreter would wait for them forever at
        # exit. The store is closed and flushed, so leaving now loses nothing.
        click.echo("stopped (gRPC calls still running were abandoned)")
        sys.stdout.flush()
        os._exit(0)
    click.echo("stopped cleanly")


class _StopSignals:
    """Wait for SIGINT/SIGTERM without a lock in the signal handler.

    A handler that calls ``threading.Event.set`` deadlocks when the signal lands while the
    main thread holds that Event's lock (inside ``wait``, between bytecodes): the handler runs
    on the same thread and waits for a lock its own thread holds, and the broker then never
    stops (seen under a burst of SIGTERMs). Here the interpreter's C-level handler writes the
    signal to a socket (``signal.set_wakeup_fd``) and the main thread blocks reading it; the
    Python-level handler does nothing."""

    def __init__(self) -> None:
        self._read, self._write = socket.socketpair()
        self._write.setblocking(False)
        signal.set_wakeup_fd(self._write.fileno(), warn_on_full_buffer=False)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _ignore_here)

    def wait(self) -> int:
        """Block until SIGINT or SIGTERM arrives; returns its number. From then on both are
        ignored: the stop is under way, and a repeated signal must neither interrupt the
        flush nor, once the interpreter resets Python-handled signals to their defaults at
        exit, kill the process after it stopped cleanly (SIGKILL still ends it at once)."""
        wanted = {int(signal.SIGINT), int(signal.SIGTERM)}
        while True:
            for number in self._read.recv(64):  # other signals wake it too: not a stop
                if number in wanted:
                    for sig in (signal.SIGINT, signal.SIGTERM):
                        signal.signal(sig, signal.SIG_IGN)
                    return number


def _ignore_here(_sig: int, _frame: object) -> None:
    """The stop is seen by ``_StopSignals.wait`` through the wakeup socket."""
