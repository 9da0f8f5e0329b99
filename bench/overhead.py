r"""What gradwatch costs the training steps users run, and what it says it costs.

Workloads (CPU, each a full training step: forward, loss, ``zero_grad``, backward,
optimizer step):

- ``cells``: an ``nn.LSTMCell(64, 128)`` decoder called once per token in a Python
  loop, 24 tokens, batch 32, a linear head per token, Adam;
- ``buckets``: the same decoder over sequences bucketed by length (12-28 tokens, five
  lengths in a fixed shuffled order), as a sequence data loader batches them: each
  step builds another autograd graph than the step before;
- ``fused2``: a 2-layer ``nn.LSTM(64, 128)`` over 48 steps, batch 32, a head per step,
  Adam;
- ``transformer``: a 4-layer ``nn.TransformerEncoder`` (d=64, 4 heads, feed-forward
  256), 48 tokens, batch 32, Adam;
- ``lm``: a 2-layer LSTM language model (vocabulary 2,000, embedding 64, hidden 128),
  35 tokens, batch 20, cross-entropy over every token, SGD with clipping;
- the four examples (``examples/``): ``long_lstm`` (121 steps), ``rotation_lstm`` and
  ``tree_gru`` as their ``--fixed`` twins (the bug variants' steps grow without end,
  so there is no steady step to compare), ``seq2seq_attention`` with its decoder
  called once per token (its "bug" is only slow, and the per-call case is the one
  that costs gradwatch most).

Variants, each on its own copy of the model (same weights): ``plain``; ``plain
(control)``, a second copy whose distance from 1.000x is this run's noise;
``gradwatch default``, ``watch(model)`` with no options (heavy quantities under the
default budget); ``every=1``; ``every=10``. Then a second pass, against its own plain
copy: ``wandb.watch(log="all", log_freq=1)`` offline and TensorBoard
``add_histogram`` of every gradient every step, when installed (skipped with a note
otherwise; ``--no-others`` skips it): wandb's threads work on after its blocks, with
nothing to drain them, and would be charged to gradwatch's variants if they shared
the pass. Interleaved blocks: every round runs one
block of each variant in a shuffled order, and each block ends by draining its own
background work (``monitor.flush()``), so that work is charged to it. Each variant
trains in a thread of its own, as a training loop does: autograd numbers its nodes
per thread, and the nodes another variant built between two of a monitor's steps
read to it as a changed graph, which re-runs the stale-state check and the graph
walk (on 103 and ~100 of 200 steps at every=1, against 13 and ~17 in one loop). The table gives
each variant's mean block step time (wall clock), its ratio to plain as medians of
the block means (robust to a block another process slowed, but blind to a heavy step
every 20th when blocks are shorter) and as means (what a budget's rare heavy steps
cost on average), the measured share ``1 - plain / variant`` from the means (what a
step of that variant spends on monitoring), and beside it the ``overhead`` gradwatch
reported for the same steps (the seconds its records say it spent, ``overhead x
duration_s``, summed over the timed blocks and divided by their measured time: a
block's first record has a duration that spans the other variants' blocks, its
seconds do not). ``heavy`` is the share of those steps that captured the heavy
quantities.

Run: ``python bench/overhead.py`` (both the default torch threads and 1 thread;
``--threads 1`` or ``--threads 0`` for one of them, 0 = torch's default), ``--quick``
(under ~6 minutes on the 2-core VM when other processes leave it be),
``--only cells lm``, ``--variants default`` (gradwatch's settings to run: fewer leave
time for more rounds), ``--rounds``, ``--steps``, ``--block-seconds`` (blocks at least
that long: each block ends with a flush, which wakes the background thread, so blocks
shorter than its pace, 0.5 s for a run nobody watches, wake it more often than training
alone would), ``--clock cpu`` (this process's CPU
time instead of the wall clock: steadier when other processes load the box, blind to
time spent waiting for the GIL), ``--device cuda`` (DEVICE_WORKLOADS on a GPU, each
block timed to a synchronize: bench/gpu.sh).
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
import tempfile
import time
import warnings
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from torch import nn
from workloads import DEVICE_WORKLOADS, WORKLOADS, Step, Workload, workload  # bench/workloads.py

from gradwatch.protocol import read_spool
from gradwatch.trainer_hooks import watch

#: what the blocks are timed with: the wall clock, or this process's CPU time (--clock)
CLOCK: list[Callable[[], float]] = [time.perf_counter]
#: where the workloads train (--device); on a GPU each block ends with a synchronize
DEVICE = ["cpu"]


def settled() -> None:
    """Wait for the device's queued work: a block's time includes its kernels."""
    if DEVICE[0] != "cpu":
        torch.cuda.synchronize()


# -- variants ----------------------------------------------------------------------


class Variant:
    """One way of training: ``run(n)`` does n steps; setup outside the timed blocks."""

    def __init__(self, name: str, step: Step, after: Callable[[torch.Tensor, int], None],
                 drain: Callable[[], object] = lambda: None, monitor: Any = None,
                 spool: Path | None = None) -> None:
        self.name = name
        self.step = step
        self.after = after
        self.drain = drain
        self.monitor = monitor
        self.spool = spool
        self.count = 0
        self.times: list[float] = []
        self.wall_s = 0.0  # wall time of the timed blocks, whatever the clock
        self.timed_steps: set[int] = set()  # record steps inside timed blocks
        self.note = ""
        self._thread: concurrent.futures.ThreadPoolExecutor | None = None

    def run(self, steps: int, timed: bool) -> float:
        """``steps`` steps in this variant's own thread (the module docstring says why)."""
        if self._thread is None:
            self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=self.name)
        return self._thread.submit(self._run, steps, timed).result()

    def _run(self, steps: int, timed: bool) -> float:
        settled()
        started, wall = CLOCK[0](), time.perf_counter()
        for _ in range(steps):
            loss = self.step()
            self.after(loss, self.count)
            if timed:
                self.timed_steps.add(self.count)
            self.count += 1
        self.drain()
        settled()
        elapsed = (CLOCK[0]() - started) / steps
        if timed:
            self.times.append(elapsed)
            self.wall_s += time.perf_counter() - wall
        return elapsed

    def reported(self) -> tuple[float, float] | None:
        """(overhead gradwatch reported, share of heavy steps) over the timed steps."""
        if self.spool is None:
            return None
        schedule = self.monitor.schedule
        if schedule.budget is not None:
            heavy_f, light_f = schedule.estimate()
            extra = schedule.heavy_extra_s() * 1e3
            self.note = (f"interval {schedule.interval}, heavy step +{extra:.2f} ms "
                         f"({heavy_f or 0:.1%}), light {light_f:.1%}")
        self.monitor.close()
        records = [r for m in read_spool(self.spool) if m["type"] == "batch"
                   for r in m["records"] if r["kind"] == "step" and r["step"] in self.timed_steps]
        if not records:
            return None
        # overhead x duration is the (wall) seconds gradwatch says it spent on a step,
        # also on a block's first step, whose duration spans the other variants'
        # blocks: so the seconds are summed and divided by the blocks' own wall time
        spent = sum(r["overhead"] * r["duration_s"] for r in records)
        heavy = sum("param_norms" in r for r in records) / len(records)
        return spent / self.wall_s, heavy


