"""The ``stratamq`` data source against a running broker (``option("endpoints", "host:port")``),
for clusters whose executors cannot see the broker's disk.

Reads use the broker's offset-based RPCs (``stratamq/broker/server.py``):

* planning (driver): the topics come from the admin service's ``ListTopics`` (``QueryRoute``
  when the admin service is not there and ``topics`` is a plain list), each queue's bounds from
  ``QueryOffset`` ``BEGINNING`` / ``END``, ``startingTimestamp`` from ``QueryOffset``
  ``TIMESTAMP``. Splits are queue offset ranges, cut exactly as for a store directory.
* executors: ``PullMessage`` from the split's start, following ``next_offset`` to its end. The
  request asks for raw CommitLog records (metadata ``x-stratamq-pull-format: records``), which
  ``stratamq.spark.rows.records_to_batch`` decodes into the same Arrow rows a directory read
  gives, byte for byte. Records arrive concatenated, not at their CommitLog positions, so the
  stored physical offset of each is rewritten to its position in the batch buffer for the
  decoder's check, then ``commitlog_offset`` and ``msg_id`` are set back to the real ones.

Writes send each row with ``SendMessage`` (the generated stub), a batch of rows per request.
Delivery is at-least-once: a request that fails in transit is sent again, and a retried Spark
task sends its rows again.

TLS and ACL (``BrokerConnection``, from the options ``tls``, ``tlsCaFile``, ``accessKey``,
``secretKey``): every call, driver or executor, goes over a TLS channel when asked and is signed
afresh with ``stratamq.signature.auth_metadata`` (the broker refuses stamps older than its
``aclSignatureWindowSec``, so a signature cannot be made once at planning and reused). A refusal
(``UNAUTHORIZED`` / ``FORBIDDEN``, or the admin service's ``UNAUTHENTICATED`` /
``PERMISSION_DENIED``) is reported naming the options to fix; the secret key never appears in a
message or a repr.
"""

from __future__ import annotations

import json
import logging
import struct
import time
import uuid
from collections.abc import Iterator, Mapping

import grpc
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import InputPartition

from stratamq.client.connection import BrokerEndpoint, read_ca_pem, read_client_cert
from stratamq.names import GROUP_MAX_LENGTH, is_valid_name
from stratamq.record import PHYSICAL_OFFSET_POS, Message, Prop
from stratamq.spark.planning import OptionError, Queue, QueueSplit, bool_option, int_option

log = logging.getLogger(__name__)

PULL_BATCH = 1024  # the broker's maximum batch_size
BATCH_ROWS = 8192  # rows per Arrow batch
SEND_BATCH = 64  # rows per SendMessage request
RPC_TIMEOUT = 60.0  # seconds
PULL_FORMAT = ("x-stratamq-pull-format", "records")  # server.PULL_FORMAT_KEY / _RECORDS
PULL_GROUP = "stratamq-spark"  # the group PullMessage names (the ACL checks SUB on it)
_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 256 * 1024 * 1024),
                    ("grpc.max_send_message_length", 256 * 1024 * 1024)]
_RETRY_SEND = {"MASTER_PERSISTENCE_TIMEOUT", "SLAVE_PERSISTENCE_TIMEOUT", "HA_NOT_AVAILABLE",
               "TOO_MANY_REQUESTS", "INTERNAL_SERVER_ERROR", "PROXY_TIMEOUT"}
_OFFSET = struct.Struct(">q")
# Refusals: the messaging service answers with a Status code, the admin service with a gRPC one.
_UNAUTHENTICATED = {"UNAUTHORIZED", "UNAUTHENTICATED"}
_FORBIDDEN = {"FORBIDDEN", "PERMISSION_DENIED"}


class BrokerReadError(RuntimeError):
    """The broker answered a read with an error status."""


class BrokerUnreachable(BrokerReadError):
    """A pull's call to the broker failed (not an answer): a cluster read asks the group's
    current broker and goes on there (``cluster_read.read_group_split``)."""


def _pb():
    # Imported lazily: ``rocketmq`` sets up its client logging when imported.
    from rocketmq.grpc_protocol import definition_pb2, service_pb2, service_pb2_grpc

    return definition_pb2, service_pb2, service_pb2_grpc


