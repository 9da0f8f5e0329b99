"""exact_hidden: the exact ∂L/∂h_t of fused layers on sampled steps.

The reference is independent of gradwatch's unrolled recomputation: it runs the fused
module on x[:t+1], cuts the state there into a leaf, runs the rest from that leaf, and
reads the leaf's gradient, the total derivative ∂L/∂h_t through every later timestep.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from gradwatch.trainer_hooks.quantities.timesteps import RecurrentTimesteps

F64 = torch.float64
T = 8


def series(record: dict[str, Any], name: str) -> torch.Tensor:
    return torch.tensor(record["timesteps"]["rnn"][name], dtype=F64)


def loss_of(out: torch.Tensor) -> torch.Tensor:
    w = torch.arange(1, out.shape[0] + 1, dtype=out.dtype).view(-1, 1, 1)
    return (out.tanh() * w).square().sum() * 0.1


def split_reference(rnn: nn.RNNBase, x: torch.Tensor, t: int) -> tuple[float, float | None]:
    """‖∂L/∂h_t‖, ‖∂L/∂c_t‖ of the top layer, by cutting the sequence after t."""
    lstm = isinstance(rnn, nn.LSTM)
    head, state = rnn(x[: t + 1])
    h_all = state[0] if lstm else state
    h_leaf = h_all.detach().requires_grad_()
    c_leaf = state[1].detach().requires_grad_() if lstm else None
    carried = (h_leaf, c_leaf) if lstm else h_leaf
    # the top layer's h_t is also output t: use the leaf there so both paths count
    outs = [head[:t].detach(), h_leaf[-1:]]
    if t + 1 < x.shape[0]:
        outs.append(rnn(x[t + 1 :], carried)[0])
    loss_of(torch.cat(outs)).backward()
    assert h_leaf.grad is not None
    c_norm = None
    if c_leaf is not None:
        # c_leaf only carries the path through later steps (zero after the last step);
        # add the path through h_t = o_t * tanh(c_t), with o_t = h_t / tanh(c_t)
        later = c_leaf.grad[-1] if c_leaf.grad is not None else torch.zeros_like(c_leaf[-1])
        h_t, tanh_c = h_all[-1].detach(), state[1][-1].detach().tanh()
        through_h = h_leaf.grad[-1] * (h_t / tanh_c) * (1 - tanh_c.square())
        c_norm = float(torch.linalg.vector_norm(later + through_h))
    return float(torch.linalg.vector_norm(h_leaf.grad[-1])), c_norm


class Wrap(nn.Module):
    def __init__(self, rnn: nn.RNNBase) -> None:
        super().__init__()
        self.rnn = rnn


@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRU, nn.RNN])
@pytest.mark.parametrize("layers", [1, 2])
def test_exact_hidden_equals_the_split_sequence_reference(
    kind: type, layers: int, captured_step: Any,
) -> None:
    torch.manual_seed(layers)
    model = Wrap(kind(3, 5, num_layers=layers).double())
    x = torch.randn(T, 4, 3, dtype=F64)
    record = captured_step(model, lambda: loss_of(model.rnn(x)[0]).backward(), exact_hidden=True)
    refs = [split_reference(model.rnn, x, t) for t in range(T)]
    expected_h = torch.tensor([h for h, _ in refs], dtype=F64)
    torch.testing.assert_close(series(record, "hidden"), expected_h, rtol=1e-10, atol=0.0)
    if kind is nn.LSTM:
        expected_c = torch.tensor([c for _, c in refs], dtype=F64)
        torch.testing.assert_close(series(record, "cell"), expected_c, rtol=1e-10, atol=0.0)
    # the loss sees output t directly, but h_t's total gradient is more than that
    out_grad_only = series(record, "hidden")[-1]
    assert out_grad_only > 0


def test_layer_series_is_the_gradient_reaching_the_upper_layer(captured_step: Any) -> None:
    torch.manual_seed(5)
    model = Wrap(nn.LSTM(3, 4, num_layers=2).double())
    x = torch.randn(T, 2, 3, dtype=F64)
    record = captured_step(model, lambda: loss_of(model.rnn(x)[0]).backward(), exact_hidden=True)
    lower, upper = nn.LSTM(3, 4).double(), nn.LSTM(4, 4).double()
    with torch.no_grad():
        for name, p in model.rnn.named_parameters():
            target = lower if name.endswith("l0") else upper
            getattr(target, name[:-1] + "0").copy_(p)
    mid = lower(x)[0]
    mid.retain_grad()
    loss_of(upper(mid)[0]).backward()
    assert mid.grad is not None
    expected = torch.linalg.vector_norm(mid.grad, dim=(1, 2))
    torch.testing.assert_close(series(record, "layer1"), expected, rtol=1e-12, atol=0.0)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_sampled_steps_give_the_fused_outputs_and_gradients(
    batch_first: bool, bidirectional: bool, captured_step: Any,
) -> None:
    torch.manual_seed(6)
    model = Wrap(nn.LSTM(3, 4, 2, batch_first=batch_first, bidirectional=bidirectional).double())
    x = torch.randn(5, T, 3, dtype=F64)
    h0 = torch.randn(2 * (1 + bidirectional), 5, 4, dtype=F64)
    state = (h0, h0.cos())
    if not batch_first:
        x = x.transpose(0, 1).contiguous()

    def run() -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        out, (h, c) = model.rnn(x, state)
        (out.sin().sum() + h.square().sum() + c.sum()).backward()
        return torch.cat([out.flatten(), h.flatten(), c.flatten()]), [
            p.grad.clone() for p in model.parameters() if p.grad is not None
        ]

    plain_out, plain_grads = run()
    seen: dict[str, Any] = {}

    def captured() -> None:
        seen["out"], seen["grads"] = run()

    record = captured_step(model, captured, exact_hidden=True)
    torch.testing.assert_close(seen["out"], plain_out, rtol=1e-12, atol=1e-12)
    for got, want in zip(seen["grads"], plain_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert len(record["timesteps"]["rnn"]["hidden"]) == T
    assert len(record["timesteps"]["rnn"]["layer1"]) == T


def test_exact_hidden_every_n_samples_only_every_nth_captured_step() -> None:
    model = Wrap(nn.GRU(2, 3))
    q = RecurrentTimesteps(exact_hidden=3)
    q.attach(model)
    got = []
    for _ in range(7):
        q.start_step(True)
        model.rnn(torch.randn(4, 1, 2))[0].sum().backward()
        got.append(sorted(q.finish_step(None)["timesteps"]["rnn"]))
    q.detach()
    with_hidden = [i for i, names in enumerate(got) if "hidden" in names]
    assert with_hidden == [0, 3, 6]
    assert all("input" in names for names in got)


@pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")
def test_exact_hidden_skips_projected_lstm_with_one_warning(captured_step: Any) -> None:
    from gradwatch.protocol.warnings import GradwatchWarning

    model = Wrap(nn.LSTM(2, 4, proj_size=2))
    with pytest.warns(GradwatchWarning, match="proj_size"):
        record = captured_step(
            model, lambda: model.rnn(torch.randn(3, 1, 2))[0].sum().backward(), exact_hidden=True
        )
    assert set(record["timesteps"]["rnn"]) == {"input"}


def test_packed_input_keeps_the_fused_output_and_its_input_series(captured_step: Any) -> None:
    from torch.nn.utils.rnn import pack_padded_sequence

    torch.manual_seed(7)
    model = Wrap(nn.GRU(2, 3).double())
    x = torch.randn(6, 3, 2, dtype=F64)
    packed = pack_padded_sequence(x, torch.tensor([6, 4, 2]))
    plain = model.rnn(packed)[0].data.detach()
    seen: dict[str, torch.Tensor] = {}

    def run() -> None:
        out = model.rnn(packed)[0].data
        seen["out"] = out.detach()
        out.sum().backward()

    record = captured_step(model, run, exact_hidden=True)
    assert torch.equal(seen["out"], plain)  # the fused output, bit for bit
    assert set(record["timesteps"]["rnn"]) == {"input"}
    assert len(record["timesteps"]["rnn"]["input"]) == 6
