"""Stacked fused layers: "layer<i>" equals autograd's ‖∂L/∂(input of layer i)‖₂ per t.

The reference is plain autograd through the layers run as separate single-layer fused
modules with the same weights, inter-layer dropout drawn with F.dropout from the same
seed (the CPU kernel draws its masks that way), each upper layer's input retaining its
gradient. No gradwatch code runs in the reference.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence
from torch.overrides import TorchFunctionMode

from gradwatch.trainer_hooks.quantities.timesteps import RecurrentTimesteps

F64 = torch.float64
FUSED = {"LSTM": nn.LSTM, "GRU": nn.GRU, "RNN": nn.RNN}


class Wrap(nn.Module):
    def __init__(self, rnn: nn.RNNBase) -> None:
        super().__init__()
        self.rnn = rnn


def series(record: dict[str, Any], name: str) -> torch.Tensor:
    return torch.tensor(record["timesteps"]["rnn"][name], dtype=F64)


def single_layers(rnn: nn.RNNBase) -> list[nn.RNNBase]:
    """One single-layer module per layer of ``rnn``, with that layer's weights."""
    dirs = 2 if rnn.bidirectional else 1
    out = []
    for layer in range(rnn.num_layers):
        size = rnn.input_size if layer == 0 else rnn.hidden_size * dirs
        one = type(rnn)(size, rnn.hidden_size, batch_first=rnn.batch_first,
                        bidirectional=rnn.bidirectional).to(F64)  # fmt: skip
        if isinstance(rnn, nn.RNN):
            one.nonlinearity = rnn.nonlinearity
            one.mode = rnn.mode
        with torch.no_grad():
            for name, p in one.named_parameters():
                p.copy_(getattr(rnn, name.replace("_l0", f"_l{layer}")))
        one.train(rnn.training)
        out.append(one)
    return out


def reference(
    rnn: nn.RNNBase, x: Any, loss_of: Any, seed: int
) -> tuple[Any, list[torch.Tensor], list[torch.Tensor]]:
    """(output, the upper layers' inputs with their .grad, parameter gradients)."""
    layers = single_layers(rnn)  # (their initialisation draws from the generator)
    torch.manual_seed(seed)
    inputs = []
    h = x
    for i, one in enumerate(layers):
        if i:
            data = h.data if isinstance(h, PackedSequence) else h
            if rnn.dropout and rnn.training:
                data = F.dropout(data, rnn.dropout, training=True)
            data.retain_grad()
            inputs.append(data)
            h = (
                PackedSequence(data, h.batch_sizes, h.sorted_indices, h.unsorted_indices)
                if isinstance(h, PackedSequence)
                else data
            )
        h = one(h)[0]
    loss_of(h).backward()
    grads = [p.grad for one in layers for p in one.parameters()]
    return h, inputs, grads


def per_t(grad: torch.Tensor, time_dim: int) -> torch.Tensor:
    dims = [d for d in range(grad.dim()) if d != time_dim]
    return torch.linalg.vector_norm(grad, dim=dims)


def weighted(out: Any) -> torch.Tensor:
    data = out.data if isinstance(out, PackedSequence) else out
    w = torch.linspace(0.2, 1.0, data.shape[-1], dtype=data.dtype)
    return (data.tanh() * w).square().sum()