def endpoint_of(options: Mapping[str, str]) -> str:
    """The broker's ``host:port`` from ``endpoints`` (lower-case keys); one address only."""
    raw = (options.get("endpoints") or "").strip()
    host, _, port = raw.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536 or ";" in raw or "," in raw:
        raise OptionError(f"option 'endpoints': want one broker address host:port, got {raw!r}")
    return raw


class BrokerConnection(BrokerEndpoint):
    """Where and how to reach the broker (``BrokerEndpoint``), with the Spark source's texts
    for refusals and failures.

    Made on the driver by ``connection_of`` and pickled to executors inside every split and the
    writer. The CA file is read on the driver, and its PEM content travels here, so
    executors need not see the file (a CA certificate is public). The secret key travels too:
    executors sign their own calls, and a signature is only good for the broker's signature
    window. It is left out of ``repr`` and of every message.
    """

    def __init__(self, endpoint: str, *, access_key: str | None = None,
                 secret_key: str | None = None, tls: bool = False, ca_pem: bytes | None = None,
                 ca_file: str | None = None,
                 client_cert: tuple[bytes, bytes] | None = None) -> None:
        super().__init__(endpoint, access_key=access_key, secret_key=secret_key, tls=tls,
                         ca_pem=ca_pem, ca_file=ca_file, channel_options=_CHANNEL_OPTIONS,
                         client_cert=client_cert)

    def refusal(self, code: str, message: str, doing: str) -> str | None:
        """The text for a broker's ACL refusal of ``doing``, naming the options to fix; None if
        ``code`` (a Status or gRPC code name) is not a refusal."""
        if code in _UNAUTHENTICATED:
            if not self.access_key:
                return (f"options 'accessKey' and 'secretKey': broker {self.endpoint} requires "
                        f"signed requests (aclEnable=true) and none were given; {doing} was "
                        f"refused: {code}: {message}")
            return (f"options 'accessKey' and 'secretKey': broker {self.endpoint} refused the "
                    f"signature of access key {self.access_key!r} ({doing}): {code}: {message}. "
                    "Check both keys (and the clocks: the broker refuses signatures older than "
                    "its aclSignatureWindowSec)")
        if code in _FORBIDDEN:
            who = (f"access key {self.access_key!r}" if self.access_key
                   else "an anonymous client")
            return (f"option 'accessKey': {who} may not do {doing} on broker {self.endpoint}: "
                    f"{code}: {message}. Use an account with that permission")
        return None

    def unreachable(self, exc: grpc.RpcError) -> str:
        """Text for a failed call, with a TLS hint when the connection itself failed."""
        code = exc.code()
        name = code.name if code is not None else "UNKNOWN"
        text = f"broker {self.endpoint} did not answer: {name}: {exc.details()}"
        if code is grpc.StatusCode.UNAVAILABLE:
            if self.tls:
                text += ("; with tls=true check that the broker serves TLS and that option "
                         "'tlsCaFile' names the CA that signed its certificate (without it, "
                         "gRPC's default roots) and that the certificate names this host")
            else:
                text += ("; if the broker serves TLS (tlsEnable=true), set option 'tls' to true "
                         "(and option 'tlsCaFile' for a private CA)")
        return text


def connection_of(options: Mapping[str, str]) -> BrokerConnection:
    """The broker connection the options describe (lower-case keys); OptionError names a bad
    one. Reads ``tlsCaFile`` here, on the driver (see ``BrokerConnection``)."""
    endpoint = endpoint_of(options)
    access_key = options.get("accesskey") or None
    secret_key = options.get("secretkey") or None
    if bool(access_key) != bool(secret_key):
        given, missing = (("accessKey", "secretKey") if access_key
                          else ("secretKey", "accessKey"))
        raise OptionError(f"option '{missing}': missing; option '{given}' is given, and "
                          "accessKey and secretKey must be given together")
    ca_file = (options.get("tlscafile") or "").strip() or None
    tls = bool_option(options, "tls", ca_file is not None)
    if ca_file and not tls:
        raise OptionError("option 'tls': false, but option 'tlsCaFile' is given (it implies "
                          "tls=true); drop one of them")
    ca_pem = _read_ca(ca_file) if ca_file else None
    client_cert = _client_cert(options)
    if client_cert is not None and not bool_option(options, "tls", True):
        raise OptionError("option 'tls': false, but option 'tlsCertFile' is given (it implies "
                          "tls=true); drop one of them")
    return BrokerConnection(endpoint, access_key=access_key, secret_key=secret_key,
                            tls=tls or client_cert is not None, ca_pem=ca_pem, ca_file=ca_file,
                            client_cert=client_cert)


