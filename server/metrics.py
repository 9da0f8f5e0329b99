"""What the live runs are doing now: ``GET /metrics`` (Prometheus) and the ``stalled`` status.

:class:`LiveRuns` keeps, in memory, the latest step of each (run, rank) this server
process received, the step times of the last few hundred steps and the open problems
(alerts raised and not cleared). Ingest feeds it once per stored batch
(:meth:`LiveRuns.observe`); it forgets a run when its ``end`` arrives or when it goes
stale, so the label sets of ``/metrics`` stay bounded by the runs that are live.

A run whose trainer is connected but whose last step arrived longer ago than
``Settings.stalled_factor`` times its median step time (and at least
``Settings.stalled_min_s``) is ``stalled``: a loop that hangs while its process lives.

Example:
    >>> runs = LiveRuns()
    >>> runs.median_step_s("nope") is None
    True
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import struct
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends
from fastapi.responses import Response

if TYPE_CHECKING:
    from .schema import Batch, Hello
    from .state import AppState

#: (run_id, rank) pairs kept at most; the oldest is forgotten beyond it.
MAX_TRACKED = 2000
_FIELDS = ("step", "t", "loss", "total_norm", "duration_s", "overhead")


@dataclass
class Latest:
    """The newest step of one rank of one run, as this process received it."""

    run: str
    step: int | None = None
    t: float | None = None
    loss: float | None = None
    total_norm: float | None = None
    duration_s: float | None = None
    overhead: float | None = None
    arrived: float = 0.0  # server clock: when the newest step arrived
    durations: deque[float] = field(default_factory=lambda: deque(maxlen=256))


def _last(column: Any, code: str) -> float | int | None:
    """The last value of a packed column (``i64``/``f64`` bytes, little-endian)."""
    if column is None:
        return None
    data: bytes = column.i64 if code == "q" else column.f64
    if len(data) < 8:
        return None
    value = struct.unpack_from("<" + code, data, len(data) - 8)[0]
    return None if isinstance(value, float) and value != value else value  # NaN: absent


def _floats(column: Any) -> list[float]:
    if column is None:
        return []
    data: bytes = column.f64
    return [v for v in struct.unpack(f"<{len(data) // 8}d", data) if v == v]


class LiveRuns:
    """The latest step, step times and open problems of each live (run, rank)."""

    def __init__(self) -> None:
        self.latest: dict[tuple[str, int], Latest] = {}
        # run_id -> (rank, code, subject) -> the alert record (raised or updated)
        self.problems: dict[str, dict[tuple[int, str, str], Any]] = {}
        self.stalled: set[str] = set()

    def observe(self, hello: Hello, batch: Batch) -> None:
        """One stored batch of ``hello``'s trainer: steps, alerts, the end."""
        key = (batch.run_id, batch.rank)
        latest = self.latest.get(key)
        if latest is None:
            latest = self.latest[key] = Latest(run=hello.run)
            if len(self.latest) > MAX_TRACKED:
                self.forget(min(self.latest.items(), key=lambda kv: kv[1].arrived)[0][0])
        newest: dict[str, Any] | None = None
        for block in batch.columns:
            values = {name: _last(getattr(block, name), "q" if name == "step" else "d")
                      for name in _FIELDS}
            if newest is None or (values["step"] or 0) >= (newest["step"] or 0):
                newest = values
            latest.durations.extend(_floats(block.duration_s))
        from .schema import AlertRecord, EndRecord, StepRecord

        for record in batch.records:
            if isinstance(record, StepRecord):
                if newest is None or record.step >= (newest["step"] or 0):
                    newest = {name: getattr(record, name) for name in _FIELDS}
                if record.duration_s is not None:
                    latest.durations.append(float(record.duration_s))
            elif isinstance(record, AlertRecord):
                open_ = self.problems.setdefault(batch.run_id, {})
                subject = (batch.rank, record.code, record.subject)
                if record.state == "cleared":
                    open_.pop(subject, None)
                else:
                    open_[subject] = record
            elif isinstance(record, EndRecord):
                self.forget(batch.run_id)
                return
        if newest is not None:
            for name, value in newest.items():
                setattr(latest, name, value)
            latest.arrived = time.time()

    def forget(self, run_id: str) -> None:
        """Drop every rank of a run (ended, or no longer live)."""
        for key in [k for k in self.latest if k[0] == run_id]:
            del self.latest[key]
        self.problems.pop(run_id, None)
        self.stalled.discard(run_id)

    def ranks(self, run_id: str) -> Iterator[tuple[int, Latest]]:
        for (rid, rank), latest in self.latest.items():
            if rid == run_id:
                yield rank, latest

    def median_step_s(self, run_id: str) -> float | None:
        times = [d for _, latest in self.ranks(run_id) for d in latest.durations]
        return statistics.median(times) if times else None

    def is_stalled(
        self, run_id: str, factor: float, floor_s: float, now: float | None = None
    ) -> bool:
        """No step for ``factor`` x the median step time (and ``floor_s``) on any rank."""
        arrived = [latest.arrived for _, latest in self.ranks(run_id) if latest.arrived]
        median = self.median_step_s(run_id)
        if not arrived or median is None:
            return False
        quiet = (time.time() if now is None else now) - max(arrived)
        return quiet > max(factor * median, floor_s)


