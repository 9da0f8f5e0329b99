"""The latest step of each live (run, rank) this server process received (GET
/metrics, the ``stalled`` status: server/metrics.py).

Its own module, below both server/state.py (which holds one) and server/metrics.py
(which serves it), so that the two import one way.

Example:
    >>> runs = LiveRuns()
    >>> runs.median_step_s("nope") is None
    True
"""

from __future__ import annotations

import math
import statistics
import struct
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .schema import Batch, Hello

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
    #: (overhead x duration_s, duration_s) of the recent steps that carry both
    costs: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=256))

    @property
    def overhead_share(self) -> float | None:
        """gradwatch's share of the recent steps' time, weighted by step time: a single
        step's ``overhead`` flips between a light step's few per cent and a heavy
        step's ~100 % under a budget."""
        time_s = sum(d for _, d in self.costs)
        return sum(c for c, _ in self.costs) / time_s if time_s > 0 else None


def _last(column: Any, code: str) -> float | int | None:
    """The last value of a packed column (``i64``/``f64`` bytes, little-endian)."""
    if column is None:
        return None
    data: bytes = column.i64 if code == "q" else column.f64
    if len(data) < 8:
        return None
    value = struct.unpack_from("<" + code, data, len(data) - 8)[0]
    return None if isinstance(value, float) and value != value else value  # NaN: absent


def _floats(column: Any, keep_nan: bool = False) -> list[float]:
    if column is None:
        return []
    data: bytes = column.f64
    values = struct.unpack(f"<{len(data) // 8}d", data)
    return list(values) if keep_nan else [v for v in values if v == v]


def _cost(overhead: Any, duration: Any) -> tuple[float, float] | None:
    """(overhead x duration, duration) of one step, when both are finite numbers."""
    if overhead is None or duration is None:
        return None
    o, d = float(overhead), float(duration)
    return (o * d, d) if math.isfinite(o) and math.isfinite(d) and d > 0 else None


class LiveRuns:
    """The latest step, step times and open problems of each live (run, rank)."""

    def __init__(self) -> None:
        self.latest: dict[tuple[str, int], Latest] = {}
        # run_id -> (rank, code, subject) -> the alert record (raised or updated)
        self.problems: dict[str, dict[tuple[int, str, str], Any]] = {}

    def observe(self, hello: Hello, batch: Batch) -> None:
        """One stored batch of ``hello``'s trainer: steps, alerts, the end."""
        key = (batch.run_id, batch.rank)
        latest = self.latest.get(key)
        if latest is None:
            latest = self.latest[key] = Latest(run=hello.run)
            if len(self.latest) > MAX_TRACKED:
                self.forget(min(self.latest.items(), key=lambda kv: kv[1].arrived)[0][0])
        newest: dict[str, Any] | None = None
        # (step, cost): a batch holds light steps as columns and heavy ones as records,
        # so they are put in step order before the window keeps the last ones
        costs: list[tuple[int, tuple[float, float] | None]] = []
        for block in batch.columns:
            values = {name: _last(getattr(block, name), "q" if name == "step" else "d")
                      for name in _FIELDS}
            if newest is None or (values["step"] or 0) >= (newest["step"] or 0):
                newest = values
            latest.durations.extend(_floats(block.duration_s))
            steps = block.step.i64 if block.step is not None else b""
            costs += zip(struct.unpack(f"<{len(steps) // 8}q", steps),
                         map(_cost, _floats(block.overhead, keep_nan=True),
                             _floats(block.duration_s, keep_nan=True)), strict=False)
        from .schema import AlertRecord, EndRecord, StepRecord

        for record in batch.records:
            if isinstance(record, StepRecord):
                if newest is None or record.step >= (newest["step"] or 0):
                    newest = {name: getattr(record, name) for name in _FIELDS}
                if record.duration_s is not None:
                    latest.durations.append(float(record.duration_s))
                costs.append((record.step, _cost(record.overhead, record.duration_s)))
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
        costs.sort(key=lambda sc: sc[0])
        latest.costs.extend(cost for _, cost in costs if cost is not None)
        if newest is not None:
            for name, value in newest.items():
                setattr(latest, name, value)
            latest.arrived = time.time()

    def forget(self, run_id: str) -> None:
        """Drop every rank of a run (ended, or no longer live)."""
        for key in [k for k in self.latest if k[0] == run_id]:
            del self.latest[key]
        self.problems.pop(run_id, None)

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