def _client_cert(options: Mapping[str, str]) -> tuple[bytes, bytes] | None:
    """``tlsCertFile`` and ``tlsKeyFile``, read on the driver: presented to a broker that asks
    for a client certificate (tls.server.need.client.auth). The key's content travels to the
    executors with the connection, as the secret key does: each task connects on its own."""
    cert_file = (options.get("tlscertfile") or "").strip() or None
    key_file = (options.get("tlskeyfile") or "").strip() or None
    if bool(cert_file) != bool(key_file):
        given, missing = (("tlsCertFile", "tlsKeyFile") if cert_file
                          else ("tlsKeyFile", "tlsCertFile"))
        raise OptionError(f"option '{missing}': missing; option '{given}' is given, and "
                          "tlsCertFile and tlsKeyFile must be given together")
    if not cert_file or not key_file:
        return None
    try:
        return read_client_cert(cert_file, key_file)
    except ValueError as exc:
        raise OptionError(f"option 'tlsCertFile': {exc}") from None


def _read_ca(path: str) -> bytes:
    try:
        return read_ca_pem(path)
    except ValueError as exc:
        raise OptionError(f"option 'tlsCaFile': {exc}") from None


class BrokerSplit(InputPartition):
    """Queue offsets [start, end) of one topic/queue, pulled from the broker ``connection``."""

    def __init__(self, connection: BrokerConnection, topic: str, queue_id: int, start: int,
                 end: int, fail_on_data_loss: bool, group: str = PULL_GROUP) -> None:
        self.connection, self.topic, self.queue_id = connection, topic, queue_id
        self.start, self.end, self.fail_on_data_loss = start, end, fail_on_data_loss
        self.group = group

    @property
    def endpoint(self) -> str:
        return self.connection.endpoint

    @classmethod
    def of(cls, connection: BrokerConnection, split: QueueSplit,
           group: str = PULL_GROUP) -> BrokerSplit:
        return cls(connection, split.topic, split.queue_id, split.start, split.end,
                   split.fail_on_data_loss, group)



def pull_group(options: Mapping[str, str]) -> str:
    """The consumer group PullMessage names (option ``group``, lower-case keys). Pulls commit
    no offset, so the group only matters to the ACL: the account needs SUB on it."""
    group = options.get("group", PULL_GROUP)
    if not is_valid_name(group, GROUP_MAX_LENGTH):
        raise OptionError(f"option 'group': {group!r} is not a consumer group name (1 to 255 "
                          "of a-z A-Z 0-9 _ - % |)")
    return group


# -- planning (driver) --------------------------------------------------------------------------


