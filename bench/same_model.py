"""What `watch()` costs one model, measured against that same model unwatched.

bench/overhead.py compares copies of a model, each in a thread of its own; on a noisy
machine two plain copies differ by a few percent however many rounds run (their
memory, their optimizer state). Here plain and watched blocks take turns on ONE model
instance in one thread: each watched block attaches a fresh ``watch()``, trains
``--warm`` untimed steps (past the stale-state checks of a monitor's first steps and
the graph walk's first pacing), times ``--steps`` steps and removes it, which leaves the
model as it was. Process CPU per step (training and background threads), the training
thread's own CPU, the monitor's background thread, and the overhead gradwatch reported
for the timed steps (``overhead x duration_s`` summed over their duration). ``--self``
adds a plain arm against itself: the noise floor of this method on this machine.

Arms: ``every=1``, ``every=N``, ``light`` (every step light after the first),
``parked`` (the same light steps with the monitor's background thread held until the
block has been timed: what the training thread's side of a light step costs alone,
as if the background work ran in another process; its records are finished after
the block, so it reports no overhead), ``unhooked`` (the same light steps after
``monitor.remove()``: only ``step()``'s record and the background thread, no hook on
the model), ``bare`` (no monitor: a ``step()`` that keeps the time and the loss and
nothing else, the floor of any per-step record), ``hooked`` (a light monitor's hooks
on the model, its steps closed by that bare ``step()`` instead: what the hooks alone
cost; they stay as its last ``step()`` left them, which on a light step is usually no
hook at all, so on most models this arm times an idle monitor beside the model) and
``default`` (``watch(model)`` with no options: the budget). ``--wall``
times the blocks by the wall clock instead of process CPU (what training waits for;
the background thread's CPU then counts only where it holds training up). The
budget learns its interval over its first steps, so ``default`` warms up
``--default-warm`` steps, and its timed blocks should hold several heavy steps
(``--steps 200``). Monitors here write spool files, which nobody watches live, so their
records are handed over at the quiet pace (every 0.5 s, trainer_hooks/pipeline.py); an
arm with ``-live`` after its name (``light-live``, ``default-live``) is paced as a run
someone watches is (every 50 ms). Each block ends with a flush, timed: whatever the
background thread has not done yet is done inside the block.

    .venv/bin/python bench/same_model.py --only cells --every 1 --rounds 20 --self
    .venv/bin/python bench/same_model.py --only long_lstm --every light parked --self \
        --rounds 30 --processes 5   # medians and ranges over five fresh processes
    .venv/bin/python bench/same_model.py --only long_lstm --every default --steps 200 --self
    .venv/bin/python bench/same_model.py --only long_lstm --every light unhooked parked \
        --self --wall --rounds 40 --steps 64   # where a light step's cost goes
    .venv/bin/python bench/same_model.py --only long_lstm --every bare hooked parked light \
        --self --wall --rounds 40 --steps 64 --processes 2   # hooks or step()?
    .venv/bin/python bench/same_model.py --only long_lstm --every light light-live default \
        default-live --self --wall --rounds 20 --steps 640 --processes 2   # watched or not
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workloads  # the workloads (bench/workloads.py)

from gradwatch.protocol import read_spool
from gradwatch.trainer_hooks import watch

LIGHT = 10**9  # every step light after step 0


def block(
    step: Any, steps: int, monitor: Any = None, flush: bool = True, wall: bool = False
) -> tuple[float, float, float]:
    """Process CPU (wall time with ``wall``), training-thread CPU and background-thread
    CPU per step."""
    pipeline = getattr(monitor, "_pipeline", None)
    thread = pipeline._thread if pipeline is not None else None
    clock = time.pthread_getcpuclockid(thread.ident) if thread is not None else None
    background = time.clock_gettime(clock) if clock is not None else 0.0
    total = time.perf_counter if wall else time.process_time
    process, own = total(), time.thread_time()
    workloads.train(step, monitor, steps, flush=flush)
    process, own = total() - process, time.thread_time() - own
    background = time.clock_gettime(clock) - background if clock is not None else 0.0
    return process / steps, own / steps, background / steps


def park(monitor: Any) -> threading.Event:
    """Hold ``monitor``'s background thread at its next wait until the returned event
    is set (the ``parked`` arm). Its queue is empty when this returns."""
    monitor.flush()
    pipeline, gate, holding = monitor._pipeline, threading.Event(), threading.Event()
    wait = pipeline._wait

    def held() -> None:
        holding.set()
        gate.wait()
        wait()

    pipeline._wait = held
    pipeline._wake.set()  # out of the wait it is in, into held()
    holding.wait()
    return gate


class Bare:
    """The ``bare`` arm's stand-in for a monitor: ``step()`` keeps the time and the
    loss and nothing else, with no hook and no thread: the floor of any per-step
    record."""

    def __init__(self) -> None:
        self.kept: list[tuple[float, Any]] = []

    def step(self, loss: Any) -> None:
        self.kept.append((time.perf_counter(), loss.detach()))

    def flush(self) -> None:
        self.kept.clear()


def reported(spool: str, first: int, steps: int) -> float:
    """The overhead gradwatch reported over steps ``first``.. of its spool."""
    records = [r for m in read_spool(spool) if m["type"] == "batch" for r in m["records"]
               if r["kind"] == "step" and first <= r["step"] < first + steps]
    spent = sum(r["overhead"] * r["duration_s"] for r in records)
    return spent / sum(r["duration_s"] for r in records)


def measure(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """One process's medians per arm: process, training-thread and background CPU per
    step (seconds) and the overhead reported (a fraction, NaN where none)."""
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    work = workloads.workload(args.only)
    model = copy.deepcopy(work.model)
    step = work.make_step(model)
    wall = args.wall
    block(step, 30)
    arms = ["plain", *(["plain again"] if args.self else []), *args.every]
    found: dict[str, list[tuple[float, float, float]]] = {arm: [] for arm in arms}
    said: dict[str, list[float]] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for arm in arms if r % 2 == 0 else arms[::-1]:  # drift falls on both sides
                if arm.startswith("plain"):
                    found[arm].append(block(step, args.steps, wall=wall))
                    continue
                if arm == "bare":
                    found[arm].append(block(step, args.steps, Bare(), wall=wall))
                    continue
                kind, live = arm.removesuffix("-live"), arm.endswith("-live")
                schedule = {} if kind == "default" else {
                    "every": LIGHT if kind in ("light", "parked", "unhooked", "hooked")
                    else int(kind)}
                warm = args.default_warm if kind == "default" else args.warm
                spool = os.path.join(tmp, f"{arm}-{r}.jsonl")
                monitor = watch(model, run=arm, spool=spool, quiet=True, **schedule,
                                **work.options)
                if live:  # paced as while a viewer watches the run (pipeline.py)
                    monitor._pipeline.sink.viewed = True
                block(step, warm, monitor)
                if arm == "hooked":  # its hooks on the model, its steps never closed
                    found[arm].append(block(step, args.steps, Bare(), wall=wall))
                    monitor.close()
                    continue
                if arm == "unhooked":
                    monitor.remove()  # steps still record: step() and the background
                if arm == "parked":
                    gate = park(monitor)
                    found[arm].append(block(step, args.steps, monitor, flush=False, wall=wall))
                    gate.set()
                    monitor.close()
                    continue
                found[arm].append(block(step, args.steps, monitor, wall=wall))
                monitor.close()
                said[arm].append(reported(spool, warm, args.steps))
    medians = {}
    for arm, rows in found.items():
        process, own, background = (statistics.median(x[i] for x in rows) for i in range(3))
        told = statistics.median(said[arm]) if said[arm] else math.nan
        medians[arm] = {"process": process, "own": own, "background": background,
                        "reported": told}
    return medians


def in_processes(args: argparse.Namespace) -> list[dict[str, dict[str, float]]]:
    """``measure`` in ``args.processes`` fresh processes, one after another: two
    copies of one process differ by a few percent however many rounds run (where
    their memory landed), so the spread between processes is the honest error bar."""
    given, kept = sys.argv[1:], []
    while given:  # this command line less --processes N
        word = given.pop(0)
        if word == "--processes":
            given.pop(0)
        elif not word.startswith("--processes="):
            kept.append(word)
    command = [sys.executable, __file__, *kept, "--json"]
    runs = []
    for _ in range(args.processes):
        done = subprocess.run(command, capture_output=True, text=True, check=True,
                              timeout=3600)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="cells", choices=workloads.WORKLOADS)
    parser.add_argument("--every", nargs="*", default=["1", "light"],
                        help="schedules to measure: an interval, 'light', 'parked', 'unhooked', "
                        "'bare', 'hooked' or 'default'; '-live' after one of them: handed "
                        "over at the pace of a watched run")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=32, help="timed steps a block")
    parser.add_argument("--warm", type=int, default=70, help="untimed steps after watch()")
    parser.add_argument("--default-warm", type=int, default=300,
                        help="untimed steps after watch() for the default budget")
    parser.add_argument("--self", action="store_true", help="add plain against itself")
    parser.add_argument("--wall", action="store_true",
                        help="time blocks by the wall clock, not process CPU")
    parser.add_argument("--processes", type=int, default=1,
                        help="run it in this many fresh processes: medians and ranges")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.json:
        print(json.dumps(measure(args)))
        return
    runs = [measure(args)] if args.processes <= 1 else in_processes(args)
    print(f"{args.only}, {len(runs)} process(es) x {args.rounds} rounds x {args.steps} steps"
          f" after {args.warm} warm-up steps ({args.default_warm} for the default), 1 torch"
          f" thread; load average {os.getloadavg()[0]:.1f}")
    print(f"| arm | {'wall time' if args.wall else 'process CPU'} per step | vs plain (range) |"
          " measured share | reported overhead |"
          " training thread, beyond plain | background thread |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for arm in runs[0]:
        ratios = [run[arm]["process"] / run["plain"]["process"] for run in runs]
        ratio = statistics.median(ratios)
        spread = f" ({min(ratios):.3f}-{max(ratios):.3f})" if len(runs) > 1 else ""
        process = statistics.median(run[arm]["process"] for run in runs)
        own = statistics.median(run[arm]["own"] - run["plain"]["own"] for run in runs)
        background = statistics.median(run[arm]["background"] for run in runs)
        told = [run[arm]["reported"] for run in runs if not math.isnan(run[arm]["reported"])]
        said = f"{statistics.median(told):.1%}" if told else ""
        print(f"| {arm} | {process * 1e3:.3f} ms | {ratio:.3f}x{spread} |"
              f" {1 - 1 / ratio:+.1%} | {said} | {own * 1e6:+.0f} µs |"
              f" {background * 1e6:.0f} µs |")


if __name__ == "__main__":
    main()
