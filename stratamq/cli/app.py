"""The root ``stratamq`` command group; each subcommand module attaches itself to ``main``.

Output that cannot be written is handled here once, for every command: a full disk or any
other failed write to stdout ends the command with ``Error: cannot write output: ...`` and
exit 1; a reader that went away (``stratamq store dump | head -1``) ends it quietly with exit
141, the status a shell reports for a program that SIGPIPE ended, as ``cat`` or ``grep`` would.
"""

from __future__ import annotations

import errno
import logging
import os
import sys
from pathlib import Path
from typing import IO, Any

import click

# 128 + SIGPIPE: what `set -o pipefail` sees from any Unix tool whose reader closed the pipe.
EXIT_BROKEN_PIPE = 128 + 13


class OutputFailed(click.ClickException):
    """A write to stdout failed: the command's output is lost, whatever else it did."""

    def __init__(self, exc: OSError, fd: int | None) -> None:
        super().__init__(f"cannot write output: {exc.strerror or exc}")
        self.errno = exc.errno
        self.fd = fd

    def show(self, file: IO[Any] | None = None) -> None:
        self.silence_stdout()
        super().show(file)

    def silence_stdout(self) -> None:
        """Point stdout at /dev/null: what is still buffered would fail again at interpreter
        exit and print a traceback there. Done when the error is reported, not when raised:
        click probes a stream with writes whose errors it swallows."""
        if self.fd is not None:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.fd)
            os.close(devnull)


class OutputClosed(OutputFailed):
    """stdout is a pipe whose reader has gone: not an error worth a message."""

    exit_code = EXIT_BROKEN_PIPE

    def show(self, file: IO[Any] | None = None) -> None:
        self.silence_stdout()


class _GuardedStdout:
    """``sys.stdout`` whose failed writes raise :class:`OutputFailed` (a ClickException).

    A ClickException because click then prints it as one ``Error:`` line and exits with its
    code, and because the commands' own ``except OSError`` clauses (meant for the store's I/O)
    must not mistake it for a store error. Everything else is the wrapped stream's.
    """

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            raise self._failed(exc) from None

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            raise self._failed(exc) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def _failed(self, exc: OSError) -> OutputFailed:
        try:
            fd: int | None = self._stream.fileno()
        except (AttributeError, OSError, ValueError):  # not a real file (click's CliRunner)
            fd = None
        return OutputClosed(exc, fd) if exc.errno == errno.EPIPE else OutputFailed(exc, fd)


def _verbose(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        logging.getLogger().setLevel(logging.INFO)


class StrataGroup(click.Group):
    """The root group: runs every command with stdout guarded (see the module docstring).

    Its subgroups are StrataGroups too, and every command added gets ``-v`` / ``--verbose``,
    so it works where a user types it: before the subcommand or after it."""

    group_class = type  # click: subgroups made with @group.group() are of this class

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        if not isinstance(cmd, click.Group) and not any(
                "-v" in getattr(p, "opts", ()) for p in cmd.params):
            cmd.params.append(click.Option(["-v", "--verbose"], is_flag=True,
                                           expose_value=False, callback=_verbose,
                                           help="Log what StrataMQ does to stderr."))
        super().add_command(cmd, name)

    def main(self, args: Any = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        saved = sys.stdout
        if saved is None:  # no stdout at all: nothing to guard
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        guarded = _GuardedStdout(saved)
        sys.stdout = guarded
        try:
            try:
                return super().main(args, prog_name, complete_var, standalone_mode, **extra)
            finally:
                # Output left buffered (print() does not flush) fails here, not at exit.
                guarded.flush()
        except OutputFailed as exc:  # from that flush: click reported the earlier ones
            if not standalone_mode:
                raise
            exc.show()
            sys.exit(exc.exit_code)
        finally:
            sys.stdout = saved


def os_error_text(exc: OSError, about: str | Path | None = None) -> str:
    """``No such file or directory: '/proc/x'``: an OSError without the ``[Errno N]``, and
    without the file name where that is ``about``, which the message names already."""
    if exc.strerror and exc.filename is not None and str(exc.filename) != str(about):
        return f"{exc.strerror}: {str(exc.filename)!r}"
    return exc.strerror or str(exc)


def prepare_store_dir(store_dir: str, *, fresh: bool = False) -> Path:
    """Create the store root ``store_dir`` (and its parents) or say in one line why not.

    With ``fresh`` the directory must not hold anything yet, a store least of all: a bench
    writes a store of its own and must not mix it into, or leave it inside, someone's data.
    """
    root = Path(store_dir)
    if root.exists() and not root.is_dir():
        raise click.ClickException(f"store directory {root} is a file")
    if fresh and root.is_dir():
        if (root / "commitlog").is_dir():
            raise click.ClickException(
                f"store directory {root} already holds a store: the bench needs an empty one")
        if any(root.iterdir()):
            raise click.ClickException(
                f"store directory {root} is not empty: the bench needs an empty one")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise click.ClickException(
            f"cannot create store directory {root}: {os_error_text(exc, root)}") from None
    return root


@click.group(cls=StrataGroup)
@click.option("-v", "--verbose", is_flag=True, help="Log what StrataMQ does to stderr.")
@click.version_option(package_name="stratamq", prog_name="stratamq")
def main(verbose: bool) -> None:
    """StrataMQ: a RocketMQ-compatible message store and broker."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