class BrokerCatalog:
    """Topics and queue bounds of a running broker, asked over gRPC. Use as a context manager."""

    def __init__(self, connection: BrokerConnection,
                 options: Mapping[str, str] | None = None) -> None:
        pb, _svc, grpc_mod = _pb()
        self.connection = connection
        self.endpoint = connection.endpoint
        self.options = options or {}
        self._channel = connection.channel()
        self._stub = grpc_mod.MessagingServiceStub(self._channel)
        self._queue_counts: dict[str, int] | None = None
        self.cluster_endpoints: list[str] = []
        self.cluster_mastered: set[str] = set()  # groups whose chosen broker is their master

    def __enter__(self) -> BrokerCatalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self._channel.close()

    def _unreachable(self, exc: grpc.RpcError, doing: str) -> OptionError:
        code = exc.code()
        refused = self.connection.refusal(code.name if code is not None else "UNKNOWN",
                                          exc.details() or "", doing)
        return OptionError(refused or "option 'endpoints': " + self.connection.unreachable(exc))

    def _check_status(self, status, doing: str) -> None:
        """OptionError for an ACL refusal answered as a Status (planning: fix the options)."""
        pb, _, _ = _pb()
        refused = self.connection.refusal(pb.Code.Name(status.code), status.message, doing)
        if refused:
            raise OptionError(refused)

    def queue_counts(self) -> dict[str, int]:
        """topic -> queue count, from the admin service (``ListTopics``)."""
        if self._queue_counts is None:
            call = self._channel.unary_unary(
                "/stratamq.admin.v1.Admin/ListTopics",
                request_serializer=lambda obj: json.dumps(obj).encode(),
                response_deserializer=lambda data: json.loads(data.decode() or "{}"))
            try:
                reply = call({}, timeout=RPC_TIMEOUT, metadata=self.connection.metadata())
                self._queue_counts = {t["topic"]: int(t["queues"]) for t in reply["topics"]}
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    self._queue_counts = self._routes("cannot list its topics")
                elif exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                    # Listing needs an admin account; one that may only read or write some
                    # topics can still name them.
                    self._queue_counts = self._routes(
                        f"lets access key {self.connection.access_key!r} read the topics it "
                        "names but not list them (ListTopics needs an admin account)")
                else:
                    raise self._unreachable(exc, "ListTopics") from None
        return self._queue_counts

    def cluster_groups(self) -> list[tuple[str, BrokerConnection]] | None:
        """Each broker group of the cluster this broker belongs to (controller mode), with a
        connection to the group's master (a live slave while it has none), from the broker's
        ``ClusterStatus``; None for a broker outside a cluster."""
        call = self._channel.unary_unary(
            "/stratamq.admin.v1.Replication/ClusterStatus",
            request_serializer=lambda obj: json.dumps(obj).encode(),
            response_deserializer=lambda data: json.loads(data.decode() or "{}"))
        try:
            reply = call({}, timeout=RPC_TIMEOUT, metadata=self.connection.metadata())
        except grpc.RpcError as exc:
            code = exc.code()
            if code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNIMPLEMENTED):
                return None  # not in controller mode: the broker alone
            if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
                log.warning("broker %s does not let access key %r ask for its cluster "
                            "(ClusterStatus needs GET on Cluster): reading this broker only; "
                            "other broker groups of its cluster, if any, are not read",
                            self.endpoint, self.connection.access_key)
                return None
            raise self._unreachable(exc, "ClusterStatus") from None
        out = []
        # Every broker the status names: where a cluster read asks again when this one fails.
        self.cluster_endpoints = [str(b["endpoint"]) for g in reply.get("groups") or []
                                  for b in g.get("brokers") or [] if b.get("endpoint")]
        for group in reply.get("groups") or []:
            brokers = group.get("brokers") or []
            chosen = next((b for b in brokers if b.get("brokerId") == group.get("masterBrokerId")),
                          brokers[0] if brokers else None)
            if chosen is None or not chosen.get("endpoint"):
                raise OptionError(f"option 'endpoints': broker group {group.get('brokerName')!r} "
                                  f"of {self.endpoint}'s cluster has no live broker: its queues "
                                  "cannot be read now")
            if chosen.get("brokerId") == group.get("masterBrokerId"):
                self.cluster_mastered.add(str(group.get("brokerName")))
            out.append((str(group.get("brokerName")),
                        self.connection.at(str(chosen["endpoint"]))))
        return out

    def _routes(self, why: str) -> dict[str, int]:
        """Without the topic list, ``topics`` must name the topics: ask their routes."""
        pb, svc, _ = _pb()
        raw = self.options.get("topics", "")
        names = [t.strip() for t in raw.split(",") if t.strip()]
        if not names or any(not t.replace("_", "").replace("-", "").isalnum() for t in names):
            raise OptionError(f"option 'topics': broker {self.endpoint} {why}; give the topics "
                              "as a comma list")
        out = {}
        for name in names:
            try:
                reply = self._stub.QueryRoute(svc.QueryRouteRequest(
                    topic=pb.Resource(name=name)), timeout=RPC_TIMEOUT,
                    metadata=self.connection.metadata())
            except grpc.RpcError as exc:
                raise self._unreachable(exc, f"QueryRoute of topic {name!r}") from None
            self._check_status(reply.status, f"QueryRoute of topic {name!r}")
            if reply.status.code == pb.Code.OK:
                out[name] = len(reply.message_queues)
        return out

    def _offset(self, queue: Queue, policy: int, timestamp_ms: int | None = None) -> int:
        pb, svc, _ = _pb()
        req = svc.QueryOffsetRequest(message_queue=pb.MessageQueue(
            topic=pb.Resource(name=queue[0]), id=queue[1]), query_offset_policy=policy)
        if timestamp_ms is not None:
            req.timestamp.FromMilliseconds(timestamp_ms)
        doing = f"QueryOffset of {queue[0]}/{queue[1]}"
        try:
            reply = self._stub.QueryOffset(req, timeout=RPC_TIMEOUT,
                                           metadata=self.connection.metadata())
        except grpc.RpcError as exc:
            raise self._unreachable(exc, doing) from None
        self._check_status(reply.status, doing)
        if reply.status.code != pb.Code.OK:
            raise BrokerReadError(f"{doing} at {self.endpoint}: "
                                  f"{pb.Code.Name(reply.status.code)}: {reply.status.message}")
        return reply.offset

    def queues(self, topics: list[str] | None) -> dict[Queue, tuple[int, int]]:
        """(topic, queue id) -> (min offset, max offset) for ``topics`` (None: all)."""
        pb, _, _ = _pb()
        counts = self.queue_counts()
        out = {}
        for topic in sorted(counts if topics is None else topics):
            for qid in range(counts.get(topic, 0)):
                out[(topic, qid)] = (self._offset((topic, qid), pb.BEGINNING),
                                     self._offset((topic, qid), pb.END))
        return out

    def offsets_by_time(self, queues: list[Queue], timestamp_ms: int) -> dict[Queue, int]:
        pb, _, _ = _pb()
        return {q: self._offset(q, pb.TIMESTAMP, timestamp_ms) for q in queues}