@pytest.mark.parametrize("kind", list(FUSED))
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("dropout", [0.0, 0.4])
def test_layer_series_equal_autograd_through_separate_layers(
    kind: str, batch_first: bool, bidirectional: bool, dropout: float, captured_step: Any
) -> None:
    torch.manual_seed(3)
    model = Wrap(FUSED[kind](3, 5, num_layers=3, batch_first=batch_first,
                             bidirectional=bidirectional, dropout=dropout).to(F64))  # fmt: skip
    x = torch.randn(4, 9, 3, dtype=F64)  # (B, T, F)
    if not batch_first:
        x = x.transpose(0, 1).contiguous()
    seen: dict[str, Any] = {}

    def step() -> None:
        torch.manual_seed(11)
        out = model.rnn(x)[0]
        seen["out"] = out.detach()
        weighted(out).backward()
        seen["rng"] = torch.get_rng_state()

    record = captured_step(model, step)
    ref_out, inputs, ref_grads = reference(model.rnn, x, weighted, seed=11)
    time_dim = 1 if batch_first else 0
    assert set(record["timesteps"]["rnn"]) == {"input", "layer1", "layer2"}
    for i, mid in enumerate(inputs, start=1):
        assert mid.grad is not None
        got = series(record, f"layer{i}")
        assert got.shape == (9,)
        torch.testing.assert_close(got, per_t(mid.grad, time_dim), rtol=1e-12, atol=0.0)
    # what the model computes is the fused module's own, dropout masks included
    torch.testing.assert_close(seen["out"], ref_out.detach(), rtol=1e-12, atol=1e-14)
    for got_g, want in zip([p.grad for p in model.parameters()], ref_grads, strict=True):
        torch.testing.assert_close(got_g, want, rtol=1e-10, atol=1e-13)
    # and the generator stands where the fused forward alone leaves it
    torch.manual_seed(11)
    plain = model.rnn(x)[0]
    assert torch.equal(seen["out"], plain.detach())
    assert torch.equal(seen["rng"], torch.get_rng_state())


@pytest.mark.parametrize("bidirectional", [False, True])
def test_packed_input_gets_layer_series_over_the_rows_present(
    bidirectional: bool, captured_step: Any
) -> None:
    torch.manual_seed(4)
    model = Wrap(nn.GRU(2, 4, num_layers=2, bidirectional=bidirectional).to(F64))
    x = torch.randn(7, 3, 2, dtype=F64)
    lengths = torch.tensor([4, 7, 2])  # unsorted: sorted_indices are used
    packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
    h0 = torch.randn(2 * (1 + bidirectional), 3, 4, dtype=F64)
    plain_out, plain_h = model.rnn(packed, h0)
    seen: dict[str, Any] = {}

    def step() -> None:
        out, h = model.rnn(packed, h0)
        seen["out"], seen["h"] = out.data.detach(), h.detach()
        (weighted(out) + h.sum()).backward()

    record = captured_step(model, step)
    torch.testing.assert_close(seen["out"], plain_out.data.detach(), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(seen["h"], plain_h.detach(), rtol=1e-12, atol=1e-14)
    lower, upper = single_layers(model.rnn)
    dirs = 1 + bidirectional
    mid, h_low = lower(packed, h0[:dirs])
    mid.data.retain_grad()
    out, h_up = upper(mid, h0[dirs:])
    (weighted(out) + h_low.sum() + h_up.sum()).backward()
    index = torch.repeat_interleave(torch.arange(7), packed.batch_sizes)
    rows = torch.linalg.vector_norm(mid.data.grad, dim=1).square()
    expected = torch.zeros(7, dtype=F64).index_add_(0, index, rows).sqrt()
    torch.testing.assert_close(series(record, "layer1"), expected, rtol=1e-12, atol=0.0)


@pytest.mark.parametrize("batch_first", [False, True])
def test_unbatched_input_and_a_given_lstm_state(batch_first: bool, captured_step: Any) -> None:
    torch.manual_seed(5)
    model = Wrap(nn.LSTM(2, 3, num_layers=2, batch_first=batch_first).to(F64))
    x = torch.randn(6, 2, dtype=F64)  # (T, F)
    state = (torch.randn(2, 3, dtype=F64), torch.randn(2, 3, dtype=F64))
    plain = model.rnn(x, state)
    seen: dict[str, Any] = {}

    def step() -> None:
        out, (h, c) = model.rnn(x, state)
        seen["all"] = [out.detach(), h.detach(), c.detach()]
        (weighted(out) + h.sum() + c.square().sum()).backward()

    record = captured_step(model, step)
    for got, want in zip(seen["all"], [plain[0], *plain[1]], strict=True):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want.detach(), rtol=1e-12, atol=1e-14)
    lower, upper = single_layers(model.rnn)
    mid, (h1, c1) = lower(x, (state[0][:1], state[1][:1]))
    mid.retain_grad()
    out, (h2, c2) = upper(mid, (state[0][1:], state[1][1:]))
    (weighted(out) + h1.sum() + h2.sum() + c1.square().sum() + c2.square().sum()).backward()
    torch.testing.assert_close(series(record, "layer1"), per_t(mid.grad, 0), rtol=1e-12, atol=0.0)


