"""What watching costs one cell call, warm: the forward of an ``nn.LSTMCell`` called 24
times a step with and without ``watch(every=1)``, beside a bare hook that only calls
``retain_grad()`` on h and c (the floor of any capture that keeps the call's gradients).
``watched`` is torch's own cell, watched through its class (no hook:
trainer_hooks/quantities/watched_class.py); ``watched, a user's cell class`` the same
cell as a subclass of the user's, which gets a forward hook.

Each step: 24 timed calls from a fresh state, then (untimed) backward and, when
watched, ``monitor.step()``, so every timed call is a captured call of a real step.
An Adam optimizer exists, as in training: it imports dynamo, which changes what a
hook wrapped for ``torch.compile`` costs. Medians over ``--steps`` steps, each arm in
turn ``--rounds`` times.

Run: ``python bench/cell_call.py [--rounds 3] [--steps 1500]`` (BENCHMARKS.md, "Capture
cost").
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hook_floor import retain_outputs

from gradwatch.trainer_hooks import watch


def per_call(cell: torch.nn.LSTMCell, x: torch.Tensor, steps: int, monitor: Any) -> float:
    """Median seconds of one call over ``steps`` steps of 24 calls."""
    h = c = torch.zeros(x.shape[0], cell.hidden_size)
    times = []
    for _ in range(steps + 20):
        hh, cc = h, c
        started = time.perf_counter()
        for _ in range(24):
            hh, cc = cell(x, (hh, cc))
        times.append((time.perf_counter() - started) / 24)
        (hh.sum() + cc.sum()).backward()
        if monitor is not None:
            monitor.step(None)
    return statistics.median(times[20:])


class UserCell(torch.nn.LSTMCell):
    """The same cell, of a class of the user's: gradwatch hooks it."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1500)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cell = torch.nn.LSTMCell(8, 8)
    x = torch.randn(2, 8)
    torch.optim.Adam(cell.parameters())  # as in training: loads dynamo
    user = UserCell(8, 8)
    user.load_state_dict(cell.state_dict())
    results: dict[str, list[float]] = {"unwatched": [], "retain_grad hook": [], "watched": [],
                                       "watched, a user's cell class": []}
    for _ in range(args.rounds):
        results["unwatched"].append(per_call(cell, x, args.steps, None))
        handle = cell.register_forward_hook(retain_outputs)
        results["retain_grad hook"].append(per_call(cell, x, args.steps, None))
        handle.remove()
        monitor = watch(cell, run="cell_call", spool=os.devnull, quiet=True, every=1,
                        diagnose=False, cells=[cell])
        results["watched"].append(per_call(cell, x, args.steps, monitor))
        monitor.close()
        monitor = watch(user, run="cell_call", spool=os.devnull, quiet=True, every=1,
                        diagnose=False, cells=[user])
        results["watched, a user's cell class"].append(per_call(user, x, args.steps, monitor))
        monitor.close()
    base = statistics.median(results["unwatched"])
    print(f"LSTMCell(8, 8), batch 2, 24 calls a step; load average {os.getloadavg()[0]:.1f}")
    print("| arm | µs a call | beyond unwatched |\n| --- | --- | --- |")
    for name, values in results.items():
        mid = statistics.median(values)
        print(f"| {name} | {mid * 1e6:.2f} | +{(mid - base) * 1e6:.2f} µs |")


if __name__ == "__main__":
    main()