# -- reading (executors) ------------------------------------------------------------------------


def read_broker_split(split: BrokerSplit) -> Iterator[pa.RecordBatch]:
    """Pull [start, end) of one queue and yield it as Arrow batches of the source's rows."""
    from stratamq.spark.reading import DataLoss

    pb, svc, grpc_mod = _pb()
    where = f"{split.topic}/{split.queue_id} at {split.endpoint}"
    with split.connection.channel() as chan:
        stub = grpc_mod.MessagingServiceStub(chan)
        offset = split.start
        pending: list[tuple[int, bytes]] = []
        while offset < split.end:
            status, records, next_offset = _pull(stub, split, offset, where)
            if status.code == pb.Code.OK:
                if not records and next_offset <= offset:
                    raise BrokerReadError(f"PullMessage {where} made no progress at {offset}")
                # Only the split's own offsets: on a queue with gaps (a compaction topic) a
                # pull of ``end - offset`` messages runs past ``end``, into the next split's.
                pending.extend(r for r in records if offset <= r[0] < split.end)
                offset = next_offset
            elif status.code == pb.Code.ILLEGAL_OFFSET and offset < next_offset:
                text = (f"{split.topic}/{split.queue_id}: messages at offsets [{offset}, "
                        f"{min(next_offset, split.end)}) cannot be read: retention deleted them "
                        f"(broker {split.endpoint}). Set failOnDataLoss=false to skip them "
                        "with a warning.")
                if split.fail_on_data_loss:
                    raise DataLoss(text)
                log.warning("%s (skipped: failOnDataLoss=false)", text)
                offset = next_offset
            else:
                refused = split.connection.refusal(
                    pb.Code.Name(status.code), status.message,
                    f"PullMessage of {split.topic}/{split.queue_id} (needs SUB on topic "
                    f"{split.topic!r} and on group {split.group!r})")
                raise BrokerReadError(refused or f"PullMessage {where} from offset {offset} "
                                      f"(reading up to {split.end}): "
                                      f"{pb.Code.Name(status.code)}: {status.message}")
            if len(pending) >= BATCH_ROWS:
                yield records_batch(pending, split)
                pending = []
        if pending:
            yield records_batch(pending, split)


