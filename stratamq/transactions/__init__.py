"""Transactional messages (RocketMQ's half / op design), free of any client protocol.

* ``messages.py``: what each record of a transaction holds (pure).
* ``table.py``: the open transactions, a store dispatcher rebuilt from the CommitLog.
* ``checkpoint.py``: where the table's replay starts (``config/transactionCheckpoint.json``).
* ``engine.py``: EndTransaction and check-back over narrow parts (put, look, notify).
* ``service.py``: the check thread.

The gRPC adapter is ``stratamq/broker/transactions.py``.
"""

from stratamq.transactions.engine import (
    CheckRequest,
    Resolution,
    Stored,
    TransactionEngine,
    TransactionError,
    TransactionSettings,
)
from stratamq.transactions.service import TransactionCheckService
from stratamq.transactions.table import TransactionTable

__all__ = ["CheckRequest", "Resolution", "Stored", "TransactionCheckService",
           "TransactionEngine", "TransactionError", "TransactionSettings", "TransactionTable"]
