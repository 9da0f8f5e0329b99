"""What the example scenarios share: the command line, watch(), timing, summary.

Each example is ``python examples/<name>.py [--fixed] [--steps N] [--server ws://..]
[--spool PATH] [--token T] [--run NAME]`` and has ``main(argv) -> dict`` for tests.
With neither ``--server`` nor ``--spool`` it records to
``.gradwatch/examples/<run>.jsonl``.

Not a public API of gradwatch: a helper for the scripts beside it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from gradwatch.trainer_hooks import watch
from gradwatch.trainer_hooks.monitor import Monitor


def parser(name: str, description: str, steps: int) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"{name}.py", description=description)
    p.add_argument("--fixed", action="store_true", help="run the fixed twin instead of the bug")
    p.add_argument("--steps", type=int, default=steps, help=f"training steps (default {steps})")
    p.add_argument(
        "--server",
        default=os.environ.get("GRADWATCH_SERVER"),
        help="ws://host:port of a gradwatch server (default $GRADWATCH_SERVER; none: spool)",
    )
    p.add_argument("--spool", default=None, help="JSON Lines spool file to write")
    p.add_argument(
        "--token", default=os.environ.get("GRADWATCH_TOKEN"), help="the server's ingest token"
    )
    p.add_argument("--run", default=None, help=f"run name (default {name} or {name}-fixed)")
    p.add_argument(
        "--max-seconds",
        type=float,
        default=120.0,
        help="stop early after this much training time (default 120: the bug variants get "
        "slower every step, and gradwatch demo asks for 400 steps)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: these small models run fastest on one)",
    )
    p.add_argument("--quiet", action="store_true", help="print only the summary line")
    return p


def parse(p: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error(f"--steps: expected a positive number, got {args.steps}")
    if args.run is None:
        args.run = p.prog.removesuffix(".py") + ("-fixed" if args.fixed else "")
    if args.server is None and args.spool is None:
        args.spool = str(Path(".gradwatch") / "examples" / f"{args.run}.jsonl")
    torch.manual_seed(args.seed)
    torch.set_num_threads(max(1, args.threads))
    return args


def start(model: torch.nn.Module, args: argparse.Namespace, **options: Any) -> Monitor:
    """watch() with the example's command-line choices (every step recorded)."""
    return watch(
        model,
        run=args.run,
        server=args.server,
        spool=args.spool,
        token=args.token,
        every=1,
        **options,
    )


class StepClock:
    """Wall time of each training step as the example itself sees it."""

    def __init__(self, max_seconds: float | None = None) -> None:
        self.times: list[float] = []
        self.max_seconds = max_seconds
        self._start = time.perf_counter()

    def out_of_time(self) -> bool:
        """True once the steps so far took longer than ``max_seconds``."""
        return self.max_seconds is not None and sum(self.times) > self.max_seconds

    def lap(self) -> float:
        now = time.perf_counter()
        self.times.append(now - self._start)
        self._start = now
        return self.times[-1]

    def ends(self, k: int = 3) -> tuple[float, float]:
        """Median step time of the first k (after the first) and of the last k steps."""
        body = self.times[1:] if len(self.times) > 2 else self.times
        k = max(1, min(k, len(body) // 2 or 1))
        return statistics.median(body[:k]), statistics.median(body[-k:])


def report(
    args: argparse.Namespace, clock: StepClock, lines: list[str], summary: dict[str, Any]
) -> dict[str, Any]:
    where = args.server or args.spool
    steps = len(clock.times)
    summary.update(run=args.run, fixed=args.fixed, steps=steps, output=where)
    if steps < args.steps:
        lines.append(
            f"  stopped after {steps} of {args.steps} steps (--max-seconds {args.max_seconds:g})"
        )
    if not args.quiet:
        for line in lines:
            print(line)
    print(f"[{args.run}] wrote to {where}")
    return summary


def timed(fn: Callable[[], Any], repeat: int) -> float:
    """Median seconds of ``repeat`` calls of ``fn``."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


class ThroughData:
    """Run a torch optimizer whose updates autograd does not see (through ``.data``).

    Current PyTorch refuses to backpropagate through a graph whose saved weights were
    updated in place since (``one of the variables needed for gradient computation
    has been modified by an inplace operation``): exactly what stops the original
    recipes of the reports at their second iteration. Older code often updated
    weights through ``.data``, which autograd does not track. This wrapper does that
    with a real optimizer: it steps shadow copies and copies them back through
    ``.data``. Old graphs are then replayed with the new weights, silently: one more
    reason to detach.
    """

    def __init__(self, params: Sequence[torch.nn.Parameter], make: Callable[..., Any], **kw: Any):
        self.params = list(params)
        self.shadows = [p.detach().clone().requires_grad_() for p in self.params]
        self.optimizer = make(self.shadows, **kw)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        for p, s in zip(self.params, self.shadows, strict=True):
            s.grad = p.grad
        self.optimizer.step()
        with torch.no_grad():
            for p, s in zip(self.params, self.shadows, strict=True):
                p.data.copy_(s)
