"""Reading a cluster on etcd through one broker's endpoint (issue 28).

A broker in controller mode names every broker group of its cluster (``ClusterStatus``, via
``BrokerCatalog.cluster_groups``): each group's master, or a live slave while it has none.

Batch (``plan_cluster``): queue ids repeat across groups, so ``startingOffsets`` /
``endingOffsets`` name the group, ``{"topic": {"<brokerName>/<queueId>": offset}}``, and the
options naming plain queue ids are refused rather than applied to every group's queue of that
id. Topics and offsets are checked against the whole cluster (a group the cluster lacks:
``failOnDataLoss``, as a stream's group that left); then each group is planned at its own
broker with the offsets naming it, as queue ids, and its splits (``GroupSplit``) pull from
there. A topic only some groups have is read from those.

Streaming (``ClusterStream``, which ``StreamReader`` hands a cluster endpoint to): offsets
name the group, ``{"topic": {"<brokerName>/<queueId>": next offset}}``, and so may
``startingOffsets`` (a group the cluster lacks there: ``failOnDataLoss``, as in a batch
read). A queue's offsets are the same on its group's master and slaves (the CommitLog is
replicated byte for byte), so every micro-batch asks the cluster status again and
its splits pull from the group's broker of that moment; a split whose broker stops answering
asks again and goes on from the offset it reached (``read_group_split``), so a failover
between or during micro-batches repeats and loses nothing. A group that registers later is
read from its queues' beginnings (as spark-sql-kafka reads new partitions); a group that
leaves the status fails the query (``failOnDataLoss=true``) or is skipped with a warning, its
offsets kept; so does a queue whose group's master ends before the offsets read (a log cut at
a failover under messages the stream had read). Offsets without a group (``"queueId"``: a
checkpoint written before this, or by a broker outside a cluster) are taken as the group's
while the cluster has one group, and refused, naming the fix, once it has several.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from stratamq.spark import planning
from stratamq.spark.broker_io import (
    BrokerCatalog,
    BrokerConnection,
    BrokerReadError,
    BrokerSplit,
    BrokerUnreachable,
    connection_of,
    pull_group,
    read_broker_split,
)
from stratamq.spark.planning import EARLIEST, OptionError
from stratamq.spark.reading import DataLoss
from stratamq.transactions.messages import HALF_TOPIC

if TYPE_CHECKING:
    from pyspark.sql.datasource import InputPartition

__all__ = ["ClusterStream", "GroupSplit", "cluster_queue_ids", "names_groups", "plan_cluster",
           "read_group_split", "without_group_offsets"]

log = logging.getLogger(__name__)

_OFFSETS_OPTIONS = (("startingOffsets", "earliest"), ("endingOffsets", "latest"))
# Options naming plain queue ids, refused on a cluster of several groups (ids repeat there).
_QUEUE_ID_OPTIONS = ("startingOffsetsByTimestamp", "endingOffsetsByTimestamp", "assign")
# How long a split whose broker stopped answering waits for its group to name another one (a
# failover takes about a lease: etcdLeaseTtlMs, then the election).
FAILOVER_WAIT_S = 60.0
# A queue of a cluster stream: (topic, "<brokerName>/<queueId>").
GroupQueue = tuple[str, str]


def plan_cluster(options: dict[str, str], entry: BrokerConnection,
                 groups: list[tuple[str, BrokerConnection]], peers: list[str],
                 catalog_of: Callable[[dict[str, str]], Any],
                 plan_queues: Callable[[dict[str, str], BrokerCatalog, None],
                                       list[InputPartition]]) -> list[InputPartition]:
    """The splits of a batch read of every group of ``entry``'s cluster (``catalog_of``: a
    ``BrokerCatalog`` for options; ``plan_queues``: the source's planning at one broker;
    ``peers``: every broker the cluster status named, where a split asks for its group's
    broker again). Topics and offsets are checked against the whole cluster; then each group
    is planned at its own broker with the offsets naming it, as queue ids."""
    names = [name for name, _c in groups]
    if len(groups) > 1:
        for name in _QUEUE_ID_OPTIONS:
            if (options.get(name.lower()) or "").strip():
                raise OptionError(f"option '{name}': names queue ids, but {entry.endpoint} is a "
                                  f"broker of a cluster of {len(groups)} broker groups, whose "
                                  "queue ids repeat; select topics with option 'topics' (and "
                                  "offsets with startingOffsets/endingOffsets {\"topic\": "
                                  "{\"<brokerName>/<queueId>\": offset}})")
    fail = planning.bool_option(options, "failOnDataLoss", True)
    specs = {name: _placed_offsets(options, name, default, names, entry.endpoint)
             for name, default in _OFFSETS_OPTIONS}
    specs = _without_absent_groups(specs, names, entry.endpoint, fail)
    at_peers = _peer_connections(entry, peers)
    splits: list[InputPartition] = []
    with contextlib.ExitStack() as stack:
        catalogs = {name: stack.enter_context(catalog_of({**options, "endpoints": c.endpoint}))
                    for name, c in groups}
        counts = {name: catalog.queue_counts() for name, catalog in catalogs.items()}
        known = sorted({t for c in counts.values() for t in c} - {HALF_TOPIC})
        topics = planning.select_topics(options, known, must_match=True,
                                        offsets=list(specs.values()))
        selected = topics if topics is not None else known
        # "<brokerName>/<queueId>" where check_offsets has queue ids (same code, other key).
        existing: dict[str, Any] = {
            t: [f"{name}/{q}" for name in names for q in range(counts[name].get(t, 0))]
            for t in known}
        for name, spec in specs.items():
            planning.check_offsets(spec, name, selected, existing)
        for group, connection in groups:
            has = [t for t in selected if t in counts[group]]
            if not has:
                continue  # a topic of some groups only is read from those
            at = {**options, "endpoints": connection.endpoint, "topics": ",".join(has)}
            for name, spec in specs.items():
                if isinstance(spec, dict):
                    at[name.lower()] = json.dumps(_of_group(spec, group, has))
            try:
                planned = plan_queues(at, catalogs[group], None)
            except DataLoss as exc:  # (a queue's messages named by plain ids: add the group)
                raise DataLoss(f"broker group {group} ({connection.endpoint}): {exc}") from None
            except OptionError as exc:
                raise OptionError(f"broker group {group} ({connection.endpoint}): {exc}"
                                  ) from None
            # Each split asks for its group's broker again if this one stops answering.
            splits += [GroupSplit(s.connection, s.topic, s.queue_id, s.start, s.end,
                                  s.fail_on_data_loss, s.group, broker_group=group,
                                  peers=at_peers)
                       if isinstance(s, BrokerSplit) else s for s in planned]
    return splits


def _placed_offsets(options: Mapping[str, str], name: str, default: str, groups: list[str],
                    endpoint: str) -> str | dict[str, dict[str, int]]:
    """A batch read's offsets option with every queue naming its group: a plain queue id is the
    sole group's, and refused when the cluster has several."""
    spec = parse_group_offsets(options, name, default)
    if isinstance(spec, str):
        return spec
    out: dict[str, dict[str, int]] = {}
    for topic, queues in spec.items():
        out[topic] = {}
        for key, offset in queues.items():
            if "/" not in key:
                if len(groups) > 1:
                    raise OptionError(
                        f"option '{name}': names queue {topic}/{key} without its broker group, "
                        f"but {endpoint} is a broker of a cluster of {len(groups)} broker groups "
                        f"({', '.join(groups)}) whose queue ids repeat; name the group, e.g. "
                        f"{{\"{topic}\": {{\"{groups[0]}/{key}\": {offset}}}}}")
                key = f"{groups[0]}/{key}"
            out[topic][key] = offset
    return out


