"""Blocking calls of one key (a consumer group and topic) run one executor job at a time, and a
job runs the calls queued for its key by then (up to ``max_batch``), in order.

Why: pops and acks of one group and topic serialise on the pop engine's lock anyway. Sent to
the executor one by one, 64 concurrent receives put 64 threads to sleep on that lock, and each
release is a thread switch (and a GIL hand-over) more; each call also pays its own executor
hop. Queued on the loop instead, they reach the lock one at a time and one hop serves several:
the broker's CPU per message of a receive+ack load fell by about a tenth. The lock stays the
guarantee; the lane only changes who waits where. Each call gets its own result or exception
as soon as it is done, not when its job ends.

Thread-safety: ``call`` on the event loop only (one ``Lanes`` per loop).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

__all__ = ["Lanes"]

Run = Callable[..., Awaitable[Any]]  # run(fn, *args): fn(*args) in the executor
_Item = tuple[Callable[..., Any], tuple[Any, ...], "asyncio.Future[Any]"]


class Lanes:
    """Per-key queues of blocking calls, drained by one executor job at a time per key."""

    def __init__(self, max_batch: int = 8) -> None:
        # A job holds one executor thread: a long queue goes on in a fresh job, so the thread
        # goes back to the pool in between (sends and other lanes share it).
        self.max_batch = max_batch
        self._queues: dict[Hashable, list[_Item]] = {}  # a key is here while its job runs
        self._tasks: set[asyncio.Task[None]] = set()

    async def call(self, key: Hashable, run: Run, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in the executor (through ``run``), after the calls queued before it
        under ``key``; its result, or its exception raised here."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        queue = self._queues.get(key)
        if queue is not None:
            queue.append((fn, args, future))
        else:
            self._queues[key] = [(fn, args, future)]
            task = asyncio.ensure_future(self._drain(key, run))
            self._tasks.add(task)  # the loop holds tasks weakly
            task.add_done_callback(self._tasks.discard)
        return await future

    async def _drain(self, key: Hashable, run: Run) -> None:
        queue = self._queues[key]
        try:
            while queue:
                batch, queue[:] = queue[:self.max_batch], queue[self.max_batch:]
                loop = asyncio.get_running_loop()
                try:
                    await run(_run_all, loop, batch)
                except Exception as exc:  # the executor is gone (stopping): fail them
                    for _fn, _args, future in batch:
                        _settle(future, False, exc)
                except BaseException:  # cancelled: the loop is closing
                    queue[:0] = [item for item in batch if not item[2].done()]
                    raise
        finally:
            del self._queues[key]
            for _fn, _args, future in queue:  # only when cancelled above
                future.cancel()


def _run_all(loop: asyncio.AbstractEventLoop, calls: list[_Item]) -> None:
    """Each call in order (in the executor), its future settled on the loop as soon as it is
    done (a call does not wait for the rest of its job)."""
    for fn, args, future in calls:
        try:
            outcome = (True, fn(*args))
        except Exception as exc:
            outcome = (False, exc)
        try:
            loop.call_soon_threadsafe(_settle, future, *outcome)
        except RuntimeError:  # the loop is closed: nobody waits for the rest
            return


def _settle(future: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if future.done():  # the caller was cancelled
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)
