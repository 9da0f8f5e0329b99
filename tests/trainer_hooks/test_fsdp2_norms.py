"""FSDP2 (``fully_shard``, DTensor parameters): two real gloo ranks on CPU, started by
the real ``torchrun``. With a fixed interval and under the default budget (whose
heavy steps the ranks agree on: trainer_hooks/agreed.py) the gradient norms are
global, equal on both ranks to the unsharded model's (``torch.nn.utils.
get_total_norm`` and per-parameter norms of the same gradient) and marked
``norm_scope: "global"``, and so are the update-to-weight ratios. A rank that leaves
costs the others their agreement, never their training: they warn once, go on with
their own steps and keep norms local: each rank's shard norms, marked ``"local"``,
whose squares add up over the ranks to the global ones."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from gradwatch.protocol import read_spool

from .conftest import Torchrun

WORKER = textwrap.dedent(
    """
    import copy, gc, json, os, sys, warnings
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import fully_shard
    from gradwatch.trainer_hooks import watch

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out_dir, mode, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
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
    kwargs = {"every": 1} if mode in ("fixed", "alone_fixed") else {}  # else the budget
    expected, reduced = [], []
    alone = mode.startswith("alone")
    if alone:  # only rank 0 watches: it waits this long for rank 1 at watch()
        from gradwatch.trainer_hooks.agreed import AgreedSchedule
        AgreedSchedule.JOIN_S = 2.0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monitor = None
        if not alone or rank == 0:
            monitor = watch(model, run="fsdp2",
                            spool=os.path.join(out_dir, f"{mode}{rank}.jsonl"),
                            run_id="6f1c0000-0000-4000-8000-00000000f5d2", diagnose=False,
                            **kwargs)
        if mode == "local":  # as if the agreement had failed on both ranks at once
            monitor.schedule._fall_back("given up by the test")
        for step in range(steps):
            if mode == "leaves" and step >= 20:
                if rank == 1:  # leaves: no close, no goodbye, as a crashed rank would
                    os._exit(0)
                monitor.step(0.5)  # rank 0 alone: no training step (FSDP needs both)
                continue
            batches = []
            for r in range(world):  # every rank's data, for the twin's reference
                torch.manual_seed(100 * r + step)
                batches.append(torch.randn(6 + 2 * r, 3))
            loss = model(batches[rank]).pow(2).mean()
            model.zero_grad()
            loss.backward()
            optimizer.step()
            if monitor is not None:
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
        if monitor is not None:
            reduced = [getattr(q, "reduce_shards", None) for q in monitor.quantities]
            monitor.close()
    with open(os.path.join(out_dir, f"{mode}-expected{rank}.json"), "w") as f:
        json.dump({"expected": expected, "reduced": [r for r in reduced if r is not None],
                   "warnings": [str(w.message) for w in caught]}, f)
    if mode != "leaves":
        del model, optimizer, monitor, loss  # they hold the process group (conftest._torchrun)
        gc.collect()
        dist.destroy_process_group()
    """
)
NAMES = ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"]


def run_ranks(
    torchrun: Torchrun, tmp_path: Path, mode: str, steps: int, ranks: int = 2
) -> list[tuple[list[dict], dict]]:
    """(step records, what the worker expected) of each rank that finished."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    done = torchrun(script, str(tmp_path), mode, str(steps))
    assert done.returncode == 0, done.stdout[-4000:]
    out = []
    for rank in range(ranks):
        messages = list(read_spool(tmp_path / f"{mode}{rank}.jsonl"))
        records = [r for m in messages[1:] for r in m["records"] if r["kind"] == "step"]
        expected = json.loads((tmp_path / f"{mode}-expected{rank}.json").read_text())
        out.append((records, expected))
    return out


def assert_global(record: dict, truth: dict) -> None:
    """A heavy step record's norms and ratios are the unsharded twin's."""
    assert record["norm_scope"] == "global"
    assert sorted(record["param_norms"]) == sorted(NAMES)
    got = [record["param_norms"][n] for n in NAMES]
    # float32 gradients summed in another order by the reduce-scatter
    assert got == pytest.approx([truth["params"][n] for n in NAMES], rel=1e-5)
    assert record["total_norm"] == pytest.approx(truth["total"], rel=1e-5)
    # update ratios: the twin, stepped alike, drifts by float32 rounding only
    ratios = [record["update_ratios"][n] for n in NAMES]
    assert ratios == pytest.approx([truth["ratios"][n] for n in NAMES], rel=1e-4)


@pytest.mark.slow
def test_fsdp2_norms_are_global_and_equal_the_unsharded_model(
    torchrun: Torchrun, tmp_path: Path
) -> None:
    ranks = run_ranks(torchrun, tmp_path, "fixed", 4)
    for steps, expected in ranks:
        assert [r["step"] for r in steps] == [0, 1, 2, 3]
        assert not [w for w in expected["warnings"] if "gradwatch" in w], expected["warnings"]
        for record, truth in zip(steps, expected["expected"], strict=True):
            assert_global(record, truth)
    # both ranks report the same global numbers
    assert [r["param_norms"] for r in ranks[0][0]] == [r["param_norms"] for r in ranks[1][0]]