def _pull(stub, split: BrokerSplit, offset: int, where: str):
    pb, svc, _ = _pb()
    req = svc.PullMessageRequest(
        group=pb.Resource(name=split.group),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=split.topic), id=split.queue_id),
        offset=offset, batch_size=min(PULL_BATCH, split.end - offset),
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"))
    status, records, next_offset = None, [], offset
    call = stub.PullMessage(req, metadata=split.connection.metadata(PULL_FORMAT),
                            timeout=RPC_TIMEOUT)
    try:
        for reply in call:
            kind = reply.WhichOneof("content")
            if kind == "status":
                status = reply.status
            elif kind == "message":
                m = reply.message
                records.append((m.system_properties.queue_offset, m.body))
            elif kind == "next_offset":
                next_offset = reply.next_offset
    except grpc.RpcError as exc:
        raise BrokerUnreachable(f"PullMessage {where}: "
                                f"{split.connection.unreachable(exc)}") from None
    if status is None:
        raise BrokerReadError(f"PullMessage {where}: the broker sent no status")
    if records and PULL_FORMAT not in tuple(call.initial_metadata() or ()):
        raise BrokerReadError(f"broker {split.endpoint} does not send raw records "
                              "(x-stratamq-pull-format); is it a StrataMQ broker?")
    return status, records, next_offset


def records_batch(records: list[tuple[int, bytes]], split: BrokerSplit) -> pa.RecordBatch:
    """Raw CommitLog records (with the queue offsets the broker said they have) as one batch."""
    batch = raw_records_batch([r for _, r in records])
    offsets = batch.column("queue_offset").to_pylist()
    want = [o for o, _ in records]
    if (batch.num_rows != len(records) or offsets != want
            or set(batch.column("topic").to_pylist()) != {split.topic}
            or set(batch.column("queue_id").to_pylist()) != {split.queue_id}):
        raise BrokerReadError(f"PullMessage {split.topic}/{split.queue_id} at {split.endpoint}: "
                              f"records do not match the queue offsets {want[0]}..{want[-1]}")
    return batch


def raw_records_batch(records: list[bytes]) -> pa.RecordBatch:
    """Whole CommitLog records taken out of their log (concatenated: a PullMessage reply, a
    tier CommitLog file) as one batch, with each record's own CommitLog offset and msg id."""
    from stratamq.spark.rows import records_to_batch

    buf = bytearray(b"".join(records))
    positions, real = [], []
    pos = 0
    for record in records:
        real.append(_OFFSET.unpack_from(record, PHYSICAL_OFFSET_POS)[0])
        _OFFSET.pack_into(buf, pos + PHYSICAL_OFFSET_POS, pos)
        positions.append(pos)
        pos += len(record)
    batch = records_to_batch(buf, positions, 0)
    if batch.num_rows != len(records):  # dropped transactional records: keep the others'
        kept = set(batch.column("commitlog_offset").to_pylist())
        real = [o for o, p in zip(real, positions, strict=True) if p in kept]
    physical = pa.array(real, pa.int64())
    # The offset message id ends in the record's physical offset as 16 hex digits.
    prefix = pc.utf8_slice_codeunits(batch.column("msg_id"), 0, -16)
    msg_id = pc.binary_join_element_wise(prefix, pa.array([f"{o:016X}" for o in real]), "")
    columns = batch.columns
    names = batch.schema.names
    columns[names.index("commitlog_offset")] = physical
    columns[names.index("msg_id")] = msg_id
    return pa.RecordBatch.from_arrays(columns, schema=batch.schema)


# -- writing (executors) ------------------------------------------------------------------------


