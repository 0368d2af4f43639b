"""``MessageStore``'s dispatch bound and listeners: how far dispatch (ConsumeQueues, index,
dispatch listeners) may go, a controller-mode store's confirm offset in its checkpoint
(``docs/formats/checkpoint.md``), and who hears of each dispatch round. A mixin:
``MessageStore`` (``message_store.py``) holds the state (declared below).

Thread-safety: any thread once the store is open; the bound is read by the dispatching thread.
"""

from __future__ import annotations

from collections.abc import Callable

from stratamq.config import BrokerRole, StoreConfig
from stratamq.record import DispatchInfo
from stratamq.store.checkpoint import ConfirmOffsetSlot
from stratamq.store.dispatch import ReputService

__all__ = ["DispatchBound"]


class DispatchBound:
    """The dispatch bound and listeners of a ``MessageStore`` (see the module docstring)."""

    config: StoreConfig
    reput: ReputService
    _opened: bool
    _confirm_slot: ConfirmOffsetSlot | None

    def add_dispatch_listener(self, listener: Callable[[DispatchInfo], None]) -> None:
        """Call ``listener(info)`` on the dispatcher thread with the newest record of each topic
        a dispatch round made readable (long-poll wake-ups). Open store only; keep it quick."""
        if not self._opened:
            raise RuntimeError("add dispatch listeners once the store is open")
        self.reput.listeners.append(listener)

    def remove_dispatch_listener(self, listener: Callable[[DispatchInfo], None]) -> None:
        """Stop calling ``listener``; a listener never added (or a closed store) is fine."""
        listeners = self.reput.listeners if self._opened else []
        if listener in listeners:
            listeners.remove(listener)

    def dispatch_behind_bytes(self) -> int:
        return self.reput.behind_bytes()

    def set_dispatch_bound(self, bound: Callable[[], int] | None) -> None:
        """Dispatch (ConsumeQueues, index, dispatch listeners) goes no further than
        ``bound()``, a record boundary (None: the log's end). A controller-mode master's bound
        is RocketMQ's confirm offset: what its SyncStateSet holds, so no consumer reads a
        message a failover may cut (it would then skip the message that takes its offset).
        Call ``wake_dispatch`` when the bound moves."""
        files = self.reput.files
        self.reput.end = (files.max_offset if bound is None
                          else lambda: min(files.max_offset(), bound()))
        self.reput.wakeup()

    def note_confirmed(self, end: int) -> None:
        """Controller mode: a put ending at ``end`` is about to be acknowledged (its group
        has it): the checkpoint's confirm offset covers it first, so a restart never holds
        an acknowledged message back. No-op otherwise."""
        slot = self._confirm_slot
        if slot is not None:
            slot.raise_to(end)

    def hold_dispatch_at(self, offset: int) -> None:
        """Dispatch goes no further than ``offset`` until ``set_dispatch_bound`` moves the
        bound (a controller-mode slave, until its log is in step with its master's)."""
        self.set_dispatch_bound(lambda: offset)

    def hold_dispatch_where_bound(self) -> None:
        """``hold_dispatch_at`` where dispatch may go now (the bound's value, else the log's
        end): a master stepping down keeps its unconfirmed tail unread."""
        self.hold_dispatch_at(self.reput.end())

    def wake_dispatch(self) -> None:
        """Dispatch looks again: its bound (``set_dispatch_bound``) moved."""
        self.reput.wakeup()

    def dispatch_progress(self) -> tuple[int, int]:
        """(offset dispatch has reached, where it stops now: the log's end or its bound)."""
        return self.reput.reput_from, self.reput.end()

    def _save_confirm_offset(self) -> None:
        """Every ConsumeQueue flush round in controller mode: the confirm offset as dispatch's
        bound says now. A slave's follows its log (back too, after a cut); a master's only
        rises: its acknowledged puts raised it (``note_confirmed``), and a SyncStateSet that
        grew may bound dispatch lower for a moment without unconfirming them."""
        slot = self._confirm_slot
        if slot is None:
            return
        if self.config.broker_role is BrokerRole.SLAVE:
            slot.set(self.reput.end())
        else:
            slot.raise_to(self.reput.end())
