"""A step's series describe the backward passes its param_norms describe.

Closure optimizers (LBFGS) run forward and backward several times per step, with
``.grad`` reset before each: the series are the last evaluation's, ``backward_passes``
counts them. Gradient accumulation keeps every micro-batch's calls. Every expected
series here is plain autograd (``torch.autograd.grad`` on the hidden states).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from gradwatch.protocol import read_spool
from gradwatch.trainer_hooks import watch

from .precision import F32_RTOL

F64 = torch.float64


def steps_of(path: Path) -> list[dict[str, Any]]:
    return [
        r for m in read_spool(path) if m["type"] == "batch"
        for r in m["records"] if r["kind"] == "step"
    ]


class CellLoop(nn.Module):
    """The public time-series example's shape: an nn.LSTMCell over every timestep."""

    def __init__(self, hidden: int = 51) -> None:
        super().__init__()
        self.hidden = hidden
        self.cell = nn.LSTMCell(1, hidden)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor, keep: list[torch.Tensor] | None = None) -> torch.Tensor:
        h = x.new_zeros(x.shape[0], self.hidden)
        c = x.new_zeros(x.shape[0], self.hidden)
        for t in range(x.shape[1]):
            h, c = self.cell(x[:, t : t + 1], (h, c))
            if keep is not None:
                keep.append(h)
        out: torch.Tensor = self.head(h)  # the loss sees the last output only
        return out


def reference(model: nn.Module, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """‖∂L/∂h_k‖₂ in float64 for every call, by plain autograd on a copy of the model."""
    hs: list[torch.Tensor] = []
    loss = (model(x, hs) - target).pow(2).mean()
    grads = torch.autograd.grad(loss, hs, allow_unused=True)
    return torch.stack([
        torch.zeros((), dtype=F64) if g is None else torch.linalg.vector_norm(g.to(F64))
        for g in grads
    ])


def data(steps: int, batch: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.sin(torch.arange(batch * steps, dtype=torch.float32).reshape(batch, steps) / 10)
    return x, torch.ones(batch, 1)


@pytest.mark.parametrize(("max_iter", "set_to_none"), [(4, True), (7, False)])
def test_lbfgs_closure_reports_the_last_evaluation_and_counts_the_passes(
    tmp_path: Path, max_iter: int, set_to_none: bool
) -> None:
    torch.manual_seed(0)
    model = CellLoop()
    x, target = data(300)
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=max_iter)
    path = tmp_path / "lbfgs.jsonl"
    evaluations: list[dict[str, torch.Tensor]] = []

    def closure() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=set_to_none)
        evaluations.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        loss = (model(x) - target).pow(2).mean()
        loss.backward()
        return loss

    with watch(model, run="lbfgs", every=1, spool=path, diagnose=False) as monitor:
        for _ in range(2):
            evaluations.clear()
            loss = optimizer.step(closure)
            monitor.step(loss)
            grads = {n: p.grad.double().norm().item()  # type: ignore[union-attr]
                     for n, p in model.named_parameters()}
            last = CellLoop()  # a fresh copy: no hooks on it
            last.load_state_dict(evaluations[-1])
            expected = reference(last, x, target)
            record = steps_of_now(monitor, path)[-1]
            assert len(evaluations) > 1  # several forward + backward passes this step
            assert record["backward_passes"] == len(evaluations)
            got = torch.tensor(record["timesteps"]["cell"]["hidden"], dtype=F64)
            assert got.shape == (300,)  # one evaluation's calls, not 300 x evaluations
            torch.testing.assert_close(got, expected, rtol=F32_RTOL, atol=0.0)
            zeros = expected == 0
            assert zeros[:10].all() and not zeros[-10:].any()  # the case
            assert torch.equal(got == 0, zeros)  # exact zeros stay exactly 0
            assert record["param_norms"] == pytest.approx(grads, rel=F32_RTOL)
            assert "timestep_layout" not in record  # one chain: absent means chain


def steps_of_now(monitor: Any, path: Path) -> list[dict[str, Any]]:
    assert monitor.flush(10.0)
    return steps_of(path)