def plain_variants(work: Workload, labels: tuple[str, ...]) -> list[Variant]:
    return [Variant(label, work.make_step(copy.deepcopy(work.model)), lambda loss, i: None)
            for label in labels]


#: gradwatch's variants of the first pass, by the name ``--variants`` takes
SETTINGS: dict[str, dict[str, Any]] = {"default": {}, "every=1": {"every": 1},
                                       "every=10": {"every": 10}}


def variants(name: str, stack: ExitStack, tmp: Path,
             settings: tuple[str, ...] = tuple(SETTINGS)) -> list[Variant]:
    """Plain, its control and gradwatch's ``settings``: the first pass."""
    work = workload(name, DEVICE[0])
    found = plain_variants(work, ("plain", "plain (control)"))
    for setting in settings:
        label, options = f"gradwatch {setting}", SETTINGS[setting]
        model = copy.deepcopy(work.model)
        spool = tmp / f"{name}-{len(found)}.jsonl"
        monitor = watch(model, run=f"bench-{name}", spool=spool, **work.options, **options)
        stack.callback(monitor.close)
        found.append(Variant(label, work.make_step(model),
                             lambda loss, i, m=monitor: m.step(loss), drain=monitor.flush,
                             monitor=monitor, spool=spool))
    return found


def other_variants(name: str, stack: ExitStack, tmp: Path, notes: list[str]) -> list[Variant]:
    """wandb and TensorBoard beside a plain copy: a second pass, apart from the first,
    because wandb's own threads go on working after its blocks (nothing drains them)
    and would be charged to whichever variant ran next."""
    work = workload(name, DEVICE[0])
    found = plain_variants(work, ("plain (second pass)",))
    try:
        import wandb
    except ImportError:
        notes.append("wandb not installed: skipped (pip install 'gradwatch[bench]')")
    else:
        model = copy.deepcopy(work.model)
        os.environ["WANDB_MODE"] = "offline"
        os.environ.setdefault("WANDB_SILENT", "true")
        run = wandb.init(project="gradwatch-bench", dir=str(tmp), name=name, reinit=True)
        stack.callback(run.finish)
        run.watch(model, log="all", log_freq=1)
        found.append(Variant("wandb.watch log=all", work.make_step(model),
                             lambda loss, i, r=run: r.log({"loss": loss.item()})))
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        notes.append("tensorboard not installed: skipped (pip install 'gradwatch[bench]')")
    else:
        model = copy.deepcopy(work.model)
        writer = SummaryWriter(log_dir=str(tmp / f"tb-{name}"))
        stack.callback(writer.close)

        def histograms(loss: torch.Tensor, i: int, m: nn.Module = model) -> None:
            for pname, p in m.named_parameters():
                if p.grad is not None:
                    writer.add_histogram(pname, p.grad, i)
            writer.add_scalar("loss", loss.item(), i)

        found.append(Variant("tensorboard histograms", work.make_step(model), histograms,
                             drain=writer.flush))
    return found if len(found) > 1 else []