def test_chunks_that_carry_the_state_append_their_layer_timesteps(captured_step: Any) -> None:
    torch.manual_seed(6)
    model = Wrap(nn.LSTM(2, 3, num_layers=2).to(F64))
    x = torch.randn(10, 2, 2, dtype=F64)

    def step() -> None:
        out1, state = model.rnn(x[:4])
        out2, _ = model.rnn(x[4:], state)
        weighted(torch.cat([out1, out2])).backward()

    record = captured_step(model, step)
    lower, upper = single_layers(model.rnn)
    mid = lower(x)[0]
    mid.retain_grad()
    weighted(upper(mid)[0]).backward()
    torch.testing.assert_close(series(record, "layer1"), per_t(mid.grad, 0), rtol=1e-12, atol=0.0)


class KernelCalls(TorchFunctionMode):
    """Counts the fused kernel calls (torch._VF.gru and friends)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if getattr(func, "__name__", "") in {"lstm", "gru", "rnn_tanh", "rnn_relu"}:
            self.calls += 1
        return func(*args, **(kwargs or {}))


def test_a_heavy_step_runs_each_layer_once_and_a_light_step_the_fused_kernel() -> None:
    stacked, single = Wrap(nn.GRU(2, 3, num_layers=2)), Wrap(nn.GRU(2, 3))
    x = torch.randn(5, 2, 2)
    counts = {}
    for label, model, heavy in (("light", stacked, False), ("heavy", stacked, True),
                                ("single", single, True)):  # fmt: skip
        q = RecurrentTimesteps()
        q.attach(model)
        q.start_step(heavy)
        with KernelCalls() as mode:
            model.rnn(x)[0].sum().backward()
        payload = q.finish_step(None)
        q.detach()
        counts[label] = (mode.calls, sorted(payload.get("timesteps", {}).get("rnn", {})))
    assert counts["light"] == (1, [])
    # one call per layer in place of the fused one: nothing is computed twice
    assert counts["heavy"] == (2, ["input", "layer1"])
    assert counts["single"] == (1, ["input"])


def test_a_forward_that_raises_leaves_no_mode_behind_and_the_next_step_captures() -> None:
    model = Wrap(nn.LSTM(2, 3, num_layers=2))
    q = RecurrentTimesteps()
    q.attach(model)
    depth = torch._C._len_torch_function_stack()
    q.start_step(True)
    wrong_state = (torch.zeros(1, 2, 3), torch.zeros(1, 2, 3))  # one layer's state, not two
    with pytest.raises(RuntimeError, match="Expected hidden"):
        model.rnn(torch.randn(4, 2, 2), wrong_state)
    q.start_step(True)
    assert torch._C._len_torch_function_stack() == depth
    model.rnn(torch.randn(4, 2, 2))[0].sum().backward()
    assert sorted(q.finish_step(None)["timesteps"]["rnn"]) == ["input", "layer1"]
    q.start_step(True)
    with pytest.raises(RuntimeError, match="Expected hidden"):
        model.rnn(torch.randn(4, 2, 2), wrong_state)
    q.detach()
    assert torch._C._len_torch_function_stack() == depth
