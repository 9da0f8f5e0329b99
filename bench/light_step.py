"""What a light step costs gradwatch, piece by piece, inside a real training loop.

A workload of ``bench/overhead.py`` trains under ``watch(every=10**9)`` (every step
light after step 0). Per step it takes ``monitor.step()``'s CPU time on the training
thread (``time.thread_time()``) inside the loop, and the same call repeated on one
loss in a warm loop (what the code costs with its caches hot); then, in interleaved
blocks against a plain copy, the process CPU time per step (training and background
threads together) with the diagnoses on and off, and the background thread's own CPU
per step. Each arm trains in a thread of its own, as in bench/overhead.py: autograd
numbers nodes per thread, and a monitor that saw another arm's nodes between two of its
steps would take them for a changed graph and check for stale state again.

Run: ``python bench/light_step.py --only long_lstm`` (BENCHMARKS.md, "What a light step
costs, and where").
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import os
import random
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


def thread_cpu(thread: Any) -> float:
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def step_cpu(work: Any, tmp: str, steps: int) -> tuple[float, float]:
    """Median CPU seconds of monitor.step() in the loop, and in a warm loop."""
    model = copy.deepcopy(work.model)
    step = work.make_step(model)
    monitor = watch(model, run="light", spool=os.path.join(tmp, "step.jsonl"), quiet=True,
                    every=10**9, **work.options)
    for _ in range(30):
        monitor.step(step())
    in_loop = []
    for _ in range(steps):
        loss = step()
        started = time.thread_time()
        monitor.step(loss)
        in_loop.append(time.thread_time() - started)
    warm = []
    for _ in range(steps):
        started = time.thread_time()
        monitor.step(loss)
        warm.append(time.thread_time() - started)
    monitor.close()
    return statistics.median(in_loop), statistics.median(warm)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="long_lstm", choices=workloads.WORKLOADS)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--steps", type=int, default=16)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    work = workloads.workload(args.only)
    with tempfile.TemporaryDirectory() as tmp:
        in_loop, warm = step_cpu(work, tmp, 600)
        arms: list[list[Any]] = []
        for label, options in (("plain", None), ("light", {}), ("light, no diagnoses",
                                                                 {"diagnose": False})):
            model = copy.deepcopy(work.model)
            monitor = None if options is None else watch(
                model, run=label, spool=os.path.join(tmp, f"{len(arms)}.jsonl"), quiet=True,
                every=10**9, **work.options, **options)
            arms.append([label, work.make_step(model), monitor, [], []])
        pools = [concurrent.futures.ThreadPoolExecutor(1) for _ in arms]
        for pool, (_, step, monitor, _, _) in zip(pools, arms, strict=True):
            pool.submit(workloads.train, step, monitor, 20).result()
        shuffle = random.Random(0)
        for _ in range(args.rounds):
            for i in shuffle.sample(range(len(arms)), len(arms)):
                _, step, monitor, cpu, background = arms[i]
                thread = monitor._pipeline._thread if monitor is not None else None
                bg = thread_cpu(thread) if thread is not None else 0.0
                started = time.process_time()
                pools[i].submit(workloads.train, step, monitor, args.steps).result()
                cpu.append((time.process_time() - started) / args.steps)
                if thread is not None:
                    background.append((thread_cpu(thread) - bg) / args.steps)
        for pool in pools:
            pool.shutdown()
        base = statistics.median(arms[0][3])
        print(f"{args.only}, light steps; load average {os.getloadavg()[0]:.1f}")
        print(f"monitor.step() CPU: {in_loop * 1e6:.1f} µs in the loop, "
              f"{warm * 1e6:.1f} µs in a warm loop")
        print("| | process CPU per step | vs plain | background thread CPU per step |")
        print("| --- | --- | --- | --- |")
        for label, _, monitor, cpu, background in arms:
            mid = statistics.median(cpu)
            bg = f"{statistics.median(background) * 1e6:.0f} µs" if background else ""
            print(f"| {label} | {mid * 1e3:.3f} ms | {mid / base:.3f}x | {bg} |")
            if monitor is not None:
                monitor.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
