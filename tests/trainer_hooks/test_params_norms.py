"""param_norms / gate_norms / total_norm / nonfinite.parameters agree with autograd."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from gradwatch.protocol import read_spool, to_float
from gradwatch.trainer_hooks import GradwatchWarning, watch

from .precision import F32_RTOL


def steps_of(path: Path) -> list[dict[str, Any]]:
    return [
        r
        for m in read_spool(path)
        if m["type"] == "batch"
        for r in m["records"]
        if r["kind"] == "step"
    ]


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(3, 4, num_layers=2, bidirectional=True)
        self.gru = nn.GRUCell(8, 5)
        self.head = nn.Linear(5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        h = torch.zeros(x.shape[1], 5, dtype=x.dtype)
        for t in range(x.shape[0]):
            h = self.gru(out[t], h)
        return self.head(h)


def expected_norms(model: nn.Module) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    params: dict[str, float] = {}
    gates: dict[str, dict[str, float]] = {}
    for name, p in model.named_parameters():
        assert p.grad is not None
        g = p.grad.double()
        params[name] = g.norm().item()
        local = name.rsplit(".", 1)[-1]
        if local.startswith(("weight_ih", "weight_hh", "bias_ih", "bias_hh")):
            names = "ifgo" if name.startswith("lstm") else "rzn"
            chunks = g.chunk(len(names))
            gates[name] = {n: c.norm().item() for n, c in zip(names, chunks, strict=True)}
    return params, gates


def test_param_and_gate_norms_equal_autograd_in_float64(tmp_path: Path) -> None:
    torch.manual_seed(1)
    model = Stack().double()
    path = tmp_path / "run.jsonl"
    with watch(model, run="norms", every=1, spool=path, diagnose=False) as monitor:
        loss = model(torch.randn(6, 2, 3, dtype=torch.float64)).pow(2).sum()
        loss.backward()
        monitor.step(loss)
        params, gates = expected_norms(model)
    (record,) = steps_of(path)
    assert record["param_norms"].keys() == params.keys()
    for name, value in params.items():
        assert record["param_norms"][name] == pytest.approx(value, rel=1e-12, abs=0.0)
    assert record["gate_norms"].keys() == gates.keys()
    assert "weight_ih_l1_reverse" in {k.rsplit(".", 1)[-1] for k in gates}
    for name, chunks in gates.items():
        assert record["gate_norms"][name] == pytest.approx(chunks, rel=1e-12, abs=0.0)
    total = math.sqrt(sum(v * v for v in params.values()))
    assert record["total_norm"] == pytest.approx(total, rel=1e-12, abs=0.0)
    assert "nonfinite" not in record


def test_float32_gate_norms_of_tiny_gradients_are_float64_exact(tmp_path: Path) -> None:
    """Float32 packed gradients (reduced on CPU as (gates, -1) rows) of 1e-25 scale,
    whose float32 squares vanish: each gate's norm is recomputed in float64 and equals
    the float64 norm of autograd's chunk."""
    torch.manual_seed(2)
    model = Stack()
    path = tmp_path / "run.jsonl"
    with watch(model, run="gates32", every=1, spool=path, diagnose=False) as monitor:
        loss = model(torch.randn(6, 2, 3)).pow(2).sum() * 1e-25
        loss.backward()
        monitor.step(loss)
        params, gates = expected_norms(model)
    (record,) = steps_of(path)
    assert min(min(chunks.values()) for chunks in gates.values()) < 1e-20  # float32 squares: 0
    for name, chunks in gates.items():  # abs=0: approx would let 1e-26 pass as 0
        assert record["gate_norms"][name] == pytest.approx(chunks, rel=1e-12, abs=0.0)
    for name, value in params.items():
        assert record["param_norms"][name] == pytest.approx(value, rel=1e-12, abs=0.0)


def test_float32_norms_of_tiny_gradients_do_not_underflow(tmp_path: Path) -> None:
    model = nn.Linear(4, 1, bias=False)
    path = tmp_path / "run.jsonl"
    with watch(model, run="tiny", every=1, spool=path, diagnose=False) as monitor:
        loss = (model(torch.ones(1, 4)) * 1e-30).sum()
        loss.backward()
        monitor.step(loss)
    (record,) = steps_of(path)
    # each grad entry is 1e-30: squared in float32 it would be 0
    assert record["param_norms"]["weight"] == pytest.approx(2e-30, rel=1e-6, abs=0.0)


