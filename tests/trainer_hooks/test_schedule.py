"""Schedule: every=N and the overhead budget, fed synthetic costs (no clocks)."""

from __future__ import annotations

import itertools
import random

import pytest

from gradwatch.trainer_hooks.schedule import Schedule


def feed(
    s: Schedule,
    steps: range,
    *,
    span: tuple[float, float],
    spent: tuple[float, float] = (0.0, 0.0),
    background: tuple[float, float] = (0.0, 0.0),
    noise: random.Random | None = None,
    drift: float = 0.0,
) -> list[int]:
    """Steps whose (heavy, light) span, timed part and background CPU are given;
    ``noise`` draws each span x U(0.7, 1.3) and one step in ten 3x slower (another
    process took the CPU); ``drift`` slows the box by that many seconds per step."""
    picked = []
    for step in steps:
        heavy = s.capture(step)
        if heavy:
            picked.append(step)
        k = 0 if heavy else 1
        length = span[k] + drift * step
        if noise is not None:
            length *= noise.uniform(0.7, 1.3) * (3.0 if noise.random() < 0.1 else 1.0)
        s.observe(step, heavy, spent[k], span_s=length, background_s=background[k])
    return picked


@pytest.mark.parametrize("every", [1, 2, 5])
def test_every_n_without_a_budget_captures_exactly_every_nth_step(every: int) -> None:
    picked = feed(Schedule(every=every), range(300), span=(0.05, 0.01))
    assert picked == list(range(0, 300, every))


def test_a_budget_first_calibrates_then_fits_the_measured_cost() -> None:
    s = Schedule(every=1, overhead=0.05)
    # a heavy step 4 ms longer than a 10 ms light one, light steps' own 0.1 ms
    picked = feed(s, range(400), span=(0.014, 0.010), spent=(0.002, 0.0001))
    assert picked[:6] == [0, 3, 6, 9, 12, 15]  # calibration: every third step
    # 0.004 / n + 0.0001 <= 0.05 * 0.010  ->  n >= 10
    assert s.interval == 10
    assert {b - a for a, b in itertools.pairwise(picked[-10:])} == {10}
    heavy, light = s.estimate()
    assert heavy == pytest.approx(0.4)
    assert light == pytest.approx(0.01)


def test_heavy_steps_become_rarer_as_their_cost_rises_and_commoner_as_it_falls() -> None:
    s = Schedule(every=1, overhead=0.02)
    feed(s, range(300), span=(0.012, 0.010))  # 2 ms extra: n = 10
    assert s.interval == 10
    feed(s, range(300, 2000), span=(0.020, 0.010))  # 10 ms extra: n = 50
    assert s.interval == 50
    feed(s, range(2000, 4000), span=(0.0104, 0.010))  # 0.4 ms extra: n = 2
    assert s.interval == 2


def test_the_interval_holds_on_a_noisy_box() -> None:
    # Spans jitter by ±30 % and one step in ten takes 3x: the medians of neighbour
    # pairs keep the interval near the noise-free one (10), never at either extreme;
    # the slow steps lean it toward fewer heavy steps (two spans of a pair are heavy
    # and after, one the baseline's median), the safe side.
    intervals = []
    for seed in range(5):
        s = Schedule(every=1, overhead=0.05)
        feed(s, range(1500), span=(0.014, 0.010), spent=(0.002, 0.0001),
             noise=random.Random(seed))
        intervals.append(s.interval)
    assert all(8 <= n <= 20 for n in intervals), intervals


def test_a_loaded_box_that_slows_everything_alike_keeps_the_interval() -> None:
    quiet, loaded = Schedule(every=1, overhead=0.05), Schedule(every=1, overhead=0.05)
    feed(quiet, range(400), span=(0.014, 0.010))
    feed(loaded, range(400), span=(0.028, 0.020))
    assert quiet.interval == loaded.interval == 8


