"""Schedule: every=N and the overhead budget."""

from __future__ import annotations

import itertools

import pytest

from gradwatch.trainer_hooks.schedule import Schedule


def heavy_steps(schedule: Schedule, steps: int, heavy_cost: float, light_cost: float) -> list[int]:
    picked = []
    for step in range(steps):
        heavy = schedule.capture(step)
        if heavy:
            picked.append(step)
        schedule.observe(step, heavy, heavy_cost if heavy else light_cost)
    return picked


@pytest.mark.parametrize("every", [1, 2, 5])
def test_every_n_without_a_budget(every: int) -> None:
    assert heavy_steps(Schedule(every=every), 20, 0.5, 0.1) == list(range(0, 20, every))


def test_budget_stretches_the_interval_to_fit() -> None:
    s = Schedule(every=1, overhead=0.02)
    picked = heavy_steps(s, 200, heavy_cost=0.10, light_cost=0.0)
    # (0.10 + (n - 1) * 0) / n <= 0.02  ->  n = 5
    assert s.interval == 5
    gaps = {b - a for a, b in itertools.pairwise(picked)}
    assert gaps == {5}


def test_budget_accounts_for_the_light_steps_cost() -> None:
    s = Schedule(every=1, overhead=0.02)
    heavy_steps(s, 300, heavy_cost=0.10, light_cost=0.01)
    # (0.10 + (n - 1) * 0.01) / n <= 0.02  ->  n >= 9
    assert s.interval == 9


def test_budget_never_captures_more_often_than_every() -> None:
    s = Schedule(every=4, overhead=0.5)
    assert heavy_steps(s, 20, heavy_cost=0.01, light_cost=0.0) == [0, 4, 8, 12, 16]


def test_interval_shrinks_again_when_heavy_steps_get_cheap() -> None:
    s = Schedule(every=1, overhead=0.02)
    heavy_steps(s, 100, heavy_cost=0.2, light_cost=0.0)
    assert s.interval == 10
    heavy_steps_after = []
    for step in range(100, 400):
        heavy = s.capture(step)
        if heavy:
            heavy_steps_after.append(step)
        s.observe(step, heavy, 0.001 if heavy else 0.0)
    assert s.interval == 1
    assert heavy_steps_after[-3:] == [397, 398, 399]


def test_a_budget_the_light_steps_already_exceed_uses_the_longest_interval() -> None:
    s = Schedule(every=1, overhead=0.01, max_interval=50)
    heavy_steps(s, 100, heavy_cost=0.3, light_cost=0.05)
    assert s.interval == 50


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


def feed(
    s: Schedule,
    steps: range,
    *,
    timed: tuple[float, float],
    training: tuple[float, float],
    background: tuple[float, float] = (0.0, 0.0),
    duration: float = 0.010,
    drift: float = 0.0,
) -> list[int]:
    """Steps of ``duration`` seconds whose heavy/light timed overhead, training time
    and background CPU are given as (heavy, light); ``drift`` slows the box by that
    many seconds per step (both kinds alike)."""
    picked = []
    for step in steps:
        heavy = s.capture(step)
        if heavy:
            picked.append(step)
        k = 0 if heavy else 1
        s.observe(
            step,
            heavy,
            timed[k],
            duration_s=duration,
            training_s=training[k] + drift * step,
            background_s=background[k],
        )
    return picked


def test_what_no_timer_sees_counts_toward_the_budget() -> None:
    # Heavy steps time themselves at 1 % of a 10 ms step, within a 5 % budget, but
    # their training runs 1.5 ms (15 %) longer than a light neighbour's.
    s = Schedule(every=1, overhead=0.05)
    feed(s, range(400), timed=(0.01, 0.0), training=(0.0095, 0.008))
    heavy, light = s.estimate()
    assert heavy == pytest.approx(0.01 + 0.15)
    assert light == 0.0
    # (0.16 + (n - 1) * 0) / n <= 0.05  ->  n = 4 (0.16 / 0.05 = 3.2)
    assert s.interval == 4


def test_the_background_threads_cpu_counts_toward_the_budget() -> None:
    s = Schedule(every=1, overhead=0.05)
    feed(s, range(200), timed=(0.01, 0.0), training=(0.008, 0.008), background=(0.002, 0.0001))
    heavy, light = s.estimate()
    assert heavy == pytest.approx(0.01 + 0.2)
    assert light == pytest.approx(0.01)
    # (0.21 + (n - 1) * 0.01) / n <= 0.05  ->  n >= 5
    assert s.interval == 5


def test_a_drifting_box_does_not_bias_the_hidden_cost() -> None:
    # The box slows by 10 µs a step (5 ms over the run, more than the 1 ms a heavy
    # step's hooks add): neighbours are compared, so the estimate stays 1 ms (plus
    # the one step of drift between neighbours).
    s = Schedule(every=1, overhead=0.05)
    feed(s, range(500), timed=(0.0, 0.0), training=(0.009, 0.008), drift=1e-5)
    assert s._hidden() == pytest.approx(0.001 + 1e-5)


def test_with_a_budget_a_light_probe_step_comes_at_least_every_probe_after_steps() -> None:
    s = Schedule(every=1, overhead=0.5)  # everything fits: every step would be heavy
    picked = feed(s, range(300), timed=(0.01, 0.0), training=(0.008, 0.008))
    light = sorted(set(range(300)) - set(picked))
    assert light, "no probe step was taken"
    assert all(b - a == Schedule.PROBE_AFTER + 1 for a, b in itertools.pairwise(light))
    assert light[0] == Schedule.PROBE_AFTER
    # without a budget nothing is ever left out
    assert feed(Schedule(every=1), range(300), timed=(0.01, 0.0), training=(0.008, 0.008)) == list(
        range(300)
    )