def test_nonfinite_names_the_parameters_whose_gradient_broke(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    path = tmp_path / "run.jsonl"
    with watch(model, run="nan", every=1, spool=path, diagnose=False) as monitor:
        loss = model(torch.ones(1, 2)).sum()
        loss.backward()
        monitor.step(loss)
        with torch.no_grad():
            model[1].weight.fill_(float("inf"))
        loss = model(torch.ones(1, 2)).sum()
        model.zero_grad()
        loss.backward()
        monitor.step(loss)
        finite_grad = model[1].weight.grad.double().norm().item()  # type: ignore[union-attr]
    first, second = steps_of(path)
    assert "nonfinite" not in first
    # the infinite weight of layer 1 breaks only the gradient flowing back into layer 0
    assert sorted(second["nonfinite"]["parameters"]) == ["0.bias", "0.weight"]
    assert not math.isfinite(to_float(second["param_norms"]["0.weight"]))
    assert second["param_norms"]["1.weight"] == pytest.approx(finite_grad, rel=F32_RTOL, abs=0.0)
    assert not math.isfinite(to_float(second["total_norm"]))


def test_gradient_accumulation_reports_the_accumulated_gradient(tmp_path: Path) -> None:
    model = nn.Linear(3, 1)
    path = tmp_path / "run.jsonl"
    with watch(model, run="accum", every=1, spool=path, diagnose=False) as monitor:
        for _ in range(3):
            loss = model(torch.randn(2, 3)).pow(2).sum()
            loss.backward()
        monitor.step(loss)
        params, _ = expected_norms(model)
    (record,) = steps_of(path)
    assert record["param_norms"] == pytest.approx(params, rel=1e-6)


def test_retain_graph_second_backward_and_create_graph(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 1)).double()
    path = tmp_path / "run.jsonl"
    x = torch.randn(4, 3, dtype=torch.float64)
    with watch(model, run="retain", every=1, spool=path, diagnose=False) as monitor:
        loss = model(x).pow(2).sum()
        loss.backward(retain_graph=True)
        loss.backward()
        monitor.step(loss)
        retained, _ = expected_norms(model)
        model.zero_grad()
        loss = model(x).pow(2).sum()
        with warnings.catch_warnings():
            # PyTorch's advice about the reference cycle, given once per process (so not
            # here when another test asked for create_graph first): it is broken below
            warnings.filterwarnings("ignore", message=".*create_graph=True")
            loss.backward(create_graph=True)
        monitor.step(loss)
        created, _ = expected_norms(model)
        penalty = sum(p.grad.pow(2).sum() for p in model.parameters())  # type: ignore[union-attr]
        assert penalty.requires_grad  # create_graph kept the double-backward graph
        model.zero_grad(set_to_none=True)  # break the parameter <-> gradient cycle
    first, second = steps_of(path)
    assert first["param_norms"] == pytest.approx(retained, rel=1e-12, abs=0.0)
    assert second["param_norms"] == pytest.approx(created, rel=1e-12, abs=0.0)


def test_activation_checkpointing_gives_the_same_norms(tmp_path: Path) -> None:
    torch.manual_seed(2)
    block = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    x = torch.randn(5, 3, dtype=torch.float64)
    block(x).sum().backward()
    plain = {n: p.grad.norm().item() for n, p in block.named_parameters()}  # type: ignore[union-attr]
    block.zero_grad()
    path = tmp_path / "run.jsonl"
    with watch(block, run="ckpt", every=1, spool=path, diagnose=False) as monitor:
        loss = checkpoint(block, x, use_reentrant=False).sum()
        loss.backward()
        monitor.step(loss)
    (record,) = steps_of(path)
    assert record["param_norms"] == pytest.approx(plain, rel=1e-12, abs=0.0)


def test_grad_scaler_norms_are_unscaled(tmp_path: Path) -> None:
    torch.manual_seed(3)
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    x = torch.randn(4, 3)
    model(x).pow(2).sum().backward()
    reference = {n: p.grad.norm().item() for n, p in model.named_parameters()}  # type: ignore[union-attr]
    model.zero_grad()
    path = tmp_path / "run.jsonl"
    with watch(model, run="amp", every=1, spool=path, scaler=scaler, diagnose=False) as monitor:
        for _ in range(2):
            loss = model(x).pow(2).sum()
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)  # unscales the grads in place; the norms were taken before
            scaler.update()
            monitor.step(loss)
    for record in steps_of(path):
        assert record["param_norms"] == pytest.approx(reference, rel=1e-5)


def test_a_quantity_that_fails_is_warned_about_once_and_left_out(tmp_path: Path) -> None:
    model = nn.Linear(2, 1)
    path = tmp_path / "run.jsonl"
    monitor = watch(model, run="broken", every=1, spool=path, diagnose=False)
    params = next(q for q in monitor.quantities if q.name == "param_norms")

    def broken(payload: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("encoder broke")

    params.encode = broken  # type: ignore[method-assign]
    with pytest.warns(GradwatchWarning, match="encoding param_norms failed"):
        for _ in range(3):
            loss = model(torch.ones(1, 2)).sum()
            loss.backward()
            monitor.step(loss)
        monitor.close()
    records = steps_of(path)
    assert [r["step"] for r in records] == [0, 1, 2]
    assert all("param_norms" not in r and "graph_nodes" in r for r in records)


class BreaksInBackward(nn.Module):
    """sqrt at 0: a finite forward whose gradient is infinite, between lin1 and lin2."""

    def __init__(self) -> None:
        super().__init__()
        self.lin0 = nn.Linear(2, 3)
        self.lin1 = nn.Linear(3, 3)
        self.lin2 = nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin1(self.lin0(x))
        return self.lin2(h + torch.sqrt(h - h.detach()))


def test_nonfinite_parameters_come_in_backward_order_nearest_the_loss_first(
    tmp_path: Path,
) -> None:
    model = BreaksInBackward()
    path = tmp_path / "run.jsonl"
    with watch(model, run="nan-order", every=1, spool=path, diagnose=False) as monitor:
        loss = model(torch.ones(1, 2)).sum()
        assert torch.isfinite(loss)
        loss.backward()
        monitor.step(loss)
    (record,) = steps_of(path)
    bad = record["nonfinite"]["parameters"]
    # backward reaches lin1 before lin0; named_parameters() order would list lin0 first
    assert sorted(bad[:2]) == ["lin1.bias", "lin1.weight"]
    assert sorted(bad[2:]) == ["lin0.bias", "lin0.weight"]
    assert "lin2.weight" in record["param_norms"] and "lin2.weight" not in bad
