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


# -- forward calls no backward ran through, made before the step's training forward ---
#
# An evaluate() run without torch.no_grad() (the char-RNN tutorial's) calls the watched
# module with grad on; no backward ever runs through that graph. Its calls are left out,
# before zero_grad() or between zero_grad() and the training forward, as the calls after
# the last backward are. Eval and train lengths differ (longer, shorter) on every step.

EVAL_LENGTHS = (11, 2, 9)
TRAIN_LENGTHS = (5, 6, 4)
WHEN = ("before_zero_grad", "after_zero_grad")


class FusedNet(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.rnn = (nn.RNN if kind == "RNN" else nn.LSTM)(3, 6, batch_first=True)
        self.head = nn.Linear(6, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        result: torch.Tensor = self.head(out[:, -1])
        return result


class HandCell(nn.Module):
    """A cell of the user's own (watched with ``cells=[...]``): h' = tanh(W [x; h])."""

    def __init__(self, inputs: int, hidden: int) -> None:
        super().__init__()
        self.i2h = nn.Linear(inputs + hidden, hidden)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.i2h(torch.cat([x, h], 1)))


class CellNet(nn.Module):
    def __init__(self, kind: str, hidden: int = 6) -> None:
        super().__init__()
        self.hidden = hidden
        self.cell = nn.GRUCell(3, hidden) if kind == "GRUCell" else HandCell(3, hidden)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor, keep: list[torch.Tensor] | None = None) -> torch.Tensor:
        h = x.new_zeros(x.shape[0], self.hidden)
        for t in range(x.shape[1]):
            h = self.cell(x[:, t], h)
            if keep is not None:
                h.retain_grad()  # the truth: autograd's own .grad of every kept output
                keep.append(h)
        out: torch.Tensor = self.head(h)
        return out


def input_norms(x: torch.Tensor) -> torch.Tensor:
    """‖∂L/∂x_t‖₂ over batch and features, from autograd's own ``x.grad``."""
    assert x.grad is not None
    return torch.linalg.vector_norm(x.grad.to(F64), dim=(0, 2))


def output_norms(outputs: list[torch.Tensor]) -> torch.Tensor:
    """‖∂L/∂h_k‖₂ of every kept output, from autograd's own retained ``h.grad``."""
    assert all(h.grad is not None for h in outputs)
    return torch.stack([torch.linalg.vector_norm(h.grad.to(F64)) for h in outputs])  # type: ignore[union-attr]