def test_gradient_accumulation_keeps_every_micro_batch_in_call_order(tmp_path: Path) -> None:
    torch.manual_seed(1)
    model = CellLoop(hidden=6).double()
    batches = [(torch.randn(2, n, dtype=F64), torch.randn(2, 1, dtype=F64)) for n in (5, 3)]
    path = tmp_path / "accumulate.jsonl"
    with watch(model, run="accumulate", every=1, spool=path, diagnose=False) as monitor:
        for x, y in batches:
            (model(x) - y).pow(2).mean().backward()  # .grad accumulates
        monitor.step(None)
        total = {n: p.grad.norm().item() for n, p in model.named_parameters()}  # type: ignore[union-attr]
    (record,) = steps_of(path)
    expected = torch.cat([reference(model, x, y) for x, y in batches])
    got = torch.tensor(record["timesteps"]["cell"]["hidden"], dtype=F64)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=0.0)
    assert record["backward_passes"] == 2
    assert record["param_norms"] == pytest.approx(total, rel=1e-12, abs=0.0)
    # call 5 starts the second micro-batch afresh: the calls are not one chain
    assert record["timestep_layout"] == {"cell": "tree"}


def test_a_second_backward_over_a_retained_graph_adds_up_like_grad(tmp_path: Path) -> None:
    torch.manual_seed(2)
    model = CellLoop(hidden=4).double()
    x, y = torch.randn(3, 6, dtype=F64), torch.randn(3, 1, dtype=F64)
    path = tmp_path / "retain.jsonl"
    with watch(model, run="retain", every=1, spool=path, diagnose=False) as monitor:
        loss = (model(x) - y).pow(2).mean()
        loss.backward(retain_graph=True)
        (2 * loss).backward()  # the same graph again: .grad holds 3x one pass
        monitor.step(loss)
        grads = {n: p.grad.norm().item() for n, p in model.named_parameters()}  # type: ignore[union-attr]
    (record,) = steps_of(path)
    got = torch.tensor(record["timesteps"]["cell"]["hidden"], dtype=F64)
    torch.testing.assert_close(got, 3 * reference(model, x, y), rtol=1e-12, atol=0.0)
    assert record["backward_passes"] == 2
    assert record["param_norms"] == pytest.approx(grads, rel=1e-12, abs=0.0)


def test_calls_after_the_last_backward_are_left_out_and_one_pass_sends_no_count(
    tmp_path: Path,
) -> None:
    torch.manual_seed(3)
    model = CellLoop(hidden=4).double()
    x, y = torch.randn(2, 7, dtype=F64), torch.randn(2, 1, dtype=F64)
    path = tmp_path / "after.jsonl"
    with watch(model, run="after", every=1, spool=path, diagnose=False) as monitor:
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        model(torch.randn(2, 4, dtype=F64))  # with grad on, never back-propagated
        monitor.step(loss)
    (record,) = steps_of(path)
    got = torch.tensor(record["timesteps"]["cell"]["hidden"], dtype=F64)
    torch.testing.assert_close(got, reference(model, x, y), rtol=1e-12, atol=0.0)
    assert "backward_passes" not in record  # one pass: absent (columns stay packed)


def test_a_fused_lstm_under_lbfgs_reports_the_last_evaluations_input_gradient(
    tmp_path: Path,
) -> None:
    torch.manual_seed(4)
    lstm = nn.LSTM(2, 5, batch_first=True).double()
    x, y = torch.randn(3, 8, 2, dtype=F64), torch.randn(3, 5, dtype=F64)
    optimizer = torch.optim.LBFGS(lstm.parameters(), lr=0.3, max_iter=3)
    states: list[dict[str, torch.Tensor]] = []

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        states.append({k: v.detach().clone() for k, v in lstm.state_dict().items()})
        loss = (lstm(x)[0][:, -1] - y).pow(2).sum()
        loss.backward()
        return loss

    path = tmp_path / "fused.jsonl"
    with watch(lstm, run="fused", every=1, spool=path, diagnose=False) as monitor:
        monitor.step(optimizer.step(closure))
    (record,) = steps_of(path)
    last = nn.LSTM(2, 5, batch_first=True).double()
    last.load_state_dict(states[-1])
    leaf = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad((last(leaf)[0][:, -1] - y).pow(2).sum(), [leaf])
    expected = torch.linalg.vector_norm(grad, dim=(0, 2))
    got = torch.tensor(record["timesteps"]["LSTM"]["input"], dtype=F64)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=0.0)
    assert record["backward_passes"] == len(states) > 1
