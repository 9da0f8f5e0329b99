"""How many steps walk the autograd graph (``graph_nodes``), per workload and schedule.

The graph walk is paced (trainer_hooks/quantities/graph.py): a graph built alike to one
seen lately is walked at doubling gaps. This counts, over ``--steps`` steps of each
workload of bench/workloads.py, the steps that carry ``graph_nodes`` and the heavy steps
(those with ``total_norm``), under ``every=1`` and the default budget.

Run: ``.venv/bin/python bench/graph_walks.py --only buckets cells`` (BENCHMARKS.md,
"Bucketed lengths").
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workloads  # the workloads (bench/workloads.py)

from gradwatch.protocol import read_spool
from gradwatch.protocol.columns import batch_records
from gradwatch.trainer_hooks import watch


def walks(name: str, steps: int, options: dict[str, int]) -> tuple[int, int]:
    """(steps walked, heavy steps) of ``steps`` steps of workload ``name``."""
    work = workloads.workload(name)
    step = work.make_step(work.model)
    with tempfile.TemporaryDirectory() as tmp:
        spool = os.path.join(tmp, "run.jsonl")
        with watch(work.model, run=name, spool=spool, quiet=True, diagnose=False,
                   **options, **work.options) as monitor:
            workloads.train(step, monitor, steps, flush=False)
        records = [r for m in read_spool(spool) if m["type"] == "batch"
                   for r in batch_records(m) if r["kind"] == "step"]
    walked = sum(1 for r in records if "graph_nodes" in r)
    return walked, sum(1 for r in records if "total_norm" in r)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", default=["buckets", "cells"])
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    print(f"| workload | schedule | steps walked of {args.steps} | heavy steps |")
    print("| --- | --- | ---: | ---: |")
    for name in args.only:
        for label, options in (("every=1", {"every": 1}), ("default", {})):
            walked, heavy = walks(name, args.steps, options)
            print(f"| {name} | {label} | {walked} | {heavy} |")


if __name__ == "__main__":
    main()