def _without_absent_groups(specs: dict[str, str | dict[str, dict[str, int]]], groups: list[str],
                           endpoint: str, fail: bool
                           ) -> dict[str, str | dict[str, dict[str, int]]]:
    """``specs`` (offsets options) without the queues of groups the cluster does not have: an
    error naming them (DataLoss: their messages cannot be read, as for a stream's group that
    left), or with failOnDataLoss=false a WARNING."""
    absent = {name: sorted({k.rpartition("/")[0] for qs in spec.values() for k in qs}
                           - set(groups))
              for name, spec in specs.items() if isinstance(spec, dict)}
    absent = {name: gone for name, gone in absent.items() if gone}
    if not absent:
        return specs
    text = "; ".join(f"broker group(s) {', '.join(gone)} of option '{name}'"
                     for name, gone in absent.items())
    text += (f": not in {endpoint}'s cluster (its groups: {', '.join(groups)}); a misspelt "
             "name, or a group that left the cluster, whose messages cannot be read")
    if fail:
        raise DataLoss(text + "; set failOnDataLoss=false to read the groups the cluster has")
    log.warning("%s; reading the groups the cluster has (failOnDataLoss=false)", text)
    return {name: spec if isinstance(spec, str) else
            {t: {k: o for k, o in qs.items() if k.rpartition("/")[0] in groups}
             for t, qs in spec.items()}
            for name, spec in specs.items()}


