"""``stratamq ha status``: a running broker's replication state, as one JSON object.

The object is RocketMQ's ``HARuntimeInfo`` (``haAdmin`` shows the same): on a master
``master: true``, ``masterCommitLogMaxOffset``, ``inSyncSlaveNums`` and per slave in
``haConnectionInfo`` its ``addr``, ``slaveAckOffset``, ``diff`` (bytes behind), ``lagMs``
(age of the oldest message it does not have), ``inSync``, ``transferredByteInSecond`` and
``transferFromWhere``; on a slave ``haClientRuntimeInfo`` (``masterAddr``, ``state``,
``maxOffset``, ``behindBytes``, ``lastError``, ``lastTruncation``: what the last cut of its log
removed) plus ``masterReachable`` and ``stateSync``. Both carry ``role`` and ``epochs``.
"""

from __future__ import annotations

import click

from stratamq.cli.admin import Connection, endpoint_option
from stratamq.cli.app import main
from stratamq.cli.common import emit, output_option


@main.group()
def ha() -> None:
    """Master/slave replication of a running broker."""


@ha.command("status")
@endpoint_option
@output_option(report=True)
def ha_status(endpoint: Connection) -> None:
    """Replication state and lag of the broker at --endpoint (JSON; --output table)."""
    from stratamq.broker.replication import SERVICE
    from stratamq.client.admin import AdminClient, AdminError

    with AdminClient(endpoint) as client:
        try:
            emit(client.call_service(SERVICE, "HaStatus"))
        except AdminError as exc:
            raise click.ClickException(str(exc)) from None
