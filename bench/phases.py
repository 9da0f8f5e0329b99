"""Where ``every=1`` spends its time on one model, by phase of the training step.

One ``cells`` model (bench/workloads.py's LSTMCell decoder, Adam), plain and watched
blocks interleaved (the order reversed every other round), wall clock per phase of each
step: forward, backward (with ``zero_grad``), ``optimizer.step()`` and ``monitor.step()``;
medians over every step of every round. Arms:

- ``plain``: no monitor;
- ``every1``: ``watch(model, every=1)``;
- ``-<quantity>`` (``--drop timesteps update_ratios``...): ``every=1`` with that quantity
  idle (its hooks off, nothing captured), so its cost shows phase by phase;
- ``stack=<elements>`` (``--stack-limits 32768 1048576``): ``every=1`` stacking the cell
  gradients afresh, ``norms.STACK_LIMIT`` elements a stack, instead of into the cell's
  kept buffer (``norms.Scratch``, off for the block: ``SCRATCH_LIMIT`` 0).

    .venv/bin/python bench/phases.py --drop timesteps update_ratios param_norms --rounds 8
    .venv/bin/python bench/phases.py --stack-limits 32768 131072 1048576 --rounds 12
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workloads  # the workloads (bench/workloads.py)

from gradwatch.trainer_hooks import watch
from gradwatch.trainer_hooks.quantities import norms

PHASES = ("forward", "backward", "optimizer", "monitor.step", "total")


def idle(monitor: Any, name: str) -> None:
    """Leave quantity ``name`` of ``monitor`` idle from now on: hooks off, no capture."""
    found = [q for q in monitor.quantities if q.name == name]
    if not found:
        names = [q.name for q in monitor.quantities]
        raise SystemExit(f"--drop: expected one of {names}, got {name!r}")
    (q,) = found
    q.start_step(False)
    q.start_step = lambda capture: None
    q.finish_step = lambda loss: {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drop", nargs="*", default=[], help="quantities to idle, one arm each")
    parser.add_argument("--stack-limits", nargs="*", type=int, default=[])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=100, help="timed steps a block")
    parser.add_argument("--warm", type=int, default=40, help="untimed steps after watch()")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = workloads.CellDecoder()
    x, y = torch.randn(24, 32, 64), torch.randn(24, 32, 64)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    clock = time.perf_counter

    def block(monitor: Any, steps: int) -> list[tuple[float, ...]]:
        rows = []
        for _ in range(steps):
            t0 = clock()
            loss = nn.functional.mse_loss(model(x), y)
            t1 = clock()
            optimizer.zero_grad()
            loss.backward()
            t2 = clock()
            optimizer.step()
            t3 = clock()
            if monitor is not None:
                monitor.step(loss)
            t4 = clock()
            rows.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0))
        return rows

    default_limit, default_scratch = norms.STACK_LIMIT, norms.SCRATCH_LIMIT
    arms = ["plain", "every1", *(f"-{q}" for q in args.drop),
            *(f"stack={n}" for n in args.stack_limits)]
    found: dict[str, list[tuple[float, ...]]] = {arm: [] for arm in arms}
    block(None, 30)
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for arm in arms if r % 2 == 0 else arms[::-1]:
                if arm == "plain":
                    found[arm] += block(None, args.steps)
                    continue
                chunked = arm.startswith("stack=")
                norms.STACK_LIMIT = int(arm.removeprefix("stack=")) if chunked else default_limit
                norms.SCRATCH_LIMIT = 0 if chunked else default_scratch
                spool = os.path.join(tmp, f"{r}-{arm}.jsonl")
                monitor = watch(model, run=arm, spool=spool, quiet=True, every=1)
                if arm.startswith("-"):
                    idle(monitor, arm[1:])
                block(monitor, args.warm)
                found[arm] += block(monitor, args.steps)
                monitor.close()
    norms.STACK_LIMIT, norms.SCRATCH_LIMIT = default_limit, default_scratch
    plain = statistics.median(row[-1] for row in found["plain"])
    print(f"cells, {args.rounds} rounds of {args.steps} steps; load {os.getloadavg()[0]:.1f}; "
          "medians in ms")
    print("| arm | " + " | ".join(PHASES) + " | vs plain |")
    print("| --- |" + " --- |" * (len(PHASES) + 1))
    for arm, rows in found.items():
        cells = [statistics.median(row[i] for row in rows) * 1e3 for i in range(len(PHASES))]
        ratio = statistics.median(row[-1] for row in rows) / plain
        print(f"| {arm} | " + " | ".join(f"{c:.3f}" for c in cells) + f" | {ratio:.3f}x |")


if __name__ == "__main__":
    main()
