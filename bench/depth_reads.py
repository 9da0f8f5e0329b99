"""Reading a model's update-to-weight ratios per block (``GET /api/runs/{id}/update_ratios``).

A real SQLite store (in this process) holds a run of --blocks blocks of 8 parameters
each (plus 2 outside the stack) whose every --every-th of --steps step records carries
``update_ratios`` and ``depth``, sent in batches of 1,000 records as a trainer sends
them: every heavy record is a chunk of its own (its shape differs from the light steps
around it). Two ways to sum the ratios up per block for 500 steps, interleaved
(A, B, A, B, ...) --repeats times, their answers checked equal:

- A: ``field_points`` of every parameter (the way ``/steps`` reads named fields: the
  chunks once, each field's points apart), then the blocks' maxima in Python;
- B: ``server/depth_reads.update_ratio_blocks``: every chunk read once
  (store/chunk_reads.py, named_matrix), the maxima in numpy.

Also the depth matrix of the stack (``/depth``, 500 rows). Prints the medians and
the ratio, with the load average.

Run: .venv/bin/python bench/depth_reads.py [--blocks 48] [--steps 20000] [--every 10]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from typing import Any

from gradwatch.protocol.codec import protocol_number
from gradwatch.protocol.messages import NONFINITE_STRINGS
from gradwatch.server.depth_reads import block_of, block_ratio, depth_matrix, update_ratio_blocks
from gradwatch.server.downsample import pick_rows
from gradwatch.server.schema import parse_message
from gradwatch.server.settings import Settings
from gradwatch.server.store import open_store

PARTS = ("a.w", "a.b", "b.w", "b.b", "c.w", "c.b", "n.w", "n.b")


def fill(store: Any, run: str, blocks: int, steps: int, every: int) -> list[str]:
    names = [f"blocks.{i}" for i in range(blocks)]
    hello = {"type": "hello", "protocol": 1, "run_id": run,
             "config": {"depth": ["blocks"], "depth_blocks": {"blocks": names}}}
    store.submit_hello(parse_message(json.dumps(hello))).result()
    params = [f"{b}.{p}" for b in names for p in PARTS] + ["head.w", "emb.w"]
    rng = random.Random(0)
    records: list[dict[str, Any]] = []
    seq = 0
    for step in range(steps):
        record: dict[str, Any] = {"kind": "step", "step": step, "loss": 1.0}
        if step % every == 0:
            record["update_ratios"] = {p: rng.random() * 1e-3 for p in params}
            record["depth"] = {"blocks": [rng.random() for _ in names]}
        records.append(record)
        if len(records) == 1000 or step == steps - 1:
            batch = {"type": "batch", "run_id": run, "rank": 0, "seq": seq, "records": records}
            store.submit_batch(parse_message(json.dumps(batch)), "").result()
            seq, records = seq + 1, []
    return names


def field_by_field(store: Any, run: str, known: list[str], max_steps: int) -> dict[str, Any]:
    """A: field_points of every parameter, then each block's maxima in Python."""
    params = store.run_detail(run)["update_ratio_parameters"]
    names = [f"update_ratios/{param}" for param in params]
    points = store.field_points(run, 0, names, 0, 2**62)
    by_block: dict[str, list[tuple[list[int], list[Any]]]] = {}
    every: set[int] = set()
    for param, name in zip(params, names, strict=True):
        steps, values = points.get(name, ([], []))
        by_block.setdefault(block_of(param, known), []).append((steps, values))
        every.update(steps)
    ordered = sorted(every)
    chosen = [ordered[i] for i in pick_rows(len(ordered), max_steps)]
    at = {step: i for i, step in enumerate(chosen)}
    out = {}
    for block, members in by_block.items():
        gathered: list[list[float]] = [[] for _ in chosen]
        for steps, values in members:
            for step, value in zip(steps, values, strict=True):
                i = at.get(step)
                if i is not None:
                    number = NONFINITE_STRINGS[value] if isinstance(value, str) else float(value)
                    gathered[i].append(number)
        out[block] = [protocol_number(block_ratio(v)) if v else None for v in gathered]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=48)
    p.add_argument("--steps", type=int, default=20_000)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    folder = tempfile.mkdtemp(prefix="gw-depth-reads-")
    store = open_store(Settings(db=os.path.join(folder, "bench.db")))
    try:
        known = fill(store, "bench", args.blocks, args.steps, args.every)
        times: dict[str, list[float]] = {"A": [], "B": [], "depth": []}
        for _ in range(args.repeats):
            started = time.perf_counter()
            a = field_by_field(store, "bench", known, 500)
            times["A"].append(time.perf_counter() - started)
            started = time.perf_counter()
            b = update_ratio_blocks(store, "bench", max_steps=500)
            times["B"].append(time.perf_counter() - started)
            assert {x["name"]: x["values"] for x in b["blocks"]} == a, "A and B disagree"
            started = time.perf_counter()
            depth_matrix(store, "bench", "blocks", max_steps=500)
            times["depth"].append(time.perf_counter() - started)
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        params = args.blocks * len(PARTS) + 2
        print(f"{params} parameters in {args.blocks + 2} blocks, {args.steps // args.every:,} heavy"
              f" steps of {args.steps:,}, 500 steps answered, median of {args.repeats}"
              f" (load average {os.getloadavg()[0]:.2f})")
        print(f"| A: field_points of every parameter | {med['A']:.0f} ms |")
        print(f"| B: update_ratio_blocks (named_matrix) | {med['B']:.0f} ms |")
        print(f"| A / B | {med['A'] / med['B']:.1f}x |")
        print(f"| /depth matrix of the stack | {med['depth']:.0f} ms |")
    finally:
        store.close()


if __name__ == "__main__":
    main()
