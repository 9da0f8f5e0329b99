"""`slowdown` on synthetic step times with epochs, many seeds: what it raises and clears.

Each kind is a run of step times (ms, each slowed by a uniform jitter, with bursts of
10 slow steps now and then) and an epoch record every ``--epoch`` steps, fed through
the diagnosis engine. Printed per kind: how many seeds gave each sequence of
``slowdown`` raises (r) and clears (c); "" is silence.

    .venv/bin/python bench/slowdown_sweep.py --seeds 20 --epoch 64
    .venv/bin/python bench/slowdown_sweep.py --cost   # µs per light record, the engine

Kinds: ``slow28``/``slow4`` steady 2.8x and 4x over 2,000 steps; ``fast10`` 10x over
1,000; ``levels`` 3x over 1,500 then flat for 2,500; ``doubling6k`` 2x over 6,000;
``stairs`` +half the start every 1,000 steps; ``sorted`` 1.8x within each epoch and
back (batches sorted by length); load from another process from some step on:
``load_all`` every step 2x, ``load_some`` 60 % of steps 1.5-4x, ``load_ramp`` 2x over
60 steps, ``load_twice`` 1.6x then 2.2x 360 steps later.
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter
from collections.abc import Callable

from gradwatch.trainer_hooks.diagnoses import DiagnosisEngine


def states(durations: list[float], epoch: int) -> str:
    """The run's slowdown raises and clears, as a string of r and c."""
    engine = DiagnosisEngine()
    out = []
    for n, seconds in enumerate(durations):
        records = [{"kind": "step", "step": n, "duration_s": seconds}]
        if (n + 1) % epoch == 0:
            records.append({"kind": "epoch", "epoch": n // epoch, "step": n,
                            "duration_s": 1.0, "steps": epoch})
        for record in records:
            for alert in engine.observe(record):
                if alert["code"] == "slowdown" and alert["state"] != "updated":
                    out.append(alert["state"][0])
    return "".join(out)


def bursts(rng: random.Random, durations: list[float], every: int = 150) -> list[float]:
    """Bursts of load from other processes: 10 steps at 2-8x, now and then (the tests
    of tests/trainer_hooks/test_diagnoses_long_trend.py use it too)."""
    out = list(durations)
    for start in range(rng.randrange(every), len(out), every):
        for n in range(start, min(start + 10, len(out))):
            out[n] *= rng.uniform(2, 8)
    return out


def ms(rng: random.Random, steps: int, level: Callable[[int], float],
       jitter: float = 1.0) -> list[float]:
    """Step times of ``level(n)`` ms, each slowed by up to ``jitter`` x itself."""
    return [1e-3 * level(n) * rng.uniform(1.0, 1.0 + jitter) for n in range(steps)]


def loaded(rng: random.Random, kind: str) -> list[float]:
    at, out = rng.randrange(500, 1500), []
    for n in range(2500):
        seconds = 1e-3 * (9 if kind == "load_all" else 2.5) * rng.uniform(1.0, 1.5)
        if n >= at:
            if kind == "load_all":
                seconds *= 2.0
            elif kind == "load_some" and rng.random() < 0.6:
                seconds *= rng.uniform(1.5, 4.0)
            elif kind == "load_ramp":
                seconds *= 1 + min((n - at) / 60, 1.0)
            elif kind == "load_twice":
                seconds *= 1.6 if n < at + 360 else 2.2
        out.append(seconds)
    return bursts(rng, out)


def run(kind: str, seed: int, epoch: int) -> list[float]:
    rng = random.Random(seed)
    if kind.startswith("load_"):
        return loaded(rng, kind)
    levels: dict[str, tuple[int, Callable[[int], float], float]] = {
        "slow28": (2000, lambda n: 2.6 + 4.7 * n / 2000, 1.0),
        "slow4": (2000, lambda n: 3.2 + 9.8 * n / 2000, 1.0),
        "fast10": (1000, lambda n: 3 + 27 * n / 1000, 0.6),
        "levels": (4000, lambda n: 2.5 + 5 * min(n, 1500) / 1500, 1.0),
        "doubling6k": (8000, lambda n: 2 + 2 * n / 6000, 1.0),
        "stairs": (8000, lambda n: 3 + 1.5 * (n // 1000), 0.5),
        "sorted": (5000, lambda n: 3 * (1 + 0.8 * (n % epoch) / epoch), 0.5),
    }
    steps, level, jitter = levels[kind]
    durations = ms(rng, steps, level, jitter)
    return durations if kind in ("levels", "stairs") else bursts(
        rng, durations, 60 if kind == "fast10" else 150)


KINDS = ("slow28", "slow4", "fast10", "levels", "doubling6k", "stairs", "sorted",
         "load_all", "load_some", "load_ramp", "load_twice")


def cost(records: int = 20_000, rounds: int = 5) -> list[float]:
    """µs per light record (jittered 1.6 ms steps, loss, memory) through the engine."""
    out = []
    for seed in range(rounds):
        rng = random.Random(seed)
        light = [{"kind": "step", "step": n, "duration_s": 0.0016 * rng.uniform(1, 1.5),
                  "loss": 1.0 + 0.01 * rng.random(), "overhead": 0.03, "rss_bytes": 10**9}
                 for n in range(records)]
        engine = DiagnosisEngine()
        started = time.perf_counter()
        for record in light:
            engine.observe(record)
        out.append((time.perf_counter() - started) / records * 1e6)
    return sorted(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--epoch", type=int, default=64, help="steps per epoch record")
    parser.add_argument("--only", nargs="*", default=list(KINDS), choices=KINDS)
    parser.add_argument("--cost", action="store_true", help="µs per light record instead")
    args = parser.parse_args()
    if args.cost:
        print("µs per light record:", " ".join(f"{c:.2f}" for c in cost()))
        return
    print(f"| kind | seeds: raises (r) and clears (c), {args.epoch}-step epochs |")
    print("| --- | --- |")
    for kind in args.only:
        got = Counter(states(run(kind, seed, args.epoch), args.epoch)
                      for seed in range(100, 100 + args.seeds))
        cells = ", ".join(f"{s or 'silent'} {n}" for s, n in got.most_common())
        print(f"| {kind} | {cells} |")


if __name__ == "__main__":
    main()
