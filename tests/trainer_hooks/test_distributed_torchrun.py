"""A job of 2 CPU ranks (gloo) started by the real `torchrun` binary streams into one
run, each rank as itself."""

from __future__ import annotations

import json
import os
import textwrap
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .conftest import Torchrun

WORKER = textwrap.dedent(
    """
    import sys
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from gradwatch.trainer_hooks import watch

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.LSTM(2, 8, batch_first=True))
    # no run_id and no GRADWATCH_RUN_ID: rank 0 chooses one for the whole job
    with watch(model, run="ddp-torchrun", server=sys.argv[1], every=1, diagnose=False) as monitor:
        for step in range(4):
            torch.manual_seed(100 * rank + step)  # each rank its own data
            out, _ = model(torch.randn(4, 6, 2))
            loss = out.pow(2).mean()
            model.zero_grad()
            loss.backward()
            monitor.step(loss)
        monitor.epoch()
    dist.destroy_process_group()
    """
)


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 - loopback http
        return json.loads(answer.read())


@pytest.mark.slow
def test_torchrun_ranks_join_one_run_and_report_side_by_side(
    tmp_path: Path, gradwatch_server: Callable[..., Any], torchrun: Torchrun
) -> None:
    server = gradwatch_server()
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if k != "GRADWATCH_RUN_ID"}
    done = torchrun(script, server.url, env=env)
    assert done.returncode == 0, done.stdout[-4000:]

    runs = [r for r in get_json(server.http + "/api/runs") if r["name"] == "ddp-torchrun"]
    assert len(runs) == 1, runs  # one run, not one per rank
    run = runs[0]
    assert sorted(run["ranks"]) == [0, 1]
    assert run["world_size"] == 2
    norms = {}
    for rank in (0, 1):
        query = f"steps?rank={rank}&fields=loss,total_norm"
        steps = get_json(f"{server.http}/api/runs/{run['id']}/{query}")
        assert steps["fields"]["loss"]["step"] == [0, 1, 2, 3]
        norms[rank] = steps["fields"]["total_norm"]["value"]
    # each rank reports its own local gradients, so the ranks differ: that is the spread
    assert norms[0] != norms[1]
