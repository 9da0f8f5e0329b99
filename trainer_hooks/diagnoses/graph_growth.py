"""``graph_growth``: the autograd graph (and the memory it holds) growing step over step.

A healthy training step builds a graph of the same size every time and frees it
after backward. When something carries a tensor from one step into the next
without ``.detach()`` (a hidden state kept on the module, ``total += loss``), each
step's graph contains every earlier one: ``graph_nodes`` climbs, memory climbs, and
backward walks all of it again, so steps get slower.

The capture names the module that receives a stale hidden state in its own
``graph_growth`` alert (subject: that module, or ``loss``). This detector watches
the numbers and uses the subject ``graph``, so the two never collide; when it has
seen the capture's alert it names that module too.

It fires when the graph has grown to ``graph_growth_ratio`` (1.5x) its size at the
start of the run (the smallest of the first ``graph_min_points``, 4, recorded sizes)
and is still growing: over the last ``graph_window`` (8) recorded steps, at least
``graph_rising_fraction`` (0.75) of the step pairs show growth (0.6 to keep holding
once raised), and, until raised, every recorded size is above the one before (or,
where two kinds of batch take turns, above the one before it): a graph that holds an
earlier step's grows by the step's own nodes, while the graphs of sequences of random
length (a character-level RNN fed one name per step) rise and fall. Comparing with
the start of the run, not with the start of the window, keeps a graph that grows by
the same number of nodes every step flagged however large it has become.

Example:
    >>> d = GraphGrowthDetector({"graph_window": 8, "graph_min_points": 4,
    ...     "graph_growth_ratio": 1.5, "graph_rising_fraction": 0.75})
    >>> for s in range(4):
    ...     v = d.observe({"kind": "step", "step": s, "graph_nodes": 100 * (s + 1)})
    >>> v["graph"].evidence["nodes_per_step"]
    100.0
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from itertools import pairwise
from typing import Any

from .base import (
    HYSTERESIS,
    Detector,
    Finding,
    Verdicts,
    fmt,
    sig,
    theil_sen,
)
from .thresholds import THRESHOLDS
from .trend import SlidingTrend

#: recorded sizes before growth in two interleaved sequences (two kinds of batch
#: taking turns) counts: 3 of each
TAKING_TURNS_MIN = 6


def _grows(points: list[tuple[int, int, int | None, bool]]) -> bool:
    """Whether each recorded size is above the one before (or equal where the walk was
    cut short at its limit)."""
    return all(a[1] < b[1] or (a[1] == b[1] and b[3]) for a, b in pairwise(points))


class GraphGrowthDetector(Detector):
    code = "graph_growth"
    needs = frozenset({"graph_nodes"})

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        window = int(config["graph_window"])
        self._points: deque[tuple[int, int, int | None, bool]] = deque(maxlen=window)
        self._trend = SlidingTrend(window)
        self._stale: list[str] = []
        self._early: list[int] = []
        self._holding = False
        self._streak = 0  # judgements in a row that held
        # the engine's: until then a judgement holds only on sizes that grew
        self._raise_after = int(config.get("raise_after", THRESHOLDS["raise_after"][0]))

    def note_alert(self, alert: Mapping[str, Any]) -> None:
        subject = alert.get("subject")
        stale = alert.get("code") == self.code and isinstance(subject, str)
        if stale and subject != "graph" and subject not in self._stale:
            self._stale.append(str(subject))

    def observe(self, record: Mapping[str, Any]) -> Verdicts:
        nodes = record.get("graph_nodes")
        step = record.get("step")
        if record.get("kind") != "step" or not isinstance(nodes, int) or not isinstance(step, int):
            return {}
        rss = record.get("rss_bytes")
        self._points.append(
            (
                step,
                nodes,
                rss if isinstance(rss, int) else None,
                bool(record.get("graph_truncated")),
            )
        )
        self._trend.push(float(step), float(nodes))
        if len(self._early) < int(self.config["graph_min_points"]):
            self._early.append(nodes)
        if len(self._points) < int(self.config["graph_min_points"]):
            return {}
        slope, last, rising = self._trend.trend()
        baseline = max(1, min(self._early))
        ratio = last / baseline
        needed = float(self.config["graph_rising_fraction"]) - (HYSTERESIS if self._holding else 0)
        holds = ratio >= float(self.config["graph_growth_ratio"]) and rising >= needed
        if holds and self._streak < self._raise_after:
            # Until raised: a graph that holds an earlier step's grows by at least the
            # step's own nodes (at the walk's limit it stays), from one recorded step to
            # the next, or from each to the one after next where two kinds of batch take
            # turns, each keeping its own (tree_gru's: judged on 3 sizes of each kind at
            # least, as 2 are too often in order by chance); the graphs of sequences of
            # random length rise and fall, and their rises alone looked like growth
            points = list(self._points)
            holds = _grows(points) or (
                len(points) >= TAKING_TURNS_MIN and _grows(points[::2]) and _grows(points[1::2])
            )
        self._streak = self._streak + 1 if holds else 0
        self._holding = holds
        if not self._holding:
            return {"graph": None}
        xs = [float(p[0]) for p in self._points]
        ys = [float(p[1]) for p in self._points]
        return {"graph": self._finding(xs, ys, slope, ratio, rising, baseline)}

    def _finding(
        self,
        xs: list[float],
        ys: list[float],
        slope: float,
        ratio: float,
        rising: float,
        baseline: int,
    ) -> Finding:
        truncated = any(p[3] for p in self._points)
        evidence: dict[str, Any] = {
            "steps": [int(x) for x in xs],
            "graph_nodes": [int(y) for y in ys],
            "nodes_per_step": sig(slope),
            "growth": sig(ratio),
            "start_nodes": baseline,
            "rising_fraction": sig(rising),
            "truncated": truncated,
        }
        at_least = "at least " if truncated else ""
        message = (
            f"the autograd graph keeps growing: {baseline:,} nodes at the start of the run, "
            f"{at_least}{int(ys[-1]):,} at step {int(xs[-1])} (+{fmt(slope)} per step over "
            f"steps {int(xs[0])}–{int(xs[-1])})"
        )
        rss = [(float(p[0]), float(p[2])) for p in self._points if p[2] is not None]
        if len(rss) >= 3:
            rss_slope = theil_sen([r[0] for r in rss], [r[1] for r in rss])
            evidence["rss_bytes_per_step"] = sig(rss_slope)
            if rss_slope > 0:
                message += f"; process memory +{fmt(rss_slope / 2**20)} MiB per step"
        hint = (
            "Something carries a tensor from one step into the next without detaching it: "
            "detach carried hidden states at the start of each sequence "
            "(h, c = h.detach(), c.detach()) and accumulate losses with loss.item(), "
            "not total += loss; then retain_graph=True is not needed"
        )
        if self._stale:
            names = ", ".join(self._stale)
            evidence["stale_modules"] = list(self._stale)
            message += f"; {names} received a hidden state still attached to an earlier step"
            hint = (
                f"Detach the hidden state that {names} carried over from the last step, at "
                "the start of each sequence (h, c = h.detach(), c.detach()); then "
                "retain_graph=True is not needed"
            )
        return Finding("error", message, hint, evidence)
