"""The check thread (RocketMQ's ``TransactionalMessageCheckService``): every
``transactionCheckInterval`` it saves the table's replay offset and, while this broker may
write (``may_check()``: a master, or a slave since promoted), runs a check round.

Threads: its own (``transaction-check``); ``shutdown`` from the owner, once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from stratamq.store.service import ServiceThread
from stratamq.transactions.engine import TransactionEngine

log = logging.getLogger(__name__)

__all__ = ["TransactionCheckService"]


class TransactionCheckService(ServiceThread):
    def __init__(self, engine: TransactionEngine, flushed_offset: Callable[[], int],
                 may_check: Callable[[], bool]) -> None:
        super().__init__("transaction-check")
        self.engine = engine
        self.flushed_offset = flushed_offset
        self.may_check = may_check
        self.rounds = 0

    def run(self) -> None:
        while not self.wait(self.engine.settings.check_interval_ms / 1000):
            self.run_once()

    def run_once(self) -> None:
        try:
            if self.may_check():
                report = self.engine.check_round()
                if report.checked or report.discarded or report.ops_rewritten:
                    log.info("transaction check: %d checked, %d moved to "
                             "TRANS_CHECK_MAX_TIME_TOPIC, %d waiting for a producer, "
                             "%d op records rewritten", report.checked, report.discarded,
                             report.waiting_for_producer, report.ops_rewritten)
            self.engine.table.save(self.flushed_offset())
        except Exception:  # one bad round must not end the checks
            log.exception("transaction check round failed")
        self.rounds += 1

    def on_shutdown(self) -> None:
        pass

    def close(self) -> None:
        """Stop the thread and save the replay offset one last time."""
        self.shutdown()
        try:
            self.engine.table.save(self.flushed_offset())
        except OSError as exc:
            log.error("transaction checkpoint not saved: %s", exc)
