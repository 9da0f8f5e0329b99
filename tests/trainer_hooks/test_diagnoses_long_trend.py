"""slowdown's long horizon: steady slowdowns too slow per step for its 30-step window,
kept through bursts, and silent when another process starts sharing the core."""

from __future__ import annotations

import random
from typing import Any

import pytest

from gradwatch.trainer_hooks.diagnoses import DiagnosisEngine
from gradwatch.trainer_hooks.diagnoses.long_trend import LOW_QUANTILE, StepTimeLows

#: the long horizon switched off: its rising fraction can never be reached
SHORT_ONLY = {"slowdown_long_rising": 1.01}


def slowdown_states(durations: list[float], config: dict[str, Any] | None = None) -> list[
    tuple[str, int]
]:
    engine = DiagnosisEngine(config)
    states = []
    for n, seconds in enumerate(durations):
        for alert in engine.observe({"kind": "step", "step": n, "duration_s": seconds}):
            if alert["code"] == "slowdown" and alert["state"] != "updated":
                states.append((alert["state"], alert["step"]))
    return states


def with_bursts(rng: random.Random, durations: list[float], every: int = 150) -> list[float]:
    """Bursts of load from other processes: 10 steps at 2-8x, now and then."""
    out = list(durations)
    for start in range(rng.randrange(every), len(out), every):
        for n in range(start, min(start + 10, len(out))):
            out[n] *= rng.uniform(2, 8)
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("start_ms", "end_ms"), [(2.6, 7.3), (3.2, 13.0)])
def test_a_steady_slowdown_too_slow_for_the_window_is_raised_once_and_kept(
    seed: int, start_ms: float, end_ms: float
) -> None:
    # a list that grows every step, under ±50% jitter and bursts of load: each 30-step
    # window rises too little beside the jitter to be a trend
    rng = random.Random(seed)
    steps = 2000
    durations = with_bursts(rng, [
        1e-3 * (start_ms + (end_ms - start_ms) * n / steps) * rng.uniform(1.0, 2.0)
        for n in range(steps)
    ])
    assert slowdown_states(durations, SHORT_ONLY) == []  # the premise: the window misses it
    states = slowdown_states(durations)
    assert [s for s, _ in states] == ["raised"]
    # raised about when the steps are 1.5x slower (a trend fitted on noisy lows
    # reaches it a little early or late), long before the end
    ratio_reached = int(steps * (0.5 * start_ms) / (end_ms - start_ms))
    assert 0.8 * ratio_reached < states[0][1] < ratio_reached + 800


def test_the_long_horizon_says_what_it_measured() -> None:
    rng = random.Random(7)
    engine = DiagnosisEngine()
    alerts = []
    for n in range(1500):
        seconds = 1e-3 * (3 + 6 * n / 1500) * rng.uniform(1.0, 2.0)
        alerts += engine.observe({"kind": "step", "step": n, "duration_s": seconds,
                                  "graph_nodes": 400, "rss_bytes": 10**9})
    (raised,) = [a for a in alerts if a["code"] == "slowdown" and a["state"] == "raised"]
    assert "fastest tenth of each 30 steps" in raised["message"]
    assert "neither the graph size nor memory grew" in raised["message"]
    evidence = raised["evidence"]
    assert evidence["horizon_steps"] >= 330  # 12 blocks of 30: centres 330 steps apart
    # the starting time is the first block's fastest tenth: ~3 ms, not the noisy median
    assert 2.9e-3 <= evidence["first_s"] <= 3.4e-3
    assert evidence["growth"] >= 1.5


@pytest.mark.parametrize("seed", range(4))
def test_a_raised_slowdown_is_not_cleared_by_bursts_while_it_grows(seed: int) -> None:
    # 3 ms to 30 ms over 1,000 steps; bursts of slow steps at a window's start used to
    # hold its rising fraction down until the alert cleared, never to come back
    rng = random.Random(seed)
    durations = with_bursts(
        rng, [1e-3 * (3 + 27 * n / 1000) * rng.uniform(1.0, 1.6) for n in range(1000)], 60
    )
    states = slowdown_states(durations)
    assert [s for s, _ in states] == ["raised"]


@pytest.mark.parametrize("seed", range(3))
def test_a_long_slowdown_that_levels_off_clears_once(seed: int) -> None:
    rng = random.Random(seed)
    durations = [
        1e-3 * (2.5 + 5 * min(n, 1500) / 1500) * rng.uniform(1.0, 2.0) for n in range(4000)
    ]
    states = slowdown_states(durations)
    assert [s for s, _ in states] == ["raised", "cleared"]
    assert states[1][1] > 1500  # cleared after it levelled off, not while it grew


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("shared", ["every step", "some steps", "over 60 steps"])
def test_another_process_sharing_the_core_from_some_step_on_is_no_slowdown(
    seed: int, shared: str
) -> None:
    # Steps longer than the scheduler's slice all slow down at once ("every step");
    # steps of a few ms are slowed when a slice lands in them ("some steps"); a burner
    # that starts its work gradually slows them over 60 steps.
    rng = random.Random(seed)
    at = rng.randrange(500, 1500)
    durations = []
    for n in range(2500):
        seconds = 1e-3 * (9 if shared == "every step" else 2.5) * rng.uniform(1.0, 1.5)
        if shared == "every step" and n >= at:
            seconds *= 2.0
        elif shared == "some steps" and n >= at and rng.random() < 0.6:
            seconds *= rng.uniform(1.5, 4.0)
        elif shared == "over 60 steps" and n >= at:
            seconds *= 1 + min((n - at) / 60, 1.0)
        durations.append(seconds)
    assert slowdown_states(with_bursts(rng, durations)) == []


def test_block_lows_are_the_fastest_tenth_and_the_base_the_first_block() -> None:
    lows = StepTimeLows(block=30, blocks=4, ratio=1.5, rising=0.8, growth=1.2,
                        noise=3.0, even=0.33)
    rng = random.Random(1)
    first = [float(v) for v in range(100, 130)]
    rng.shuffle(first)
    closed = [lows.push(float(n), v) for n, v in enumerate(first)]
    assert closed == [False] * 29 + [True]
    assert lows.base == sorted(first)[int(LOW_QUANTILE * 29)] == 102.0
    second = [v * 3 for v in first]
    rng.shuffle(second)
    for n, v in enumerate(second, start=30):
        lows.push(float(n), v)
    assert lows.base == 102.0  # the run's start stays the first block's
    assert lows.judge(raised=False) is None  # two blocks: no horizon yet


def test_block_lows_refuse_a_horizon_too_short_to_judge() -> None:
    with pytest.raises(ValueError, match="expected block >= 1 and blocks >= 4, got 30, 3"):
        StepTimeLows(block=30, blocks=3, ratio=1.5, rising=0.8, growth=1.2,
                     noise=3.0, even=0.33)
