"""The timesteps capture around the training loop: it never changes a gradient, leaves
no trace after detach, stays out of no_grad passes, and survives retain_graph,
create_graph and activation checkpointing."""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from gradwatch.trainer_hooks.quantities.timesteps import RecurrentTimesteps

F64 = torch.float64


class Net(nn.Module):
    """A fused LSTM feeding a GRUCell loop: both kinds of capture at once."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(2, 4, num_layers=2, batch_first=True)
        self.cell = nn.GRUCell(4, 3)
        self.head = nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        h = out.new_zeros(out.shape[0], 3)
        for t in range(out.shape[1]):
            h = self.cell(out[:, t], h)
        return self.head(h)


def make(seed: int = 0) -> tuple[Net, torch.Tensor]:
    torch.manual_seed(seed)
    return Net().double(), torch.randn(3, 6, 2, dtype=F64)


def host(payload: dict[str, Any]) -> dict[str, Any]:
    return {m: {k: v.cpu() for k, v in s.items()} for m, s in payload.get("timesteps", {}).items()}


def train_step(model: Net, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad()
    out = model(x)
    out.square().sum().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def hook_state(model: nn.Module) -> list[tuple[str, int, int, int, int]]:
    return [
        (
            name,
            len(m._forward_hooks),
            len(m._forward_pre_hooks),
            len(m._backward_hooks),
            len(m._forward_hooks_with_kwargs) + len(m._forward_pre_hooks_with_kwargs),
        )
        for name, m in model.named_modules()
    ]


@pytest.mark.parametrize("exact_hidden", [False, True])
def test_capturing_never_changes_outputs_or_gradients(exact_hidden: bool) -> None:
    model, x = make()
    plain_out, plain_grads = train_step(model, x)
    q = RecurrentTimesteps(exact_hidden=exact_hidden)
    q.attach(model)
    q.start_step(True)
    out, grads = train_step(model, x)
    assert set(q.finish_step(None)["timesteps"]) == {"lstm", "cell"}
    q.detach()
    tol = {"rtol": 1e-12, "atol": 1e-14} if exact_hidden else {"rtol": 0.0, "atol": 0.0}
    torch.testing.assert_close(out, plain_out, **tol)
    for got, want in zip(grads, plain_grads, strict=True):
        torch.testing.assert_close(got, want, **tol)


def test_detach_leaves_the_model_exactly_as_it_was() -> None:
    model, x = make()
    before = hook_state(model)
    plain_out, plain_grads = train_step(model, x)
    q = RecurrentTimesteps(cells=["head"], exact_hidden=True)
    q.attach(model)
    assert hook_state(model) != before
    q.start_step(True)
    train_step(model, x)
    q.finish_step(None)
    q.detach()
    q.detach()  # twice is fine
    assert hook_state(model) == before
    out, grads = train_step(model, x)
    assert torch.equal(out, plain_out)
    assert all(torch.equal(a, b) for a, b in zip(grads, plain_grads, strict=True))
    assert q.modules == []


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_passes_without_grad_register_nothing_and_raise_nothing(mode: Any) -> None:
    model, x = make()
    q = RecurrentTimesteps(exact_hidden=True)
    q.attach(model)
    q.start_step(True)
    with mode():
        out = model(x)
    assert not out.requires_grad
    assert q.finish_step(None) == {}
    q.detach()


def test_a_step_not_captured_leaves_the_input_as_it_came() -> None:
    model, x = make()
    q = RecurrentTimesteps()
    q.attach(model)
    seen: list[torch.Tensor] = []
    handle = model.lstm.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    q.start_step(False)
    model(x).sum().backward()
    assert seen[0] is x
    assert q.finish_step(None) == {}
    handle.remove()
    q.detach()


def input_norms(x: torch.Tensor) -> torch.Tensor:
    assert x.grad is not None
    return torch.linalg.vector_norm(x.grad, dim=(0, 2))  # x is (B, T, F)


def test_a_second_backward_over_a_retained_graph_adds_up_like_grad() -> None:
    model, x = make()
    x.requires_grad_()
    q = RecurrentTimesteps()
    q.attach(model)
    q.start_step(True)
    loss = model(x).square().sum()
    loss.backward(retain_graph=True)
    first = host(q.finish_step(None))
    loss.backward()
    second = host(q.finish_step(None))
    q.detach()
    # x.grad holds both passes, and so does the input series
    torch.testing.assert_close(second["lstm"]["input"], input_norms(x), rtol=1e-12, atol=0.0)
    for module, series in first.items():  # the same gradient twice: twice the norm
        for name, values in series.items():
            torch.testing.assert_close(second[module][name], 2 * values, rtol=1e-12, atol=0.0)


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True:UserWarning")
def test_create_graph_then_a_double_backward_add_up_like_grad() -> None:
    model, x = make()
    q = RecurrentTimesteps()
    q.attach(model)
    q.start_step(True)
    model(x).square().sum().backward()
    plain = host(q.finish_step(None))
    q.start_step(True)
    model.zero_grad()
    x.requires_grad_()
    model(x).square().sum().backward(create_graph=True)
    first = host(q.finish_step(None))
    for module, series in plain.items():  # first order: as without create_graph
        for name, values in series.items():
            torch.testing.assert_close(first[module][name], values, rtol=1e-12, atol=0.0)
    penalty = sum(p.grad.square().sum() for p in model.parameters())  # type: ignore[union-attr]
    penalty.backward()  # reaches the same forward graph: x.grad adds second-order terms
    both = host(q.finish_step(None))
    q.detach()
    torch.testing.assert_close(both["lstm"]["input"], input_norms(x), rtol=1e-12, atol=0.0)
    assert not torch.equal(both["lstm"]["input"], first["lstm"]["input"])
    for p in model.parameters():
        p.grad = None  # break the parameter <-> gradient cycle create_graph made


@pytest.mark.parametrize("reentrant", [False, True])
def test_activation_checkpointing_gives_the_same_series(reentrant: bool) -> None:
    model, x = make()
    q = RecurrentTimesteps()
    q.attach(model)
    q.start_step(True)
    model(x).square().sum().backward()
    plain = host(q.finish_step(None))
    q.start_step(True)
    x_in = x.clone().requires_grad_(reentrant)  # reentrant needs an input that requires grad
    out = checkpoint(model, x_in, use_reentrant=reentrant)
    out.square().sum().backward()
    checked = host(q.finish_step(None))
    q.detach()
    assert checked.keys() == plain.keys()
    for module, series in plain.items():
        for name, values in series.items():
            torch.testing.assert_close(checked[module][name], values, rtol=1e-12, atol=0.0)


class StackedLast(nn.Module):
    """A checkpointed region that ends with a stacked LSTM: in backward, non-reentrant
    checkpointing stops its recomputation inside the LSTM's forward."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(2, 4, num_layers=2, batch_first=True)
        self.head = nn.Linear(4, 1)

    def body(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return out


@pytest.mark.parametrize("exact_hidden", [False, True])
@pytest.mark.parametrize("reentrant", [False, True])
def test_a_checkpointed_region_ending_in_the_lstm_trains_as_without_gradwatch(
    reentrant: bool, exact_hidden: bool
) -> None:
    torch.manual_seed(5)
    model, x = StackedLast().double(), torch.randn(3, 6, 2, dtype=F64)
    q = RecurrentTimesteps(exact_hidden=exact_hidden)
    q.attach(model)
    q.start_step(True)
    model.head(model.body(x)).square().sum().backward()
    plain = host(q.finish_step(None))
    plain_grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    q.start_step(True)
    x_in = x.clone().requires_grad_(reentrant)
    # the per-layer split (or the exact-hidden unroll) runs again in backward, where
    # checkpointing raises its stop signal from inside it: it must reach checkpointing
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        out = checkpoint(model.body, x_in, use_reentrant=reentrant)
        model.head(out).square().sum().backward()
    checked = host(q.finish_step(None))
    q.detach()
    assert [str(w.message) for w in said] == []  # no capture "failed": nothing did
    assert torch._C._len_torch_function_stack() == 0  # the split's mode was popped
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert len(grads) == len(plain_grads) == 10
    for got, want in zip(grads, plain_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=0.0)
    assert set(plain["lstm"]) == {"input", "layer1", *(["hidden", "cell"] if exact_hidden else [])}
    assert checked.keys() == plain.keys()
    for module, series in plain.items():
        assert checked[module].keys() == series.keys()
        for name, values in series.items():
            torch.testing.assert_close(checked[module][name], values, rtol=1e-12, atol=0.0)


def test_a_late_backward_of_an_earlier_step_does_not_write_into_this_step() -> None:
    model, x = make()
    q = RecurrentTimesteps()
    q.attach(model)
    q.start_step(True)
    stale_loss = model(x).square().sum()
    q.start_step(True)  # the step closed without its backward
    model(x * 2).square().sum().backward()
    now = host(q.finish_step(None))
    stale_loss.backward()
    after = host(q.finish_step(None))
    q.detach()
    for module, series in now.items():
        for name, values in series.items():
            assert torch.equal(after[module][name], values)


def test_encode_names_the_first_non_finite_timestep_of_each_series() -> None:
    q = RecurrentTimesteps()
    nan, inf = math.nan, math.inf
    record = q.encode(
        {
            "timesteps": {
                "lstm": {"input": torch.tensor([1.0, 2.0, nan, inf], dtype=F64)},
                "cell": {
                    "hidden": torch.tensor([inf, 0.0], dtype=F64),
                    "cell": torch.tensor([1.0, 1e-300], dtype=F64),
                },
            }
        }
    )
    assert record["nonfinite"] == {"timesteps": {"lstm": {"input": 2}, "cell": {"hidden": 0}}}
    assert record["timesteps"]["cell"]["cell"] == [1.0, 1e-300]
    assert math.isnan(record["timesteps"]["lstm"]["input"][2])
    assert q.encode({}) == {}


def test_a_real_non_finite_gradient_is_reported_at_its_first_timestep() -> None:
    model = nn.RNNCell(2, 3)
    q = RecurrentTimesteps()
    q.attach(model)
    q.start_step(True)
    h = None
    outs = []
    for _ in range(5):
        h = model(torch.ones(1, 2), h)
        outs.append(h)
    # only h_4 receives an infinite gradient; it flows back through every earlier call
    (outs[4].sum() * math.inf + outs[0].sum()).backward()
    record = q.encode({"timesteps": host(q.finish_step(None))})
    q.detach()
    assert record["nonfinite"]["timesteps"]["RNNCell"]["hidden"] == 0
    assert not math.isfinite(record["timesteps"]["RNNCell"]["hidden"][4])
