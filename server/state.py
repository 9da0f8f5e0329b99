"""What the running app shares between its endpoints: settings, store, hub, and
which runs have a trainer connected (for the ``live`` status)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

from .live import RUNS_CHANNEL, Hub
from .settings import Settings
from .store import Store


class AppState:
    """One per app; reached as ``request.app.state.gradwatch``."""

    def __init__(self, settings: Settings, store: Store) -> None:
        self.settings = settings
        self.store = store
        self.hub = Hub(settings.live_queue_size, settings.live_queue_bytes)
        self.connected: Counter[str] = Counter()
        self._summary_due: set[str] = set()
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
