"""Live across replicas: what other ``gradwatch serve`` processes on the same
PostgreSQL stored reaches this replica's viewers exactly as a local batch would.

The listen thread (:class:`gradwatch.server.pg_listen.Listener`) hands each
notification to this replica's event loop; one task takes them in arrival order, reads
back the records of the batches that have viewers here (one query for all that are
waiting), and publishes ``{"type":"records","run_id","rank","seq","records"}`` to the
run's viewers and a run summary to run-list viewers. Local batches never pass through
here: ingest publishes them itself, and the listener drops this replica's own notes.

Other replicas store their batches' frames only while this one is registered as
watching (store/postgres.py): :meth:`ReplicaFeed.viewer_joins` registers before a
run's viewer is told ``subscribed`` (so before it reads history), a heartbeat keeps
the registration while run viewers are here and drops it when none are left; if it
lapsed (the database was away) viewers are told ``lagged`` once it is made again.

Example (``create_app`` does this for a PostgreSQL store):
    >>> feed = ReplicaFeed(state, store)   # doctest: +SKIP
    >>> await feed.start()                 # LISTEN is in place when it returns  # doctest: +SKIP
    >>> await feed.stop()                  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from typing import Any

from gradwatch.protocol.codec import dumps

from .live import RUNS_CHANNEL
from .pg_listen import Delivery, Listener
from .state import AppState
from .store.postgres import RETAIN_S, WATCH_EVERY_S, WATCH_EXPIRE_S, PostgresStore

log = logging.getLogger("gradwatch.server")

# Notifications taken from the queue and read back together, at most.
CHUNK = 256
# Row ids remembered as delivered, so a resync after a reconnect sends none twice.
SEEN = 100_000
# Seconds between tries to register again after the database refused (or was away).
WATCH_RETRY_S = 2.0


def records_message(run_id: str, rank: int, seq: int, records: str) -> str:
    """The live message of one batch, built as ingest builds it (records already JSON).

    >>> records_message("r", 0, 3, '[{"kind":"epoch","epoch":0,"step":0}]')
    '{"type":"records","run_id":"r","rank":0,"seq":3,"records":[{"kind":"epoch","epoch":0,"step":0}]}'
    """
    head = dumps({"type": "records", "run_id": run_id, "rank": rank, "seq": seq})
    return head[:-1] + ',"records":' + records + "}"


class ReplicaFeed:
    """Publishes to this replica's viewers what other replicas stored."""

    def __init__(self, state: AppState, store: PostgresStore) -> None:
        self.state = state
        self.store = store
        self.delivered = 0  # batches of other replicas published to viewers here
        self._queue: asyncio.Queue[Delivery] = asyncio.Queue()
        self._seen: OrderedDict[int, None] = OrderedDict()
        self._listener: Listener | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._watch_lock = asyncio.Lock()
        # When this replica's registration was last made or extended (monotonic, taken
        # before the statement), None while it has none; and whether viewers may have
        # missed frames (a registration failed) and are owed a "lagged".
        self._confirmed: float | None = None
        self._owed = False

    async def start(self) -> None:
        """Start listening; returns once LISTEN is in place, so a replica that answers
        /api/health already receives what the others store."""
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._consume())
        self._listener = Listener(
            self.store.settings.db, self.store.channel, self.store.replica, self._from_thread
        )
        await asyncio.to_thread(self._listener.start)
        self._heartbeat = asyncio.create_task(self._beat_forever())

    async def stop(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
        if self._confirmed is not None:  # other replicas stop storing frames at once
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.store.unwatch)
        if self._listener is not None:
            await asyncio.to_thread(self._listener.stop)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def viewer_joins(self) -> None:
        """Before a run's viewer is told ``subscribed``: other replicas store frames
        for this one from now on (at once when the registration is fresh)."""
        if not self._fresh():
            await self._ensure_watch(unless_fresh=True)

    def _fresh(self) -> bool:
        """Whether the registration surely holds for a while (a heartbeat is due well
        before it would lapse)."""
        return self._confirmed is not None and (
            time.monotonic() - self._confirmed < WATCH_EXPIRE_S - WATCH_EVERY_S
        )

    async def _beat_forever(self) -> None:
        while True:
            await asyncio.sleep(WATCH_RETRY_S if self._owed else WATCH_EVERY_S)  # a period
            await self._beat()

    async def _beat(self) -> None:
        """Keep the registration while run viewers are here; drop it once none are."""
        if self._watched():
            await self._ensure_watch()
            return
        self._owed = False  # no viewer is left to have missed anything
        if self._confirmed is not None:
            async with self._watch_lock:
                if not self._watched():
                    # First: a viewer joining while the row is deleted registers anew.
                    self._confirmed = None
                    with contextlib.suppress(Exception):  # else it expires
                        await asyncio.to_thread(self.store.unwatch)

    def _watched(self) -> bool:
        return any(c != RUNS_CHANNEL for c in self.state.hub.channels())

    async def _ensure_watch(self, unless_fresh: bool = False) -> None:
        """Extend the registration, or make it again; viewers that may have missed
        frames meanwhile (it had lapsed, or a registration failed) are told ``lagged``
        once it is made, so the history they refetch has no gap."""
        async with self._watch_lock:
            if unless_fresh and self._fresh():
                return  # viewers joining together: the first one registered
            began = time.monotonic()
            try:
                if self._confirmed is not None and await asyncio.to_thread(
                    self.store.refresh_watch
                ):
                    self._confirmed, self._owed = began, False  # it never lapsed
                    return
                lapsed = self._confirmed is not None or self._owed
                await asyncio.to_thread(self.store.watch)
            except Exception as error:
                log.warning("gradwatch live across replicas: cannot register viewers: %s", error)
                self._owed = True
                return
            self._confirmed, self._owed = began, False
            if lapsed:
                self._tell_lagged(None)

    def _from_thread(self, item: Delivery) -> None:
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the loop closed during shutdown
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    async def _consume(self) -> None:
        while True:
            items = [await self._queue.get()]
            while len(items) < CHUNK and not self._queue.empty():
                items.append(self._queue.get_nowait())
            try:
                await self._apply(items)
            except Exception as error:  # the database is away: viewers repaint from history
                log.warning("gradwatch live across replicas: cannot read back batches: %s", error)
                self._tell_lagged(None)

    async def _apply(self, items: list[Delivery]) -> None:
        notes: list[dict[str, Any]] = []
        for kind, value in items:
            if kind == "resync":
                notes.extend(await self._resync(float(value)))
            else:
                notes.append(value)
        wanted = [
            int(n["id"])
            for n in notes
            if "id" in n and int(n["id"]) not in self._seen and self.state.hub.has_viewers(n["run"])
        ]
        rows: dict[int, tuple[Any, ...]] = {}
        if wanted:
            rows = {int(r[0]): r for r in await asyncio.to_thread(self.store.live_rows, wanted)}
        for note in notes:
            run_id = note["run"]
            if "id" in note:
                row_id = int(note["id"])
                if row_id in self._seen:
                    continue
                self._remember(row_id)
                row = rows.get(row_id) or note.get("row")
                if row is not None:
                    _, _, rank, seq, records = row[:5]
                    self.state.hub.publish(run_id, records_message(run_id, rank, seq, records))
                    self.delivered += 1
                elif row_id in wanted:
                    self._tell_lagged(run_id)  # expired before it could be read back
            self.state.run_changed(run_id, urgent=bool(note.get("u") or note.get("hello")))

    async def _resync(self, seconds: float) -> list[dict[str, Any]]:
        """Notes for what other replicas stored while the LISTEN connection was away."""
        if seconds > RETAIN_S:
            self._tell_lagged(None)  # older rows are gone: repaint from history
        found = await asyncio.to_thread(self.store.live_rows_since, min(seconds, RETAIN_S))
        return [{"id": r[0], "run": r[1], "u": r[5], "row": r} for r in found]

    def _remember(self, row_id: int) -> None:
        self._seen[row_id] = None
        if len(self._seen) > SEEN:
            self._seen.popitem(last=False)

    def _tell_lagged(self, run_id: str | None) -> None:
        """Viewers of ``run_id`` (None: every run) missed batches; they refetch history."""
        channels = [run_id] if run_id is not None else self.state.hub.channels()
        for channel in channels:
            if channel != RUNS_CHANNEL:
                self.state.hub.lag(channel)
