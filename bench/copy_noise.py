"""How far plain copies of one model drift apart in ``bench/overhead.py``'s method.

``overhead.py`` times interleaved blocks of copies of a model, each training in a
thread of its own, and reads its ``control`` (a second plain copy) as the run's noise.
This script runs only plain copies that way and reports each copy's median block
against the first, the spread of those medians (max / min), the same from per-round
paired ratios, and the standard deviation of one copy's blocks. ``--rotate`` moves
every copy to the next thread each round (glibc serves each thread from its own malloc
arena, so a copy would otherwise keep one arena all run); ``MALLOC_ARENA_MAX=1`` in the
environment gives all threads one arena; ``--clock cpu`` times process CPU instead of
the wall clock (preemption then does not count).

    .venv/bin/python bench/copy_noise.py --only long_lstm --rounds 12
    .venv/bin/python bench/copy_noise.py --only long_lstm --rounds 12 --rotate
    MALLOC_ARENA_MAX=1 .venv/bin/python bench/copy_noise.py --only long_lstm --rounds 12
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import math
import os
import random
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workloads  # the workloads (bench/workloads.py)


def block(step: Any, steps: int, clock: Any) -> float:
    """Seconds per step over ``steps`` steps."""
    started = clock()
    for _ in range(steps):
        step()
    return (clock() - started) / steps


def spread(values: list[float]) -> float:
    return max(values) / min(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="long_lstm", choices=workloads.WORKLOADS)
    parser.add_argument("--copies", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--block-seconds", type=float, default=0.6)
    parser.add_argument("--rotate", action="store_true",
                        help="move every copy to the next thread each round")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    work = workloads.workload(args.only)
    k = args.copies
    threads = [concurrent.futures.ThreadPoolExecutor(1) for _ in range(k)]
    try:
        steps = [threads[i].submit(work.make_step, copy.deepcopy(work.model)).result()
                 for i in range(k)]
        for i in range(k):  # allocator, first calls
            threads[i].submit(block, steps[i], 40, clock).result()
        per_step = threads[0].submit(block, steps[0], 20, clock).result()
        n = max(16, int(args.block_seconds / per_step))
        times: list[list[float]] = [[] for _ in range(k)]
        shuffle = random.Random(0)
        for r in range(args.rounds):
            order = list(range(k))
            shuffle.shuffle(order)
            for i in order:
                thread = threads[(i + r) % k] if args.rotate else threads[i]
                times[i].append(thread.submit(block, steps[i], n, clock).result())
    finally:
        for thread in threads:
            thread.shutdown()
    medians = [statistics.median(t) for t in times]
    paired = [statistics.median(a / b for a, b in zip(t, times[0], strict=True))
              for t in times]

    def sd(values: list[float]) -> float:
        mean = statistics.fmean(values)
        return math.sqrt(statistics.fmean([(v - mean) ** 2 for v in values]))

    arenas = os.environ.get("MALLOC_ARENA_MAX")
    print(f"{args.only}, {k} plain copies, {args.rounds} rounds x {n} steps "
          f"({per_step * 1e3:.2f} ms a step), {args.clock} clock"
          f"{', threads rotating' if args.rotate else ''}"
          f"{f', MALLOC_ARENA_MAX={arenas}' if arenas else ''}"
          f"; load average {os.getloadavg()[0]:.1f}")
    print("medians against copy 0:", " ".join(f"{m / medians[0]:.3f}" for m in medians),
          f"spread {spread(medians):.3f}")
    print("paired per round:      ", " ".join(f"{p:.3f}" for p in paired),
          f"spread {spread(paired):.3f}")
    spreads = [sd([t / m for t in ts]) for ts, m in zip(times, medians, strict=True)]
    print("block sd per copy %:   ", " ".join(f"{s * 100:.1f}" for s in spreads))


if __name__ == "__main__":
    main()
