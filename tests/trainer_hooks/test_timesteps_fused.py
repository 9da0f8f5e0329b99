"""Fused nn.LSTM/GRU/RNN: the "input" series equals autograd's ‖∂L/∂x_t‖₂ exactly."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from gradwatch.trainer_hooks.quantities.timesteps import RecurrentTimesteps

F64 = torch.float64
FUSED = {"LSTM": nn.LSTM, "GRU": nn.GRU, "RNN": nn.RNN}


def series(record: dict[str, Any], module: str, name: str) -> torch.Tensor:
    return torch.tensor(record["timesteps"][module][name], dtype=F64)


def per_step_norm(grad: torch.Tensor, time_dim: int) -> torch.Tensor:
    dims = [d for d in range(grad.dim()) if d != time_dim]
    return torch.linalg.vector_norm(grad.to(F64), dim=dims)


def autograd_input_grad(model: nn.Module, x: torch.Tensor, loss_of: Any) -> torch.Tensor:
    xr = x.detach().clone().requires_grad_()
    (grad,) = torch.autograd.grad(loss_of(model(xr)), xr)
    return grad


def loss_of(output: Any) -> torch.Tensor:
    out, state = output
    h = state[0] if isinstance(state, tuple) else state
    # weights per timestep, so every t gets a different, non-trivial gradient
    w = torch.linspace(0.1, 1.0, out.shape[-1], dtype=out.dtype)
    return (out.tanh() * w).square().sum() + h.sum()


@pytest.mark.parametrize("kind", list(FUSED))
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_input_series_equals_autograd_for_every_fused_layout(
    kind: str, layers: int, batch_first: bool, bidirectional: bool, captured_step: Any,
) -> None:
    torch.manual_seed(layers * 10 + batch_first * 2 + bidirectional)
    model = FUSED[kind](
        3, 6, num_layers=layers, batch_first=batch_first, bidirectional=bidirectional
    ).double()
    x = torch.randn(4, 9, 3, dtype=F64)  # (B, T, F) if batch_first else (T, B, F)
    record = captured_step(model, lambda: loss_of(model(x)).backward())
    expected = per_step_norm(autograd_input_grad(model, x, loss_of), 1 if batch_first else 0)
    got = series(record, kind, "input")
    assert got.shape == (x.shape[1 if batch_first else 0],)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=0.0)


def test_raw_input_that_does_not_require_grad_is_captured_and_left_untouched(
    captured_step: Any,
) -> None:
    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module("rnn", nn.GRU(2, 5, batch_first=True).double())
    x = torch.randn(3, 11, 2, dtype=F64)
    record = captured_step(model, lambda: model.rnn(x)[0].sum().backward())
    assert not x.requires_grad and x.grad is None and x.grad_fn is None
    expected = per_step_norm(autograd_input_grad(model.rnn, x, lambda o: o[0].sum()), 1)
    torch.testing.assert_close(series(record, "rnn", "input"), expected, rtol=1e-12, atol=0.0)


def test_input_that_requires_grad_keeps_its_own_gradient_unchanged(captured_step: Any) -> None:
    torch.manual_seed(1)
    model = nn.LSTM(2, 4).double()
    x = torch.randn(6, 2, 2, dtype=F64, requires_grad=True)
    record = captured_step(model, lambda: loss_of(model(x)).backward())
    assert x.grad is not None
    torch.testing.assert_close(x.grad, autograd_input_grad(model, x, loss_of), rtol=0, atol=0)
    torch.testing.assert_close(
        series(record, "LSTM", "input"), per_step_norm(x.grad, 0), rtol=1e-12, atol=0.0
    )


def test_unbatched_input_runs_time_along_dim_zero(captured_step: Any) -> None:
    torch.manual_seed(2)
    model = nn.RNN(3, 4).double()
    x = torch.randn(8, 3, dtype=F64)
    record = captured_step(model, lambda: loss_of(model(x)).backward())
    expected = per_step_norm(autograd_input_grad(model, x, loss_of), 0)
    torch.testing.assert_close(series(record, "RNN", "input"), expected, rtol=1e-12, atol=0.0)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_packed_sequence_sums_only_the_rows_present_at_each_timestep(
    bidirectional: bool, captured_step: Any,
) -> None:
    torch.manual_seed(3)
    model = nn.LSTM(2, 5, num_layers=2, batch_first=True, bidirectional=bidirectional).double()
    padded = torch.randn(4, 7, 2, dtype=F64)
    lengths = torch.tensor([3, 7, 5, 1])

    def run(x: torch.Tensor) -> torch.Tensor:
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = pad_packed_sequence(model(packed)[0], batch_first=True)
        return (out.tanh() ** 2).sum()

    record = captured_step(model, lambda: run(padded).backward())
    xr = padded.clone().requires_grad_()
    run(xr).backward()
    assert xr.grad is not None
    # padded positions get zero gradient, so the padded per-t norm is the packed one
    expected = per_step_norm(xr.grad, 1)
    torch.testing.assert_close(series(record, "LSTM", "input"), expected, rtol=1e-12, atol=0.0)


def test_fp32_lstm_over_121_steps_keeps_early_values_that_fp32_squares_lose(
    captured_step: Any,
) -> None:
    torch.manual_seed(4)
    model = nn.LSTM(1, 16, batch_first=True)
    with torch.no_grad():  # a forgetful LSTM: gradient shrinks ~0.6x per step back in time
        model.bias_ih_l0[16:32].fill_(-0.4)
        model.bias_hh_l0[16:32].zero_()
        model.weight_hh_l0.mul_(0.3)
    x = torch.randn(121, 121, 1)

    def loss() -> torch.Tensor:
        out, _ = model(x)
        return out[:, -1].square().sum()  # the loss sees only the last step

    record = captured_step(model, lambda: loss().backward())
    got = series(record, "LSTM", "input")
    xr = x.clone().requires_grad_()
    out, _ = model(xr)
    out[:, -1].square().sum().backward()
    assert xr.grad is not None
    expected = per_step_norm(xr.grad, 1)  # float64 norm of autograd's fp32 gradient
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=0.0)
    fp32_norms = torch.linalg.vector_norm(xr.grad, dim=(0, 2))
    assert got[0] > 0.0 and got[0] < 1e-19  # tiny but kept
    assert fp32_norms[0] == 0.0  # what an fp32 norm would have shown
    assert bool((got > 0).all())


def test_chunks_that_carry_the_state_append_their_timesteps(captured_step: Any) -> None:
    torch.manual_seed(5)
    model = nn.LSTM(2, 4, batch_first=True).double()
    x = torch.randn(3, 12, 2, dtype=F64)
    chunks = x.split(4, dim=1)

    def truncated_bptt() -> None:
        state = None
        for chunk in chunks:  # carried state, detached between chunks
            out, state = model(chunk, state)
            out.square().sum().backward()
            state = tuple(s.detach() for s in state)

    record = captured_step(model, truncated_bptt)
    expected = []
    state = None
    for chunk in chunks:
        xr = chunk.clone().requires_grad_()
        out, state = model(xr, state)
        out.square().sum().backward()
        state = tuple(s.detach() for s in state)
        assert xr.grad is not None
        expected.append(per_step_norm(xr.grad, 1))
    got = series(record, "LSTM", "input")
    assert got.shape == (12,)
    torch.testing.assert_close(got, torch.cat(expected), rtol=1e-12, atol=0.0)


def test_micro_batches_without_carried_state_combine_as_one_batch(captured_step: Any) -> None:
    torch.manual_seed(6)
    model = nn.GRU(2, 4).double()
    micro = [torch.randn(10, 3, 2, dtype=F64), torch.randn(10, 5, 2, dtype=F64)]

    def accumulate() -> None:
        for x in micro:
            loss_of(model(x)).backward()

    record = captured_step(model, accumulate)
    grads = [autograd_input_grad(model, x, loss_of) for x in micro]
    expected = per_step_norm(torch.cat(grads, dim=1), 0)  # norm over the union of batches
    torch.testing.assert_close(series(record, "GRU", "input"), expected, rtol=1e-12, atol=0.0)


def test_names_of_nested_modules_are_their_qualified_names() -> None:
    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = nn.ModuleDict({"lstm": nn.LSTM(2, 3)})

    model = Stack()
    q = RecurrentTimesteps()
    q.attach(model)
    assert q.modules == ["encoder.lstm"]
    q.detach()