def _to_pb(msg: Message):
    """A store ``Message`` from ``write.rows_to_messages`` as a SendMessage entry."""
    pb, _, _ = _pb()
    out = pb.Message(body=msg.body)
    out.topic.name = msg.topic
    sp = out.system_properties
    props = dict(msg.properties)
    if Prop.TAGS in props:
        sp.tag = props.pop(Prop.TAGS)
    if Prop.KEYS in props:
        sp.keys.extend(k for k in props.pop(Prop.KEYS).split(" ") if k)
    if Prop.MESSAGE_GROUP in props:
        sp.message_group = props.pop(Prop.MESSAGE_GROUP)
    if Prop.TIMER_DELIVER_MS in props:
        sp.delivery_timestamp.FromMilliseconds(int(props.pop(Prop.TIMER_DELIVER_MS)))
    # A client's message id: "01" + 32 hex digits, as the official clients make them.
    sp.message_id = props.pop(Prop.UNIQ_KEY, None) or "01" + uuid.uuid4().hex.upper()
    sp.born_timestamp.FromMilliseconds(msg.born_timestamp or int(time.time() * 1000))
    sp.born_host = "127.0.0.1"  # the broker records the connection's peer for the store host
    sp.body_encoding = pb.IDENTITY
    for key, value in props.items():
        out.user_properties[key] = value
    return out


class BrokerSender:
    """Sends messages to a broker ``SEND_BATCH`` at a time; retries what failed in transit."""

    def __init__(self, connection: BrokerConnection, options: Mapping[str, str]) -> None:
        _, _, grpc_mod = _pb()
        self.connection = connection
        self.endpoint = connection.endpoint
        self.retries = int_option(options, "sendRetries", 3, minimum=0) or 0
        self._channel = connection.channel()
        self._stub = grpc_mod.MessagingServiceStub(self._channel)
        self.buffer: list = []
        self.written = 0

    def add(self, messages: Iterator[Message]) -> None:
        for msg in messages:
            self.buffer.append(_to_pb(msg))
            if len(self.buffer) >= SEND_BATCH:
                self.flush()

    def flush(self) -> None:
        pb, svc, _ = _pb()
        todo, self.buffer = self.buffer, []
        attempt = 0
        while todo:
            try:
                reply = self._stub.SendMessage(svc.SendMessageRequest(messages=todo),
                                               timeout=RPC_TIMEOUT,
                                               metadata=self.connection.metadata())
            except grpc.RpcError as exc:
                retry = exc.code() in (grpc.StatusCode.UNAVAILABLE,
                                       grpc.StatusCode.DEADLINE_EXCEEDED)
                if not retry or attempt >= self.retries:
                    raise RuntimeError(f"SendMessage failed: {self.connection.unreachable(exc)} "
                                       f"({self.written} messages sent by this task)") from None
                attempt += 1
                time.sleep(0.2 * 2**attempt)
                continue
            entries = list(reply.entries)
            if len(entries) != len(todo):  # a request-level refusal (one status, no entries)
                entries = [reply] * len(todo)
            again = []
            for msg, entry in zip(todo, entries):
                code = pb.Code.Name(entry.status.code)
                if entry.status.code == pb.Code.OK:
                    self.written += 1
                elif code in _RETRY_SEND and attempt < self.retries:
                    again.append(msg)
                else:
                    refused = self.connection.refusal(
                        code, entry.status.message,
                        f"SendMessage to topic {msg.topic.name!r} (needs PUB on it)")
                    raise RuntimeError((refused or f"broker {self.endpoint} refused a message "
                                        f"to topic {msg.topic.name!r}: {code}: "
                                        f"{entry.status.message}")
                                       + f" ({self.written} messages sent by this task)")
            todo = again
            if todo:
                attempt += 1
                time.sleep(0.2 * 2**attempt)

    def close(self) -> None:
        self._channel.close()


def send_batches(connection: BrokerConnection, options: Mapping[str, str],
                 batches: Iterator[pa.RecordBatch]) -> int:
    """Send every row of ``batches`` to the broker; returns how many it accepted."""
    from stratamq.spark.write import rows_to_messages

    sender = BrokerSender(connection, options)
    try:
        default_topic = options.get("topic")
        for batch in batches:
            sender.add(rows_to_messages(batch, default_topic))
        sender.flush()
        return sender.written
    finally:
        sender.close()
