"""The broker's store, opened with the parts that must be plugged into it before it replays: the
tier (``tieredBackendServiceProvider``), the topic metadata, the compaction store
(``enableCompaction``) and the open-transaction table.

``open_store`` is handed the two configs and nothing of the Broker; ``Broker.start``
(server.py) starts the tier and the compaction store afterwards, once the rest is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stratamq.broker.metadata import MetadataStore
from stratamq.compaction.service import CompactionStore
from stratamq.config import BrokerConfig, BrokerRole, StoreConfig
from stratamq.store.message_store import MessageStore

__all__ = ["PluggedStore", "open_store"]


@dataclass
class PluggedStore:
    """An open store and what was plugged into it (None where a setting leaves a part off)."""

    store: MessageStore
    tiered: Any  # stratamq.tiered.TieredStore
    meta: MetadataStore
    compaction: CompactionStore | None
    compaction_gate: Any  # a slave's: ha.message_replication.CompactionGate
    transaction_table: Any  # broker.transactions' table of open transactions


def open_store(store_config: StoreConfig, cfg: BrokerConfig) -> PluggedStore:
    """Make the store, plug its parts in and open it (a replay they all see); on failure, close
    the parts opened so far and raise."""
    from stratamq.broker.replication import plug_compaction
    from stratamq.broker.transactions import plug_transactions
    from stratamq.compaction.tiering import link as link_compaction_tier
    from stratamq.tiered import wire

    tiered: Any = None
    compaction: CompactionStore | None = None
    try:
        store = MessageStore(store_config, controller_mode=cfg.enable_controller_mode)
        # Plugged in before the open: its uploader replays from its own durable progress.
        # A SLAVE reads its master's tier but never uploads to it (nor would its uploader
        # follow a cut-back of its CommitLog): no uploader, and its compacted files are
        # not uploaded either (the compaction tier is read-only then).
        # In controller mode the tier is the group's: every broker has an uploader,
        # paused until it is elected (broker/master_duties.py).
        tiered = wire(store, cluster=cfg.broker_cluster_name, broker=cfg.broker_name,
                      upload=(store_config.broker_role is not BrokerRole.SLAVE
                              or cfg.enable_controller_mode),
                      group=cfg.enable_controller_mode)
        # The topics first: compaction topics are split out from the first replay on.
        meta = MetadataStore(store_config.root, cfg.default_retry_max_times)
        # A slave's compaction queues are pulled from its master (message replication).
        compaction, compaction_gate = plug_compaction(store, store_config, meta)
        link_compaction_tier(compaction, tiered)  # compacted files in the tier
        # Open transactions, rebuilt from the half and op topics as the store replays.
        transaction_table = plug_transactions(store, store_config.root)
        store.open()
    except BaseException:
        if tiered is not None:
            tiered.close()
        if compaction is not None:
            compaction.close()
        raise
    return PluggedStore(store, tiered, meta, compaction, compaction_gate, transaction_table)
