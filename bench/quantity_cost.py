"""What each captured quantity adds to a heavy step: drop one at a time from a running Monitor.

A workload of ``bench/overhead.py`` trains under ``watch(every=1, diagnose=False)`` in
several copies: all quantities, then one copy per name given with that quantity
detached and removed. Interleaved blocks of ``--steps`` steps, shuffled each round;
the training thread's CPU time (``time.thread_time()``: hooks, ``step()`` and the
device work of the norms, not the background thread) per step, beyond a plain copy,
medians over rounds.

Each copy trains in a thread of its own, as a training loop does (autograd numbers
nodes per thread: another copy's nodes between two of a monitor's steps would read to
it as a changed graph and re-run the stale-state check and the graph walk).

Run: ``python bench/quantity_cost.py --only cells --drop timesteps update_ratios
param_norms graph_nodes --rounds 25`` (BENCHMARKS.md, "Capture cost").
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


def arm(work: Any, tmp: str, label: str, drop: str | None, plain: bool = False) -> list[Any]:
    model = copy.deepcopy(work.model)
    step = work.make_step(model)
    monitor = None
    if not plain:
        monitor = watch(model, run=label, spool=os.path.join(tmp, f"{label}.jsonl"),
                        quiet=True, diagnose=False, every=1, **work.options)
        for q in list(monitor.quantities):
            if q.name == drop:
                q.detach()
                monitor.quantities.remove(q)
                monitor._pipeline.quantities.remove(q)
    return [label, step, monitor, []]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="cells", choices=workloads.WORKLOADS)
    parser.add_argument("--drop", nargs="*", default=["timesteps", "update_ratios",
                                                      "param_norms", "graph_nodes"])
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    work = workloads.workload(args.only)
    with tempfile.TemporaryDirectory() as tmp:
        labels = ["plain", "all"] + [f"without {name}" for name in args.drop]
        pools = {label: concurrent.futures.ThreadPoolExecutor(1) for label in labels}

        def steps(step: Any, monitor: Any, count: int) -> float:
            started = time.thread_time()
            for _ in range(count):
                loss = step()
                if monitor is not None:
                    monitor.step(loss)
            return (time.thread_time() - started) / count

        arms = [pools["plain"].submit(arm, work, tmp, "plain", None, True).result(),
                pools["all"].submit(arm, work, tmp, "all", None).result()]
        arms += [pools[f"without {name}"].submit(arm, work, tmp, f"without {name}", name).result()
                 for name in args.drop]
        for label, step, monitor, _ in arms:
            pools[label].submit(steps, step, monitor, args.warmup).result()
        shuffle = random.Random(0)
        for _ in range(args.rounds):
            for label, step, monitor, times in shuffle.sample(arms, len(arms)):
                times.append(pools[label].submit(steps, step, monitor, args.steps).result())
                if monitor is not None:
                    monitor.flush()
        base = statistics.median(arms[0][3])
        print(f"{args.only}, every=1, {args.rounds} rounds x {args.steps} steps; plain "
              f"{base * 1e3:.2f} ms; load average {os.getloadavg()[0]:.1f}")
        print("| | training-thread CPU beyond plain, per step |\n| --- | --- |")
        for label, _, monitor, times in arms[1:]:
            print(f"| {label} | +{(statistics.median(times) - base) * 1e3:.2f} ms |")
            monitor.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
