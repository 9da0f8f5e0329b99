r"""What gradwatch costs a training step, side by side with wandb.watch and TensorBoard.

Two workloads from the reports gradwatch exists for:

- ``lstm121``: one ``nn.LSTM`` layer over 121 timesteps, batch 121, ``batch_first``,
  one input feature, a linear head on every step, MSE, Adam (the "first 100 of 121
  steps get zero gradient" model);
- ``cells``: an ``nn.LSTMCell`` decoder called once per target token in a Python loop
  (24 tokens), a linear head per token, Adam;
- ``gpt`` (with ``--only gpt``): an ``nn.TransformerEncoder`` of 4 layers (width 64,
  4 heads, causal mask, sequence 32, batch 16), a linear head, MSE, Adam: a stack of
  blocks, so gradwatch captures its ``depth`` series, and ``update_ratios`` of Adam.

Variants, each on its own copy of the model (same weights), timed in interleaved
blocks (every round runs one block of every variant, in a shuffled order, so drift and
noise from other processes hit all of them alike); each block ends by draining the
variant's own background work (gradwatch's ``monitor.flush()``, the TensorBoard
writer's ``flush()``), so that work is charged to it and not to the next block; the
table gives each variant's median step time over the rounds and its ratio to plain
training, and the ratio of the fastest block to plain's fastest (``min vs min``: on a
loaded box the steadier estimate of a fixed cost):

- ``plain``: the training step alone; ``plain (control)``, a second copy of it, shows
  how far apart two identical variants land in this run (the noise floor);
- ``gradwatch every=1`` / ``every=10``: ``watch(model, server=None, spool=<tmp>)``,
  ``monitor.step(loss)`` after every step (heavy quantities every step / every 10th);
- ``wandb.watch``: ``wandb.watch(model, log="all", log_freq=1)`` in offline mode, with
  ``wandb.log({"loss": ...})`` every step (which is what writes the histograms);
- ``tensorboard``: ``SummaryWriter.add_histogram`` of every gradient every step.

wandb and TensorBoard are measured when installed (``pip install 'gradwatch[bench]'``)
and skipped with a note otherwise.

Run: ``python bench/overhead.py`` (``--rounds``, ``--steps``, ``--device cuda``,
``--only lstm121``; ``--threads`` sets torch's intra-op threads, 1 by default so that
other processes on a small box disturb the run less; ``--clock cpu`` times this
process's CPU time instead of the wall clock, steadier on a loaded box but blind to
wandb's separate service process; ``--no-others`` leaves wandb and TensorBoard out;
``--budget 0.03 ...`` adds ``watch(..., overhead=F)`` variants and notes the interval
each budget ended at and the heavy/light cost it estimated).

Before/after in one run (``--baseline DIR``): an older gradwatch, imported under the
package name ``gwbase``, adds ``gradwatch (baseline) every=N`` variants beside the
current ones, so both see the same box in the same rounds. Make ``DIR`` with::

    mkdir -p DIR/gwbase && touch DIR/gwbase/__init__.py
    git archive <commit> trainer_hooks protocol | tar -x -C DIR/gwbase
    grep -rl 'gradwatch\.' DIR/gwbase \
        | xargs sed -i 's/gradwatch\.\(protocol\|trainer_hooks\)/gwbase.\1/g'
"""

from __future__ import annotations

import argparse
import copy
import importlib
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

from gradwatch.trainer_hooks import watch

Step = Callable[[], torch.Tensor]