def _of_group(spec: dict[str, dict[str, int]], group: str, topics: list[str]
              ) -> dict[str, dict[str, int]]:
    """The offsets ``spec`` gives queues of ``group`` (of ``topics``), keyed by queue id."""
    return {t: {k.rpartition("/")[2]: o for k, o in qs.items() if k.rpartition("/")[0] == group}
            for t, qs in spec.items() if t in topics}


def cluster_queue_ids(broker: BrokerCatalog) -> dict[str, list[int]] | None:
    """topic -> queue ids of every group of ``broker``'s cluster (a topic some groups lack
    included), for the checks at load(); None for a broker outside a cluster or in a cluster
    of one group (its own queues are the cluster's)."""
    groups = broker.cluster_groups()
    if groups is None or len(groups) < 2:
        return None
    counts: dict[str, int] = {}
    for _name, connection in groups:
        with BrokerCatalog(connection, broker.options) as catalog:
            for topic, count in catalog.queue_counts().items():
                counts[topic] = max(counts.get(topic, 0), count)
    return {topic: list(range(count)) for topic, count in counts.items()}


# -- offsets naming the group -------------------------------------------------------------------


def parse_group_offsets(options: Mapping[str, str], name: str,
                        default: str) -> str | dict[str, dict[str, int]]:
    """"earliest", "latest", or {topic: {"<brokerName>/<queueId>": offset}} (-2 earliest, -1
    latest); a plain "queueId" key is kept as it is (``ClusterStream.named`` places it)."""
    raw = options.get(name.lower(), default).strip()
    if raw in ("earliest", "latest"):
        return raw
    want = '{"topic": {"<brokerName>/<queueId>": offset}}'
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise OptionError(f"option '{name}': not JSON ({exc.msg} at char {exc.pos}): {raw!r}; "
                          f"want \"earliest\", \"latest\" or {want}") from None
    if not isinstance(parsed, dict) or not all(isinstance(v, dict) for v in parsed.values()):
        raise OptionError(f"option '{name}': want {want}, got {raw!r}")
    out: dict[str, dict[str, int]] = {}
    for topic, queues in parsed.items():
        for key, offset in queues.items():
            group, sep, qid = str(key).rpartition("/")
            if (not qid.isdigit() or (sep and not group) or type(offset) is not int
                    or offset < EARLIEST):
                raise OptionError(f"option '{name}': {topic}: {key!r}: {offset!r}: want "
                                  "\"<brokerName>/<queueId>\" and an offset (-2 earliest, -1 "
                                  "latest, or >= 0)")
            out.setdefault(topic, {})[f"{group}/{int(qid)}" if sep else str(int(qid))] = offset
    return out


def _naming_groups(options: Mapping[str, str], name: str) -> dict[str, dict[str, int]] | None:
    """Offsets option ``name`` when it names broker groups (a "<brokerName>/<queueId>" key)."""
    if "/" not in options.get(name.lower(), ""):
        return None
    spec = parse_group_offsets(options, name, "latest")
    if isinstance(spec, dict) and any("/" in k for qs in spec.values() for k in qs):
        return spec
    return None