@pytest.mark.slow
def test_fsdp2_under_the_default_budget_agrees_on_heavy_steps_and_norms_are_global(
    torchrun: Torchrun, tmp_path: Path
) -> None:
    ranks = run_ranks(torchrun, tmp_path, "budget", 40)
    for steps, expected in ranks:
        assert [r["step"] for r in steps] == list(range(40))
        assert not [w for w in expected["warnings"] if "gradwatch" in w], expected["warnings"]
        assert expected["reduced"] == [True, True]
    heavy = [[r for r in steps if "param_norms" in r] for steps, _ in ranks]
    # the same heavy steps on both ranks: calibration's 0, 3, 6, ... at least up to
    # step 16, where the first agreement (started at step 0) takes over
    assert [r["step"] for r in heavy[0]] == [r["step"] for r in heavy[1]]
    assert [r["step"] for r in heavy[0] if r["step"] < 16] == [0, 3, 6, 9, 12, 15]
    truth = ranks[0][1]["expected"]
    for a, b in zip(*heavy, strict=True):
        assert_global(a, truth[a["step"]])
        assert a["param_norms"] == b["param_norms"]
    light = [r for r in ranks[0][0] if "param_norms" not in r]
    assert light and not [r for r in light if "norm_scope" in r or "update_ratios" in r]


@pytest.mark.slow
def test_fsdp2_norms_after_the_agreement_failed_are_local_shard_norms_and_say_so(
    torchrun: Torchrun, tmp_path: Path
) -> None:
    ranks = run_ranks(torchrun, tmp_path, "local", 4)
    for _, expected in ranks:
        [warning] = [w for w in expected["warnings"] if "gradwatch" in w]
        assert "given up by the test" in warning and "norm_scope 'local'" in warning
        assert expected["reduced"] == [False, False]
    heavy = [[r for r in steps if "param_norms" in r] for steps, _ in ranks]
    # each rank's own budget schedule, still calibrating: every third step heavy
    assert [r["step"] for r in heavy[0]] == [r["step"] for r in heavy[1]] == [0, 3]
    truth = ranks[0][1]["expected"]
    for a, b in zip(*heavy, strict=True):
        assert a["norm_scope"] == b["norm_scope"] == "local"
        for name in NAMES:
            shards = [a["param_norms"][name], b["param_norms"][name]]
            whole = truth[a["step"]]["params"][name]
            assert shards != pytest.approx([whole] * 2, rel=1e-3)
            # each rank's shard: their squares add up to the whole parameter's
            assert (shards[0] ** 2 + shards[1] ** 2) ** 0.5 == pytest.approx(whole, rel=1e-5)
            assert name in a["update_ratios"] and name in b["update_ratios"]


@pytest.mark.slow
def test_fsdp2_watched_on_rank_0_alone_costs_a_bounded_wait_and_norms_stay_local(
    torchrun: Torchrun, tmp_path: Path
) -> None:
    # rank 1 never calls watch(): rank 0 gives up the agreement after JOIN_S (2 s
    # here) instead of waiting for a process group rank 1 never joins, while rank 1
    # waits for rank 0 in FSDP's first all-gather; then both train to the end
    [(steps, expected)] = run_ranks(torchrun, tmp_path, "alone", 4, ranks=1)
    [warning] = [w for w in expected["warnings"] if "gradwatch" in w]
    assert "not every rank" in warning and "norm_scope 'local'" in warning
    assert expected["reduced"] == [False, False]
    heavy = [r for r in steps if "param_norms" in r]
    assert [r["step"] for r in heavy] == [0, 3]
    assert all(r["norm_scope"] == "local" for r in heavy)
    assert not (tmp_path / "alone1.jsonl").exists()


@pytest.mark.slow
def test_fsdp2_every_1_watched_on_rank_0_alone_keeps_norms_local_instead_of_hanging(
    torchrun: Torchrun, tmp_path: Path
) -> None:
    # every=1 on rank 0 alone: a reduction per step on FSDP's own group would pair
    # with rank 1's all-gathers (a hang, or wrong numbers); the ranks meet on the store
    # first, rank 1 never comes, so rank 0 warns once and keeps every step local
    [(steps, expected)] = run_ranks(torchrun, tmp_path, "alone_fixed", 4, ranks=1)
    [warning] = [w for w in expected["warnings"] if "gradwatch" in w]
    assert "not every rank called watch()" in warning and "norm_scope 'local'" in warning
    assert expected["reduced"] == [False, False]
    assert [r["step"] for r in steps if "param_norms" in r] == [0, 1, 2, 3]
    assert all(r["norm_scope"] == "local" for r in steps if "param_norms" in r)


@pytest.mark.slow
def test_fsdp2_a_rank_that_leaves_costs_the_agreement_not_the_training(
    torchrun: Torchrun, tmp_path: Path
) -> None:
    # rank 1 exits after step 19; rank 0 goes on to step 59 (the agreement started at
    # step 16 completed; the one started at step 32 never will)
    [(steps, expected)] = run_ranks(torchrun, tmp_path, "leaves", 60, ranks=1)
    assert [r["step"] for r in steps] == list(range(60))
    agreement = [w for w in expected["warnings"] if "could not agree" in w]
    assert len(agreement) == 1, expected["warnings"]
    assert "norm_scope 'local'" in agreement[0]
    assert expected["reduced"] == [False, False]  # no collective from then on
    truth = expected["expected"]
    for record in steps[:20]:
        if "param_norms" in record:
            assert_global(record, truth[record["step"]])
