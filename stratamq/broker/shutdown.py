"""How the broker stops: every step runs whatever the steps before it did, and each failure is
logged and reported together at the end (``StopSteps``, ``BrokerStopError``); undoing a failed
start swallows and logs each failure instead (``suppress_all``).

A failing step must not leave the store unflushed with its ``abort`` marker behind: the order
of the steps is ``Broker.stop``'s (server.py), this module only runs them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["BrokerStopError", "StopSteps", "suppress_all"]


class BrokerStopError(RuntimeError):
    """One or more shutdown steps failed (all of them ran); ``errors`` names each."""

    def __init__(self, errors: list[tuple[str, BaseException]]) -> None:
        super().__init__("; ".join(f"{name}: {type(exc).__name__}: {exc}"
                                   for name, exc in errors))
        self.errors = errors


class StopSteps:
    """``steps(name, action)`` runs ``action()`` and keeps its failure, if any, under ``name``;
    ``raise_failures()`` then raises one ``BrokerStopError`` naming them all."""

    def __init__(self) -> None:
        self.errors: list[tuple[str, BaseException]] = []

    def __call__(self, name: str, action: Callable[[], object]) -> None:
        try:
            action()
        except BaseException as exc:  # every step runs; all failures are reported
            log.error("broker stop: %s failed: %s", name, exc)
            self.errors.append((name, exc))

    def raise_failures(self) -> None:
        if self.errors:
            raise BrokerStopError(self.errors)


class suppress_all:
    """Swallow (and log) any exception: undoing a failed start must undo everything."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> bool:
        if exc is not None:
            log.warning("while undoing a failed start: %s", exc)
        return True
