"""Reading a cluster on etcd through one broker's endpoint (issue 28).

A broker in controller mode names every broker group of its cluster (``ClusterStatus``, via
``BrokerCatalog.cluster_groups``); a batch read plans each group at its own broker (its
master, a live slave while it has none) with the same options, so its splits pull from there.
Queue ids repeat across groups: options that name queues are refused rather than applied to
every group's queue of that id. A topic only some groups have is read from those. A
streaming read of a cluster of several groups is refused (not yet: its offsets name queues).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stratamq.spark import planning
from stratamq.spark.planning import OptionError

if TYPE_CHECKING:
    from pyspark.sql.datasource import InputPartition

    from stratamq.spark.broker_io import BrokerCatalog, BrokerConnection

__all__ = ["plan_cluster", "refuse_cluster_stream"]

_PER_QUEUE_OPTIONS = ("startingOffsets", "endingOffsets", "startingOffsetsByTimestamp",
                      "endingOffsetsByTimestamp", "assign")


def plan_cluster(options: dict[str, str], groups: list[tuple[str, BrokerConnection]],
                 catalog_of: Callable[[dict[str, str]], Any],
                 plan_queues: Callable[[dict[str, str], BrokerCatalog, None],
                                       list[InputPartition]]) -> list[InputPartition]:
    """The splits of a batch read of every group (``catalog_of``: a ``BrokerCatalog`` for
    options; ``plan_queues``: the source's planning at one broker)."""
    for name in _PER_QUEUE_OPTIONS:
        value = (options.get(name.lower()) or "").strip()
        if value.startswith("{") or (name == "assign" and value):
            raise OptionError(f"option '{name}': names queues, but {options['endpoints']} is a "
                              f"broker of a cluster of {len(groups)} broker groups, whose queue "
                              "ids repeat; read whole topics (from the beginning, the end or a "
                              "time: startingOffsets=earliest, startingTimestamp, ...)")
    splits: list[InputPartition] = []
    unknown: list[planning.UnknownTopics] = []
    for _group, connection in groups:
        at = {**options, "endpoints": connection.endpoint}
        with catalog_of(at) as catalog:
            try:
                splits += plan_queues(at, catalog, None)
            except planning.UnknownTopics as exc:  # a topic of some groups only
                unknown.append(exc)
    if len(unknown) == len(groups):
        raise unknown[0]
    return splits


def refuse_cluster_stream(options: dict[str, str], broker: BrokerCatalog) -> None:
    """OptionError when the endpoint is a broker of a cluster of several groups: a streaming
    read would read one group only, never quietly."""
    groups = broker.cluster_groups()
    if groups is not None and len(groups) > 1:
        raise OptionError(f"option 'endpoints': {options['endpoints']} is a broker of a "
                          f"cluster of {len(groups)} broker groups; a streaming read reads "
                          "one group only (not yet the whole cluster: a batch read does)")
