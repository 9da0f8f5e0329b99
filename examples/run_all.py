"""Run every example scenario, the bug and its fixed twin, one after the other.

Used by the compose demo service (``examples/Dockerfile``) and handy for a quick
look: ``python examples/run_all.py --server ws://127.0.0.1:8765`` streams ten runs
(``long_lstm``, ``long_lstm-fixed``, ...) into a server; with ``--spool-dir DIR``
each run is written to ``DIR/<run>.jsonl`` instead. ``--repeat 0`` keeps going round
until stopped (the compose demo), each round under new run ids.

Each run is its own process (a fresh interpreter, as ``gradwatch demo`` starts
them), so one run's leftovers (a bug variant's graph of hundreds of steps) cannot
slow the next one down. A run that fails is reported and the others still run; the
exit code says whether all of them ran.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: (module, steps by default): small enough that all ten runs take about a minute on a CPU
SCENARIOS: tuple[tuple[str, int], ...] = (
    ("long_lstm", 60),
    ("rotation_lstm", 40),
    ("tree_gru", 40),
    ("seq2seq_attention", 30),
    ("tiny_gpt", 90),  # the padded batch comes at step 80
)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="run_all.py", description=__doc__.splitlines()[0])
    p.add_argument("--server", default=os.environ.get("GRADWATCH_SERVER"))
    p.add_argument("--token", default=os.environ.get("GRADWATCH_TOKEN"))
    p.add_argument("--spool-dir", default=None, help="write DIR/<run>.jsonl (no server)")
    p.add_argument("--steps", type=int, default=None, help="steps per run (default: per scenario)")
    p.add_argument("--only", action="append", choices=[s for s, _ in SCENARIOS])
    p.add_argument("--repeat", type=int, default=1, help="rounds; 0 = until stopped")
    args = p.parse_args(argv)
    if args.server is None and args.spool_dir is None:
        args.spool_dir = str(Path(".gradwatch") / "examples")
    return args


def commands(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    out = []
    for name, steps in SCENARIOS:
        if args.only and name not in args.only:
            continue
        for fixed in (False, True):
            run = name + ("-fixed" if fixed else "")
            argv = ["--steps", str(args.steps or steps), "--run", run, "--quiet"]
            if args.server:
                argv += ["--server", args.server]
                if args.spool_dir:
                    argv += ["--spool", str(Path(args.spool_dir) / f"{run}.jsonl")]
            else:
                argv += ["--spool", str(Path(args.spool_dir) / f"{run}.jsonl")]
            if args.token:
                argv += ["--token", args.token]
            if fixed:
                argv.append("--fixed")
            out.append((name, argv))
    return out


def main(argv: Sequence[str] | None = None) -> list[tuple[str, int]]:
    """Run every scenario and twin; returns (run name, exit code) for each run."""
    args = parse(argv)
    results: list[tuple[str, int]] = []
    round_ = 0
    while args.repeat == 0 or round_ < args.repeat:
        round_ += 1
        for name, scenario_argv in commands(args):
            run = scenario_argv[scenario_argv.index("--run") + 1]
            command = [sys.executable, str(HERE / f"{name}.py"), *scenario_argv]
            code = subprocess.run(command, check=False).returncode
            results.append((run, code))
    failed = [run for run, code in results if code != 0]
    if failed:
        print(f"run_all: {len(failed)} run(s) failed: {', '.join(failed)}", file=sys.stderr)
        raise SystemExit(1)
    return results


if __name__ == "__main__":
    main()
