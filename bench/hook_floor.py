"""The floor under gradwatch's cost on a cell loop: what PyTorch charges for hooks
that do nothing, and what each of gradwatch's own pieces costs, on the ``cells``
workload of ``bench/overhead.py`` (an ``nn.LSTMCell(64, 128)`` decoder, 24 calls a step).

Two tables from one run:

1. Whole steps, interleaved blocks (shuffled each round), CPU time of this process:
   plain training; plain with an empty forward hook on the cell; plain with that hook
   adding two empty autograd-node pre-hooks per call (h and c: the shape of the
   earlier cell capture, doing nothing); plain with the hook calling ``retain_grad()``
   on h and c (the shape of the cell capture now: a C++ hook, nothing in Python during
   backward); gradwatch ``every=1`` and ``every=10``. Median and
   minimum of the block means, each as a ratio to plain: on a loaded box the minimum
   is the steadier estimate of a fixed cost, the median what a user sees.
2. Each piece alone, ``timeit`` best of 7: the stale-state pre-hook on a later call,
   the cell forward hook (on a fresh output each time), the float64 norms of the cell series
   (2 x 24 gradients), the parameter and gate norms, the graph walk.

Run: ``python bench/hook_floor.py [--rounds 30] [--steps 5]``.
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import statistics
import sys
import time
import timeit
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workloads import train, workload

from gradwatch.trainer_hooks import watch
from gradwatch.trainer_hooks.quantities.graph import count_nodes


def _nop(*args: Any) -> None:
    return None


def _node_hooks(module: nn.Module, args: Any, out: Any) -> None:
    h, c = out
    h.grad_fn.register_prehook(_nop)
    c.grad_fn.register_prehook(_nop)


def retain_outputs(module: nn.Module, args: Any, out: Any) -> None:
    """A forward hook that keeps the gradients of a cell's (h, c): the floor of any
    capture of them (bench/cell_call.py uses it too)."""
    h, c = out
    h.retain_grad()
    c.retain_grad()


def whole_steps(rounds: int, steps: int) -> None:
    work = workload("cells")
    base, make_step = work.model, work.make_step
    variants: dict[str, tuple[Callable[[], torch.Tensor], Any]] = {}
    for name in ("plain", "plain (control)"):
        variants[name] = (make_step(copy.deepcopy(base)), None)
    model = copy.deepcopy(base)
    model.cell.register_forward_hook(_nop)
    variants["empty forward hook"] = (make_step(model), None)
    model = copy.deepcopy(base)
    model.cell.register_forward_hook(_node_hooks)
    variants["+ 2 empty node hooks/call"] = (make_step(model), None)
    model = copy.deepcopy(base)
    model.cell.register_forward_hook(retain_outputs)
    variants["+ retain_grad on h, c/call"] = (make_step(model), None)
    for every in (1, 10):
        model = copy.deepcopy(base)
        monitor = watch(model, run="floor", server=None, spool=os.devnull, every=every)
        variants[f"gradwatch every={every}"] = (make_step(model), monitor)
    times: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants)
    shuffle = random.Random(0)

    def block(name: str) -> float:
        step, monitor = variants[name]
        started = time.process_time()
        train(step, monitor, steps)
        return (time.process_time() - started) / steps

    # Each variant trains in a thread of its own, as a training loop does: autograd
    # numbers nodes per thread, and another variant's nodes between two of a monitor's
    # steps would read to it as a changed graph (bench/overhead.py says more).
    threads = {name: ThreadPoolExecutor(1) for name in variants}
    for r in range(rounds + 1):
        shuffle.shuffle(order)
        for name in order:
            elapsed = threads[name].submit(block, name).result()
            if r:  # round 0 warms up
                times[name].append(elapsed)
    for pool in threads.values():
        pool.shutdown()
    med0, min0 = statistics.median(times["plain"]), min(times["plain"])
    print("| variant | median ms | vs plain | min ms | vs plain |\n| --- | --- | --- | --- | --- |")
    for name, t in times.items():
        med, low = statistics.median(t), min(t)
        print(f"| {name} | {med * 1e3:.3f} | {med / med0:.3f}x | {low * 1e3:.3f} | "
              f"{low / min0:.3f}x |")
    for _, monitor in variants.values():
        if monitor is not None:
            monitor.close()


def pieces() -> None:
    work = workload("cells")
    model = work.model
    monitor = watch(model, run="pieces", server=None, spool=os.devnull, every=1,
                    diagnose=False)
    step = work.make_step(model)
    for _ in range(3):
        monitor.step(step())
    q = {quantity.name: quantity for quantity in monitor.quantities}
    cell = model.cell
    h = c = torch.zeros(32, 128)
    args = (torch.randn(32, 64), (h, c))
    # a fresh output per call, as in a loop (a second retain_grad() on one is a no-op)
    outs = iter([cell(*args) for _ in range(50 * 7 + 50)])
    stale, timesteps = q["stale_state"], q["timesteps"]
    capture = timesteps._cells[0]  # type: ignore[attr-defined]
    stale._seen_this_step.add(id(cell))  # type: ignore[attr-defined]
    grads = [torch.randn(32, 128) for _ in range(24)]
    loss = step()
    q["graph_nodes"].capturing = True

    def series() -> Any:
        capture.outputs = [(None, None)] * 24
        capture.versions = [(0, 0)] * 24
        capture.hooked = {"hidden": dict(enumerate(grads)), "cell": dict(enumerate(grads))}
        capture.count, capture.device = 24, torch.device("cpu")
        capture.used = {"hidden", "cell"}
        return capture.series()

    def forward_hook() -> None:
        capture._post(cell, args, next(outs))

    rows: list[tuple[str, Callable[[], Any], int]] = [
        ("stale-state pre-hook, a later call", lambda: stale._pre_forward(cell, args, {}), 24),  # type: ignore[attr-defined]
        ("cell forward hook (retain_grad on h, c)", forward_hook, 24),
        ("cell series: norms of 2 x 24 (float64 accumulation)", series, 1),
        ("parameter and gate norms (float64)", q["param_norms"]._norms, 1),  # type: ignore[attr-defined]
        ("graph walk (when it runs: paced)", lambda: count_nodes(loss.grad_fn), 1),
    ]
    print("\n| piece | µs each | per step | µs per step |\n| --- | --- | --- | --- |")
    for name, fn, per_step in rows:
        each = min(timeit.repeat(fn, number=50, repeat=7)) / 50
        print(f"| {name} | {each * 1e6:.1f} | x{per_step} | {each * per_step * 1e6:.0f} |")
    capture.reset()
    monitor.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, cpu, 1 thread, load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    whole_steps(args.rounds, args.steps)
    pieces()
    return 0


if __name__ == "__main__":
    sys.exit(main())
