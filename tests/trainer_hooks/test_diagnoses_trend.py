"""The incremental Theil–Sen trend gives the brute-force trend's numbers, exactly."""

from __future__ import annotations

import math
import random

import pytest

from gradwatch.trainer_hooks.diagnoses import DiagnosisEngine
from gradwatch.trainer_hooks.diagnoses.base import trend
from gradwatch.trainer_hooks.diagnoses.trend import SlidingTrend


def same(a: tuple[float, float, float], b: tuple[float, float, float]) -> bool:
    return all((x == y) or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b, strict=True))


def value(rng: random.Random, kind: str) -> float:
    if kind == "noise":
        return rng.gauss(0.02, 0.005)
    if kind == "ties":  # many equal values and equal slopes (integer graph sizes)
        return float(rng.choice([100, 100, 120, 150]))
    if kind == "rising":
        return rng.uniform(0.0, 1.0) + rng.random() * 3
    return rng.choice([rng.gauss(0.0, 1.0), 0.0, -0.0, 1e-300, 1e300, -1e300])


@pytest.mark.parametrize("window", [1, 2, 3, 8, 30])
@pytest.mark.parametrize("kind", ["noise", "ties", "rising", "extreme"])
def test_sliding_trend_equals_brute_force_trend_on_random_windows(window: int, kind: str) -> None:
    rng = random.Random(f"{window}-{kind}")
    sliding = SlidingTrend(window)
    xs: list[float] = []
    ys: list[float] = []
    x = 0.0
    for _ in range(200):
        # steps usually rise by one; sometimes jump, repeat (equal x: no slope) or go back
        x += rng.choice([1.0, 1.0, 1.0, 5.0, 0.0, -2.0])
        y = value(rng, kind)
        sliding.push(x, y)
        xs, ys = [*xs, x][-window:], [*ys, y][-window:]
        expected = trend(xs, ys)
        # the rising count is kept always; the sorted slopes only between a trend()
        # and a release(): both ways must give the brute force's numbers
        assert same((sliding.rising(),), (expected[2],)), (xs, ys)
        if rng.random() < 0.5:
            assert same(sliding.trend(), expected), (xs, ys)
        if rng.random() < 0.2:
            sliding.release()


@pytest.mark.parametrize(
    "points",
    [
        # subnormal y differences over x gaps of 2: the slope rounds to zero, so a pair
        # whose newer y is larger does not rise (the sorted-y count would say it does)
        [(0.0, 5e-324), (2.0, 1e-323), (4.0, 1.5e-323), (6.0, 2e-323), (8.0, 1.0)],
        # a tiny point followed by ordinary ones: the counts may only come from sorted
        # y values again once the tiny point has left the window
        [(0.0, 1.0), (2.0, -5e-324), (4.0, 0.0), (6.0, 0.0), (8.0, 1.0), (10.0, 2.0)],
        # x goes back and repeats, then rises again
        [(0.0, 1.0), (1.0, 2.0), (0.5, 3.0), (0.5, 0.5), (2.0, 1.0), (3.0, 4.0), (4.0, 0.0)],
    ],
)
@pytest.mark.parametrize("window", [2, 3])
def test_sliding_trend_counts_exactly_where_slopes_are_not_the_y_differences_sign(
    points: list[tuple[float, float]], window: int
) -> None:
    sliding = SlidingTrend(window)
    for i, (x, y) in enumerate(points):
        sliding.push(x, y)
        held = points[max(0, i - window + 1) : i + 1]
        expected = trend([p[0] for p in held], [p[1] for p in held])
        assert sliding.rising() == expected[2], held


def test_sliding_trend_counts_from_sorted_values_on_an_ordinary_run() -> None:
    """The usual case (steps that only grow, ordinary seconds) takes the sorted-y count."""
    rng = random.Random(3)
    sliding = SlidingTrend(30)
    for step in range(100):
        sliding.push(float(step), rng.gauss(0.02, 0.005))
    assert sliding._ys_sorted == sorted(sliding.ys)  # type: ignore[attr-defined]


