"""DDP: two real gloo ranks on loopback started by the real ``torchrun``, each
reporting its own rank and gradients, and the global total norm of the gradient DDP
averaged; under the default budget too, where each rank keeps its own schedule (no
collective of gradwatch's: rank 0 may watch alone)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from gradwatch.protocol import read_spool

from .conftest import Torchrun

WORKER = textwrap.dedent(
    """
    import gc, json, os, sys
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from gradwatch.trainer_hooks import watch

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1)))
    out_dir, mode, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    local, final = [], []
    # "budget": the default schedule, and only rank 0 watches
    kwargs = {"every": 1} if mode == "every" else {}
    monitor = None
    if mode == "every" or rank == 0:
        monitor = watch(model, run="ddp", spool=os.path.join(out_dir, f"rank{rank}.jsonl"),
                        run_id="6f1c0000-0000-4000-8000-00000000dd00", diagnose=False,
                        **kwargs)
    for step in range(steps):
        torch.manual_seed(100 * rank + step)  # each rank its own data
        x = torch.randn(8, 3)
        model.zero_grad()
        # the rank's own gradient, computed without DDP's all-reduce
        local_loss = model.module(x).pow(2).mean()
        local.append([g.double().norm().item() for g in
                      torch.autograd.grad(local_loss, list(model.parameters()))])
        loss = model(x).pow(2).mean()
        loss.backward()
        final.append([p.grad.double().norm().item() for p in model.parameters()])
        if monitor is not None:
            monitor.step(loss)
    if monitor is not None:
        monitor.close()
    with open(os.path.join(out_dir, f"expected{rank}.json"), "w") as f:
        json.dump({"local": local, "final": final}, f)
    del model, monitor, loss  # they hold the process group (conftest._torchrun)
    gc.collect()
    dist.destroy_process_group()
    """
)


def run_ranks(torchrun: Torchrun, tmp_path: Path, mode: str, steps: int) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    done = torchrun(script, str(tmp_path), mode, str(steps))
    assert done.returncode == 0, done.stdout[-4000:]


@pytest.mark.slow
def test_each_ddp_rank_reports_its_own_rank_and_gradients(
    torchrun: Torchrun, tmp_path: Path
) -> None:
    run_ranks(torchrun, tmp_path, "every", 3)
    names = ["0.weight", "0.bias", "2.weight", "2.bias"]
    for rank in range(2):
        messages = list(read_spool(tmp_path / f"rank{rank}.jsonl"))
        hello = messages[0]
        assert (hello["rank"], hello["world_size"]) == (rank, 2)
        assert hello["run_id"] == "6f1c0000-0000-4000-8000-00000000dd00"
        assert all(m["rank"] == rank for m in messages[1:])
        steps = [r for m in messages[1:] for r in m["records"] if r["kind"] == "step"]
        assert [r["step"] for r in steps] == [0, 1, 2]
        expected = json.loads((tmp_path / f"expected{rank}.json").read_text())
        for record, local, final in zip(steps, expected["local"], expected["final"], strict=True):
            got = [record["param_norms"][n] for n in names]
            # the rank's own gradient, before DDP averages it: ranks differ, which is
            # what a side-by-side view of ranks is for
            assert got == pytest.approx(local, rel=1e-6)
            assert got != pytest.approx(final, rel=1e-3)
            # ...and the global total: the norm of the gradient DDP averaged over the
            # ranks, the one the optimizer steps with (the same on both ranks)
            assert record["global_total_norm"] == pytest.approx(
                sum(v * v for v in final) ** 0.5, rel=1e-6
            )
            assert record["total_norm"] == pytest.approx(sum(v * v for v in local) ** 0.5)


@pytest.mark.slow
def test_ddp_under_the_default_budget_with_rank_0_watching_alone(
    torchrun: Torchrun, tmp_path: Path
) -> None:
    # a rank that does not watch costs nothing: gradwatch starts no collective under
    # DDP (no agreed schedule, whose process group would need every rank)
    run_ranks(torchrun, tmp_path, "budget", 20)
    assert not (tmp_path / "rank1.jsonl").exists()
    messages = list(read_spool(tmp_path / "rank0.jsonl"))
    assert messages[0]["config"]["overhead"] == 0.02
    steps = [r for m in messages[1:] for r in m["records"] if r["kind"] == "step"]
    assert [r["step"] for r in steps] == list(range(20))
    heavy = [r for r in steps if "param_norms" in r]
    assert [r["step"] for r in heavy][:5] == [0, 3, 6, 9, 12]  # calibration
    expected = json.loads((tmp_path / "expected0.json").read_text())
    for record in heavy:
        final = expected["final"][record["step"]]
        assert "norm_scope" not in record  # nothing sharded
        assert record["global_total_norm"] == pytest.approx(
            sum(v * v for v in final) ** 0.5, rel=1e-6
        )
        local = expected["local"][record["step"]]
        assert record["total_norm"] == pytest.approx(sum(v * v for v in local) ** 0.5)
