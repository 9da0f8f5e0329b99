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

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends
from fastapi.responses import Response

if TYPE_CHECKING:
    from .state import AppState

from .live_runs import MAX_TRACKED, Latest, LiveRuns

__all__ = ["MAX_TRACKED", "Latest", "LiveRuns", "metrics_router"]

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
                "overhead_share": ("gradwatch's share of the time of the last 256 steps,"
                                   " weighted by step time", "overhead_share"),
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