def test_sliding_trend_falls_back_while_a_non_finite_point_is_in_the_window() -> None:
    sliding = SlidingTrend(4)
    points = [(0.0, 1.0), (1.0, math.nan), (2.0, 3.0), (3.0, math.inf), (4.0, 5.0),
              (5.0, 6.0), (6.0, 7.0), (7.0, 9.0), (8.0, 8.0)]
    for i, (x, y) in enumerate(points):
        sliding.push(x, y)
        window = points[max(0, i - 3) : i + 1]
        expected = trend([p[0] for p in window], [p[1] for p in window])
        assert same(sliding.trend(), expected), window
    assert sliding._slopes is not None  # the non-finite points left: incremental again


def test_detectors_feed_their_trend_the_window_they_judge() -> None:
    """slowdown and graph_growth: the kept trend equals the brute-force trend of their
    own window on every record of a long noisy run that slows down and grows."""
    rng = random.Random(7)
    engine = DiagnosisEngine()
    slowdown = next(d for d in engine.detectors if d.code == "slowdown")
    growth = next(d for d in engine.detectors if d.code == "graph_growth")
    codes = []
    for n in range(400):
        base = 0.02 if n < 200 else 0.02 + 0.0004 * (n - 200)
        record = {"kind": "step", "step": n, "t": float(n),
                  "duration_s": base * rng.uniform(0.8, 1.25)}
        if n % 3 == 0:  # heavy steps only, as with every=3
            record["graph_nodes"] = 400 + (4 * (n - 300) if n > 300 else rng.choice([0, 0, 4]))
        codes += [a["code"] for a in engine.observe(record)]
        rows = slowdown._rows  # type: ignore[attr-defined]
        if rows:
            expected = trend([float(r["step"]) for r in rows], [r["duration_s"] for r in rows])
            assert slowdown._trend.trend() == expected  # type: ignore[attr-defined]
        points = growth._points  # type: ignore[attr-defined]
        if points:
            expected = trend([float(p[0]) for p in points], [float(p[1]) for p in points])
            assert growth._trend.trend() == expected  # type: ignore[attr-defined]
    assert "slowdown" in codes and "graph_growth" in codes  # the premise: both fired


def test_slowdown_alerts_do_not_depend_on_how_long_the_sorted_slopes_are_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Step times that drift in runs (as a real loop's do) cross the rising fraction
    now and then; the slopes are dropped KEEP_SLOPES records later and built again at
    the next crossing. The alerts are those of slopes kept for a whole window."""
    from gradwatch.trainer_hooks.diagnoses import slowdown

    rng = random.Random(11)
    drift, records = 0.0, []
    for n in range(700):
        drift = 0.9 * drift + rng.gauss(0.0, 0.002)  # autocorrelated: runs of slow steps
        ramp = 0.0003 * (n - 500) if n > 500 else 0.0  # then a real slowdown
        records.append({"kind": "step", "step": n, "t": float(n),
                        "duration_s": 0.02 + abs(drift) + ramp})
    runs: dict[int, list[tuple[int, str, str]]] = {}
    builds: dict[int, int] = {}
    default = slowdown.KEEP_SLOPES
    for keep in (1, default, 30):
        monkeypatch.setattr(slowdown, "KEEP_SLOPES", keep)
        engine = DiagnosisEngine()
        detector = next(d for d in engine.detectors if d.code == "slowdown")
        alerts, built = [], 0
        for record in records:
            before = detector._trend._slopes  # type: ignore[attr-defined]
            alerts += [(a["step"], a["code"], a["state"]) for a in engine.observe(record)]
            after = detector._trend._slopes  # type: ignore[attr-defined]
            built += before is None and after is not None
        runs[keep], builds[keep] = alerts, built
    assert runs[1] == runs[default] == runs[30]
    assert (500 < runs[30][0][0] < 700, runs[30][0][1:]) == (True, ("slowdown", "raised"))
    # the premise: kept for shorter, the slopes were dropped and built again more often
    assert builds[1] >= builds[default] > builds[30] >= 1
