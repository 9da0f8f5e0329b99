"""FSDP2 (``fully_shard``, DTensor parameters): two real gloo ranks on CPU. With a fixed
interval the gradient norms are global, equal on both ranks to the unsharded model's
(``torch.nn.utils.get_total_norm`` and per-parameter norms of the same gradient) and
marked ``norm_scope: "global"``, and so are the update-to-weight ratios; under an
overhead budget they are each rank's shard norms, marked ``"local"``, whose squares
add up over the ranks to the global ones."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gradwatch.protocol import read_spool

WORKER = textwrap.dedent(
    """
    import copy, json, os, sys, warnings
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import fully_shard
    from gradwatch.trainer_hooks import watch

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out_dir, mode = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    # 5 output rows: the first Linear's weight and bias shard unevenly (3 + 2 rows)
    model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 4), nn.Tanh(),
                          nn.Linear(4, 1))
    twin = copy.deepcopy(model)  # the unsharded model, same weights
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    names = [n for n, _ in twin.named_parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    twin_optimizer = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
    kwargs = {"every": 1} if mode == "fixed" else {}  # default: the overhead budget
    expected = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monitor = watch(model, run="fsdp2", spool=os.path.join(out_dir, f"{mode}{rank}.jsonl"),
                        diagnose=False, **kwargs)
        for step in range(4):
            batches = []
            for r in range(world):  # every rank's data, for the twin's reference
                torch.manual_seed(100 * r + step)
                batches.append(torch.randn(6 + 2 * r, 3))
            loss = model(batches[rank]).pow(2).mean()
            model.zero_grad()
            loss.backward()
            optimizer.step()
            monitor.step(loss)
            # FSDP2 averages the ranks' gradients: the twin's loss is the ranks' mean
            twin.zero_grad()
            (sum(twin(x).pow(2).mean() for x in batches) / world).backward()
            grads = [p.grad for p in twin.parameters()]
            before = [p.detach().clone() for p in twin.parameters()]
            twin_optimizer.step()
            norm = lambda t: torch.linalg.vector_norm(t, dtype=torch.float64).item()
            expected.append({
                "params": {n: norm(g) for n, g in zip(names, grads)},
                "total": torch.nn.utils.get_total_norm(grads).item(),
                "ratios": {n: norm(p.detach() - b) / norm(b)
                           for n, p, b in zip(names, twin.parameters(), before)},
            })
        monitor.close()
    with open(os.path.join(out_dir, f"{mode}-expected{rank}.json"), "w") as f:
        json.dump({"expected": expected,
                   "warnings": [str(w.message) for w in caught]}, f)
    dist.destroy_process_group()
    """
)
NAMES = ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(tmp_path: Path, mode: str) -> list[tuple[list[dict], dict]]:
    """(step records, what the worker expected) of each rank."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    port = free_port()
    procs = []
    try:
        for rank in range(2):
            env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                       GRADWATCH_RUN_ID="6f1c0000-0000-4000-8000-00000000f5d2")
            procs.append(subprocess.Popen(
                [sys.executable, "-W", "ignore::DeprecationWarning", str(script), str(tmp_path),
                 mode],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            ))
        for proc in procs:
            output, _ = proc.communicate(timeout=120)
            assert proc.returncode == 0, output.decode()[-4000:]
    finally:
        for proc in procs:  # never leave a rank behind, even when one failed
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    out = []
    for rank in range(2):
        messages = list(read_spool(tmp_path / f"{mode}{rank}.jsonl"))
        steps = [r for m in messages[1:] for r in m["records"] if r["kind"] == "step"]
        expected = json.loads((tmp_path / f"{mode}-expected{rank}.json").read_text())
        out.append((steps, expected))
    return out


@pytest.mark.slow
def test_fsdp2_norms_are_global_and_equal_the_unsharded_model(tmp_path: Path) -> None:
    ranks = run_ranks(tmp_path, "fixed")
    for steps, expected in ranks:
        assert [r["step"] for r in steps] == [0, 1, 2, 3]
        assert not [w for w in expected["warnings"] if "gradwatch" in w], expected["warnings"]
        for record, truth in zip(steps, expected["expected"], strict=True):
            assert record["norm_scope"] == "global"
            assert sorted(record["param_norms"]) == sorted(NAMES)
            got = [record["param_norms"][n] for n in NAMES]
            # float32 gradients summed in another order by the reduce-scatter
            assert got == pytest.approx([truth["params"][n] for n in NAMES], rel=1e-5)
            assert record["total_norm"] == pytest.approx(truth["total"], rel=1e-5)
            # update ratios: the twin, stepped alike, drifts by float32 rounding only
            ratios = [record["update_ratios"][n] for n in NAMES]
            assert ratios == pytest.approx([truth["ratios"][n] for n in NAMES], rel=1e-4)
    # both ranks report the same global numbers
    assert [r["param_norms"] for r in ranks[0][0]] == [r["param_norms"] for r in ranks[1][0]]


@pytest.mark.slow
def test_fsdp2_under_a_budget_reports_local_shard_norms_and_says_so(tmp_path: Path) -> None:
    ranks = run_ranks(tmp_path, "budget")
    for _, expected in ranks:
        assert any("sharded (FSDP2)" in w and "every=N" in w for w in expected["warnings"])
    heavy = [[r for r in steps if "param_norms" in r] for steps, _ in ranks]
    # calibration: every third step is heavy on every rank (steps 0 and 3)
    assert [r["step"] for r in heavy[0]] == [r["step"] for r in heavy[1]] == [0, 3]
    truth = ranks[0][1]["expected"]
    for a, b in zip(*heavy, strict=True):
        assert a["norm_scope"] == b["norm_scope"] == "local"
        for name in NAMES:
            shards = [a["param_norms"][name], b["param_norms"][name]]
            assert shards != pytest.approx([truth[a["step"]]["params"][name]] * 2, rel=1e-3)
            squares = shards[0] ** 2 + shards[1] ** 2
            assert squares ** 0.5 == pytest.approx(truth[a["step"]]["params"][name], rel=1e-5)
            assert name in a["update_ratios"] and name in b["update_ratios"]
