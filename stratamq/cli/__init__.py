"""The ``stratamq`` command line: one module per command group, attached to ``main``.

Output shapes here are contracts: ``store dump`` prints one JSON object per message,
``store verify`` one JSON summary (exit 1 on any inconsistency), ``bench ...`` one JSON line.
Adding a command group is one import line below.
"""

# Each module attaches its commands to ``main`` when imported.
from stratamq.cli import (  # noqa: F401
    admin,  # topic ..., group ...
    bench,
    broker,  # broker start
    cluster,  # cluster status, cluster elect
    compaction,  # compaction run, compaction status
    config,  # config show
    console,  # console (the web console)
    cq,  # store migrate-cq, bench cq
    demo,
    ha,  # ha status
    message,  # message send, message consume, message get
    namesrv,  # namesrv start
    spark,  # spark export
    store,
    store_clean,  # store clean
    store_lookup,  # store query, store offset-by-time
    tier,  # tier status, tier flush
    transaction,  # transaction list
)
from stratamq.cli.app import main

__all__ = ["main"]
