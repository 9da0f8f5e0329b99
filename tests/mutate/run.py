"""`make mutate`: cosmic-ray over the modules whose mutants the suite once missed.

Each module is mutated in place (cosmic-ray applies one mutation to the file, runs the
module's tests, restores it), one module at a time, with only the tests that exercise
it. Slow (minutes per module on two cores), so it is never part of `make test` or CI.

    .venv/bin/python tests/mutate/run.py                     # every module below
    .venv/bin/python tests/mutate/run.py vanishing security  # the ones whose name matches

It refuses a module with uncommitted changes (a mutation left behind by a killed run
would otherwise be indistinguishable from an edit) and restores every module from git
when it ends, however it ends. It writes build/mutate/<module>.sqlite (the session)
and build/mutate/summary.md (score and surviving mutants); docs/TESTING.md quotes the
last summary. The two JavaScript modules of the issue (client/js/heatmap.js,
client/js/alerts.js) are outside a Python mutation tool; their hand-applied mutants are
listed in docs/TESTING.md.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "build" / "mutate"
BIN = Path(sys.executable).parent

# module -> the tests that exercise it (quick ones: each mutant runs them once)
MODULES: dict[str, list[str]] = {
    "trainer_hooks/quantities/params.py": [
        "tests/trainer_hooks/test_params_norms.py",
        "tests/trainer_hooks/test_params_scaler.py",
    ],
    "trainer_hooks/diagnoses/vanishing.py": [
        "tests/trainer_hooks/test_diagnoses_vanishing.py",
        "tests/trainer_hooks/test_diagnoses_mutants.py",
    ],
    "trainer_hooks/diagnoses/graph_growth.py": [
        "tests/trainer_hooks/test_diagnoses_growth.py",
        "tests/trainer_hooks/test_graph_growth.py",
        "tests/trainer_hooks/test_diagnoses_mutants.py",
    ],
    "server/security.py": [
        "tests/server/test_security.py",
        "tests/server/test_security_variants.py",
    ],
    "server/store/base.py": [
        "tests/server/test_dedup_ranks.py",
        "tests/server/test_delivery.py",
    ],
}

CONFIG = """[cosmic-ray]
module-path = "{module}"
timeout = {timeout}
excluded-modules = []
test-command = "{python} -m pytest -x -q -p no:cacheprovider {tests}"

[cosmic-ray.distributor]
name = "local"
"""


def run(*cmd: str) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` in its own process group; stopped, group and all, if we are."""
    child = subprocess.Popen(cmd, cwd=ROOT, text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
    try:
        out, err = child.communicate()
    except BaseException:
        # Interrupted (Ctrl-C, SIGTERM): no cosmic-ray worker may go on mutating files
        # after main() has restored them.
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        raise
    return subprocess.CompletedProcess(cmd, child.returncode, out, err)


def dirty(module: str) -> bool:
    return run("git", "diff", "--quiet", "HEAD", "--", module).returncode != 0


def results(session: Path) -> list[dict[str, object]]:
    """One entry per mutant: file, line, operator, occurrence, outcome."""
    dump = run(str(BIN / "cosmic-ray"), "dump", str(session))
    out = []
    for line in dump.stdout.splitlines():
        work, result = json.loads(line)
        mutation = work["mutations"][0]
        out.append({
            "line": mutation["start_pos"][0],
            "operator": mutation["operator_name"].removeprefix("core/"),
            "occurrence": mutation["occurrence"],
            "outcome": (result or {}).get("test_outcome"),
            "worker": (result or {}).get("worker_outcome"),
        })  # fmt: skip
    return out


def mutate(module: str, tests: list[str]) -> dict[str, object]:
    stem = module.replace("/", "_").removesuffix(".py")
    config, session = OUT / f"{stem}.toml", OUT / f"{stem}.sqlite"
    # The tests' own time on this machine, times 4, bounds each mutant (a mutant that
    # loops forever counts as killed by the timeout).
    started = time.monotonic()
    base = run(str(BIN / "python"), "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests)
    if base.returncode != 0:
        raise SystemExit(f"{module}: its tests fail without a mutant:\n{base.stdout[-2000:]}")
    timeout = max(30.0, 4 * (time.monotonic() - started))
    config.write_text(CONFIG.format(module=module, timeout=round(timeout), python=BIN / "python",
                                    tests=" ".join(tests)))  # fmt: skip
    session.unlink(missing_ok=True)
    for cmd in (("init", str(config), str(session)), ("exec", str(config), str(session))):
        done = run(str(BIN / "cosmic-ray"), *cmd)
        if done.returncode != 0:
            raise SystemExit(f"cosmic-ray {cmd[0]} failed for {module}:\n{done.stderr[-2000:]}")
    found = results(session)
    killed = [r for r in found if r["outcome"] == "killed"]
    survived = [r for r in found if r["outcome"] == "survived"]
    return {"module": module, "tests": tests, "mutants": len(found), "killed": len(killed),
            "survived": survived, "seconds": round(time.monotonic() - started)}  # fmt: skip


def main(argv: list[str]) -> int:
    # SIGTERM (timeout, a closed terminal) unwinds like Ctrl-C, so `finally` restores.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    chosen = [m for m in MODULES if not argv or any(a in m for a in argv)]
    if not chosen:
        raise SystemExit(f"expected module names among {sorted(MODULES)}, got {argv}")
    if busy := [m for m in chosen if dirty(m)]:
        raise SystemExit(f"expected committed modules (they are mutated in place), got "
                         f"uncommitted changes in {busy}")  # fmt: skip
    OUT.mkdir(parents=True, exist_ok=True)
    lines = ["| module | mutants | killed | survived | score | time (s) |", "|---" * 6 + "|"]
    details = []
    try:
        for module in chosen:
            print(f"mutating {module} ...", flush=True)
            r = mutate(module, MODULES[module])
            score = 100.0 * int(r["killed"]) / max(1, int(r["mutants"]))  # type: ignore[call-overload]
            survived = r["survived"]
            assert isinstance(survived, list)
            lines.append(f"| {module} | {r['mutants']} | {r['killed']} | {len(survived)} | "
                         f"{score:.0f}% | {r['seconds']} |")  # fmt: skip
            print(lines[-1], flush=True)
            for s in survived:
                where = f"{module}:{s['line']}"
                details.append(f"- {where} {s['operator']} (occurrence {s['occurrence']})")
    finally:
        # Whatever happened (an interrupt mid-mutant included), no mutant stays behind.
        run("git", "checkout", "HEAD", "--", *chosen)
    summary = "\n".join([*lines, "", "Surviving mutants:", *(details or ["- none"])]) + "\n"
    (OUT / "summary.md").write_text(summary)
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
