"""How a command's results reach stdout: JSON lines (the contract), or tables for people.

Every command that lists or reports takes ``--output json|table`` (``output_option``). With
``table`` the objects the command hands to ``emit`` are collected and printed as tables when it
ends, whatever their fields: a command (or a new field in a broker's answer) needs nothing of
its own to show in a table. A list makes one table, a column per field; a report of one
object (``broker status``, ``ha status``, ``group progress``) is shown as field/value rows,
nested objects as dotted names (``disk.free``), and each list of objects in it as a table of
its own under its name (``queues``, ``clients``, ``haConnectionInfo``).

On a terminal the tables are drawn by ``rich`` (long values fold onto more lines, never cut);
off a terminal (a pipe, a file) they are plain text with every value whole, columns padded
with spaces, so ``grep`` and ``awk`` see what JSON would have said.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import click

__all__ = ["emit", "emit_rows", "output_option", "print_table"]

_ROWS_KEY = "stratamq.output.rows"


def _json(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def _collecting() -> list[Any] | None:
    """The rows ``--output table`` collects for the command running now (None: JSON)."""
    ctx = click.get_current_context(silent=True)
    return ctx.meta.get(_ROWS_KEY) if ctx is not None else None


def emit(obj: Any) -> None:
    """One result: a JSON line, or (``--output table``) a row of the table printed at the
    command's end."""
    rows = _collecting()
    if rows is not None:
        rows.append(obj)
        return
    click.echo(_json(obj))


def emit_rows(rows: list[dict[str, Any]]) -> None:
    """Rows as JSON lines, or (``--output table``) as one table."""
    for row in rows:
        emit(row)


def output_option(command: Callable[..., Any] | None = None, *, report: bool = False) -> Any:
    """``--output json|table`` for a command that lists or reports: JSON lines (the
    contract), or tables for people (see the module docstring). The command itself just
    calls ``emit``. ``@output_option`` for a command that lists (one row per object);
    ``@output_option(report=True)`` for one that reports a single object (field/value rows,
    and a table per list of objects in it)."""
    if command is None:
        return functools.partial(output_option, report=report)

    @click.option("--output", type=click.Choice(["json", "table"]), default="json",
                  show_default=True, help="JSON lines, or tables for people.")
    @functools.wraps(command)
    def wrapper(*args: Any, output: str, **kwargs: Any) -> Any:
        if output == "json":
            return command(*args, **kwargs)
        ctx = click.get_current_context()
        rows: list[Any] = []
        ctx.meta[_ROWS_KEY] = rows
        try:
            return command(*args, **kwargs)
        finally:  # what was emitted before a failure is shown, as JSON lines would have been
            ctx.meta.pop(_ROWS_KEY, None)
            print_results(rows, report=report)

    return wrapper


def print_results(results: list[Any], *, report: bool = False) -> None:
    """Tables for what a command emitted (see the module docstring)."""
    if not results:
        return
    if report and len(results) == 1 and isinstance(results[0], dict):
        fields: list[tuple[str, Any]] = []
        subtables: list[tuple[str, list[dict[str, Any]]]] = []
        _flatten(results[0], "", fields, subtables)
        if fields:
            print_table(["field", "value"], [[name, _cell(v)] for name, v in fields])
        for n, (title, rows) in enumerate(subtables):
            if fields or n:
                click.echo("")
            _print_rows(rows, title)
        return
    _print_rows([r if isinstance(r, dict) else {"value": r} for r in results], None)


def _flatten(obj: dict[str, Any], prefix: str, fields: list[tuple[str, Any]],
             subtables: list[tuple[str, list[dict[str, Any]]]]) -> None:
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            _flatten(value, f"{name}.", fields, subtables)
        elif (isinstance(value, list) and value
              and all(isinstance(item, dict) for item in value)):
            subtables.append((name, value))
        else:
            fields.append((name, value))


def _print_rows(rows: list[dict[str, Any]], title: str | None) -> None:
    columns = list(dict.fromkeys(k for row in rows for k in row))
    print_table(columns, [[_cell(row.get(c)) for c in columns] for row in rows], title)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else _json(value)


def print_table(columns: list[str], rows: list[list[str]], title: str | None = None) -> None:
    """One table on stdout: ``rich`` on a terminal, plain padded text elsewhere (values whole)."""
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title, title_justify="left")
        for column in columns:
            table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(*row)
        Console().print(table)
        return
    # Off a terminal: no width to fit, so nothing is folded or cut. A newline inside a value
    # is written as \n to keep one row per line.
    cells = [[c.replace("\n", "\\n") for c in row] for row in [columns, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = [f"{title}:"] if title else []
    for n, row in enumerate(cells):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    click.echo("\n".join(lines))
