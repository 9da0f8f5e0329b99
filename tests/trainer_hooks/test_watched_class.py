"""torch's cells watched by a class of their own instead of a forward hook
(trainer_hooks/quantities/watched_class.py): the same series, the fast call path, and
copies, replicas, pickles and traced graphs that are plain cells."""

from __future__ import annotations

import copy
import io
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from gradwatch.protocol import read_spool
from gradwatch.trainer_hooks import watch


def steps_of(path: Path) -> list[dict[str, Any]]:
    return [r for m in read_spool(path) if m["type"] == "batch" for r in m["records"]
            if r["kind"] == "step"]


class Decoder(nn.Module):
    def __init__(self, cell: nn.Module) -> None:
        super().__init__()
        self.cell = cell
        self.out = nn.Linear(5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.new_zeros(x.shape[1], 5)
        state: Any = (h, h.clone()) if isinstance(self.cell, nn.LSTMCell) else h
        outs = []
        for t in range(x.shape[0]):
            state = self.cell(x[t], state)
            h = state[0] if isinstance(state, tuple) else state
            outs.append(self.out(h))
        return torch.stack(outs)


class OwnCell(nn.LSTMCell):
    """A user's subclass: its class is theirs, so it gets a forward hook."""


def hidden_grads(model: Decoder, x: torch.Tensor, steps: int) -> list[list[float]]:
    """‖∂L/∂h_k‖ of every call, by plain autograd (retain_grad on every output)."""
    kept: list[torch.Tensor] = []

    def keep(module: nn.Module, args: Any, out: Any) -> None:
        h = out[0] if isinstance(out, tuple) else out
        h.retain_grad()
        kept.append(h)

    handle = model.cell.register_forward_hook(keep)
    series = []
    for step in range(steps):
        kept.clear()
        (model(x * (1 + step)) ** 2).mean().backward()
        series.append([float(h.grad.double().norm()) for h in kept])  # type: ignore[union-attr]
    handle.remove()
    return series


@pytest.mark.parametrize("make", [lambda: nn.LSTMCell(3, 5), lambda: nn.GRUCell(3, 5),
                                  lambda: nn.RNNCell(3, 5), lambda: OwnCell(3, 5)])
def test_the_series_are_plain_autograds_whichever_way_the_cell_is_watched(
    tmp_path: Path, make: Any
) -> None:
    torch.manual_seed(3)
    model = Decoder(make())
    twin = copy.deepcopy(model)
    x = torch.randn(4, 2, 3)
    want = hidden_grads(twin, x, 3)
    plain = type(model.cell)
    path = tmp_path / "w.jsonl"
    with watch(model, run="w", spool=path, every=1, quiet=True, diagnose=False) as monitor:
        for step in range(3):
            model.zero_grad()
            loss = (model(x * (1 + step)) ** 2).mean()
            loss.backward()
            monitor.step(loss)
            swapped = type(model.cell) is not plain
            assert swapped == (plain is not OwnCell)  # torch's cells only
            assert bool(model.cell._forward_hooks) == (plain is OwnCell)
    assert type(model.cell) is plain and not model.cell._forward_hooks
    got = [r["timesteps"]["cell"]["hidden"] for r in steps_of(path)]
    for row, expected in zip(got, want, strict=True):
        assert row == pytest.approx(expected, rel=1e-6)


def test_a_replica_sharing_the_cells_dict_computes_with_its_own_weights_and_is_not_captured(
    tmp_path: Path,
) -> None:
    # nn.DataParallel's replicas copy the module's __dict__ and swap in their own
    # parameters: the class's forward must run on the replica, and only the watched
    # instance reports.
    torch.manual_seed(4)
    model = Decoder(nn.LSTMCell(3, 5))
    x = torch.randn(4, 2, 3)
    path = tmp_path / "r.jsonl"
    with watch(model, run="r", spool=path, every=1, quiet=True, diagnose=False) as monitor:
        replica = model.cell._replicate_for_data_parallel()
        for name, p in model.cell.named_parameters():
            replica._parameters[name] = (p.detach() * 2).requires_grad_()
        reference = nn.LSTMCell(3, 5)
        reference.load_state_dict({k: v * 2 for k, v in model.cell.state_dict().items()})
        h = torch.zeros(2, 5)
        got = replica(x[0], (h, h))
        want = reference(x[0], (h, h))
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=0.0, atol=0.0)
        assert model.cell.__dict__ is not replica.__dict__
        loss = (model(x) ** 2).mean()
        loss.backward()
        monitor.step(loss)
    [step] = steps_of(path)
    assert len(step["timesteps"]["cell"]["hidden"]) == 4  # the replica's call is not one


def test_copies_pickles_and_fx_see_a_plain_cell(tmp_path: Path) -> None:
    torch.manual_seed(5)
    model = Decoder(nn.GRUCell(3, 5))
    x = torch.randn(4, 2, 3)
    with watch(model, run="c", spool=tmp_path / "c.jsonl", every=1, quiet=True,
               diagnose=False) as monitor:
        loss = (model(x) ** 2).mean()
        loss.backward()
        monitor.step(loss)
        assert type(model.cell) is not nn.GRUCell  # watched between steps at every=1
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        # our own bytes, read back to see a watched cell stored as a plain one
        copies = [copy.deepcopy(model), copy.copy(model.cell),
                  torch.load(buffer, weights_only=False),
                  pickle.loads(pickle.dumps(model))]  # noqa: S301
        cells = [c if isinstance(c, nn.GRUCell) and not isinstance(c, Decoder) else c.cell
                 for c in copies]
        assert [type(c) for c in cells] == [nn.GRUCell] * 4
        # torch.fx keeps a watched torch cell a leaf module, as it does a plain one
        graph = torch.fx.symbolic_trace(nn.Sequential(model.cell))
        assert [n.op for n in graph.graph.nodes] == ["placeholder", "call_module", "output"]
        with torch.no_grad():
            want = model(x)
            for other in (copies[0], copies[2], copies[3]):
                torch.testing.assert_close(other(x), want, rtol=0.0, atol=0.0)


def test_an_instance_whose_forward_was_replaced_keeps_it_and_is_hooked(tmp_path: Path) -> None:
    torch.manual_seed(6)
    cell = nn.LSTMCell(3, 5)
    original = cell.forward
    calls: list[int] = []

    def forward(*args: Any, **kwargs: Any) -> Any:  # as accelerate or a user would
        calls.append(1)
        return original(*args, **kwargs)

    cell.forward = forward  # type: ignore[method-assign]
    model = Decoder(cell)
    x = torch.randn(4, 2, 3)
    path = tmp_path / "f.jsonl"
    with watch(model, run="f", spool=path, every=1, quiet=True, diagnose=False) as monitor:
        loss = (model(x) ** 2).mean()
        loss.backward()
        monitor.step(loss)
        assert type(cell) is nn.LSTMCell and cell._forward_hooks
    assert len(calls) == 4 and cell.forward is forward
    [step] = steps_of(path)
    assert len(step["timesteps"]["cell"]["hidden"]) == 4
