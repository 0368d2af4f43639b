"""``stratamq topic ...`` and ``stratamq group ...`` against a running broker (JSON output).

Every command takes ``--endpoint`` and, for a broker with ``aclEnable=true``, ``--access-key``
/ ``--secret-key`` (or ``STRATAMQ_ACCESS_KEY`` / ``STRATAMQ_SECRET_KEY``): requests are then
signed as the official clients sign theirs; for a broker with ``tlsEnable=true``, ``--tls``
(gRPC's default roots) or ``--tls-ca-file PEM``, and ``--tls-cert-file PEM --tls-key-file PEM``
for one that requires client certificates (``tls.server.need.client.auth=require``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import click

from stratamq.cli.app import main
from stratamq.cli.broker import broker
from stratamq.cli.common import TIME, emit, output_option
from stratamq.client.connection import BrokerEndpoint, read_ca_pem, read_client_cert

TYPES = click.Choice(["NORMAL", "FIFO", "DELAY", "TRANSACTION"], case_sensitive=False)


def _check_endpoint(_ctx: click.Context, _param: click.Parameter,
                    value: str | None) -> str | None:
    from stratamq.client.admin import check_endpoint

    if value is None:
        return None
    try:
        return check_endpoint(value)
    except ValueError:
        raise click.BadParameter(f"must be HOST:PORT with a port 1..65535, not {value!r}") from None


def endpoint_option(fn: Callable) -> Callable:
    """``--endpoint`` plus the ACL credentials and TLS options; passes one ``Connection`` as
    ``endpoint``."""
    return _endpoint_options(required=True, help_text="Broker HOST:PORT.")(fn)


def optional_endpoint_option(help_text: str) -> Callable[[Callable], Callable]:
    """As ``endpoint_option`` for a command that may reach its data another way (``cluster
    status --etcd``): ``endpoint`` is None when ``--endpoint`` is not given."""
    return _endpoint_options(required=False, help_text=help_text)


def _endpoint_options(*, required: bool, help_text: str) -> Callable[[Callable], Callable]:
    def decorate(fn: Callable) -> Callable:
        @click.option("--endpoint", required=required, default=None, callback=_check_endpoint,
                      help=help_text)
        @click.option("--access-key", envvar="STRATAMQ_ACCESS_KEY", default=None,
                      help="Access key to sign requests with (broker with aclEnable=true); "
                           "env STRATAMQ_ACCESS_KEY.")
        @click.option("--secret-key", envvar="STRATAMQ_SECRET_KEY", default=None,
                      help="Secret key of --access-key; env STRATAMQ_SECRET_KEY.")
        @click.option("--tls", is_flag=True, default=False,
                      help="Connect over TLS (a broker with tlsEnable=true), trusting gRPC's "
                           "default roots.")
        @click.option("--tls-ca-file", default=None,
                      help="PEM file of the CA(s) that signed the broker's certificate "
                           "(implies --tls).")
        @click.option("--tls-cert-file", default=None,
                      help="PEM certificate chain to present to a broker that asks for one "
                           "(tls.server.need.client.auth; implies --tls; with "
                           "--tls-key-file).")
        @click.option("--tls-key-file", default=None, help="PEM private key of --tls-cert-file.")
        @functools.wraps(fn)
        def wrapper(endpoint: str | None, access_key: str | None, secret_key: str | None,
                    tls: bool, tls_ca_file: str | None, tls_cert_file: str | None,
                    tls_key_file: str | None, **kwargs: object) -> None:
            if endpoint is None:
                return fn(endpoint=None, **kwargs)
            return fn(endpoint=_connect(endpoint, access_key, secret_key, tls, tls_ca_file,
                                        tls_cert_file, tls_key_file), **kwargs)

        return wrapper

    return decorate


def _connect(endpoint: str, access_key: str | None, secret_key: str | None, tls: bool,
             tls_ca_file: str | None, tls_cert_file: str | None,
             tls_key_file: str | None) -> Connection:
    if bool(access_key) != bool(secret_key):
        raise click.UsageError("--access-key and --secret-key must be given together "
                               "(or STRATAMQ_ACCESS_KEY and STRATAMQ_SECRET_KEY)")
    if bool(tls_cert_file) != bool(tls_key_file):
        raise click.UsageError("--tls-cert-file and --tls-key-file must be given together")
    try:
        conn = Connection(endpoint, access_key, secret_key, tls=tls, ca_file=tls_ca_file)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--tls-ca-file") from None
    if tls_cert_file and tls_key_file:
        try:
            conn.client_cert = read_client_cert(tls_cert_file, tls_key_file)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--tls-cert-file") from None
        conn.tls = True
    return conn


class Connection(BrokerEndpoint):
    """Where and as whom to call the broker (``--endpoint``, ``--access-key``, ``--tls``...).
    ``ca_file`` (PEM) implies TLS; ValueError when it cannot be read or holds no PEM."""

    def __init__(self, endpoint: str, access_key: str | None, secret_key: str | None, *,
                 tls: bool = False, ca_file: str | None = None) -> None:
        super().__init__(endpoint, access_key=access_key, secret_key=secret_key,
                         tls=tls or bool(ca_file), ca_file=ca_file,
                         ca_pem=read_ca_pem(ca_file) if ca_file else None)


def _call(conn: Connection, method: str, **request: object) -> dict:
    from stratamq.client.admin import AdminClient, AdminError

    with AdminClient(conn) as client:
        try:
            return client.call(method, **request)
        except AdminError as exc:
            raise click.ClickException(str(exc)) from None


def _attributes(_ctx: click.Context, _param: click.Parameter,
                values: tuple[str, ...]) -> dict[str, str]:
    """``NAME=VALUE`` pairs (RocketMQ's ``+NAME=VALUE`` too) as a dict."""
    out: dict[str, str] = {}
    for value in values:
        name, sep, text = value.partition("=")
        name = name.strip().lstrip("+")
        if not sep or not name:
            raise click.BadParameter(f"must be NAME=VALUE, not {value!r}")
        out[name] = text.strip()
    return out


@main.group()
def topic() -> None:
    """Create, change, delete and list topics of a running broker."""


@topic.command("create")
@endpoint_option
@click.option("--topic", "name", required=True, help="Name of the new topic.")
@click.option("--queues", type=int, default=8, show_default=True,
              help="Read and write queues (1..1024).")
@click.option("--type", "mtype", type=TYPES, default="NORMAL", show_default=True,
              help="The only message type the topic accepts.")
@click.option("--attribute", "attributes", multiple=True, callback=_attributes,
              metavar="NAME=VALUE",
              help="A topic attribute (repeatable): cleanup.policy=COMPACTION makes a "
                   "compaction topic (the latest value per key); delete.retention.ms=MS how "
                   "long its tombstones stay (default 86400000).")
@click.option("--cluster", "cluster_name", default=None,
              help="Create it on the master of every broker group of this cluster (controller "
                   "mode; mqadmin updateTopic -c); --endpoint is any broker of it. One JSON "
                   "line per group.")
def topic_create(endpoint: Connection, name: str, queues: int, mtype: str,
                 attributes: dict[str, str], cluster_name: str | None) -> None:
    """Create a topic; fails if it exists."""
    request = {"topic": name, "queues": queues, "type": mtype.upper(), "attributes": attributes}
    if cluster_name:
        from stratamq.cli.cluster import create_topic_everywhere

        results = create_topic_everywhere(endpoint, cluster_name, request)
        for line in results:
            emit(line)
        failed = [r["brokerName"] for r in results if "error" in r]
        if failed:
            raise click.ClickException(f"not created on {', '.join(failed)}")
        return
    emit(_call(endpoint, "CreateTopic", **request)["topic"])


@topic.command("update")
@endpoint_option
@click.option("--topic", "name", required=True, help="The topic to change.")
@click.option("--queues", type=int, default=None, help="Read and write queue count.")
@click.option("-r", "--read-queues", type=int, default=None,
              help="Queues consumers read (mqadmin updateTopic -r).")
@click.option("-w", "--write-queues", type=int, default=None,
              help="Queues producers write (mqadmin updateTopic -w).")
@click.option("--type", "mtype", type=TYPES, default=None, help="Message type.")
@click.option("--force", is_flag=True, default=False,
              help="Shrink read queues even though they hold unconsumed messages.")
@click.option("--attribute", "attributes", multiple=True, callback=_attributes,
              metavar="NAME=VALUE",
              help="Change a topic attribute (repeatable), e.g. delete.retention.ms=3600000.")
def topic_update(endpoint: Connection, name: str, queues: int | None, read_queues: int | None,
                 write_queues: int | None, mtype: str | None, force: bool,
                 attributes: dict[str, str]) -> None:
    """Change a topic's queue counts or message type. To remove queues without losing
    messages: shrink the write queues, let consumers drain, then the read queues."""
    emit(_call(endpoint, "UpdateTopic", topic=name, queues=queues, read_queues=read_queues,
               write_queues=write_queues, force=force,
               type=mtype.upper() if mtype else None, attributes=attributes or None)["topic"])


@topic.command("delete")
@endpoint_option
@click.option("--topic", "name", required=True, help="The topic to delete.")
def topic_delete(endpoint: Connection, name: str) -> None:
    """Delete a topic with its messages and consumer state (a topic created again under the
    name starts empty)."""
    emit(_call(endpoint, "DeleteTopic", topic=name))


@topic.command("list")
@endpoint_option
@output_option
def topic_list(endpoint: Connection) -> None:
    """One JSON line per topic."""
    for t in _call(endpoint, "ListTopics")["topics"]:
        emit(t)


@main.group()
def group() -> None:
    """Consumer groups of a running broker and their progress."""


@group.command("create")
@endpoint_option
@click.option("--group", "name", required=True, help="Name of the new consumer group.")
@click.option("--retry-max-times", type=int, default=None,
              help="Deliveries after the first before %DLQ% (default retryMaxTimes, 16).")
@click.option("--orderly/--no-orderly", default=False, help="Consume in FIFO order.")
def group_create(endpoint: Connection, name: str, retry_max_times: int | None,
                 orderly: bool) -> None:
    """Create a consumer group; fails if it exists."""
    emit(_call(endpoint, "CreateGroup", group=name, retry_max_times=retry_max_times,
               orderly=orderly)["group"])


@group.command("list")
@endpoint_option
@output_option
def group_list(endpoint: Connection) -> None:
    """One JSON line per group."""
    for g in _call(endpoint, "ListGroups")["groups"]:
        emit(g)


@group.command("progress")
@endpoint_option
@click.option("--group", "name", required=True, help="The consumer group.")
@output_option(report=True)
def group_progress(endpoint: Connection, name: str) -> None:
    """Per-queue max offset, consumed offset, in-flight count and lag, as one JSON object."""
    emit(_call(endpoint, "GroupProgress", group=name))


@group.command("update")
@endpoint_option
@click.option("--group", "name", required=True, help="The consumer group to change.")
@click.option("--retry-max-times", type=int, default=None,
              help="Deliveries after the first before %DLQ%.")
@click.option("--orderly/--no-orderly", default=None, help="Consume in FIFO order, or not.")
def group_update(endpoint: Connection, name: str, retry_max_times: int | None,
                 orderly: bool | None) -> None:
    """Change a consumer group's retry policy or ordering."""
    emit(_call(endpoint, "UpdateGroup", group=name, retry_max_times=retry_max_times,
               orderly=orderly)["group"])


@group.command("delete")
@endpoint_option
@click.option("--group", "name", required=True, help="The consumer group to delete.")
def group_delete(endpoint: Connection, name: str) -> None:
    """Delete a consumer group."""
    emit(_call(endpoint, "DeleteGroup", group=name))


@group.command("reset-offset")
@endpoint_option
@click.option("--group", "name", required=True, help="The consumer group.")
@click.option("--topic", required=True, help="The topic whose offsets move.")
@click.option("--timestamp", type=TIME, required=True,
              help="Move to the first message stored at or after this time (epoch ms or ISO "
                   "8601); 0 is the earliest retained message.")
@output_option(report=True)
def group_reset_offset(endpoint: Connection, name: str, topic: str, timestamp: int) -> None:
    """Move the group's position in every queue of the topic to a point in time, as
    mqadmin resetOffsetByTime and kafka-consumer-groups --reset-offsets --to-datetime do.
    Messages in flight to the group are dropped from its state."""
    emit(_call(endpoint, "ResetOffset", group=name, topic=topic, timestamp=timestamp))


@topic.command("route")
@endpoint_option
@click.option("--topic", "name", required=True, help="The topic.")
@output_option(report=True)
def topic_route(endpoint: Connection, name: str) -> None:
    """The topic's route as clients get it: broker, endpoint, each queue's permission (on a
    slave whose master is down: itself, read-only)."""
    emit(_call(endpoint, "TopicRoute", topic=name))


@topic.command("status")
@endpoint_option
@click.option("--topic", "name", required=True, help="The topic.")
@output_option(report=True)
def topic_status(endpoint: Connection, name: str) -> None:
    """Per queue: min and max offset and the last store time (mqadmin topicStatus)."""
    emit(_call(endpoint, "TopicStatus", topic=name))


@broker.command("status")
@endpoint_option
@output_option(report=True)
def broker_status(endpoint: Connection) -> None:
    """Version, role, uptime, disk, dispatch lag, connections and store identity of a running
    broker."""
    emit(_call(endpoint, "BrokerStatus"))
