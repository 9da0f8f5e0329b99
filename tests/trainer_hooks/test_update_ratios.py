"""``update_ratios`` equal a snapshot of the weights taken around ``optimizer.step()``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

from gradwatch.protocol import read_spool, to_float
from gradwatch.trainer_hooks import watch

from .precision import F32_RTOL, F64_RTOL

F64 = torch.float64


def steps_of(path: Path) -> list[dict[str, Any]]:
    return [
        r for m in read_spool(path) if m["type"] == "batch" for r in m["records"]
        if r["kind"] == "step"
    ]


def model_of() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.LayerNorm(8), nn.Linear(8, 2))


OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-3),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-3),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_update_ratios_equal_a_snapshot_around_optimizer_step(
    kind: str, dtype: torch.dtype, tmp_path: Path
) -> None:
    model = model_of().to(dtype)
    optimizer = OPTIMIZERS[kind](model.parameters())
    path = tmp_path / "run.jsonl"
    expected: list[dict[str, float]] = []
    with watch(model, run="ratios", every=1, spool=path, diagnose=False) as monitor:
        for step in range(4):
            x = torch.randn(16, 4, dtype=dtype)
            loss = model(x).square().mean()
            optimizer.zero_grad()
            loss.backward()
            before = {n: p.detach().clone() for n, p in model.named_parameters()}
            optimizer.step()
            expected.append({
                n: (torch.linalg.vector_norm(p.detach() - before[n], dtype=F64)
                    / torch.linalg.vector_norm(before[n], dtype=F64)).item()
                for n, p in model.named_parameters()
            })
            monitor.step(loss)
            del step
    records = steps_of(path)
    assert len(records) == 4
    for record, want in zip(records, expected, strict=True):
        assert list(record["update_ratios"]) == list(want)
        # LayerNorm's bias starts at zero: its first ratio is infinite, honestly
        rtol = F64_RTOL if dtype == F64 else F32_RTOL
        for name, value in want.items():
            got = to_float(record["update_ratios"][name])
            assert got == pytest.approx(value, rel=rtol, abs=0.0), name
    assert records[0]["update_ratios"]["2.bias"] == "Infinity"
    assert 0 < records[-1]["update_ratios"]["0.weight"] < 1


def test_light_steps_and_other_models_optimizers_add_nothing(tmp_path: Path) -> None:
    model, other = model_of(), nn.Linear(3, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    other_optimizer = torch.optim.SGD(other.parameters(), lr=0.1)
    path = tmp_path / "run.jsonl"
    with watch(model, run="ratios", spool=path, diagnose=False, every=2,
               exclude=["3.bias"]) as monitor:
        for _ in range(3):
            model(torch.randn(2, 4)).sum().backward()
            other(torch.randn(2, 3)).sum().backward()
            optimizer.step()
            other_optimizer.step()
            monitor.step()
    records = steps_of(path)
    assert ["update_ratios" in r for r in records] == [True, False, True]
    assert list(records[0]["update_ratios"]) == ["0.weight", "0.bias", "2.weight", "2.bias",
                                                 "3.weight"]


def test_remove_takes_the_global_optimizer_hooks_off(tmp_path: Path) -> None:
    pre, post = len(_global_optimizer_pre_hooks), len(_global_optimizer_post_hooks)
    monitor = watch(model_of(), run="ratios", spool=tmp_path / "r.jsonl", diagnose=False)
    assert (len(_global_optimizer_pre_hooks), len(_global_optimizer_post_hooks)) == (
        pre + 1, post + 1
    )
    monitor.remove()
    monitor.remove()
    assert (len(_global_optimizer_pre_hooks), len(_global_optimizer_post_hooks)) == (pre, post)
    monitor.close()
