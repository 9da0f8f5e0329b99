"""What the background thread costs the training loop, by the wall clock, in one run.

The ``overhead`` field of a step record charges it the background thread's CPU for it:
its own work and its share of a wake and a send (trainer_hooks/pipeline.py). Whether
training loses that much depends on when the thread holds the GIL: while the training
thread is inside an op that gave the GIL back (most of a fused LSTM's backward) it loses
nothing, and when it comes back to Python while the thread holds the GIL it waits. This
script measures it from outside. It times every step by the wall clock, from before
``step()`` of the workload to after ``monitor.step()``, and notes each stretch of the
background thread's work (from a wake to its next wait). Steps that overlap such a stretch
are compared with the steps that do not: their time beyond the mean clean step, summed over
the run, per step, is what training lost to the background thread (``lost``), beside the
thread's CPU per step (``charged``, what the records' ``overhead`` counts for it).

The estimate leans high: a step made slow by something else (another process) is longer,
so more likely to overlap a stretch. Rounds alternate the arms; figures are medians over
rounds.

    .venv/bin/python bench/background_cost.py --only long_lstm cells --every light 1
"""

from __future__ import annotations

import argparse
import bisect
import copy
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workloads  # the workloads (bench/workloads.py)

from gradwatch.trainer_hooks import watch

LIGHT = 10**9  # every step light after step 0


def note_stretches(monitor: Any) -> list[tuple[float, float]]:
    """A list that gets ``(start, end)`` (``perf_counter``) of each stretch of the
    monitor's background thread's work: from a wake to its next wait."""
    pipeline = monitor._pipeline
    wait = pipeline._wait
    stretches: list[tuple[float, float]] = []
    woke: list[float] = []

    def noted() -> None:
        if woke:
            stretches.append((woke.pop(), time.perf_counter()))
        wait()
        woke.append(time.perf_counter())

    pipeline._wait = noted  # the thread looks it up on every round of its loop
    return stretches


def lost_per_step(
    steps: list[tuple[float, float]], stretches: list[tuple[float, float]]
) -> tuple[float, float]:
    """Training time lost to the stretches per step (seconds), and the share of steps
    that overlapped one."""
    starts = [s for s, _ in stretches]
    clean, overlapped = [], []
    for a, b in steps:
        j = bisect.bisect_left(starts, b) - 1  # the last stretch that began before b
        hit = j >= 0 and stretches[j][1] > a
        (overlapped if hit else clean).append(b - a)
    if not clean or not overlapped:
        return 0.0, len(overlapped) / max(len(steps), 1)
    base = statistics.fmean(clean)
    return sum(d - base for d in overlapped) / len(steps), len(overlapped) / len(steps)


def measure(name: str, every: str, steps: int, warm: int, tmp: str) -> dict[str, float]:
    """One round: ``steps`` watched steps after ``warm``; seconds per step."""
    work = workloads.workload(name)
    model = copy.deepcopy(work.model)
    step = work.make_step(model)
    interval = LIGHT if every == "light" else int(every)
    spool = os.path.join(tmp, f"{name}-{every}-{time.monotonic_ns()}.jsonl")
    monitor = watch(model, run=every, spool=spool, quiet=True, every=interval, **work.options)
    try:
        workloads.train(step, monitor, warm)
        stretches = note_stretches(monitor)
        monitor.flush()
        stretches.clear()
        thread = monitor._pipeline._thread
        clock = time.pthread_getcpuclockid(thread.ident)
        cpu = time.clock_gettime(clock)
        spans = []
        clock_now = time.perf_counter
        for _ in range(steps):
            a = clock_now()
            monitor.step(step())
            spans.append((a, clock_now()))
        monitor.flush()  # its records' work counts, and its last stretch ends
        charged = (time.clock_gettime(clock) - cpu) / steps
        lost, share = lost_per_step(spans, list(stretches))
        mean = statistics.fmean(b - a for a, b in spans)
    finally:
        monitor.close()
    return {"step": mean, "charged": charged, "lost": lost, "overlapped": share}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=["long_lstm", "cells"],
                        choices=workloads.WORKLOADS)
    parser.add_argument("--every", nargs="*", default=["light", "1"],
                        help="'light' (every step light after the first) or an interval")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=1500, help="timed steps a round")
    parser.add_argument("--warm", type=int, default=70, help="untimed steps after watch()")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    print(f"{args.rounds} rounds x {args.steps} steps, 1 torch thread; "
          f"load average {os.getloadavg()[0]:.1f}")
    print("| workload | schedule | step (wall) | steps overlapping its work |"
          " charged: its CPU per step | lost: training's time per step | lost / charged |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only:
            found: dict[str, list[dict[str, float]]] = {every: [] for every in args.every}
            for r in range(args.rounds):
                for every in args.every if r % 2 == 0 else args.every[::-1]:
                    found[every].append(measure(name, every, args.steps, args.warm, tmp))
            for every, rounds in found.items():
                med = {k: statistics.median(x[k] for x in rounds) for k in rounds[0]}
                ratios = [x["lost"] / x["charged"] for x in rounds if x["charged"] > 0]
                spread = f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else "-"
                print(f"| {name} | {every} | {med['step'] * 1e3:.3f} ms |"
                      f" {med['overlapped']:.0%} | {med['charged'] * 1e6:.0f} µs |"
                      f" {med['lost'] * 1e6:.0f} µs | {statistics.median(ratios):.2f}"
                      f" ({spread}) |")


if __name__ == "__main__":
    main()
