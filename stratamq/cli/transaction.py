"""``stratamq transaction list``: the open transactions of a running broker."""

from __future__ import annotations

from stratamq.cli.admin import Connection, _call, endpoint_option
from stratamq.cli.app import main
from stratamq.cli.common import emit_rows, output_option


@main.group()
def transaction() -> None:
    """Transactional messages of a running broker."""


@transaction.command("list")
@endpoint_option
@output_option
def transaction_list(endpoint: Connection) -> None:
    """Open half messages, oldest first, one JSON line each (``--output table``: a table):
    transaction_id, topic, age_ms, checks (so far), producer_group, half_offset (CommitLog
    offset of its latest copy)."""
    emit_rows(_call(endpoint, "ListTransactions")["transactions"])