def names_groups(options: Mapping[str, str]) -> bool:
    """Whether startingOffsets or endingOffsets name broker groups."""
    return any(_naming_groups(options, name) is not None for name, _d in _OFFSETS_OPTIONS)


def without_group_offsets(options: dict[str, str]) -> dict[str, str]:
    """``options`` without the offsets options that name groups (checked by their own parser
    when the read is planned or the stream starts), for the checks of queue-id offsets at
    load()."""
    out = dict(options)
    for name, _default in _OFFSETS_OPTIONS:
        if _naming_groups(options, name) is not None:
            del out[name.lower()]
    return out


def _peer_connections(entry: BrokerConnection, peers: list[str]) -> list[BrokerConnection]:
    """Connections (``entry``'s TLS and credentials) to ``entry`` and every broker in ``peers``:
    where a split asks for its group's broker again."""
    return [entry.at(e) for e in dict.fromkeys([entry.endpoint, *peers])]


def _status(entry: BrokerConnection, peers: list[str], options: Mapping[str, str]
            ) -> tuple[list[tuple[str, BrokerConnection]] | None, list[str], set[str]]:
    """The cluster's groups (``cluster_groups``), every broker it names and the groups read at
    their master, asked of ``entry`` or, when it does not answer, of the other brokers last
    named (``peers``)."""
    failed: OptionError | None = None
    for endpoint in dict.fromkeys([entry.endpoint, *peers]):
        try:
            with BrokerCatalog(entry.at(endpoint), options) as broker:
                groups = broker.cluster_groups()
                return groups, broker.cluster_endpoints, broker.cluster_mastered
        except OptionError as exc:
            if "did not answer" not in str(exc):
                raise
            failed = failed or exc
    assert failed is not None
    raise failed


# -- streaming ----------------------------------------------------------------------------------