def interleaved(found: list[Variant], rounds: int, steps: int, warmup: int,
                block_s: float = 0.0) -> None:
    for v in found:  # allocator, first calls, the default budget's first estimates
        per_step = v.run(warmup, timed=False)
        if v is found[0] and block_s > 0:  # blocks of at least block_s of plain steps
            steps = max(steps, math.ceil(block_s / max(per_step, 1e-6)))
    shuffle = random.Random(0)
    for _ in range(rounds):
        order = list(found)
        shuffle.shuffle(order)
        for v in order:
            v.run(steps, timed=True)


def measure(name: str, rounds: int, steps: int, warmup: int, notes: list[str],
            others: bool = True, block_s: float = 0.0,
            settings: tuple[str, ...] = tuple(SETTINGS)) -> list[str]:
    lines: list[str] = []
    with tempfile.TemporaryDirectory() as tmpdir, ExitStack() as stack:
        passes = [variants(name, stack, Path(tmpdir), settings)]
        if others:
            passes.append(other_variants(name, stack, Path(tmpdir), notes))
        for found in passes:
            if found:
                interleaved(found, rounds, steps, warmup, block_s)
                lines += table_rows(name, found, notes)
    return lines


def table_rows(name: str, found: list[Variant], notes: list[str]) -> list[str]:
    """One row per variant, each against the first (a plain copy) of its pass."""
    plain = statistics.median(found[0].times)
    plain_mean = statistics.fmean(found[0].times)
    lines = []
    for v in found:
        med, mean = statistics.median(v.times), statistics.fmean(v.times)
        got = v.reported()
        said = heavy = ""
        if got is not None:
            said, heavy = f"{got[0]:.1%}", f"{got[1]:.0%}"
        if v.note:
            notes.append(f"{name}, {torch.get_num_threads()} thread(s), {v.name}: {v.note}")
        lines.append(f"| {name} | {v.name} | {mean * 1e3:.2f} | {med / plain:.3f}x | "
                     f"{mean / plain_mean:.3f}x | {1 - plain_mean / mean:+.1%} | {said} | "
                     f"{heavy} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="fewer rounds and steps: under ~6 minutes on the 2-core VM")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None, help="steps per timed block")
    parser.add_argument(
        "--block-seconds", type=float, default=0.0,
        help="at least this long a block (of plain steps): each block ends with a flush, "
        "which wakes the background thread, so blocks shorter than its pace (0.5 s while "
        "nobody watches) hand records over more often than training does",
    )
    parser.add_argument("--threads", type=int, nargs="*", default=[0, 1],
                        help="torch intra-op threads to run with (0: torch's default)")
    parser.add_argument("--only", nargs="*", choices=WORKLOADS, default=None,
                        help="workloads to run (default: all; on a GPU, DEVICE_WORKLOADS)")
    parser.add_argument("--variants", nargs="*", choices=list(SETTINGS), default=list(SETTINGS),
                        help="gradwatch's settings to run beside plain and its control "
                        "(fewer variants leave time for more rounds)")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda where one is at hand")
    parser.add_argument("--no-others", action="store_true",
                        help="skip the second pass (wandb and TensorBoard, where installed)")
    parser.add_argument(
        "--clock", choices=["wall", "cpu"], default="wall",
        help="wall: what a user waits (default); cpu: this process's CPU time, both "
        "threads, steadier on a box other processes load (blind to GIL waits)",
    )
    args = parser.parse_args(argv)
    if args.device != "cpu" and not torch.cuda.is_available():
        parser.error(f"expected a CUDA device for --device {args.device}: torch sees none")
    DEVICE[0] = args.device
    only = args.only or list(WORKLOADS if args.device == "cpu" else DEVICE_WORKLOADS)
    if args.clock == "cpu":
        CLOCK[0] = time.process_time
    # Long blocks: a schedule measures the wall time between its own records, and the
    # first step of a block spans the other variants' blocks (one such step in 16 is
    # an outlier its medians absorb; one in 4 was not)
    rounds = args.rounds or (4 if args.quick else 10)
    steps = args.steps or 16
    warmup = 40 if args.quick else 60
    warnings.filterwarnings("ignore")
    default_threads = torch.get_num_threads()
    notes: list[str] = []
    started = time.perf_counter()
    blocks = f"{steps} steps" + (f" (at least {args.block_seconds:g} s)"
                                 if args.block_seconds > 0 else "")
    print(f"torch {torch.__version__}, {args.device}, {rounds} rounds x {blocks} per variant "
          f"after {warmup} warm-up steps, {args.clock} clock; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    for threads in args.threads:
        torch.set_num_threads(threads or default_threads)
        print(f"\n{torch.get_num_threads()} torch thread(s)"
              f"{' (the default)' if not threads else ''}\n")
        print("| workload | variant | step ms (mean) | vs plain (medians) | vs plain (means) "
              "| measured share | reported overhead | heavy steps |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for name in only:
            for line in measure(name, rounds, steps, warmup, notes, not args.no_others,
                                args.block_seconds, tuple(args.variants)):
                print(line, flush=True)
    for note in dict.fromkeys(notes):
        print(f"note: {note}")
    print(f"\n{time.perf_counter() - started:.0f} s; load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