def test_a_drifting_box_does_not_bias_the_measured_cost() -> None:
    # The box slows by 10 µs a step (5 ms over the run, more than the 1 ms a heavy
    # step adds): neighbours are compared, so the estimate stays 1 ms (plus a few
    # steps of drift).
    s = Schedule(every=1, overhead=0.05)
    feed(s, range(500), span=(0.011, 0.010), drift=1e-5)
    assert s.heavy_extra_s() == pytest.approx(0.001, abs=1.5e-4)


def test_the_background_threads_cpu_counts_toward_the_budget() -> None:
    s = Schedule(every=1, overhead=0.05)
    feed(s, range(400), span=(0.011, 0.010), background=(0.0021, 0.0001))
    heavy, light = s.estimate()
    assert heavy == pytest.approx(0.1 + 0.2)  # 1 ms of span, 2 ms more background
    assert light == pytest.approx(0.01)
    # 0.3 / n + 0.01 <= 0.05  ->  n >= 7.5
    assert s.interval == 8


def test_what_no_timer_sees_is_the_extra_span_less_the_timed_part() -> None:
    s = Schedule(every=1, overhead=0.05)
    feed(s, range(300), span=(0.015, 0.010), spent=(0.003, 0.0005))
    assert s.hidden_s() == pytest.approx(0.005 - 0.0025)


def test_without_a_budget_the_unseen_cost_is_measured_where_light_steps_come() -> None:
    s = Schedule(every=3)
    assert feed(s, range(60), span=(0.015, 0.010), spent=(0.003, 0.0)) == list(range(0, 60, 3))
    assert s.hidden_s() == pytest.approx(0.002)  # for the records; the interval stays
    every_step = Schedule(every=1)
    feed(every_step, range(60), span=(0.015, 0.010), spent=(0.003, 0.0))
    assert every_step.hidden_s() == 0.0  # no light step to compare with


def test_a_budget_never_captures_more_often_than_every() -> None:
    s = Schedule(every=4, overhead=0.5)
    assert feed(s, range(20), span=(0.0101, 0.010)) == [0, 4, 8, 12, 16]


def test_a_budget_the_light_steps_already_exceed_still_captures_at_the_heavy_floor() -> None:
    # light steps cost 2 % against a 1 % budget; a heavy step 10 ms (100 %) more: heavy
    # capture keeps HEAVY_FLOOR (0.5 %) of the step, every 200th step, not never
    s = Schedule(every=1, overhead=0.01, max_interval=1000)
    feed(s, range(400), span=(0.020, 0.010), spent=(0.0102, 0.0002))
    heavy, light = s.estimate()
    assert light == pytest.approx(0.02) and heavy == pytest.approx(1.0)
    assert s.interval == 200
    capped = Schedule(every=1, overhead=0.01, max_interval=50)
    feed(capped, range(200), span=(0.020, 0.010), spent=(0.0102, 0.0002))
    assert capped.interval == 50


def test_with_a_budget_a_light_probe_step_comes_at_least_every_probe_after_steps() -> None:
    s = Schedule(every=1, overhead=0.5)  # everything fits: every step would be heavy
    picked = feed(s, range(400), span=(0.0101, 0.010))
    assert s.interval == 1
    light = sorted(set(range(400)) - set(picked))
    probes = [k for k in light if k > 30 and k + 1 in light]  # past the calibration
    assert len(probes) >= 3, light
    for p in probes:  # light, light, heavy, light
        assert [k in light for k in range(p, p + 4)] == [True, True, False, True]
    gaps = {b - a for a, b in itertools.pairwise(probes)}
    assert gaps == {Schedule.PROBE_AFTER + 4}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"every": 0}, "expected every= to be an integer >= 1, got 0"),
        ({"every": 1.5}, "expected every= to be an integer >= 1, got 1.5"),
        ({"overhead": 0}, "expected overhead= to be a fraction between 0 and 1"),
        ({"overhead": True}, "expected overhead= to be a fraction between 0 and 1"),
        ({"every": 10, "max_interval": 5}, "expected max_interval >= every (10), got 5"),
    ],
)
def test_bad_settings_say_what_was_expected(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Schedule(**kwargs)  # type: ignore[arg-type]
