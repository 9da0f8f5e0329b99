"""``slowdown``: training steps getting slower, and what grows with them.

The run's starting speed is the median ``duration_s`` of its first
``slowdown_min_points`` (8) steps (after the first ``slowdown_skip_first`` steps,
which carry start-up work). It fires when the Theil–Sen trend over the last
``slowdown_window`` (30) steps puts the current step at ``slowdown_ratio`` (1.5x)
that speed or slower, and the steps are still getting slower: at least
``slowdown_rising_fraction`` (0.7) of the step pairs in the window got slower (0.55
to keep holding once raised, so that noise does not clear it and raise it again).
Theil–Sen is the median of pairwise slopes, so a garbage-collection pause or a
checkpoint write does not make a trend; comparing with the start of the run keeps a
steady linear slowdown flagged however slow the steps have become.

Against the run's own noise: nothing is judged before ``slowdown_min_window`` (16)
steps are in the window, and the trend's rise over the window must be at least
``slowdown_noise`` (3) times the window's jitter (1.4826 x the median absolute
deviation of the step times from the trend line), and each half of the window must
rise on its own (a rising fraction of 0.6: a trend keeps going, a level shift when
other processes load the machine is flat on one side), so a loaded machine's random
step times (±50%) make no trend however the pairs happen to fall; and it must hold
for ``slowdown_sustain`` (15) steps in a row before it is raised, longer than a burst
of load from other processes (10 steps at 2-20x, seen on a shared 2-core machine).

A second look judges the lows of whole epochs, the last 12 to 48 (``long_trend.py``):
a slowdown too slow per step for the window to see beside its jitter, and one raised
that bursts of slow steps would clear while it goes on.

Then it says what grew alongside since the start of the run: the autograd graph
(``graph_nodes``, 1.2x or more), process memory (``rss_bytes``, 1.1x or more), and
with ``profile=True`` the module whose time grew most. The subject is always
``step_time``.

Example:
    >>> from gradwatch.trainer_hooks.diagnoses.thresholds import resolve
    >>> d = SlowdownDetector(resolve(None))
    >>> for s in range(36):
    ...     v = d.observe({"kind": "step", "step": s, "duration_s": 0.01 * (1 + s),
    ...                    "graph_nodes": 50 * (1 + s)})
    >>> v["step_time"].evidence["explained_by"]
    ['graph_nodes']
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

from .base import (
    HYSTERESIS,
    Detector,
    Finding,
    Verdicts,
    as_float,
    fitted_last,
    fmt,
    median,
    sig,
    theil_sen,
    trend,
)
from .long_trend import LongTrend, StepTimeLows
from .profiles import module_rows
from .trend import SlidingTrend

#: a correlate "explains" the slowdown when it grew at least this much over the window
_GREW = {"graph_nodes": 1.2, "rss_bytes": 1.1}


def _jitter(xs: list[float], ys: list[float], slope: float, last: float) -> float:
    """The window's step-time noise: 1.4826 x the median absolute residual from the trend."""
    return 1.4826 * median(
        [abs(y - (last + slope * (x - xs[-1]))) for x, y in zip(xs, ys, strict=True)]
    )


def _both_halves_rise(xs: list[float], ys: list[float]) -> bool:
    """Whether each half of the window rises on its own: a trend keeps going, while a
    level shift (other processes start loading the machine) is flat on one side."""
    half = len(xs) // 2
    return all(trend(xs[a:b], ys[a:b])[2] >= _HALF_RISING for a, b in ((0, half), (half, len(xs))))


#: the rising fraction each half of the window needs (noise alone gives 0.5 ± 0.1)
_HALF_RISING = 0.6

#: judgements in a row that end at the rising fraction before the sorted slopes are
#: dropped. Kept, they cost each record ~12 µs (its 29 slopes in, the oldest's out);
#: built again at the next trend(), ~47 µs. A real loop's step times cross the rising
#: fraction now and then, one record at a time: on three workloads' own records,
#: keeping them for a whole window (30 records) made a light record's diagnoses
#: 1.06-1.40x dearer (BENCHMARKS.md, "Diagnoses: cost per record"). Kept through one
#: such record, so that a slowdown's run of trend() calls keeps them.
KEEP_SLOPES = 2

