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
    import gc, sys
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
    del model, monitor, out, loss  # they hold the process group (conftest._torchrun)
    gc.collect()
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


ONE_RANK_WATCHES = textwrap.dedent(
    """
    import gc, sys, warnings
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from gradwatch.trainer_hooks import identity, watch
    from gradwatch.protocol.columns import batch_records
    from gradwatch.protocol.spool import read_spool

    watching, folder = int(sys.argv[1]), sys.argv[2]
    identity.RUN_ID_WAIT_S = 3.0  # rank 0 never writes an id when it does not watch
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.LSTM(2, 8, batch_first=True))
    monitor = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if rank == watching:  # the usual `if rank == 0: watch(model)`, no run_id
            monitor = watch(model, run="one-rank", spool=f"{folder}/rank{rank}.jsonl",
                            every=1, diagnose=False)
    for step in range(6):
        torch.manual_seed(100 * rank + step)
        out, _ = model(torch.randn(4, 6, 2))
        loss = out.pow(2).mean()
        model.zero_grad()
        loss.backward()  # DDP's all-reduce: the job's own collective
        if monitor is not None:
            monitor.step(loss)
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)  # a collective after training still pairs with its twin
    if monitor is not None:
        monitor.close()
        records = [r for m in read_spool(f"{folder}/rank{rank}.jsonl")
                   if m["type"] == "batch" for r in batch_records(m) if r["kind"] == "step"]
        words = [str(w.message) for w in caught]
        print(f"RANK {rank} STEPS {len(records)} RUN {monitor.run_id} SUM {total.item()}"
              f" WARNED {any('run id' in w for w in words)}", flush=True)
    del model, monitor, out, loss  # they hold the process group (conftest._torchrun)
    gc.collect()
    dist.destroy_process_group()
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("watching", [0, 1])
def test_one_rank_watching_alone_neither_hangs_nor_disturbs_the_jobs_collectives(
    tmp_path: Path, torchrun: Torchrun, watching: int
) -> None:
    """`if rank == 0: watch(model)` with no run_id: the run id must not travel by a
    collective the other rank never joins (it would pair with DDP's all-reduce)."""
    script = tmp_path / "worker.py"
    script.write_text(ONE_RANK_WATCHES)
    env = {k: v for k, v in os.environ.items() if k != "GRADWATCH_RUN_ID"}
    done = torchrun(script, str(watching), str(tmp_path), env=env, timeout=90)
    assert done.returncode == 0, done.stdout[-4000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("RANK")]
    assert len(lines) == 1, done.stdout[-4000:]
    words = lines[0].split()
    assert words[1] == str(watching) and words[3] == "6", lines
    assert words[7] == "3.0", lines  # 1 + 2: the all-reduce met its twin on the other rank
    # rank 0 never waits and so never warns; rank 1 waits, warns, and streams alone
    assert words[9] == str(watching == 1), lines