async def watch_stalls(state: AppState, every_s: float = 1.0) -> None:
    """Tell viewers when a run becomes or stops being stalled (no batch says so)."""
    from gradwatch.protocol.codec import dumps

    from .live import RUNS_CHANNEL

    while True:
        await asyncio.sleep(every_s)  # the tick of a periodic check, not synchronisation
        runs = state.live_runs
        for run_id in {rid for rid, _ in runs.latest}:
            settings = state.settings
            now = runs.is_stalled(run_id, settings.stalled_factor, settings.stalled_min_s)
            if now == (run_id in runs.stalled):
                continue
            (runs.stalled.add if now else runs.stalled.discard)(run_id)
            with contextlib.suppress(Exception):
                summary = await asyncio.to_thread(state.store.run_summary, run_id)
                text = dumps({"type": "run", "run": state.public(summary)})
                state.hub.publish(RUNS_CHANNEL, text)
                state.hub.publish(run_id, text)


def _registry(state: AppState) -> Any:
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import GaugeMetricFamily

    class Live:
        def collect(self) -> Iterator[Any]:
            labels = ["run", "run_id", "rank"]
            gauges = {
                "last_step_timestamp_seconds": ("Unix time of the run's last step", "t"),
                "step": ("The last step's index", "step"),
                "loss": ("The last step's loss", "loss"),
                "grad_norm_total": ("The last step's total gradient norm", "total_norm"),
                "step_duration_seconds": ("The last step's duration", "duration_s"),
                "overhead_ratio": ("gradwatch's share of the last step's time", "overhead"),
            }
            families = {
                name: GaugeMetricFamily(f"gradwatch_{name}", text, labels=labels)
                for name, (text, _) in gauges.items()
            }
            problems = GaugeMetricFamily(
                "gradwatch_open_problems", "Problems raised and not cleared, by code",
                labels=["run", "run_id", "code"],
            )
            stalled = GaugeMetricFamily(
                "gradwatch_stalled", "1 while the run is stalled (docs/API.md)",
                labels=["run", "run_id"],
            )
            runs = state.live_runs
            names: dict[str, str] = {}
            for (run_id, rank), latest in list(runs.latest.items()):
                names[run_id] = latest.run
                for name, (_, attr) in gauges.items():
                    value = getattr(latest, attr)
                    if attr == "t" and value is None:
                        value = latest.arrived or None
                    if value is not None:
                        families[name].add_metric([latest.run, run_id, str(rank)], float(value))
            for run_id, run in names.items():
                counts: dict[str, int] = {}
                for _, code, _ in runs.problems.get(run_id, {}):
                    counts[code] = counts.get(code, 0) + 1
                for code, count in sorted(counts.items()):
                    problems.add_metric([run, run_id, code], count)
                stalled.add_metric([run, run_id], 1.0 if state.is_stalled(run_id) else 0.0)
            yield from families.values()
            yield problems
            yield stalled

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Live())
    return registry


def metrics_router(require_viewer: Any) -> APIRouter:
    """``GET /metrics``, behind the view token when tokens are set."""
    router = APIRouter()

    @router.get("/metrics", summary="Live runs in the Prometheus text format")
    async def metrics(state: AppState = Depends(require_viewer)) -> Response:  # noqa: B008
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        state.prune_live_runs()
        body = generate_latest(_registry(state))
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return router
