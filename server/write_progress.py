"""Whether the store's writer makes progress: ``/api/health`` answers 503 when not.

A query that answers says the database can be read; it says nothing of the writer.
SQLite's writer (a child process, or a thread) can be alive and not committing: the
process stopped (``SIGSTOP``, a debugger), or another program holding the database's
write lock. Trainers then wait for acks that never come, while health said "ok".

This watches the writes from outside the store, at the futures the server already
holds: a write submitted and not yet answered is *pending*; an answer (stored or
refused) is *progress*. The writer is *stalled* when writes are pending and none
was answered for ``bound_s`` seconds since the later of the last answer and the
oldest pending write's submission (an idle writer is never stalled).

Example:
    >>> from concurrent.futures import Future
    >>> progress = WriteProgress(clock=iter([0.0, 0.0, 30.0, 31.0]).__next__)
    >>> f = progress.track(Future())
    >>> progress.stalled(bound_s=10.0)  # submitted at 0 s, nothing answered by 30 s
    'the database writer has 1 write(s) waiting and answered none for 30 s'
    >>> f.set_result(True)
    >>> progress.stalled(bound_s=10.0) is None
    True
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class WriteProgress:
    """Pending writes and the time of the last answer; thread-safe (futures resolve on
    the writer's threads)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._pending: dict[int, float] = {}  # id -> when submitted (insertion order)
        self._answered_at = clock()

    def track(self, future: Future[T]) -> Future[T]:
        """Count ``future`` as pending until it resolves; returns it."""
        ident = next(self._ids)
        with self._lock:
            self._pending[ident] = self._clock()
        future.add_done_callback(lambda _: self._done(ident))
        return future

    def _done(self, ident: int) -> None:
        now = self._clock()
        with self._lock:
            self._pending.pop(ident, None)
            self._answered_at = now

    def stalled(self, bound_s: float) -> str | None:
        """Why the writer is stalled, or None (nothing pending, or progress within
        ``bound_s`` seconds)."""
        with self._lock:
            if not self._pending:
                return None
            oldest = next(iter(self._pending.values()))
            since = max(self._answered_at, oldest)
            waiting = len(self._pending)
        quiet = self._clock() - since
        if quiet <= bound_s:
            return None
        return (
            f"the database writer has {waiting} write(s) waiting and answered none"
            f" for {quiet:.0f} s"
        )

    def snapshot(self) -> dict[str, Any]:
        """What health reports beside its status: writes pending now."""
        with self._lock:
            return {"pending_writes": len(self._pending)}
