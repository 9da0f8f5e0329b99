"""DDP: two real gloo ranks on loopback, each reporting its own rank and gradients,
and the global total norm of the gradient DDP averaged."""

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
    import json, os, sys
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from gradwatch.trainer_hooks import watch

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1)))
    out_dir = sys.argv[1]
    local, final = [], []
    with watch(model, run="ddp", spool=os.path.join(out_dir, f"rank{rank}.jsonl"),
               every=1, diagnose=False) as monitor:
        for step in range(3):
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
            monitor.step(loss)
    with open(os.path.join(out_dir, f"expected{rank}.json"), "w") as f:
        json.dump({"local": local, "final": final}, f)
    dist.destroy_process_group()
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_each_ddp_rank_reports_its_own_rank_and_gradients(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            GRADWATCH_RUN_ID="6f1c0000-0000-4000-8000-00000000dd00",
            OMP_NUM_THREADS="1",
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-W", "ignore", str(script), str(tmp_path)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        )
    for proc in procs:
        output, _ = proc.communicate(timeout=100)
        assert proc.returncode == 0, output.decode()

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
