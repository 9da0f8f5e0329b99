"""gradwatch's own cost on the training thread, per step, light and heavy.

``bench/overhead.py`` gives the end-to-end ratios to plain training (wall clock,
which on a shared box is noisy). This one isolates the capture core's hot path: the
training thread's CPU time (``time.thread_time()``, blind to other processes and to
the background thread) per step, for

- ``plain``: the training step alone;
- ``light``: ``watch(...)`` whose heavy quantities are never due (``every`` huge):
  ``monitor.step()``, the per-step checks (stale state, kept losses), the hooks that
  return at once;
- ``heavy``: ``every=1``: gradient norms, per-timestep norms, the graph walk and the
  host copy on every step;
- ``budget``: ``every=1, overhead=0.02``: the schedule stretches the heavy interval
  to keep gradwatch's mean share within 2 % (each block starts a fresh monitor, so
  its first steps are heavy before the schedule has measured anything);

in interleaved blocks (every round runs one block of each, in rotating order), with
the median over rounds, the difference to plain in microseconds, and the median of
the ``overhead`` field gradwatch itself put into the records.

Run: ``python bench/capture_cost.py [--rounds 7] [--steps 20] [--device cuda]``. On
CUDA the training thread's CPU time is what gradwatch adds to launching the step
(each block ends with a synchronisation, outside the timed part's hot path).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch
from torch import nn

from gradwatch.protocol import read_spool
from gradwatch.trainer_hooks import Monitor, watch


class Lstm121(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(1, 64, batch_first=True)
        self.head = nn.Linear(64, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(x)[0])


class Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(32, 64)
        self.head = nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.new_zeros(x.shape[0], 64)
        c = torch.zeros_like(h)
        out, ys = x, []
        for _ in range(24):
            h, c = self.cell(out, (h, c))
            out = self.head(h)
            ys.append(out)
        return torch.stack(ys, 1)


def workloads(device: str) -> dict[str, tuple[nn.Module, torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    cases = {
        "lstm121": (Lstm121(), torch.randn(32, 121, 1), torch.randn(32, 121, 1)),
        "cells": (Decoder(), torch.randn(32, 32), torch.randn(32, 24, 32)),
    }
    return {k: (m.to(device), x.to(device), y.to(device)) for k, (m, x, y) in cases.items()}


def block(model: nn.Module, x: torch.Tensor, y: torch.Tensor, opt: torch.optim.Optimizer,
          monitor: Monitor | None, steps: int) -> float:
    started = time.thread_time()
    for _ in range(steps):
        loss = (model(x) - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if monitor is not None:
            monitor.step(loss)
    if x.is_cuda:
        torch.cuda.synchronize()
    return (time.thread_time() - started) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    folder = Path(tempfile.mkdtemp())
    print(f"torch {torch.__version__}, {args.device}, 1 thread, "
          f"{args.rounds} rounds x {args.steps} steps, "
          "training-thread CPU time per step, medians over rounds\n")
    for name, (model, x, y) in workloads(args.device).items():
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def make(
            variant: str, r: int, model: nn.Module = model, name: str = name
        ) -> Monitor | None:
            if variant == "plain":
                return None
            return watch(model, run=variant, spool=folder / f"{name}-{variant[0]}{r}.jsonl",
                         every=10**9 if variant == "light" else 1, diagnose=False,
                         overhead=0.02 if variant == "budget" else None)

        monitors = ("plain", "light", "heavy", "budget")
        times: dict[str, list[float]] = {k: [] for k in monitors}
        block(model, x, y, opt, None, 3)  # warm-up
        for r in range(args.rounds):
            for variant in monitors[r % 4 :] + monitors[: r % 4]:
                monitor = make(variant, r)
                block(model, x, y, opt, monitor, 2)  # the monitor's first steps
                times[variant].append(block(model, x, y, opt, monitor, args.steps))
                if monitor is not None:
                    monitor.close()
        plain = statistics.median(times["plain"])
        print(f"{name}")
        print("| variant | CPU per step (ms) | gradwatch (us) | overhead field: median, mean "
              "| heavy steps |")
        print("|---|---|---|---|---|")
        for variant, values in times.items():
            med = statistics.median(values)
            field = heavy = "-"
            if variant != "plain":
                steps = [
                    rec
                    for spool in sorted(folder.glob(f"{name}-{variant[0]}*.jsonl"))
                    for msg in read_spool(spool) if msg["type"] == "batch"
                    for rec in msg["records"] if rec["kind"] == "step"
                ]
                fractions = [rec["overhead"] for rec in steps]
                field = f"{statistics.median(fractions):.2%}, {statistics.fmean(fractions):.2%}"
                heavy = f"{sum('param_norms' in rec for rec in steps) / len(steps):.0%}"
            print(f"| {variant} | {med * 1e3:.3f} | {(med - plain) * 1e6:+.0f} | {field} "
                  f"| {heavy} |")
        print()


if __name__ == "__main__":
    main()
