"""Seeded step-record sequences, light and heavy, for checking that the diagnoses'
output does not change when their light-record path gets faster.

Each scenario is what a ``watch()`` run hands the engine: light records (loss,
duration, overhead, memory) on most steps, a heavy one (total norm, per-timestep and
depth series) every ``HEAVY_EVERY``-th, with the problems the detectors look for put
in: loss spikes, NaN losses, a slowdown, an explosion, vanishing gradients.

Example:
    >>> records = list(scenario("healthy", steps=3))
    >>> [sorted(r) for r in records][1]
    ['duration_s', 'epoch', 'kind', 'loss', 'overhead', 'rss_bytes', 'step', 't']
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from typing import Any

HEAVY_EVERY = 10
SCENARIOS = ("healthy", "loss_spikes", "nan_loss", "slowdown", "exploding", "vanishing", "mixed")


def scenario(name: str, steps: int = 600, seed: int = 0) -> Iterator[dict[str, Any]]:
    """The records of one scenario, in step order (epoch records every 200 steps)."""
    rng = random.Random(f"{name}:{seed}")
    mixed = name == "mixed"
    for n in range(steps):
        loss = 2.0 * math.exp(-n / 300) + 0.1
        loss *= math.exp(rng.gauss(0, 0.05))
        duration = 0.003 * (1 + 0.3 * rng.random())
        if name == "slowdown" or (mixed and n > 400):
            duration *= 1 + max(0, n - 200) / 10
        if (name == "loss_spikes" or mixed) and n in (150, 151, 320, 480):
            loss *= 6 if n != 480 else 50
        if (name == "nan_loss" or mixed) and 250 <= n < 262:
            loss = math.nan if n % 3 else math.inf
        total = 1.0 + 0.1 * rng.random()
        if (name == "exploding" or mixed) and n in (300, 301, 302, 540):
            total *= 80
            loss *= 12
        record: dict[str, Any] = {
            "kind": "step",
            "step": n,
            "epoch": n // 200,
            "t": 1_000.0 + 0.003 * n,
            "duration_s": duration,
            "loss": loss if math.isfinite(loss) else ("NaN" if loss != loss else "Infinity"),
            "overhead": 0.01 + 0.002 * rng.random(),
            "rss_bytes": 100_000_000 + 4096 * (n // 7),
        }
        if n % HEAVY_EVERY == 0:
            decay = 0.5 if name == "vanishing" or (mixed and 100 <= n < 200) else 0.99
            record["total_norm"] = total
            record["timesteps"] = {
                "lstm": {"input": [total * decay ** (63 - k) for k in range(64)]},
            }
            record["depth"] = {"blocks": [total * (1 + 0.1 * rng.random()) for _ in range(4)]}
            record["graph_nodes"] = 466
        yield record
        if n % 200 == 199:
            yield {"kind": "epoch", "epoch": n // 200, "step": n, "t": 1_000.0 + 0.003 * n,
                   "duration_s": 0.6, "steps": 200}