class ClusterStream:
    """The driver's side of a streaming read of a whole cluster, for ``StreamReader``: its
    queues are ``GroupQueue`` keys, which its offsets encode as they are."""

    def __init__(self, options: dict[str, str], entry: BrokerConnection,
                 groups: list[tuple[str, BrokerConnection]], peers: list[str]) -> None:
        self.options, self.entry, self.peers = options, entry, peers
        self.connections: dict[str, BrokerConnection] = {}
        self.mastered: set[str] = set()  # groups read at their master (not a slave) now
        self.sole_group: str | None = None  # the group of a one-group cluster, once seen
        self.fail = planning.bool_option(options, "failOnDataLoss", True)
        self._warned: set[str] = set()
        self._take(groups)

    @classmethod
    def of(cls, options: dict[str, str]) -> ClusterStream | None:
        """For a broker in controller mode (the endpoint's cluster); None for one outside."""
        entry = connection_of(options)
        groups, peers, _mastered = _status(entry, [], options)
        return None if groups is None else cls(options, entry, groups, peers)

    def _take(self, groups: list[tuple[str, BrokerConnection]]) -> None:
        self.connections = dict(groups)
        if len(groups) == 1:
            self.sole_group = groups[0][0]

    def refresh(self) -> None:
        """Each group's broker now (a failover moves a group to its new master)."""
        groups, peers, self.mastered = _status(self.entry, self.peers, self.options)
        if groups is None:
            raise OptionError(f"option 'endpoints': {self.entry.endpoint} is no longer a broker "
                              "of a cluster (enableControllerMode): its stream's offsets name "
                              "broker groups")
        self._take(groups)
        self.peers = peers

    # GroupQueue keys where StreamReader has Queue keys (same code, other key type): Any.
    def starting(self) -> Any:
        return parse_group_offsets(self.options, "startingOffsets", "latest")

    def _place(self, topic: str, key: str, offsets: object) -> str:
        """``key`` with its group: a plain queue id is the sole group's."""
        if "/" in key:
            return key
        if self.sole_group is not None and len(self.connections) <= 1:
            return f"{self.sole_group}/{key}"
        groups = sorted(self.connections)
        raise OptionError(
            f"offsets {json.dumps(offsets)} name queue {topic}/{key} without its broker group, "
            f"and {self.entry.endpoint}'s cluster has {len(groups)} groups "
            f"({', '.join(groups)}) whose queue ids repeat. Offsets without a group are from a "
            "checkpoint written while the cluster had one group (or before StrataMQ named "
            "groups) or from option 'startingOffsets'; which group they belong to cannot be "
            "told now. Start the query with a new checkpoint and option 'startingOffsets' "
            f"naming the group, e.g. {{\"{topic}\": {{\"{groups[0]}/{key}\": offset}}}}")

    def named(self, spec: Any) -> Any:
        """``startingOffsets`` with every queue naming its group; queues of a group the cluster
        does not have: DataLoss naming it, or (failOnDataLoss=false) a WARNING and the other
        groups read, as a batch read (``_without_absent_groups``)."""
        if isinstance(spec, str):
            return spec
        placed = {t: {self._place(t, k, spec): o for k, o in qs.items()}
                  for t, qs in spec.items()}
        return _without_absent_groups({"startingOffsets": placed}, sorted(self.connections),
                                      self.entry.endpoint, self.fail)["startingOffsets"]

    def decode(self, offsets: dict) -> dict[Any, int]:
        """A checkpoint's (or Spark's) offsets as queues; plain queue ids are placed."""
        return {(t, self._place(t, str(k), offsets)): int(o)
                for t, qs in offsets.items() for k, o in qs.items()}

    def queues(self, starting: object) -> dict[Any, tuple[int, int]]:
        """(min, max) offset of every queue of every group this read selects, now."""
        self.refresh()
        with contextlib.ExitStack() as stack:
            catalogs = {name: stack.enter_context(BrokerCatalog(c, self.options))
                        for name, c in self.connections.items()}
            known = sorted({t for c in catalogs.values() for t in c.queue_counts()}
                           - {HALF_TOPIC})
            topics = planning.select_topics(self.options, known, must_match=False,
                                            offsets=[starting])
            out: dict[GroupQueue, tuple[int, int]] = {}
            for name, catalog in catalogs.items():
                counts = catalog.queue_counts()
                wanted = [t for t in (topics if topics is not None else known) if t in counts]
                for (topic, qid), bounds in catalog.queues(wanted).items():
                    out[(topic, f"{name}/{qid}")] = bounds
        return self._assigned(out)

    def _assigned(self, queues: dict[GroupQueue, tuple[int, int]]
                  ) -> dict[GroupQueue, tuple[int, int]]:
        wanted = planning.assigned(self.options)
        if wanted is None:
            return queues
        if len(self.connections) > 1:
            raise OptionError(f"option 'assign': names queue ids, but {self.entry.endpoint} is "
                              f"a broker of a cluster of {len(self.connections)} broker groups, "
                              "whose queue ids repeat; select topics with option 'topics' (and "
                              "offsets with startingOffsets {\"topic\": {\"<brokerName>/"
                              "<queueId>\": offset}})")
        named = {(t, f"{self.sole_group}/{q}") for t, q in wanted}
        missing = sorted(f"{t}/{q}" for t, q in named - set(queues))
        if missing:
            raise OptionError(f"option 'assign': no such queue: {', '.join(missing[:5])}")
        return {q: b for q, b in queues.items() if q in named}

    def check(self, begin: Mapping[Any, int], queues: Mapping[Any, tuple[int, int]]) -> None:
        """What the offsets read so far say was lost, per failOnDataLoss (DataLoss, or a
        warning): a group the cluster no longer has (``check_groups``), or a queue whose
        group's master now ends before the offset read (the stream read messages its old
        master had written but its SyncStateSet had not: the new master writes other messages
        at those offsets, which the stream would skip). Read at a slave (no master now), a
        queue that ends early is only behind."""
        self.check_groups(begin)
        cut = sorted(f"{t}/{key} (read to {o}, ends at {queues[(t, key)][1]})"
                     for (t, key), o in begin.items() if (t, key) in queues
                     and key.rpartition("/")[0] in self.mastered and queues[(t, key)][1] < o)
        if not cut:
            return
        text = (f"queue(s) {', '.join(cut[:5])}: the group's master ends before the offsets this "
                "stream read (its log was cut at a failover: the old master had written "
                "messages the new one never got); new messages at those offsets would be "
                "skipped")
        if self.fail:
            raise DataLoss(text + "; set failOnDataLoss=false to read on from the offsets read")
        log.warning("%s (failOnDataLoss=false)", text)

    def check_groups(self, begin: Mapping[Any, int]) -> None:
        """A group whose queues the offsets name but the cluster no longer has: DataLoss, or
        (failOnDataLoss=false) a warning; its offsets are kept, so a group that returns is
        read on from them."""
        gone = sorted({key.rpartition("/")[0] for _t, key in begin} - set(self.connections))
        if not gone:
            return
        text = (f"broker group(s) {', '.join(gone)} left {self.entry.endpoint}'s cluster (the "
                "cluster status no longer names them): messages of their queues after the "
                "offsets read so far cannot be read")
        if self.fail:
            raise DataLoss(text + "; set failOnDataLoss=false to read the other groups on "
                           "(the offsets of these are kept: a group that returns is read on)")
        for group in set(gone) - self._warned:
            log.warning("%s; reading the other groups (failOnDataLoss=false)", text)
            self._warned.add(group)

    def splits(self, ranges: dict[Any, tuple[int, int]], min_parts: int
               ) -> list[InputPartition]:
        """Splits of ``ranges``, each pulling from its group's broker as of ``queues()``."""
        group = pull_group(self.options)
        peers = _peer_connections(self.entry, self.peers)
        out: list[InputPartition] = []
        for s in planning.queue_splits("", ranges, min_parts, self.fail):
            name, _, qid = str(s.queue_id).rpartition("/")
            if name not in self.connections:  # a planned batch (recovered) of a group now gone
                self.check_groups({(s.topic, str(s.queue_id)): s.start})
                continue
            out.append(GroupSplit(self.connections[name], s.topic, int(qid), s.start, s.end,
                                  self.fail, group, broker_group=name, peers=peers))
        return out


