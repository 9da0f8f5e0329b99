"""Every threshold the detectors use, with its default and meaning, in one place.

``watch(model, thresholds={...})`` overrides any of them; an unknown name is an
error that lists the known ones. docs/DIAGNOSES.md explains each; the defaults keep
the fixed twins in ``examples/`` silent and make their bug variants fire within 10
steps.

Example:
    >>> cfg = resolve({"vanishing_factor": 1e-4})
    >>> cfg["vanishing_factor"], cfg["update_every"]
    (0.0001, 25)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: name -> (default, meaning). Ints stay ints; floats accept ints.
THRESHOLDS: dict[str, tuple[float | int, str]] = {
    # life cycle of every alert
    "update_every": (25, "steps between two 'updated' records of one alert while it holds"),
    "raise_after": (3, "judgements in a row with the condition before 'raised' (sustained)"),
    "clear_after": (10, "judgements in a row without the condition before 'cleared'"),
    # the noise floor of gradients (no_gradient; exploding and vanishing skip it)
    "gradient_floor": (
        1e-7,
        "a gradient is at the noise floor below this fraction of its own peak in the run",
    ),
    "gradient_floor_abs": (1e-20, "or at most this absolute L2 norm (or exactly 0)"),
    # vanishing
    "vanishing_factor": (
        1e-3,
        "a timestep 'gets gradient' when its norm is at least this fraction of the largest",
    ),
    "vanishing_min_timesteps": (16, "shorter sequences are never judged vanishing"),
    "vanishing_min_fraction": (
        0.25,
        "fires when at least this fraction of the timesteps gets no gradient",
    ),
    # exploding
    "exploding_time_ratio": (
        1e3,
        "through time: mean log-norm of the earliest quarter over the latest quarter",
    ),
    "exploding_step_ratio": (
        50.0,
        "over steps: a spike is the total norm over the median of the recent window",
    ),
    "exploding_window": (50, "recorded steps in the window of recent total norms"),
    "exploding_min_history": (5, "recorded steps needed before judging growth over steps"),
    "exploding_clip_quantile": (0.9, "the suggested clip value is this quantile of the window"),
    "exploding_harm_steps": (
        5,
        "over steps: steps after a spike in which the loss must leave its band (the harm)",
    ),
    "exploding_loss_margin": (
        1.0,
        "the loss leaves its band above the window's highest loss plus this many times "
        "the larger of the window's spread and that highest loss",
    ),
    # graph_growth
    "graph_window": (8, "recorded steps in the graph-size window"),
    "graph_min_points": (4, "recorded steps that set the starting size (their smallest)"),
    "graph_growth_ratio": (
        1.5,
        "fires when the graph reaches this multiple of its starting size",
    ),
    "graph_rising_fraction": (0.75, "and at least this fraction of step pairs shows growth"),
    # slowdown
    "slowdown_window": (30, "steps in the step-time window"),
    "slowdown_min_points": (8, "steps that set the starting time (their median)"),
    "slowdown_ratio": (1.5, "fires when the trend reaches this multiple of the starting time"),
    "slowdown_rising_fraction": (0.7, "and at least this fraction of step pairs got slower"),
    "slowdown_skip_first": (
        5,
        "leading steps ignored: warm-up (allocator, caches, lazy init) is no evidence",
    ),
    "slowdown_sustain": (
        15,
        "judgements in a row before 'raised': longer than a burst of load on the machine",
    ),
    "slowdown_min_window": (16, "steps in the window before the trend is judged at all"),
    "slowdown_noise": (
        3.0,
        "and the trend's rise over the window is this many times the run's step-time jitter",
    ),
    "slowdown_long_blocks": (
        12,
        "the second look: the last this many epochs judged by their fastest tenth "
        "(and twice and four times as many, in pairs and fours)",
    ),
    "slowdown_long_rising": (0.8, "fraction of the epochs' pairs that got slower"),
    "slowdown_long_growth": (1.2, "the long horizon's trend grew this many times over it"),
    "slowdown_long_even": (
        0.33,
        "each half of the long horizon rises at least this share of its whole slope",
    ),
    # hotspot
    "hotspot_share": (0.4, "a module is a hotspot when it takes this fraction of the forward pass"),
    "hotspot_min_calls": (4, "and runs at least this many times per step (a Python loop)"),
    # spike
    "spike_window": (100, "recorded values in the rolling band of the loss and of each block"),
    "spike_min_history": (20, "values in the band before it judges anything"),
    "spike_z": (
        6.0,
        "a spike is at least this robust z-score above the median: (x - median) / (1.4826 MAD), "
        "on logarithms when the values are positive",
    ),
    "spike_min_rise": (
        0.5, "and at least this many times the median's size above the median (the loss)"
    ),
    "spike_block_min_rise": (
        1.0,
        "the same for a block's gradient norm, which varies more from batch to batch: "
        "at least 2x its median by default",
    ),
    "spike_over_max": (
        4.0,
        "or, for positive values, at least this many times the largest value in the band",
    ),
    "spike_rare": (
        0.05,
        "and the rise is asked over all but this top fraction of the band too: a level "
        "the band holds (a loss's second mode) is no spike",
    ),
    "spike_min_share": (
        0.01,
        "and a loss spike rises at least this fraction of the loss's level (the largest "
        "median its band had): a converged loss near 0 has noise large on a log scale",
    ),
    "spike_clear_after": (3, "judgements in a row back in band before a spike is cleared"),
}


def resolve(config: Mapping[str, Any] | None) -> dict[str, float | int]:
    """Defaults overridden by ``config``; unknown names and non-numbers are errors."""
    resolved: dict[str, float | int] = {name: d for name, (d, _) in THRESHOLDS.items()}
    if config is None:
        return resolved
    if not isinstance(config, Mapping):
        raise ValueError(f"expected a dict of diagnosis thresholds, got {type(config).__name__}")
    for name, value in config.items():
        if name not in THRESHOLDS:
            known = ", ".join(sorted(THRESHOLDS))
            raise ValueError(f"expected a known diagnosis threshold, got {name!r}; known: {known}")
        default = THRESHOLDS[name][0]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"threshold {name}: expected a number, got {value!r}")
        if isinstance(default, int) and not isinstance(default, bool):
            if not float(value).is_integer():
                raise ValueError(f"threshold {name}: expected an integer, got {value!r}")
            value = int(value)
        if value < 0:
            raise ValueError(f"threshold {name}: expected a number >= 0, got {value!r}")
        resolved[name] = value
    return resolved
