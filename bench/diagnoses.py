"""What the diagnoses cost per record, beside what encoding the same record costs.

The engine runs on the Monitor's background thread, once per step record, and shares
the interpreter (the GIL) with the training loop, so it must stay small next to the
work the thread does anyway. Each round times, interleaved: ``DiagnosisEngine.observe``
on a recorded step (3 recurrent modules x 121 timesteps, 24 parameter norms, 12
profiled modules, graph size, memory) and on a light step (timing only), and
``gradwatch.protocol.dumps`` of the same recorded step. Medians over rounds.

Run:
    .venv/bin/python bench/diagnoses.py [--rounds 7] [--records 2000]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from gradwatch.protocol import dumps
from gradwatch.trainer_hooks.diagnoses import DiagnosisEngine


def heavy(step: int, rng: random.Random) -> dict[str, Any]:
    return {
        "kind": "step",
        "step": step,
        "epoch": step // 100,
        "t": 1e9 + step,
        "duration_s": 0.02 * rng.uniform(0.8, 1.2),
        "loss": rng.random(),
        "timesteps": {
            f"lstm{m}": {
                "input": [math.exp(-0.3 * (120 - t)) * rng.uniform(0.5, 1.5) for t in range(121)]
            }
            for m in range(3)
        },
        "param_norms": {f"lstm{m}.p{i}": rng.random() for m in range(3) for i in range(8)},
        "total_norm": rng.uniform(0.5, 1.5),
        "graph_nodes": 900,
        "rss_bytes": 400_000_000 + rng.randrange(1_000_000),
        "profile": {
            f"m{i}": {
                "forward_s": 0.001 * rng.random(),
                "backward_s": 0.002 * rng.random(),
                "calls": 1,
            }
            for i in range(12)
        },
    }


def light(step: int, rng: random.Random) -> dict[str, Any]:
    return {
        "kind": "step",
        "step": step,
        "t": 1e9 + step,
        "duration_s": 0.02 * rng.uniform(0.8, 1.2),
    }


def per_record(fn: Callable[[dict[str, Any]], Any], records: list[dict[str, Any]]) -> float:
    start = time.perf_counter()
    for record in records:
        fn(record)
    return (time.perf_counter() - start) / len(records)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--records", type=int, default=2000)
    args = p.parse_args()
    rng = random.Random(0)
    heavies = [heavy(s, rng) for s in range(args.records)]
    lights = [light(s, rng) for s in range(args.records)]
    results: dict[str, list[float]] = {
        "observe (recorded step)": [],
        "observe (light step)": [],
        "dumps (recorded step)": [],
    }
    for _ in range(args.rounds):
        results["observe (recorded step)"].append(per_record(DiagnosisEngine().observe, heavies))
        results["observe (light step)"].append(per_record(DiagnosisEngine().observe, lights))
        results["dumps (recorded step)"].append(per_record(dumps, heavies))
    base = statistics.median(results["dumps (recorded step)"])
    print(f"{'what':28s} {'median µs/record':>18s} {'x dumps':>8s}")
    for name, values in results.items():
        m = statistics.median(values)
        print(f"{name:28s} {m * 1e6:18.1f} {m / base:8.2f}")


if __name__ == "__main__":
    main()