#: epoch judgements in a row the long horizon must hold before a new slowdown counts
LONG_CONFIRM = 2
#: and miss before a raised one stops holding: an epoch's low is noisier than a trend
#: that has held for epochs
LONG_RELEASE = 3

#: the graph size and memory are kept every this many steps (their value when a
#: judged span began), the last MARKS of them: 16,384 steps
MARK_EVERY = 32
MARKS = 512


class SlowdownDetector(Detector):
    code = "slowdown"

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        window = int(config["slowdown_window"])
        self._rows: deque[Mapping[str, Any]] = deque(maxlen=window)
        # the window's step times as (step, seconds), its pairwise slopes kept sorted:
        # this runs on every step record, and recomputing 435 slopes each time was most
        # of the diagnoses' cost per record
        self._trend = SlidingTrend(window)
        self._seen = 0
        self._early: list[float] = []
        self._early_end = 0.0  # the step that completed the starting speed
        # the graph size and memory: their last measurements (the graph is measured on
        # captured steps only, 0-2 of a 30-step window under the default budget), and
        # one every MARK_EVERY steps, so the value when a judged span began is known
        self._measured: dict[str, deque[tuple[float, float]]] = {
            field: deque(maxlen=window) for field in _GREW
        }
        self._marks: dict[str, deque[tuple[float, float]]] = {
            field: deque(maxlen=MARKS) for field in _GREW
        }
        # the same, as one tuple to walk on every record
        self._tracked = tuple((f, self._measured[f], self._marks[f]) for f in _GREW)
        self._streak = 0  # judgements in a row that held
        self._cold = 0  # judgements in a row that ended at the rising fraction
        # the thresholds as numbers once (this runs on every step record)
        self._skip_first = int(config["slowdown_skip_first"])
        self._min_points = int(config["slowdown_min_points"])
        self._min_window = int(config["slowdown_min_window"])
        self._sustain = int(config["slowdown_sustain"])
        self._rising = float(config["slowdown_rising_fraction"])
        # the second look: the lows of whole epochs (long_trend.py)
        self._lows = StepTimeLows(
            # an epoch's low from fewer steps is noisier than a slow trend's rise over
            # 12 of them: shorter epochs are joined (a 64-step epoch flapped 1 run in 4)
            min_block=4 * window,
            blocks=int(config["slowdown_long_blocks"]),
            ratio=float(config["slowdown_ratio"]),
            rising=float(config["slowdown_long_rising"]),
            growth=float(config["slowdown_long_growth"]),
            noise=float(config["slowdown_noise"]),
            even=float(config["slowdown_long_even"]),
        )
        self._long: LongTrend | None = None  # the last epoch's judgement
        self._long_streak = 0  # epoch judgements in a row that held
        self._long_misses = 0  # and in a row that did not

    def observe(self, record: Mapping[str, Any]) -> Verdicts:
        if record.get("kind") == "epoch":
            if self._seen > self._skip_first and self._lows.epoch_ended():
                self._judge_long(raised=self._streak >= self._sustain)
            return {}
        duration = as_float(record.get("duration_s"))
        if (
            record.get("kind") != "step"
            or duration is None
            or not isinstance(record.get("step"), int)
        ):
            return {}
        # what grows alongside, from the first step on: the warm-up skipped below is
        # the step time's, the graph and memory are what they are
        for field, points, marks in self._tracked:
            value = record.get(field)
            if type(value) is int and value > 0:  # not a bool, not a float
                point = (float(record["step"]), float(value))
                points.append(point)
                if not marks or point[0] >= marks[-1][0] + MARK_EVERY:
                    marks.append(point)
        self._seen += 1
        if self._seen <= self._skip_first:
            return {}
        self._rows.append(
            {
                "step": record["step"],
                "duration_s": duration,
                # parsed only when a slowdown holds (_module), not on every step
                "profile": record.get("profile"),
            }
        )
        self._trend.push(float(record["step"]), duration)
        self._lows.push(float(record["step"]), duration)
        if len(self._early) < self._min_points:
            self._early.append(duration)
            self._early_end = float(record["step"])
            if len(self._early) == self._min_points:
                # the values when the starting speed was complete, what grew is read from
                for field, points in self._measured.items():
                    marks = self._marks[field]
                    if points and (not marks or marks[-1] != points[-1]):
                        marks.append(points[-1])
        if len(self._early) < self._min_points or len(self._rows) < self._min_window:
            return {}
        raised = self._streak >= self._sustain
        finding = self._short(raised)
        if finding is None and self._long is not None and (
            raised or self._long_streak >= LONG_CONFIRM
        ):
            finding = self._long_finding(self._long)
        self._streak = self._streak + 1 if finding is not None else 0
        return {"step_time": finding}

    def _judge_long(self, raised: bool) -> None:
        """An ended epoch's judgement of the long horizon. Each stands for the epoch's
        records, so it takes LONG_CONFIRM in a row to start holding, and LONG_RELEASE
        misses in a row to stop once raised: one noisy epoch must not clear it."""
        seen = self._lows.judge(raised=raised)
        if seen is not None:
            self._long, self._long_streak, self._long_misses = seen, self._long_streak + 1, 0
            return
        self._long_misses += 1
        if not (raised and self._long is not None and self._long_misses < LONG_RELEASE):
            self._long, self._long_streak = None, 0

    def _short(self, raised: bool) -> Finding | None:
        """The 30-step window's judgement: strict until raised (the full rising
        fraction, a rise clear of the noise, both halves rising), then the looser
        rising fraction alone keeps it (a late linear slowdown rises little per window)."""
        needed = self._rising - (HYSTERESIS if raised else 0)
        if self._trend.rising() < needed:
            # Cannot hold, whatever the slope: most records of a steady run end here,
            # without the slopes' sort (this runs on every step record). The sorted
            # slopes are dropped after KEEP_SLOPES such records, kept in between.
            self._cold += 1
            if self._cold >= KEEP_SLOPES:
                self._trend.release()
            return None
        self._cold = 0
        slope, last, rising = self._trend.trend()
        baseline = median(self._early)
        ratio = last / baseline if baseline > 0 else 1.0
        holds = ratio >= float(self.config["slowdown_ratio"]) and rising >= needed
        xs = [float(r["step"]) for r in self._rows]
        ys = [float(r["duration_s"]) for r in self._rows]
        jitter = _jitter(xs, ys, slope, last) if holds else 0.0
        if holds and not raised:
            holds = slope * (xs[-1] - xs[0]) >= float(
                self.config["slowdown_noise"]
            ) * jitter and _both_halves_rise(xs, ys)
        if not holds:
            return None
        return self._finding(xs, ys, slope, ratio, rising, baseline, jitter)

    def _long_finding(self, seen: LongTrend) -> Finding:
        """The long horizon's judgement as a finding: its lows stand for the steps."""
        finding = self._finding(
            seen.xs, seen.ys, seen.slope, seen.last / seen.base, seen.rising, seen.base,
            seen.jitter, last=seen.last,
            over="Theil–Sen on the fastest tenth of each epoch's steps", since=seen.base_end,
        )
        finding.evidence["horizon_steps"] = int(seen.xs[-1] - seen.xs[0])
        return finding

    def _correlates(self, since: float) -> dict[str, float]:
        """How much graph size and memory grew since the starting speed was measured:
        their trend now (over their last ``slowdown_window`` measurements) over their
        value when it was complete (the last one measured by step ``since``, else the
        first kept). Not from step 0: memory grows in warm-up, and a first epoch may
        build a smaller graph than all the later ones."""
        grown: dict[str, float] = {}
        for field, points in self._measured.items():
            marks = self._marks[field]
            before = [p for p in marks if p[0] <= since]
            then = before[-1] if before else (marks[0] if marks else None)
            if then is None or (len(points) < 2 and points[-1] == then):
                continue  # one measurement says nothing of growth
            # the trend of the measurements since then (the graph's are few: its walk
            # is paced by what it finds), else of the last two
            recent = [p for p in points if p[0] >= since]
            recent = recent if len(recent) >= 2 else list(points)[-2:]
            xs, ys = [p[0] for p in recent], [p[1] for p in recent]
            if len(recent) >= 3:
                slope, last = fitted_last(xs, ys)
            else:
                slope = (ys[-1] - ys[0]) / (xs[-1] - xs[0]) if xs[-1] != xs[0] else 0.0
                last = ys[-1]
            # A graph still growing, or it explains nothing: one built larger once (a
            # module added at an epoch) and flat since is not what slows each step.
            # (Memory grows in jumps: a flat stretch between two says nothing.)
            still = slope > 0 or field != "graph_nodes"
            grown[field] = last / then[1] if still else min(last / then[1], 1.0)
        return grown

    def _module(self, xs: list[float]) -> tuple[str, float] | None:
        """The profiled module whose time grew fastest (slope in s per step)."""
        times = [
            {n: row.total_s for n, row in module_rows(r["profile"], r["duration_s"]).items()}
            for r in self._rows
        ]
        names = {n for t in times for n in t}
        best: tuple[str, float] | None = None
        for name in sorted(names):
            pts = [(x, t[name]) for x, t in zip(xs, times, strict=True) if name in t]
            if len(pts) < 3:
                continue
            s = theil_sen([p[0] for p in pts], [p[1] for p in pts])
            # Prefer the deepest module among equals: a child explains more than its parent.
            if (
                best is None
                or s > best[1] * 1.05
                or (s >= best[1] * 0.95 and name.startswith(best[0] + "."))
            ):
                best = (name, s)
        return best

    def _finding(
        self,
        xs: list[float],
        ys: list[float],
        slope: float,
        ratio: float,
        rising: float,
        first: float,
        jitter: float,
        last: float | None = None,
        over: str = "Theil–Sen",
        since: float | None = None,
    ) -> Finding:
        if last is None:
            last = ys[-1] if len(ys) < 3 else sorted(ys[-3:])[1]
        grown = self._correlates(since=self._early_end if since is None else since)
        explained = [f for f, r in grown.items() if r >= _GREW[f]]
        evidence: dict[str, Any] = {
            "steps": [int(xs[0]), int(xs[-1])],
            "seconds_per_step": sig(slope),
            "growth": sig(ratio),
            "rising_fraction": sig(rising),
            "first_s": sig(first),
            "last_s": sig(last),
            "explained_by": explained,
            "jitter_s": sig(jitter),
        }
        for f, r in grown.items():
            evidence[f"{f}_growth"] = sig(r)
        message = (
            f"steps are getting slower: {fmt(first * 1e3)} ms at the start of the run, "
            f"{fmt(last * 1e3)} ms at step {int(xs[-1])} (+{fmt(slope * 1e3)} ms per step over "
            f"steps {int(xs[0])}–{int(xs[-1])}, {over})"
        )
        if "graph_nodes" in explained:
            message += f"; the autograd graph grew {grown['graph_nodes']:.1f}x alongside"
            hint = (
                "The graph grows with the step time: something carries autograd history "
                "from step to step. Detach carried state (h = h.detach(); for state kept on "
                "objects such as tree.state, reset or detach it every epoch) and accumulate "
                "losses with loss.item()"
            )
        elif "rss_bytes" in explained:
            message += f"; process memory grew {grown['rss_bytes']:.2f}x alongside"
            hint = (
                "Memory grows with the step time: look for tensors kept across steps "
                "(lists of outputs or losses, caches, state stored on data objects) and "
                "detach or drop them"
            )
        else:
            message += "; " + {
                2: "neither the graph size nor memory grew with it",
                1: ("memory did not grow with it (the graph size is not measured yet)"
                    if "rss_bytes" in grown else
                    "the graph size did not grow with it (memory is not measured)"),
                0: "the graph size and memory are not measured",
            }[len(grown)]
            hint = (
                "Look for work that grows with time outside the graph (growing lists, "
                "data loading, logging); watch(..., profile=True) shows which module's "
                "time grows"
            )
        module = self._module(xs)
        if module is not None and module[1] > 0.3 * slope:
            evidence["module"], evidence["module_seconds_per_step"] = module[0], sig(module[1])
            message += (
                f"; most of the added time is in {module[0]} (+{fmt(module[1] * 1e3)} ms per step)"
            )
        hint += (
            ". If the work grows by design (a curriculum of longer sequences, layers "
            "unfrozen epoch by epoch), this is expected"
        )
        return Finding(
            "warning", message, hint, evidence, sustain=int(self.config["slowdown_sustain"])
        )