class GroupSplit(BrokerSplit):
    """A queue range of broker group ``broker_group``, pulled from the broker the cluster
    status named for it at planning; ``peers``: where to ask for its broker again."""

    def __init__(self, connection: BrokerConnection, topic: str, queue_id: int, start: int,
                 end: int, fail_on_data_loss: bool, group: str, *, broker_group: str,
                 peers: list[BrokerConnection]) -> None:
        super().__init__(connection, topic, queue_id, start, end, fail_on_data_loss, group)
        self.broker_group, self.peers = broker_group, peers


def read_group_split(split: GroupSplit) -> Iterator[pa.RecordBatch]:
    """``read_broker_split``, going on at the group's broker of the moment (its new master
    after a failover) from the offset reached when the planned one stops answering."""
    connection, offset = split.connection, split.start
    failing_since: float | None = None
    while offset < split.end:
        part = BrokerSplit(connection, split.topic, split.queue_id, offset, split.end,
                           split.fail_on_data_loss, split.group)
        try:
            for batch in read_broker_split(part):
                offset = int(pc.max(batch.column("queue_offset")).as_py()) + 1
                failing_since = None
                yield batch
            return
        except BrokerUnreachable as exc:
            now = time.monotonic()
            failing_since = failing_since or now
            if now - failing_since > FAILOVER_WAIT_S:
                raise BrokerReadError(f"{exc}; broker group {split.broker_group} named no broker "
                                      f"that answers within {FAILOVER_WAIT_S:.0f} s") from None
            time.sleep(0.5)
            connection = _group_broker(split) or connection
            log.warning("%s; going on from offset %d at %s (broker group %s)", exc, offset,
                        connection.endpoint, split.broker_group)


def _group_broker(split: GroupSplit) -> BrokerConnection | None:
    """The broker the cluster status names for the split's group now (None: none answered)."""
    for peer in split.peers:
        try:
            with BrokerCatalog(peer) as broker:
                groups = broker.cluster_groups()
        except OptionError:
            continue
        for name, connection in groups or []:
            if name == split.broker_group:
                return connection
    return None
