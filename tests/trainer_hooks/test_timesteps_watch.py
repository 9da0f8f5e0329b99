"""End to end: watch(..., server=None, spool=...) writes the timesteps series that
autograd gives, on the heavy steps, under the names hello announces."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from gradwatch.protocol import read_spool
from gradwatch.trainer_hooks import watch

F64 = torch.float64


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.LSTM(1, 6, batch_first=True)
        self.decoder = nn.GRUCell(6, 6)
        self.head = nn.Linear(6, 1)

    def forward(self, x: torch.Tensor, keep: list[torch.Tensor] | None = None) -> torch.Tensor:
        out, (h, _) = self.encoder(x)
        state = h[-1]
        loss = x.new_zeros(())
        for t in range(4):
            state = self.decoder(out[:, -1 - t], state)
            if keep is not None:
                state.retain_grad()
                keep.append(state)
            loss = loss + self.head(state).square().sum()
        return loss


def step_records(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    messages = list(read_spool(path))
    hello = messages[0]
    records = [r for m in messages[1:] for r in m["records"] if r["kind"] == "step"]
    return hello, records


def test_watch_spools_the_series_autograd_gives_on_every_heavy_step(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Model().double()
    batches = [torch.randn(3, 12, 1, dtype=F64) for _ in range(4)]
    spool = tmp_path / "run.jsonl"
    with watch(model, run="seq", server=None, spool=spool, every=2, diagnose=False) as monitor:
        for x in batches:
            model.zero_grad()
            loss = model(x)
            loss.backward()
            monitor.step(loss)
    hello, records = step_records(spool)
    assert hello["model"]["recurrent"] == ["encoder", "decoder"]
    assert [("timesteps" in r) for r in records] == [True, False, True, False]
    for x, record in zip(batches, records, strict=True):
        if "timesteps" not in record:
            continue
        xr = x.clone().requires_grad_()
        kept: list[torch.Tensor] = []
        model(xr, kept).backward()
        assert xr.grad is not None
        expected_input = torch.linalg.vector_norm(xr.grad, dim=(0, 2))
        got = record["timesteps"]
        torch.testing.assert_close(
            torch.tensor(got["encoder"]["input"], dtype=F64), expected_input, rtol=1e-12, atol=0
        )
        expected_hidden = torch.stack([torch.linalg.vector_norm(h.grad) for h in kept])  # type: ignore[arg-type]
        torch.testing.assert_close(
            torch.tensor(got["decoder"]["hidden"], dtype=F64), expected_hidden, rtol=1e-12, atol=0
        )
        assert "nonfinite" not in record


def test_watch_with_exact_hidden_adds_the_hidden_series(tmp_path: Path) -> None:
    torch.manual_seed(1)
    model = Model()
    spool = tmp_path / "run.jsonl"
    with watch(model, run="x", every=1, spool=spool, exact_hidden=2, diagnose=False) as monitor:
        for _ in range(3):
            loss = model(torch.randn(2, 5, 1))
            loss.backward()
            monitor.step(loss)
    _, records = step_records(spool)
    names = [sorted(r["timesteps"]["encoder"]) for r in records]
    assert names == [["cell", "hidden", "input"], ["input"], ["cell", "hidden", "input"]]
    assert all(len(r["timesteps"]["encoder"]["hidden"]) == 5 for r in records[::2])


def test_watch_refuses_a_named_cell_that_is_not_in_the_model(tmp_path: Path) -> None:
    model = Model()
    with pytest.raises(ValueError, match=r"got 'decodr'; modules: 'encoder', 'decoder'"):
        watch(model, run="x", spool=tmp_path / "run.jsonl", cells=["decodr"])
    assert not model.encoder._forward_pre_hooks and not model.decoder._forward_hooks


def test_watch_records_the_first_non_finite_timestep(tmp_path: Path) -> None:
    cell = nn.RNNCell(2, 3)
    spool = tmp_path / "run.jsonl"
    with watch(cell, run="x", spool=spool, diagnose=False) as monitor:
        h = None
        outs = []
        for _ in range(4):
            h = cell(torch.ones(1, 2), h)
            outs.append(h)
        loss = outs[2].sum() * math.inf
        loss.backward()
        monitor.step(loss)
    _, records = step_records(spool)
    assert records[0]["nonfinite"]["timesteps"] == {"RNNCell": {"hidden": 0}}
    assert records[0]["timesteps"]["RNNCell"]["hidden"][3] == 0.0


class FrozenEncoder(nn.Module):
    """A pretrained 2-layer LSTM encoder kept frozen under a trainable head (transfer
    learning); ``embed`` puts a trainable layer in front of it."""

    def __init__(self, embed: bool) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 4) if embed else nn.Identity()
        self.encoder = nn.LSTM(4, 16, num_layers=2, batch_first=True)
        self.encoder.requires_grad_(False)
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.encoder(self.embed(x))
        return self.head(out[:, -1])


@pytest.mark.parametrize("embed", [False, True])
def test_a_frozen_encoder_is_judged_only_where_its_gradient_trains_something(
    tmp_path: Path, embed: bool
) -> None:
    torch.manual_seed(4)
    model = FrozenEncoder(embed)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    path = tmp_path / "frozen.jsonl"
    with watch(model, run="frozen", spool=path, every=4, quiet=True) as monitor:
        for _ in range(120):
            x = torch.randn(8, 60, 4)
            # the target needs the first timesteps: a gradient that reaches them matters
            loss = (model(x) - x[:, :5, 0].sum(1, keepdim=True)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            monitor.step(loss)
    records = [r for m in read_spool(path) if m["type"] == "batch" for r in m["records"]]
    heavy = [r for r in records if r["kind"] == "step" and "param_norms" in r]
    assert len(heavy) == 30
    vanishing = [r for r in records if r["kind"] == "alert" and r["code"] == "vanishing"]
    if embed:  # the gradient through the frozen encoder trains the embedding: judged
        assert all(sorted(r["timesteps"]["encoder"]) == ["input", "layer1"] for r in heavy)
        assert {a["subject"] for a in vanishing} == {"encoder"}
    else:  # nothing upstream learns from it: no series to judge, no alarm about it
        assert all("encoder" not in (r.get("timesteps") or {}) for r in heavy)
        assert vanishing == []
