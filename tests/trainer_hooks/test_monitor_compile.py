"""torch.compile: the compiled model trains the same and its gradient norms are right."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from gradwatch.protocol import read_spool
from gradwatch.trainer_hooks import watch


def steps_of(path: Path) -> list[dict[str, Any]]:
    return [
        r
        for m in read_spool(path)
        if m["type"] == "batch"
        for r in m["records"]
        if r["kind"] == "step"
    ]


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh())
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def net_and_eager_norms() -> tuple[Net, torch.Tensor, dict[str, float]]:
    """A float64 Net, its input, and its parameters' gradient norms in eager mode."""
    torch.manual_seed(0)
    model = Net().double()
    x = torch.randn(4, 3, dtype=torch.float64)
    model(x).pow(2).sum().backward()
    eager = {n: p.grad.norm().item() for n, p in model.named_parameters()}  # type: ignore[union-attr]
    model.zero_grad()
    return model, x, eager


@pytest.mark.slow
def test_compiled_model_gives_eager_norms_with_every_hook_attached(tmp_path: Path) -> None:
    model, x, eager = net_and_eager_norms()
    eager_out = model(x).detach()

    path = tmp_path / "compiled.jsonl"
    with watch(model, run="compiled", every=1, spool=path, profile=True, diagnose=False) as monitor:
        compiled = torch.compile(model, backend="aot_eager")
        for _ in range(2):
            model.zero_grad()
            out = compiled(x)
            loss = out.pow(2).sum()
            loss.backward()
            monitor.step(loss)
    assert torch.equal(out.detach(), eager_out)
    records = steps_of(path)
    assert len(records) == 2
    for record in records:
        assert record["param_norms"] == pytest.approx(eager, rel=1e-12, abs=0.0)
        assert record["graph_nodes"] > 0


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + torch.tanh(block(x))
        return x


@pytest.mark.slow
def test_a_compiled_stack_gets_no_graph_break_from_the_depth_hooks(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Stack()
    x = torch.randn(2, 4)
    path = tmp_path / "compiled.jsonl"
    with watch(model, run="compiled", every=1, spool=path, diagnose=False) as monitor:
        # fullgraph=True refuses any graph break: a hook that broke the graph would raise
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
        for _ in range(2):
            model.zero_grad()
            loss = compiled(x).pow(2).sum()
            loss.backward()
            monitor.step(loss)
        model(x).sum().backward()  # eager calls of the same model are captured as usual
        monitor.step()
    records = steps_of(path)
    assert ["depth" in r for r in records] == [False, False, True]
    assert len(records[-1]["depth"]["blocks"]) == 3


@pytest.mark.slow
def test_a_model_compiled_before_watch_is_watched_under_its_own_names(tmp_path: Path) -> None:
    model, x, eager = net_and_eager_norms()
    compiled = torch.compile(model, backend="aot_eager")
    path = tmp_path / "compiled-first.jsonl"
    # the usual order: compile right after building the model, watch what training calls
    with watch(compiled, run="compiled", every=1, spool=path, diagnose=False) as monitor:
        assert monitor.model is model
        for _ in range(2):
            model.zero_grad()
            loss = compiled(x).pow(2).sum()
            loss.backward()
            monitor.step(loss)
    hello = next(iter(read_spool(path)))
    names = [m["name"] for m in hello["model"]["modules"]]
    assert names == ["Net", "body", "body.0", "body.1", "body.2", "body.3", "head"]
    assert hello["model"]["parameters"] == sum(p.numel() for p in model.parameters())
    for record in steps_of(path):
        # the same names as the model watched uncompiled: runs compare by name
        assert record["param_norms"] == pytest.approx(eager, rel=1e-12, abs=0.0)
