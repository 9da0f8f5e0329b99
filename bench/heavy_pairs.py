"""Whether ``watch(model)``'s records charge its heavy steps what they cost.

One model, one process, the default budget: a heavy step's capture lengthens that step
and the one after it (the outputs it kept are freed when the next step starts). From
the records themselves: each heavy step plus the step after it, beyond two clean light
steps (medians of light steps at least three steps after a heavy one), by their
``duration_s`` (the wall clock) against what their ``overhead`` charged beyond two
clean light steps' charge. The first ``--skip`` records (the budget learning) are left
out.

    .venv/bin/python bench/heavy_pairs.py --only seq2seq_attention --steps 700
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workloads  # the workloads (bench/workloads.py)

from gradwatch.protocol import read_spool
from gradwatch.trainer_hooks import watch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="seq2seq_attention", choices=workloads.WORKLOADS)
    parser.add_argument("--steps", type=int, default=700)
    parser.add_argument("--skip", type=int, default=100)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    work = workloads.workload(args.only)
    step = work.make_step(work.model)
    for _ in range(20):  # allocator, first calls
        step()
    with tempfile.TemporaryDirectory() as tmp:
        spool = Path(tmp) / "run.jsonl"
        monitor = watch(work.model, spool=spool, quiet=True, **work.options)
        for _ in range(args.steps):
            monitor.step(step())
        schedule = monitor.schedule
        print(f"{args.only}: interval {schedule.interval}, a heavy step's extra as the "
              f"budget sees it {schedule.heavy_extra_s() * 1e3:.2f} ms "
              f"(of which unseen by timers {schedule.hidden_s() * 1e3:.2f} ms)")
        monitor.close()
        records = [r for m in read_spool(spool) if m["type"] == "batch"
                   for r in m["records"] if r["kind"] == "step"][args.skip:]
    heavy = {r["step"] for r in records if "param_norms" in r}
    by_step = {r["step"]: r for r in records}
    clean = [r for r in records if not heavy & {r["step"], r["step"] - 1, r["step"] - 2}]
    base = statistics.median(r["duration_s"] for r in clean)
    base_charged = statistics.median(r["overhead"] * r["duration_s"] for r in clean)
    extra, charged = [], []
    for h in sorted(heavy):
        if h in by_step and h + 1 in by_step:
            pair = (by_step[h], by_step[h + 1])
            extra.append(sum(r["duration_s"] for r in pair) - 2 * base)
            charged.append(sum(r["overhead"] * r["duration_s"] for r in pair) - 2 * base_charged)
    print(f"clean light step {base * 1e3:.2f} ms, charged {base_charged * 1e6:.0f} µs "
          f"({base_charged / base:.2%})")
    print(f"{len(extra)} heavy pairs beyond two clean light steps: took "
          f"{statistics.median(extra) * 1e3:.2f} ms (median; mean "
          f"{statistics.fmean(extra) * 1e3:.2f}), charged {statistics.median(charged) * 1e3:.2f}"
          f" ms (mean {statistics.fmean(charged) * 1e3:.2f})")
    total = sum(r["duration_s"] for r in records)
    spent = sum(r["overhead"] * r["duration_s"] for r in records)
    print(f"reported over the run {spent / total:.2%}; heavy steps {len(heavy) / len(records):.0%}")


if __name__ == "__main__":
    main()
