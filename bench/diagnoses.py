"""What the diagnoses cost per record, beside what encoding the same record costs.

The engine runs on the Monitor's background thread, once per step record, and shares
the interpreter (the GIL) with the training loop, so it must stay small next to the
work the thread does anyway. Each round times, interleaved: ``DiagnosisEngine.observe``
on a recorded step (3 recurrent modules x 121 timesteps, 24 parameter norms, 12
profiled modules, graph size, memory), on a light step (timing only, uniform jitter),
on the light step records of a real training loop (``--workload``, trained first:
step times that drift and come in runs), the latter again with the slowdown
detector's sorted slopes kept for a whole window, and ``gradwatch.protocol.dumps`` of
the recorded step. Medians over rounds.

With ``--alarms`` it measures what the diagnoses say instead (bench/diagnosis_runs.py):
per diagnosis, false alarms (alerts raised that are not true of the model) per 1,000
healthy steps, over the fixed twin of every example, four tutorial-style models and
a ReLU RNN under Adam that meets a long batch every 50 steps, each trained
``--steps`` (500) steps under seeded step-time jitter (±50%); and, per bug variant
(the examples' and that RNN under plain SGD), the step at which its diagnosis is
raised (also under jitter).

Run:
    .venv/bin/python bench/diagnoses.py [--rounds 7] [--records 2000]
    .venv/bin/python bench/diagnoses.py --alarms [--steps 500] [--seeds 1]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from gradwatch.protocol import dumps, read_spool
from gradwatch.protocol import messages as m
from gradwatch.trainer_hooks.diagnoses import DiagnosisEngine, slowdown


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


def recorded_light(steps: int, workload: str) -> list[dict[str, Any]]:
    """The light step records of a real training loop (``bench/workloads.py``), read
    back from its spool: their step times drift and come in runs, which the uniform
    jitter of :func:`light` never does."""
    import os
    import sys
    import tempfile
    from pathlib import Path

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import workloads

    from gradwatch.trainer_hooks import watch

    torch.set_num_threads(1)
    work = workloads.workload(workload)
    step = work.make_step(work.model)
    with tempfile.TemporaryDirectory() as tmp:
        spool = os.path.join(tmp, "light.jsonl")
        monitor = watch(work.model, run="light", spool=spool, quiet=True, diagnose=False,
                        every=10**9, **work.options)
        workloads.train(step, monitor, steps)
        monitor.close()
        return [r for m in read_spool(spool) if m["type"] == "batch" for r in m["records"]
                if r["kind"] == "step" and r["step"] > 0]


def per_record(fn: Callable[[dict[str, Any]], Any], records: list[dict[str, Any]]) -> float:
    start = time.perf_counter()
    for record in records:
        fn(record)
    return (time.perf_counter() - start) / len(records)


def alarms(steps: int, seeds: int) -> None:
    """Print the false-alarm and detection tables (markdown)."""
    import sys
    from pathlib import Path

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import diagnosis_runs as runs

    torch.set_num_threads(1)
    healthy = 0
    false: dict[str, int] = {code: 0 for code in m.ALERT_CODES}
    per_model: list[tuple[str, int, list[str], list[str]]] = []
    jobs: list[tuple[str, Callable[[int], tuple[list[dict[str, Any]], list[float]]]]] = [
        (name, lambda seed, name=name: runs.run_model(name, steps, seed)) for name in runs.MODELS
    ]
    jobs += [
        (
            f"{name}-fixed",
            lambda seed, name=name: runs.run_example(
                name, "--fixed", "--steps", str(steps), "--max-seconds", "100000", seed=seed
            ),
        )
        for name in sorted(runs.BUGS)
    ]
    for label, job in jobs:
        for seed in range(1, seeds + 1):
            alerts, durations = job(seed)
            allowed = runs.EXPECTED.get(label, set())
            bad = [
                a
                for a in alerts
                if a["state"] == "raised" and (a["code"], a["subject"]) not in allowed
            ]
            true = [
                a for a in alerts if a["state"] == "raised" and (a["code"], a["subject"]) in allowed
            ]
            healthy += len(durations)
            for a in bad:
                false[a["code"]] += 1
            per_model.append(
                (
                    f"{label} (seed {seed})",
                    len(durations),
                    [f"{a['code']}@{a['step']}" for a in bad],
                    [f"{a['code']} on {a['subject']}@{a['step']}" for a in true],
                )
            )
    print(f"False alarms under jitter: {healthy} healthy steps\n")
    print("| diagnosis | false alarms | per 1,000 healthy steps |")
    print("| --- | ---: | ---: |")
    for code, n in false.items():
        print(f"| `{code}` | {n} | {1000 * n / max(healthy, 1):.2f} |")
    print("\n| healthy run | steps | raised, false | raised, true of the model |")
    print("| --- | ---: | --- | --- |")
    for label, n, bad, true in per_model:
        print(f"| {label} | {n} | {', '.join(bad) or 'nothing'} | {', '.join(true) or '-'} |")
    print("\n| bug variant | diagnosis | raised at step |")
    print("| --- | --- | ---: |")
    for name, (code, subject) in sorted(runs.BUGS.items()):
        alerts, _ = runs.run_example(name, "--steps", "10", seed=3)
        raised = [
            a["step"]
            for a in alerts
            if (a["code"], a["subject"], a["state"]) == (code, subject, "raised")
        ]
        print(f"| {name} | `{code}` on `{subject}` | {raised[0] if raised else 'not in 10'} |")
    for name, (code, subject) in sorted(runs.MODEL_BUGS.items()):
        alerts, _ = runs.run_model(name, steps=10, seed=3)
        raised = [
            a["step"]
            for a in alerts
            if (a["code"], a["subject"], a["state"]) == (code, subject, "raised")
        ]
        print(f"| {name} | `{code}` on `{subject}` | {raised[0] if raised else 'not in 10'} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--records", type=int, default=2000)
    p.add_argument("--workload", default="long_lstm",
                   help="the training loop whose light step records are replayed")
    p.add_argument("--alarms", action="store_true", help="false alarms and detection steps")
    p.add_argument("--steps", type=int, default=500, help="with --alarms: steps per healthy run")
    p.add_argument("--seeds", type=int, default=1, help="with --alarms: jitter seeds per run")
    args = p.parse_args()
    if args.alarms:
        alarms(args.steps, args.seeds)
        return
    rng = random.Random(0)
    heavies = [heavy(s, rng) for s in range(args.records)]
    lights = [light(s, rng) for s in range(args.records)]
    looped = recorded_light(args.records, args.workload)
    window = int(DiagnosisEngine().config["slowdown_window"])
    results: dict[str, list[float]] = {
        "observe (recorded step)": [],
        "observe (light step)": [],
        f"observe (light, {args.workload})": [],
        "  slopes kept a window": [],
        "dumps (recorded step)": [],
    }
    for _ in range(args.rounds):
        results["observe (recorded step)"].append(per_record(DiagnosisEngine().observe, heavies))
        results["observe (light step)"].append(per_record(DiagnosisEngine().observe, lights))
        results[f"observe (light, {args.workload})"].append(
            per_record(DiagnosisEngine().observe, looped))
        # the sorted slopes kept through a window of records that cannot hold: the
        # same alerts, at the cost that dropping them after KEEP_SLOPES records saves
        kept, slowdown.KEEP_SLOPES = slowdown.KEEP_SLOPES, window
        try:
            results["  slopes kept a window"].append(per_record(DiagnosisEngine().observe, looped))
        finally:
            slowdown.KEEP_SLOPES = kept
        results["dumps (recorded step)"].append(per_record(dumps, heavies))
    base = statistics.median(results["dumps (recorded step)"])
    print(f"{'what':32s} {'median µs/record':>18s} {'x dumps':>8s}")
    for name, values in results.items():
        m = statistics.median(values)
        print(f"{name:32s} {m * 1e6:18.1f} {m / base:8.2f}")


if __name__ == "__main__":
    main()
