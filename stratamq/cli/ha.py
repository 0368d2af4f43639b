"""``stratamq ha status``: a running broker's replication state, as one JSON object;
``stratamq ha reseed``: clear a stopped slave's log to follow a master of another lineage.

The object is RocketMQ's ``HARuntimeInfo`` (``haAdmin`` shows the same): on a master
``master: true``, ``masterCommitLogMaxOffset``, ``inSyncSlaveNums`` and per slave in
``haConnectionInfo`` its ``addr``, ``slaveAckOffset``, ``diff`` (bytes behind), ``lagMs``
(age of the oldest message it does not have), ``inSync``, ``transferredByteInSecond`` and
``transferFromWhere``; on a slave ``haClientRuntimeInfo`` (``masterAddr``, ``state``,
``maxOffset``, ``behindBytes``, ``lastError``, ``lastTruncation``: what the last cut of its log
removed, ``masterLineage``) plus ``masterReachable`` and ``stateSync``. Both carry ``role``,
``epochs``, ``storeId``, ``lineage`` (the store's CommitLog's, ``stratamq/store/identity.py``) and
``lineageMismatch`` (a slave refusing a master of another lineage: see ``ha reseed``).
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


@ha.command("reseed")
@click.option("--store", "store_dir", required=True, type=click.Path(file_okay=False),
              help="The stopped slave's store directory.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (scripts).")
def ha_reseed(store_dir: str, yes: bool) -> None:
    """Discard a stopped slave's CommitLog so it follows its master again.

    For a slave that refuses its master because the master's store is of another lineage
    (`ha status`: lineageMismatch; the master's store was wiped or replaced). Says what goes
    (bytes, messages, topics) and asks first; prints what it discarded as JSON."""
    import os
    from pathlib import Path

    from stratamq.cli.common import store_config
    from stratamq.ha import reseed
    from stratamq.store.layout import StoreLayout
    from stratamq.store.message_store import StoreLocked, lock_store

    root = Path(store_dir)
    if not (root / "commitlog").is_dir():
        raise click.ClickException(f"no store at {root}: it has no commitlog/ directory")
    try:
        fd = lock_store(StoreLayout(root))
    except StoreLocked as exc:
        raise click.ClickException(f"{exc} (a running broker?): stop it first") from None
    try:
        config = store_config(root)
        try:
            what = reseed.plan(config)
        except (OSError, ValueError, RuntimeError) as exc:
            raise click.ClickException(f"cannot read store {root}: {exc}") from None
        click.echo(what.describe(), err=True)
        if not yes and not click.confirm("Discard them?", err=True):
            raise click.ClickException("nothing discarded")
        reseed.apply(config, what)
        emit({"discarded": what.as_dict()})
    finally:
        os.close(fd)
