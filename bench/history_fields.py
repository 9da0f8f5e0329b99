"""`/steps` over many fields at once, as the run view asks: CPU ms per answer.

In-process SQLite store: 30,000 step records, each with loss, total_norm, graph_nodes
and 100 parameter norms, a profiled module every third step; then `store.steps` for
105 fields in several shapes (a raw range, fine and coarse buckets, a window cut
mid-bucket, the default fields), best of 5 each, process CPU time. With ``--old
ROOT`` (an import root of an older tree, as bench/ingest_ab.py makes) the two trees
run in alternating rounds and the answers are compared.

Run: ``python bench/history_fields.py [--old /tmp/oldgw] [--rounds 3]``
(BENCHMARKS.md, "History: 105 fields at once").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROUND = r'''
import hashlib, json, os, random, tempfile, time
from gradwatch.server.schema import parse_message
from gradwatch.server.settings import Settings
from gradwatch.server.store import open_store

folder = tempfile.mkdtemp(prefix="gw-history-")
store = open_store(Settings(db=os.path.join(folder, "h.db"), writer_process=False))
hello = {"type": "hello", "protocol": 1, "run_id": "h"}
store.submit_hello(parse_message(json.dumps(hello))).result()
rng = random.Random(1)
for seq, at in enumerate(range(0, 30000, 1000)):
    records = []
    for s in range(at, at + 1000):
        r = {"kind": "step", "step": s, "loss": rng.random(), "total_norm": rng.random(),
             "graph_nodes": s % 97, "param_norms": {f"p{j}": rng.random() for j in range(100)}}
        if s % 3 == 0:
            r["profile"] = {"m": {"forward_s": rng.random(), "calls": 3}}
        records.append(r)
    batch = {"type": "batch", "run_id": "h", "rank": 0, "seq": seq, "records": records}
    store.submit_batch(parse_message(json.dumps(batch)), "").result()
fields = ["loss", "total_norm", "graph_nodes", "profile/m/calls", "profile/m/forward_s"]
fields += [f"param_norms/p{j}" for j in range(100)]
cases = {
    "raw 1,500 steps": dict(start=1000, stop=2499, max_points=2000),
    "16,000 steps, buckets of 8": dict(start=0, stop=15999, max_points=4000),
    "30,000 steps, 400 points": dict(max_points=400),
    "123..27,777, 300 points": dict(start=123, stop=27777, max_points=300),
    "default fields, 30,000": dict(),
}
out = {}
for name, options in cases.items():
    times = []
    for _ in range(5):
        started = time.process_time()
        answer = store.steps("h", fields=None if name.startswith("default") else fields,
                             **options)
        times.append((time.process_time() - started) * 1e3)
    digest = hashlib.sha256(json.dumps(answer, sort_keys=True).encode()).hexdigest()
    out[name] = (min(times), digest)
store.close()
print(json.dumps(out))
'''


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", default=None, help="import root of an older tree")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    trees = ["new"] if args.old is None else ["old", "new"]
    found: dict[str, list[dict[str, list[object]]]] = {tree: [] for tree in trees}
    for r in range(args.rounds):
        for tree in trees if r % 2 == 0 else trees[::-1]:
            env = dict(os.environ)
            if tree == "old":
                env["PYTHONPATH"] = args.old
            done = subprocess.run([sys.executable, "-c", ROUND], env=env, capture_output=True,
                                  text=True, check=False)
            if done.returncode:
                print(done.stderr)
                return 1
            found[tree].append(json.loads(done.stdout))
    print(f"load average {os.getloadavg()[0]:.1f}; CPU ms, best of 5 per round")
    for case in found["new"][0]:
        cells = []
        for tree in trees:
            cells.append(f"{tree} " + ", ".join(f"{r[case][0]:.0f}" for r in found[tree]))
        digests = {r[case][1] for runs in found.values() for r in runs}
        same = "" if args.old is None else ("; answers same" if len(digests) == 1 else "; DIFFER")
        print(f"{case}: {'; '.join(cells)}{same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
