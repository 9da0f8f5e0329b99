"""The agreed schedule (trainer_hooks/agreed.py) on two real gloo ranks started by the
real ``torchrun``: ranks whose budgets allow different intervals take the same heavy
steps, at the larger interval (MAX: every rank stays within its budget), and an
interval below 3 keeps the agreed probe steps light on every rank; a rank that stops
taking part costs the others one bounded wait and a warning."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from .conftest import Torchrun

WORKER = textwrap.dedent(
    """
    import json, os, sys, warnings
    import torch.distributed as dist
    from gradwatch.trainer_hooks.agreed import AgreedSchedule

    dist.init_process_group("gloo")
    rank = dist.get_rank()

    def run(heavy_span, stop=None, wait_s=None):
        # A heavy step of heavy_span against light steps of 10 ms that gradwatch's
        # timers see 0.1 ms of: with a 5 % budget, 12 ms proposes an interval of 5,
        # 14 ms one of 10 (Schedule's doctest), 10.1 ms one of 1.
        s = AgreedSchedule(every=1, overhead=0.05, wait_s=wait_s)
        out = []
        for step in range(120):
            if step == stop:
                break
            proposal = s.interval  # what this rank proposes if step starts an agreement
            heavy = s.capture(step)
            out.append({"step": step, "heavy": heavy, "proposal": proposal,
                        "agreed": s.agreed})
            s.observe(step, heavy, 0.0001, heavy_span if heavy else 0.010)
        s.close()
        return out

    result = {"max": run([0.012, 0.014][rank]), "probe": run(0.0101)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # rank 1 stops monitoring after step 39, alive: rank 0 waits wait_s at step 64
        result["stops"] = run(0.014, stop=[None, 40][rank], wait_s=1.0)
    result["warnings"] = [str(w.message) for w in caught]
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()  # rank 1 stays until rank 0 has given up on it
    dist.destroy_process_group()
    """
)


@pytest.mark.slow
def test_ranks_with_different_budgets_take_the_same_heavy_steps(
    torchrun: Torchrun, tmp_path: Path
) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    done = torchrun(script, str(tmp_path))
    assert done.returncode == 0, done.stdout[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]

    steps = [r["max"] for r in ranks]
    heavy = [[s["step"] for s in rank if s["heavy"]] for rank in steps]
    assert heavy[0] == heavy[1]
    # each rank's own budget: 5 and 10, once calibrated
    assert steps[0][-1]["proposal"] == 5 and steps[1][-1]["proposal"] == 10
    for at in range(16, 120, 16):  # each agreement is the larger of what both proposed
        proposed = max(steps[0][at - 16]["proposal"], steps[1][at - 16]["proposal"])
        assert steps[0][at]["agreed"] == steps[1][at]["agreed"] == proposed
    assert heavy[0][:6] == [0, 3, 6, 9, 12, 15]  # calibration until the first agreement
    # a step is heavy when the agreed interval has passed since the last heavy one
    last = None
    for s in steps[0]:
        assert s["heavy"] == (last is None or s["step"] - last >= s["agreed"]), s
        last = s["step"] if s["heavy"] else last
    # calibrated by step 32, proposed there, agreed from step 48: rank 1's 10
    assert steps[0][47]["agreed"] == 3 and steps[0][48]["agreed"] == 10
    gaps = {b - a for a, b in zip(heavy[0], heavy[0][1:], strict=False) if a >= 45}
    assert gaps == {10}

    steps = [r["probe"] for r in ranks]
    heavy = [[s["step"] for s in rank if s["heavy"]] for rank in steps]
    assert heavy[0] == heavy[1]
    assert steps[0][-1]["agreed"] == 1
    # every step heavy at an interval of 1, but the probe's light, light, heavy, light
    assert [s for s in range(48, 120) if s not in heavy[0]] == [60, 61, 63]

    steps = [r["stops"] for r in ranks]
    assert len(steps[0]) == 120 and len(steps[1]) == 40
    heavy = [[s["step"] for s in rank if s["heavy"]] for rank in steps]
    assert heavy[0][: len(heavy[1])] == heavy[1]  # agreed while both took part
    assert [w for w in ranks[1]["warnings"] if "gradwatch" in w] == []
    [warning] = [w for w in ranks[0]["warnings"] if "gradwatch" in w]
    assert "could not agree" in warning and "norm_scope 'local'" in warning
    # from step 64 on, rank 0's own budget (10, the same): heavy steps go on, counted
    # from the last shared one
    last = max(s for s in heavy[0] if s < 64)
    assert [s for s in heavy[0] if s >= 64] == list(range(last + 10, 120, 10))
