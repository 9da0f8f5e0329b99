"""What the running app shares between its endpoints: settings, store, hub, and
which runs have a trainer connected (for the ``live`` status); and the watch that
pushes each run's status to its viewers when it changes (:class:`StatusWatch`).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

from .live import RUNS_CHANNEL, Hub
from .settings import Settings
from .store import RunNotFound, Store

#: The statuses time alone can change (live -> stalled -> stale): runs in them are watched.
OPEN = ("live", "stalled")


class AppState:
    """One per app; reached as ``request.app.state.gradwatch``."""

    def __init__(self, settings: Settings, store: Store) -> None:
        self.settings = settings
        self.store = store
        self.hub = Hub(settings.live_queue_size, settings.live_queue_bytes)
        self.connected: Counter[str] = Counter()
        self._summary_due: set[str] = set()
        # Pushes each run's status to its viewers when it changes (app.py runs its watch).
        self.statuses = StatusWatch(self)
        self._tasks: set[asyncio.Task[None]] = set()
        # The live feed from other replicas (a ReplicaFeed on PostgreSQL), else None.
        self.replicas: Any = None
        # The latest step of each live run (GET /metrics, "stalled"), and where alerts go.
        from .live_runs import LiveRuns
        from .webhooks import Webhooks
        from .write_progress import WriteProgress

        self.live_runs = LiveRuns()
        # Writes submitted and not yet answered: /api/health tells a frozen writer.
        self.writes = WriteProgress()
        self.webhooks = Webhooks.from_settings(settings)

    def on_batch(self, hello: Any, batch: Any) -> None:
        """A batch was stored (ingest calls this once per batch): /metrics, webhooks."""
        self.live_runs.observe(hello, batch)
        if self.webhooks is not None:
            self.webhooks.notify(hello, batch)

    def watched(self, run_id: str) -> bool:
        """Whether anyone may be watching ``run_id`` live: a viewer of its live feed
        here, or (replicas sharing a PostgreSQL store) another replica with viewers of
        any run at the last write. Acks carry it: a trainer nobody watches hands its
        records over less often, which costs its training less."""
        return self.hub.has_viewers(run_id) or bool(getattr(self.store, "others_watching", False))

    def is_stalled(self, run_id: str) -> bool:
        s = self.settings
        return self.live_runs.is_stalled(run_id, s.stalled_factor, s.stalled_min_s)

    def prune_live_runs(self) -> None:
        """Forget runs that are no longer live (bounded /metrics label sets)."""
        now = time.time()
        for run_id, _ in list(self.live_runs.latest):
            latest = [x.arrived for _, x in self.live_runs.ranks(run_id)]
            if self.connected[run_id] <= 0 and now - max(latest) > self.settings.stale_after_s:
                self.live_runs.forget(run_id)

    def status(self, summary: dict[str, Any]) -> str:
        """live, stalled, finished, crashed or stale (docs/API.md)."""
        if summary.get("end_status"):
            return str(summary["end_status"])
        updated = summary.get("updated") or 0.0
        quiet = time.time() - updated >= self.settings.stale_after_s
        if self.connected[summary["id"]] <= 0 and quiet:
            return "stale"
        return "stalled" if self.is_stalled(summary["id"]) else "live"

    def public(self, summary: dict[str, Any]) -> dict[str, Any]:
        """A store summary as the API shows it."""
        out = {k: v for k, v in summary.items() if k != "end_status"}
        out["status"] = self.status(summary)
        return out

    def run_changed(self, run_id: str, urgent: bool = False) -> None:
        """Tell run-list viewers, at most about twice a second per run."""
        self.statuses.touch(run_id)  # its status may have changed too
        if not self.hub.has_viewers(RUNS_CHANNEL) or run_id in self._summary_due:
            return
        self._summary_due.add(run_id)
        loop = asyncio.get_running_loop()
        loop.call_later(0.0 if urgent else 0.5, self._spawn_summary, run_id)

    def _spawn_summary(self, run_id: str) -> None:
        task = asyncio.ensure_future(self._publish_summary(run_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _publish_summary(self, run_id: str) -> None:
        self._summary_due.discard(run_id)
        try:
            summary = await asyncio.to_thread(self.store.run_summary, run_id)
        except Exception:
            return
        from gradwatch.protocol.codec import dumps

        self.hub.publish(RUNS_CHANNEL, dumps({"type": "run", "run": self.public(summary)}))


class StatusWatch:
    """Tells the viewers of a run and of the runs list whenever the run's status
    changes, the changes no record reports included: live -> stalled -> stale as time
    passes. Each replica tells its own viewers what its own API says (docs/DEPLOY.md).

    A change is told from the status viewers have: the one told before, or read as a
    run's first viewer subscribed (its page loaded it just before). The opening of a run
    nobody watched (a new one) is no change to them: the runs list gets its summary
    from :meth:`AppState.run_changed`, as it always did.
    """

    def __init__(self, state: AppState) -> None:
        self.state = state
        # The status told (or loaded) of each watched run: the open ones, and closed
        # ones while they have run viewers (to whom a returning trainer is news).
        self.told: dict[str, str] = {}
        # The summary each open run was judged from, to judge it again as time passes.
        self.judged: dict[str, dict[str, Any]] = {}
        # Runs an event changed since the last tick (hello, batch, disconnect, another
        # replica's batch).
        self.touched: set[str] = set()

    def touch(self, run_id: str) -> None:
        self.touched.add(run_id)

    async def viewer_joins(self, run_id: str) -> None:
        """A run's viewer subscribes (already in the hub), its page loaded just before:
        the status read now is the one to tell changes from, a stale run's included. A
        change the watch had not told yet goes to every viewer of the run, this one too."""
        try:
            summary = await asyncio.to_thread(self.state.store.run_summary, run_id)
        except Exception:  # no such run yet, or the database is away: from its next event
            return
        self._tell(summary)

    async def run(self, every_s: float = 1.0) -> None:
        """Check every ``every_s`` seconds, forever (app.py cancels it)."""
        await self._watch_open_runs()
        while True:
            await asyncio.sleep(every_s)  # the tick of a periodic check, not synchronisation
            for run_id in self._due():
                try:
                    summary = await asyncio.to_thread(self.state.store.run_summary, run_id)
                except RunNotFound:
                    continue
                except Exception:  # the database is away: read it again on the next tick
                    self.touched.add(run_id)
                    continue
                self._tell(summary)

    async def _watch_open_runs(self) -> None:
        """The runs already open when this process starts (a replica joining, a restart
        while a trainer was away): watched from the status their viewers load."""
        try:
            runs = await asyncio.to_thread(self.state.store.list_runs)
        except Exception:  # the database is away: a run is watched from its next event
            return
        for summary in runs:
            self._keep(summary, self.state.status(summary))

    def _due(self) -> list[str]:
        """Runs to read again: touched, or whose last summary, judged now, no longer
        gives the status told (``updated`` only grows: an old summary never looks
        fresher than the run is)."""
        hub, told = self.state.hub, self.told
        for run_id in [r for r, s in told.items() if s not in OPEN and not hub.has_viewers(r)]:
            del told[run_id]  # closed, and its last viewer left
        moved = {r for r, s in self.judged.items() if self.state.status(s) != told.get(r)}
        due, self.touched = self.touched | moved, set()
        return sorted(due)

    def _keep(self, summary: dict[str, Any], status: str) -> None:
        """Remember the status told of a run, and the summary of an open one."""
        run_id = summary["id"]
        if status in OPEN:
            self.told[run_id], self.judged[run_id] = status, summary
            return
        self.judged.pop(run_id, None)
        if self.state.hub.has_viewers(run_id):
            self.told[run_id] = status
        else:  # only an event (a hello, a batch) opens it again, and touches it
            self.told.pop(run_id, None)
        if status == "stale":
            # As prune_live_runs: a trainer that comes back is not judged stalled on the
            # step times of before it went away, whether /metrics was read meanwhile or not.
            self.state.live_runs.forget(run_id)

    def _tell(self, summary: dict[str, Any]) -> None:
        """Publish the run's summary where its status is not the one told."""
        from gradwatch.protocol.codec import dumps

        run_id = summary["id"]
        public = self.state.public(summary)
        status = public["status"]
        told = self.told.get(run_id)
        self._keep(summary, status)
        if told is None or status == told:
            return  # a run that opens: the runs list has its summary from run_changed
        text = dumps({"type": "run", "run": public})
        self.state.hub.publish(RUNS_CHANNEL, text)
        self.state.hub.publish(run_id, text)
