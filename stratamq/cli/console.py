"""``stratamq console``: the web console for a running broker (``stratamq/console``)."""

from __future__ import annotations

import signal
import sys

import click

from stratamq.cli.admin import Connection, endpoint_option
from stratamq.cli.app import main
from stratamq.cli.common import warn


@main.command("console")
@endpoint_option
@click.option("--listen", default="127.0.0.1:8080", show_default=True,
              help="HOST:PORT the console serves on (loopback unless set; port 0: any free).")
@click.option("--read-only", is_flag=True, default=False,
              help="Refuse every change (create, update, delete, reset, send, resend).")
def console(endpoint: Connection, listen: str, read_only: bool) -> None:
    """Serve the web console of the broker at --endpoint until interrupted. Credentials
    (--access-key/--secret-key) stay in this process: the browser never sees them."""
    from stratamq.console.server import ConsoleServer

    try:
        server = ConsoleServer(endpoint, listen, read_only=read_only)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--listen") from None
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {listen}: {exc.strerror or exc}"
                                   ) from None
    if server.host not in ("127.0.0.1", "::1", "localhost"):
        warn(f"the console serves {server.host}, not just loopback: whoever reaches it acts "
             f"on the broker as {endpoint.access_key or 'the console'}"
             f"{'' if read_only else ' and can change it (--read-only to refuse changes)'}")
    click.echo(f"StrataMQ console on {server.url} for {endpoint.endpoint}"
               f"{' (read-only)' if read_only else ''}", err=True)
    # uvicorn stops gracefully on SIGINT/SIGTERM, then raises the signal again to the handler
    # it found: this one, so a stop asked for is a clean exit (0), not a death by signal.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _exit_cleanly)
    server.run()


def _exit_cleanly(_sig: int, _frame: object) -> None:
    sys.exit(0)
