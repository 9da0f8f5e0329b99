"""slowdown's second look, epoch by epoch: steady slowdowns too slow per step for its
30-step window, kept through bursts, and silent when another process starts sharing
the core or when batches sorted by length make every epoch slow down and speed up."""

from __future__ import annotations

import importlib.util
import random
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest

from gradwatch.trainer_hooks.diagnoses import DiagnosisEngine
from gradwatch.trainer_hooks.diagnoses.long_trend import CHUNK, LOW_QUANTILE, StepTimeLows

#: the second look switched off: its rising fraction can never be reached
SHORT_ONLY = {"slowdown_long_rising": 1.01}


def slowdown_alerts(
    durations: list[float], epoch: int | None = 64, config: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The slowdown alerts of a run with these step times and an epoch record every
    ``epoch`` steps (None: a loop that never calls ``Monitor.epoch()``)."""
    engine = DiagnosisEngine(config)
    alerts = []
    for n, seconds in enumerate(durations):
        alerts += engine.observe({"kind": "step", "step": n, "duration_s": seconds})
        if epoch is not None and (n + 1) % epoch == 0:
            alerts += engine.observe({"kind": "epoch", "epoch": n // epoch, "step": n,
                                      "duration_s": 1.0, "steps": epoch})
    return [a for a in alerts if a["code"] == "slowdown"]


def states(durations: list[float], epoch: int | None = 64,
           config: dict[str, Any] | None = None) -> list[tuple[str, int]]:
    return [(a["state"], a["step"]) for a in slowdown_alerts(durations, epoch, config)
            if a["state"] != "updated"]


def _sweep() -> Any:
    """bench/slowdown_sweep.py, whose synthetic step times these tests use too."""
    path = Path(__file__).resolve().parents[2] / "bench" / "slowdown_sweep.py"
    spec = importlib.util.spec_from_file_location("slowdown_sweep", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("slowdown_sweep", module)
    spec.loader.exec_module(module)
    return module


sweep = _sweep()
with_bursts = sweep.bursts  # bursts of load from other processes: 10 steps at 2-8x
ms = sweep.ms  # step times of level(n) ms, each slowed by up to jitter x itself


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("start_ms", "end_ms"), [(2.6, 7.3), (3.2, 13.0)])
def test_a_steady_slowdown_too_slow_for_the_window_is_raised_once_and_kept(
    seed: int, start_ms: float, end_ms: float
) -> None:
    # a list that grows every step, under ±50% jitter and bursts of load: each 30-step
    # window rises too little beside the jitter to be a trend
    rng = random.Random(seed)
    durations = with_bursts(rng, ms(rng, 2000, lambda n: start_ms + (end_ms - start_ms) * n / 2000))
    assert states(durations, config=SHORT_ONLY) == []  # the premise: the window misses it
    found = states(durations)
    assert [s for s, _ in found] == ["raised"]
    # raised after the steps are 1.5x slower (the second look needs six blocks of
    # epochs), long before the end
    assert int(2000 * 0.5 * start_ms / (end_ms - start_ms)) < found[0][1] < 1500


def test_the_second_look_says_what_it_measured() -> None:
    rng = random.Random(7)
    engine = DiagnosisEngine()
    alerts = []
    for n in range(3000):
        seconds = 1e-3 * (3 + 6 * n / 3000) * rng.uniform(1.0, 2.0)
        alerts += engine.observe({"kind": "step", "step": n, "duration_s": seconds,
                                  "graph_nodes": 400, "rss_bytes": 10**9})
        if (n + 1) % 200 == 0:
            alerts += engine.observe({"kind": "epoch", "epoch": n // 200, "step": n,
                                      "duration_s": 0.9, "steps": 200})
    (raised,) = [a for a in alerts if a["code"] == "slowdown" and a["state"] == "raised"]
    assert "fastest tenth of each epoch's steps" in raised["message"]
    assert "neither the graph size nor memory grew" in raised["message"]
    evidence = raised["evidence"]
    assert evidence["horizon_steps"] >= 5 * 200  # six epochs at least, centre to centre
    # the start is the fastest tenth of the first epochs: ~3.3 ms, not a noisy median
    assert 3.0e-3 <= evidence["first_s"] <= 3.6e-3
    assert evidence["growth"] >= 1.5


@pytest.mark.parametrize("seed", range(4))
def test_a_raised_slowdown_is_not_cleared_by_bursts_while_it_grows(seed: int) -> None:
    # 3 ms to 30 ms over 1,000 steps; bursts of slow steps at a window's start used to
    # hold its rising fraction down until the alert cleared, never to come back
    rng = random.Random(seed)
    durations = with_bursts(rng, ms(rng, 1000, lambda n: 3 + 27 * n / 1000, 0.6), 60)
    assert [s for s, _ in states(durations)] == ["raised"]


@pytest.mark.parametrize("seed", range(3))
def test_a_cost_that_grows_once_an_epoch_is_raised_and_kept_while_it_grows(seed: int) -> None:
    # each epoch adds work that runs on every step (a frozen teacher per epoch)
    rng = random.Random(seed)
    durations = with_bursts(rng, ms(rng, 8000, lambda n: 3 + 1.5 * (n // 1000), 0.5))
    assert states(durations, epoch=1000, config=SHORT_ONLY) == []  # the premise
    assert [s for s, _ in states(durations, epoch=1000)] == ["raised"]


@pytest.mark.parametrize("seed", range(3))
def test_a_slowdown_that_levels_off_clears_once(seed: int) -> None:
    rng = random.Random(seed)
    durations = ms(rng, 6000, lambda n: 2.5 + 5 * min(n, 1500) / 1500)
    found = states(durations)
    assert [s for s, _ in found] == ["raised", "cleared"]
    assert found[1][1] > 1500  # cleared after it levelled off, not while it grew


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("epoch", [400, 800])
def test_batches_sorted_by_length_in_each_epoch_are_no_slowdown(seed: int, epoch: int) -> None:
    # longer sequences towards each epoch's end: steps 1.8x slower, then fast again at
    # the next epoch; nothing grows from one epoch to the next
    rng = random.Random(seed)
    durations = with_bursts(rng, ms(rng, 6000, lambda n: 3 * (1 + 0.8 * (n % epoch) / epoch), 0.5))
    assert states(durations, epoch=epoch) == []


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("shared", ["every step", "some steps", "over 60 steps", "twice"])
def test_another_process_sharing_the_core_from_some_step_on_is_no_slowdown(
    seed: int, shared: str
) -> None:
    # Steps longer than the scheduler's slice all slow down at once ("every step");
    # steps of a few ms are slowed when a slice lands in them ("some steps"); a burner
    # that starts its work gradually slows them over 60 steps; a second one starts
    # 360 steps after the first
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
        elif shared == "twice" and n >= at:
            seconds *= 1.6 if n < at + 360 else 2.2
        durations.append(seconds)
    assert states(with_bursts(rng, durations)) == []


def test_a_loop_that_never_ends_an_epoch_gets_no_second_look() -> None:
    rng = random.Random(2)
    durations = with_bursts(rng, ms(rng, 2000, lambda n: 2.6 + 4.7 * n / 2000))
    assert states(durations, epoch=64) != []
    assert states(durations, epoch=None) == []  # documented: the window alone


def test_epoch_lows_are_the_fastest_tenth_and_the_start_the_fastest_first_epoch() -> None:
    lows = StepTimeLows(min_block=30, blocks=6, ratio=1.5, rising=0.8, growth=1.2,
                        noise=3.0, even=0.33)
    rng = random.Random(1)
    epochs = []
    for scale in (3.0, 2.0, 2.5, 4.0):  # a slow first epoch (caching), then faster
        times = [scale * v for v in range(100, 140)]
        rng.shuffle(times)
        epochs.append(times)
    step = 0
    for times in epochs:
        for seconds in times:
            lows.push(float(step), seconds)
            step += 1
        assert lows.epoch_ended()
    low = sorted(range(100, 140))[int(LOW_QUANTILE * 39)]  # 103
    assert [y for _, y in lows._lows] == [3.0 * low, 2.0 * low, 2.5 * low, 4.0 * low]
    assert lows.base == 2.0 * low  # the fastest of the first three epochs


def test_short_epochs_are_joined_and_long_ones_taken_in_chunks() -> None:
    lows = StepTimeLows(min_block=30, blocks=6, ratio=1.5, rising=0.8, growth=1.2,
                        noise=3.0, even=0.33)
    for n in range(20):
        lows.push(float(n), 1.0 + n)
    assert not lows.epoch_ended()  # 20 steps: it goes on into the next epoch
    for n in range(20, 40):
        lows.push(float(n), 1.0 + n)
    assert lows.epoch_ended()
    assert lows._lows[-1] == (19.5, sorted(1.0 + n for n in range(40))[3])
    # an epoch of 3 chunks and a rest: the median of the chunks' lows (and the rest's)
    values = [float(v) for v in range(3 * CHUNK + 40)]
    for n, seconds in enumerate(values, start=40):
        lows.push(float(n), seconds)
    assert lows.epoch_ended()
    chunk_lows = [values[k * CHUNK + int(LOW_QUANTILE * (CHUNK - 1))] for k in range(3)]
    rest_low = values[3 * CHUNK + int(LOW_QUANTILE * 39)]
    assert lows._lows[-1][1] == statistics.median([*chunk_lows, rest_low])


def test_epoch_lows_refuse_a_horizon_too_short_to_judge() -> None:
    with pytest.raises(ValueError, match="expected min_block >= 1 and blocks >= 6, got 30, 4"):
        StepTimeLows(min_block=30, blocks=4, ratio=1.5, rising=0.8, growth=1.2,
                     noise=3.0, even=0.33)


@pytest.mark.parametrize("seed", range(3))
def test_a_slow_first_epoch_that_fills_a_cache_does_not_hide_a_slowdown(seed: int) -> None:
    # epoch 0 decodes and caches its samples (2x slower); from epoch 1 the steps are
    # fast and then get slower through a cost that grows every step
    rng = random.Random(seed)

    def level(n: int) -> float:
        return 2.4 if n < 250 else 1.2 + 1.4 * (n - 250) / 1500

    durations = ms(rng, 3000, level, 0.3)
    assert states(durations, epoch=250, config=SHORT_ONLY) == []  # the premise
    found = states(durations, epoch=250)
    assert found and found[0][0] == "raised" and found[0][1] < 2600


def test_what_grew_alongside_is_read_over_the_slowdown_not_from_warm_up() -> None:
    # Memory grows in warm-up (allocator, caches: the first 5 steps, which the step
    # time skips too) and is flat after; the graph is built
    # larger once, at epoch 1 (a module added), and flat after; the steps slow down
    # from other work. Neither explains it.
    rng = random.Random(4)
    engine = DiagnosisEngine()
    alerts = []
    for n in range(4000):
        record: dict[str, Any] = {
            "kind": "step", "step": n,
            "duration_s": 1e-3 * (2 + 3 * n / 4000) * rng.uniform(1.0, 1.3),
            "rss_bytes": int(3.4e8 + 5e7 * min(n, 5) / 5),
        }
        if n % 37 == 0:
            record["graph_nodes"] = 16 if n < 500 else 22
        alerts += engine.observe(record)
        if (n + 1) % 250 == 0:
            alerts += engine.observe({"kind": "epoch", "epoch": n // 250, "step": n,
                                      "duration_s": 0.5, "steps": 250})
    raised = [a for a in alerts if a["code"] == "slowdown" and a["state"] != "cleared"]
    assert raised
    for a in raised:
        assert "neither the graph size nor memory grew with it" in a["message"], a["message"]
        assert a["evidence"]["explained_by"] == []