def train_with_evaluations(
    model: nn.Module, path: Path, when: str, train: Any, **options: Any
) -> list[torch.Tensor]:
    """Three SGD steps, each with an evaluation forward under grad mode (never
    back-propagated) before ``zero_grad()`` or between it and the training forward;
    ``train(length)`` runs the training forward and backward and returns the truth."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    expected = []
    with watch(model, run="eval", every=1, spool=path, diagnose=False, **options) as monitor:
        for evaluated, length in zip(EVAL_LENGTHS, TRAIN_LENGTHS, strict=True):
            if when == "before_zero_grad":
                model(torch.randn(2, evaluated, 3))  # evaluate() without torch.no_grad()
            optimizer.zero_grad()
            if when == "after_zero_grad":
                model(torch.randn(2, evaluated, 3))
            loss, truth = train(length)
            expected.append(truth)
            optimizer.step()
            monitor.step(loss)
    return expected


def assert_series(path: Path, module: str, name: str, expected: list[torch.Tensor]) -> None:
    records = steps_of(path)
    assert len(records) == len(expected)
    for record, want in zip(records, expected, strict=True):
        got = torch.tensor(record["timesteps"][module][name], dtype=F64)
        assert got.shape == want.shape  # the training forward's calls only
        torch.testing.assert_close(got, want, rtol=1e-5, atol=0.0)
        assert "timestep_layout" not in record  # absent: every module's calls are a chain


@pytest.mark.parametrize("when", WHEN)
@pytest.mark.parametrize("kind", ["RNN", "LSTM"])
def test_an_evaluation_forward_with_grad_on_is_left_out_of_a_fused_modules_series(
    tmp_path: Path, kind: str, when: str
) -> None:
    torch.manual_seed(5)
    model = FusedNet(kind)

    def train(length: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(2, length, 3, requires_grad=True)
        loss = (model(x) - 1).pow(2).mean()
        loss.backward()
        return loss, input_norms(x)

    path = tmp_path / "fused_eval.jsonl"
    expected = train_with_evaluations(model, path, when, train)
    assert_series(path, "rnn", "input", expected)


@pytest.mark.parametrize("when", WHEN)
@pytest.mark.parametrize("kind", ["GRUCell", "HandCell"])
def test_an_evaluation_forward_with_grad_on_is_left_out_of_a_cell_loops_series(
    tmp_path: Path, kind: str, when: str
) -> None:
    torch.manual_seed(6)
    model = CellNet(kind)

    def train(length: int) -> tuple[torch.Tensor, torch.Tensor]:
        outputs: list[torch.Tensor] = []
        loss = (model(torch.randn(2, length, 3), outputs) - 1).pow(2).mean()
        loss.backward()
        return loss, output_norms(outputs)

    path = tmp_path / "cell_eval.jsonl"
    options = {"cells": [model.cell]} if kind == "HandCell" else {}
    expected = train_with_evaluations(model, path, when, train, **options)
    assert_series(path, "cell", "hidden", expected)


@pytest.mark.parametrize("kind", ["fused", "cell"])
def test_an_evaluation_between_accumulated_micro_batches_is_left_out(
    tmp_path: Path, kind: str
) -> None:
    torch.manual_seed(7)
    model: nn.Module = FusedNet("LSTM") if kind == "fused" else CellNet("GRUCell")
    micro = [torch.randn(2, n, 3, requires_grad=kind == "fused") for n in (5, 3)]
    path = tmp_path / "accumulate_eval.jsonl"
    outputs: list[list[torch.Tensor]] = [[], []]
    with watch(model, run="accumulate", every=1, spool=path, diagnose=False) as monitor:
        for i, x in enumerate(micro):
            model(torch.randn(2, 8, 3))  # an evaluation with grad on before each micro-batch
            out = model(x) if kind == "fused" else model(x, outputs[i])
            (out - 1).pow(2).mean().backward()  # .grad accumulates
        model(torch.randn(2, 4, 3))  # and one after the last backward
        monitor.step(None)
    (record,) = steps_of(path)
    assert record["backward_passes"] == 2
    if kind == "fused":
        # fresh sequences combine per timestep: the root of the sum of squares
        first, second = (input_norms(x) for x in micro)
        expected = first.square()
        expected[: second.shape[0]] += second.square()
        got = torch.tensor(record["timesteps"]["rnn"]["input"], dtype=F64)
        torch.testing.assert_close(got, expected.sqrt(), rtol=1e-5, atol=0.0)
        assert "timestep_layout" not in record
    else:
        expected = torch.cat([output_norms(hs) for hs in outputs])
        got = torch.tensor(record["timesteps"]["cell"]["hidden"], dtype=F64)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=0.0)
        assert record["timestep_layout"] == {"cell": "tree"}  # two micro-batches


@pytest.mark.parametrize("kind", ["fused", "cell"])
def test_a_leading_call_whose_gradient_is_zero_is_kept(tmp_path: Path, kind: str) -> None:
    """A call a gradient of zero reached is a call of the step (vanishing stays visible):
    only the calls no gradient reached at all, before the first one, are left out."""
    torch.manual_seed(8)
    path = tmp_path / "zero.jsonl"
    if kind == "fused":
        rnn = nn.RNN(3, 4, batch_first=True)
        first = torch.randn(2, 7, 3, requires_grad=True)
        second = torch.randn(2, 4, 3, requires_grad=True)
        with watch(rnn, run="zero", every=1, spool=path, diagnose=False) as monitor:
            rnn(torch.randn(2, 9, 3))  # no backward runs through this one
            loss = (rnn(first)[0] * 0.0).sum() + rnn(second)[0][:, -1].pow(2).sum()
            loss.backward()
            monitor.step(loss)
        assert first.grad is not None and not first.grad.any()  # a gradient, all zeros
        expected = input_norms(first).square()
        expected[:4] += input_norms(second).square()
        got = torch.tensor(steps_of(path)[0]["timesteps"]["RNN"]["input"], dtype=F64)
        assert got.shape == (7,)  # the zero-gradient call's length, not the evaluation's
        torch.testing.assert_close(got, expected.sqrt(), rtol=1e-5, atol=0.0)
        assert (got[4:] == 0).all()
    else:
        cell = nn.GRUCell(3, 4)
        x = torch.randn(6, 2, 3)
        outputs: list[torch.Tensor] = []
        with watch(cell, run="zero", every=1, spool=path, diagnose=False) as monitor:
            h = torch.zeros(2, 4)
            for _ in range(5):
                h = cell(torch.randn(2, 3), h)  # an evaluation, never back-propagated
            h = torch.zeros(2, 4)
            for t in range(6):
                h = cell(x[t], h * 0.0 if t == 2 else h)  # calls 0-1 get a zero gradient
                h.retain_grad()
                outputs.append(h)
            loss = h.pow(2).sum()
            loss.backward()
            monitor.step(loss)
        expected = output_norms(outputs)
        assert (expected[:2] == 0).all() and (expected[2:] > 0).all()
        record = steps_of(path)[0]
        got = torch.tensor(record["timesteps"]["GRUCell"]["hidden"], dtype=F64)
        assert got.shape == (6,)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=0.0)
        assert "timestep_layout" not in record  # h * 0.0 still feeds the chain


@pytest.mark.parametrize("kind", ["fused", "cell"])
def test_a_module_no_gradient_reaches_keeps_its_zeros_and_is_named(
    tmp_path: Path, kind: str
) -> None:
    """A recurrent module whose output is detached on the way to the loss gets nothing:
    its series stays, all zeros, one per call, and no_gradient names it."""
    torch.manual_seed(0)
    rnn: nn.Module = nn.GRU(3, 4) if kind == "fused" else nn.GRUCell(3, 4)
    head = nn.Linear(3 + 4, 1)
    model = nn.ModuleDict({"rnn": rnn, "head": head})
    path = tmp_path / "detached.jsonl"
    lengths = [5, 7, 4, 6]
    with watch(model, run="detached", spool=path, every=1) as monitor:
        for length in lengths:
            x = torch.randn(length, 2, 3, requires_grad=True)
            if kind == "fused":
                out, _ = rnn(x)
                last = out[-1]
            else:
                h = torch.zeros(2, 4)
                for t in range(length):
                    h = rnn(x[t], h)
                last = h
            loss = head(torch.cat([x[-1], last.detach()], dim=1)).square().mean()
            loss.backward()
            monitor.step(loss)
    records = [r for m in read_spool(path) if m["type"] == "batch" for r in m["records"]]
    steps = [r for r in records if r["kind"] == "step"]
    series = [next(iter(r["timesteps"]["rnn"].values())) for r in steps]
    assert [len(s) for s in series] == lengths
    assert all(v == 0.0 for s in series for v in s)
    named = {a["subject"] for a in records if a["kind"] == "alert" and a["code"] == "no_gradient"}
    assert "rnn" in named