class Lstm121(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(1, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(out)


class CellDecoder(nn.Module):
    def __init__(self, hidden: int, tokens: int) -> None:
        super().__init__()
        self.embed = nn.Linear(8, hidden)
        self.cell = nn.LSTMCell(hidden, hidden)
        self.head = nn.Linear(hidden, 8)
        self.tokens = tokens

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = c = x.new_zeros(x.shape[1], self.cell.hidden_size)
        outs = []
        for t in range(self.tokens):
            h, c = self.cell(self.embed(x[t]), (h, c))
            outs.append(self.head(h))
        return torch.stack(outs)


class Gpt(nn.Module):
    def __init__(self, width: int = 64, layers: int = 4) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device)
        return self.head(self.encoder(x, mask=mask, is_causal=True))


def workload(name: str, device: torch.device) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    if name == "gpt":
        torch.manual_seed(0)
        model: nn.Module = Gpt()
        x = torch.randn(16, 32, 64, generator=gen)
        y = torch.randn(16, 32, 64, generator=gen)
    elif name == "lstm121":
        torch.manual_seed(0)
        model = Lstm121(hidden=64)
        x = torch.randn(121, 121, 1, generator=gen)
        y = torch.randn(121, 121, 1, generator=gen)
    else:
        torch.manual_seed(0)
        model = CellDecoder(hidden=128, tokens=24)
        x = torch.randn(24, 32, 8, generator=gen)
        y = torch.randn(24, 32, 8, generator=gen)
    return model.to(device), x.to(device), y.to(device)


def make_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Step:
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.MSELoss()

    def step() -> torch.Tensor:
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    return step


class Variant:
    """One way of training: ``run(n)`` does n steps; setup outside the timed blocks."""

    def __init__(
        self,
        name: str,
        step: Step,
        after: Callable[[torch.Tensor, int], None],
        drain: Callable[[], object] = lambda: None,
    ):
        self.name = name
        self.step = step
        self.after = after
        # finishes the variant's own background work inside its timed block, so that
        # it is charged to this variant and not to whichever block runs next
        self.drain = drain
        self.count = 0
        self.times: list[float] = []

    def run(self, steps: int, sync: Callable[[], None], clock: Callable[[], float]) -> float:
        sync()
        started = clock()
        for _ in range(steps):
            loss = self.step()
            self.after(loss, self.count)
            self.count += 1
        self.drain()
        sync()
        return (clock() - started) / steps


def variants(
    name: str, device: torch.device, stack: ExitStack, tmp: Path, notes: list[str],
    others: bool = True, baseline: Callable[..., Any] | None = None,
    budgets: tuple[float, ...] = (),
) -> list[Variant]:
    base, x, y = workload(name, device)
    found: list[Variant] = []

    def copy_model() -> nn.Module:
        return copy.deepcopy(base)

    found.append(Variant("plain", make_step(copy_model(), x, y), lambda loss, i: None))
    # a second plain copy: its ratio is the noise floor of this run
    found.append(Variant("plain (control)", make_step(copy_model(), x, y), lambda loss, i: None))
    # the current gradwatch and, with --baseline, the older one: every=1, every=10, and
    # each budget, all made the same way
    watchers: list[tuple[str, Callable[..., Any]]] = [("", watch)]
    if baseline is not None:
        watchers.append(("(baseline) ", baseline))
    for label, make in watchers:
        settings = [("every", 1), ("every", 10), *(("overhead", b) for b in budgets)]
        for key, value in settings:
            model = copy_model()
            tag = f"{label[1:5]}{key}-{value}"
            monitor = make(
                model, run=f"bench-{name}-{tag}", server=None,
                spool=tmp / f"{name}-{tag}.jsonl", **{key: value},
            )
            stack.callback(monitor.close)
            found.append(
                Variant(f"gradwatch {label}{key}={value:g}", make_step(model, x, y),
                        lambda loss, i, m=monitor: m.step(loss), drain=monitor.flush)
            )
            if key == "overhead" and not label:  # an older schedule may lack estimate()
                stack.callback(_heavy_note, notes, name, value, monitor)
    if not others:
        return found
    try:
        import wandb
    except ImportError:
        notes.append("wandb not installed: skipped (pip install 'gradwatch[bench]')")
    else:
        model = copy_model()
        os.environ["WANDB_MODE"] = "offline"
        os.environ.setdefault("WANDB_SILENT", "true")
        run = wandb.init(project="gradwatch-bench", dir=str(tmp), name=name, reinit=True)
        stack.callback(run.finish)
        run.watch(model, log="all", log_freq=1)
        found.append(
            Variant("wandb.watch log=all", make_step(model, x, y),
                    lambda loss, i, r=run: r.log({"loss": loss.item()}))
        )
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        notes.append("tensorboard not installed: skipped (pip install 'gradwatch[bench]')")
    else:
        model = copy_model()
        writer = SummaryWriter(log_dir=str(tmp / f"tb-{name}"))
        stack.callback(writer.close)

        def histograms(loss: torch.Tensor, i: int, m: nn.Module = model) -> None:
            for pname, p in m.named_parameters():
                if p.grad is not None:
                    writer.add_histogram(pname, p.grad, i)
            writer.add_scalar("loss", loss.item(), i)

        found.append(Variant("tensorboard histograms", make_step(model, x, y), histograms,
                             drain=writer.flush))
    return found


def _heavy_note(notes: list[str], name: str, budget: float, monitor: Any) -> None:
    heavy, light = monitor.schedule.estimate()
    notes.append(
        f"{name}: overhead={budget:g} ended capturing every {monitor.schedule.interval}"
        f" steps (its estimate of a heavy step: {heavy or 0:.1%} of the step, a light"
        f" one {light:.1%})"
    )


def measure(
    name: str, device: torch.device, rounds: int, steps: int, notes: list[str],
    clock: Callable[[], float], others: bool = True,
    baseline: Callable[..., Any] | None = None, budgets: tuple[float, ...] = (),
) -> list[tuple[str, float, float, float]]:
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    with tempfile.TemporaryDirectory() as tmpdir, ExitStack() as stack:
        found = variants(
            name, device, stack, Path(tmpdir), notes, others, baseline, budgets
        )
        for v in found:  # warm-up: allocator, first-call paths, wandb/tb lazy set-up
            v.run(3, sync, clock)
        shuffle = random.Random(0)
        for _ in range(rounds):
            order = list(found)
            shuffle.shuffle(order)  # no variant always follows the same one
            for v in order:
                v.times.append(v.run(steps, sync, clock))
        plain = statistics.median(found[0].times)
        low = min(found[0].times)
        return [(v.name, statistics.median(v.times), statistics.median(v.times) / plain,
                 min(v.times) / low) for v in found]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=10, help="steps per timed block")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", choices=["lstm121", "cells", "gpt"])
    parser.add_argument(
        "--clock", choices=["wall", "cpu"], default="wall",
        help="wall: perf_counter (what a user waits); cpu: this process's CPU time, all "
        "threads (steadier on a loaded box; misses wandb's separate service process)",
    )
    parser.add_argument("--no-others", action="store_true",
                        help="leave wandb and TensorBoard out")
    parser.add_argument("--baseline", metavar="DIR",
                        help="a folder holding an older gradwatch as package gwbase "
                        "(see the module docstring): adds its variants beside the current")
    parser.add_argument("--budget", type=float, nargs="*", default=[], metavar="F",
                        help="also gradwatch with watch(..., overhead=F) for each F")
    args = parser.parse_args(argv)
    baseline = None
    if args.baseline:
        sys.path.insert(0, str(Path(args.baseline).resolve()))
        baseline = importlib.import_module("gwbase.trainer_hooks").watch
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    notes: list[str] = []
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    print(f"torch {torch.__version__}, device {device}, threads {args.threads}, "
          f"clock {args.clock}, {args.rounds} rounds x {args.steps} steps per variant, "
          "medians of block means")
    for name in ([args.only] if args.only else ["lstm121", "cells"]):
        rows = measure(name, device, args.rounds, args.steps, notes, clock,
                       not args.no_others, baseline, tuple(args.budget))
        print(f"\n{name}")
        print(f"| {'variant':<30} | {'step (ms)':>9} | {'vs plain':>8} | {'min vs min':>10} |")
        print(f"|{'-' * 32}|{'-' * 11}|{'-' * 10}|{'-' * 12}|")
        for vname, seconds, ratio, low in rows:
            print(f"| {vname:<30} | {seconds * 1e3:9.3f} | {ratio:7.3f}x | {low:9.3f}x |")
    for note in dict.fromkeys(notes):
        print(f"note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
