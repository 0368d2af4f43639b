"""``stratamq cluster status``: each broker group of a cluster on etcd, one JSON line each;
``stratamq cluster elect``: a planned switch of a group's master (RocketMQ's ``electMaster``).

Both read etcd directly (``--etcd`` URLs, with ``--cluster`` or ``--etcd-prefix``) or through
any broker of the cluster (``--endpoint``, with the ACL keys and ``--tls`` / ``--tls-ca-file``
/ ``--tls-cert-file`` / ``--tls-key-file`` as every admin command takes them). The line's
shape is in ``stratamq/cluster/status.py``.
"""

from __future__ import annotations

from typing import Any

import click

from stratamq.cli.admin import Connection, optional_endpoint_option
from stratamq.cli.app import main
from stratamq.cli.common import emit, output_option


def _where(fn: Any) -> Any:
    """``--endpoint`` (with the ACL keys and TLS options of every admin command, through the
    same code) or ``--etcd`` with ``--cluster`` / ``--etcd-prefix``."""
    options = [
        optional_endpoint_option("Any broker of the cluster, HOST:PORT."),
        click.option("--etcd", "etcd", default=None,
                     help="etcd members' client URLs, comma-separated (as etcdEndpoints)."),
        click.option("--cluster", "cluster_name", default="DefaultCluster", show_default=True,
                     help="brokerClusterName (with --etcd)."),
        click.option("--etcd-prefix", default="",
                     help="etcdPrefix, if the brokers set one (default /stratamq/<cluster>)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _check(endpoint: Connection | None, etcd: str | None) -> None:
    if (endpoint is not None) == bool(etcd):
        raise click.UsageError("give exactly one of --endpoint (a broker) and --etcd (URLs)")


def _etcd(etcd: str, cluster_name: str, etcd_prefix: str) -> tuple[Any, str]:
    from stratamq.cluster.etcd import EtcdCoordination

    try:
        coord = EtcdCoordination(etcd)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--etcd") from None
    return coord, (etcd_prefix or f"/stratamq/{cluster_name}").rstrip("/")


def _via_broker(conn: Any, method: str, **request: object) -> dict:
    """``method`` of the replication service on the broker ``conn`` (a ``Connection``) names,
    reached as it says (keys, TLS)."""
    from stratamq.broker.replication import SERVICE
    from stratamq.client.admin import AdminClient, AdminError

    with AdminClient(conn) as client:
        try:
            return client.call_service(SERVICE, method, **request)
        except AdminError as exc:
            raise click.ClickException(str(exc)) from None


@main.group()
def cluster() -> None:
    """A cluster of broker groups on etcd (enableControllerMode)."""


@cluster.command("status")
@_where
@output_option
def cluster_status(endpoint: Connection | None, etcd: str | None, cluster_name: str,
                   etcd_prefix: str) -> None:
    """One JSON line per broker group: master, epoch, SyncStateSet and brokers."""
    from stratamq.cluster.coordination import CoordinationError
    from stratamq.cluster.status import group_status

    _check(endpoint, etcd)
    if endpoint is not None:
        groups = _via_broker(endpoint, "ClusterStatus")["groups"]
    else:
        assert etcd is not None
        coord, prefix = _etcd(etcd, cluster_name, etcd_prefix)
        try:
            groups = group_status(coord, prefix, cluster_name)
        except CoordinationError as exc:
            raise click.ClickException(str(exc)) from None
        finally:
            coord.close()
    for group in groups:
        emit(group)


@cluster.command("elect")
@click.option("--broker-name", required=True, help="The broker group (brokerName).")
@click.option("--broker-id", type=int, default=None,
              help="The broker to make master (default: the policy's choice, which keeps a "
                   "live master).")
@_where
def cluster_elect(broker_name: str, broker_id: int | None, endpoint: Connection | None,
                  etcd: str | None, cluster_name: str, etcd_prefix: str) -> None:
    """Switch a group's master to --broker-id (planned; nothing acknowledged is lost): the
    master stops taking writes, the chosen broker of its SyncStateSet takes over at the next
    epoch. Prints the group's status line once done."""
    from stratamq.cluster.coordination import CoordinationError
    from stratamq.cluster.status import ElectError, request_election

    _check(endpoint, etcd)
    if endpoint is not None:
        emit(_via_broker(endpoint, "ClusterElect", brokerName=broker_name,
                         brokerId=broker_id))
        return
    assert etcd is not None
    coord, prefix = _etcd(etcd, cluster_name, etcd_prefix)
    try:
        emit(request_election(coord, prefix, cluster_name, broker_name, broker_id))
    except (ElectError, CoordinationError) as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        coord.close()


def create_topic_everywhere(conn: Any, cluster_name: str, request: dict[str, Any]
                            ) -> list[dict[str, Any]]:
    """``topic create --cluster``: CreateTopic on the master of every broker group of the
    cluster that the broker at ``conn`` belongs to (RocketMQ's ``updateTopic -c``). One result
    per group, ``{"brokerName", "endpoint", "topic"}`` or ``{"brokerName", "error"}``."""
    from stratamq.client.admin import AdminClient, AdminError

    status = _via_broker(conn, "ClusterStatus")
    groups = [g for g in status["groups"] if g["cluster"] == cluster_name]
    if not groups:
        raise click.ClickException(f"the broker at {conn.endpoint} knows no broker group of "
                                   f"cluster {cluster_name!r} (is it in controller mode?)")
    out = []
    for g in groups:
        master = next((b for b in g["brokers"] if b["brokerId"] == g["masterBrokerId"]), None)
        if master is None:
            out.append({"brokerName": g["brokerName"], "error": "no master elected"})
            continue
        try:
            with AdminClient(conn.at(master["endpoint"])) as client:
                topic = client.call("CreateTopic", **request)["topic"]
            out.append({"brokerName": g["brokerName"], "endpoint": master["endpoint"],
                        "topic": topic})
        except (AdminError, OSError) as exc:
            out.append({"brokerName": g["brokerName"], "endpoint": master["endpoint"],
                        "error": str(exc)})
    return out
