"""What watch() does to the model: nothing that changes it, nothing left after remove()."""

from __future__ import annotations

import functools
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from gradwatch.protocol import read_spool
from gradwatch.protocol.sink import SpoolSink
from gradwatch.trainer_hooks import GradwatchWarning, watch
from gradwatch.trainer_hooks.pipeline import Item, Pipeline
from gradwatch.trainer_hooks.quantities.module_hooks import OwnHook, inert


def records_of(path: Path) -> list[dict[str, Any]]:
    return [r for m in read_spool(path) if m["type"] == "batch" for r in m["records"]]


class Seq2Seq(nn.Module):
    """An encoder LSTM and a decoder cell called once per target token."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.LSTM(3, 6, batch_first=True)
        self.decoder = nn.LSTMCell(6, 6)
        self.out = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor, steps: int = 5) -> torch.Tensor:
        enc, (h, c) = self.encoder(x)
        h, c = h[0], c[0]
        ys = []
        for _ in range(steps):
            attn = torch.softmax((enc * h[:, None]).sum(-1), dim=1)
            context = (attn[..., None] * enc).sum(1)
            h, c = self.decoder(context, (h, c))
            ys.append(self.out(h))
        return torch.stack(ys, 1)


def outputs_and_grads(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    y = model(x)
    y.pow(2).sum().backward()
    return y.detach().clone(), [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]


def hook_state(model: nn.Module) -> list[Any]:
    state: list[Any] = []
    for module in model.modules():
        state += [
            type(module),
            dict(module._forward_hooks),
            dict(module._forward_pre_hooks),
            dict(module._backward_hooks),
            dict(module._backward_pre_hooks),
            module._is_full_backward_hook,
        ]
    for p in model.parameters():
        post = getattr(p, "_post_accumulate_grad_hooks", None)
        state += [dict(p._backward_hooks or {}), dict(post or {})]
    return state


def test_hooks_never_change_outputs_or_gradients_and_remove_leaves_no_trace(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Seq2Seq().double()
    x = torch.randn(2, 7, 3, dtype=torch.float64)
    before_state = hook_state(model)
    y0, g0 = outputs_and_grads(model, x)

    monitor = watch(model, run="rm", spool=tmp_path / "rm.jsonl", profile=True, diagnose=False)
    y1, g1 = outputs_and_grads(model, x)  # a captured step, every hook active
    monitor.step(y1.sum())
    assert any(module._forward_pre_hooks for module in model.modules())
    monitor.remove()
    y2, g2 = outputs_and_grads(model, x)
    monitor.close()

    for y in (y1, y2):
        assert torch.equal(y, y0)
    for grads in (g1, g2):
        assert all(torch.equal(a, b) for a, b in zip(grads, g0, strict=True))
    assert hook_state(model) == before_state
    records = records_of(tmp_path / "rm.jsonl")
    assert "profile" in records[0] and "param_norms" in records[0]


class Stacked(nn.Module):
    """A 2-layer fused LSTM (the per-layer split) under a transformer block (depth)."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(3, 4, num_layers=2, batch_first=True)
        self.blocks = nn.ModuleList(
            [nn.TransformerEncoderLayer(4, 2, 8, dropout=0.0, batch_first=True) for _ in range(2)]
        )
        self.out = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(x)
        for block in self.blocks:
            h = block(h)
        return self.out(h)


def gradwatch_hooks(model: nn.Module) -> list[tuple[str, str, Any]]:
    """(module, hook dict, hook) for every hook gradwatch put on ``model``."""
    found = []
    for name, module in model.named_modules():
        for kind in ("_forward_pre_hooks", "_forward_hooks"):
            found += [(name, kind, h) for h in getattr(module, kind).values()
                      if isinstance(h, OwnHook)]
    return found


@pytest.mark.parametrize(
    ("make", "options"),
    [(Seq2Seq, {}), (Seq2Seq, {"exact_hidden": True}), (Stacked, {"profile": True})],
)
def test_a_watched_model_can_be_copied_saved_and_averaged_mid_training(
    tmp_path: Path, make: Any, options: dict[str, Any]
) -> None:
    import copy
    import io

    torch.manual_seed(2)
    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(4, 5, 3)
    monitor = watch(model, run="copies", spool=tmp_path / "c.jsonl", every=1, quiet=True,
                    **options)
    for step in range(3):
        loss = model(x * (1 + step)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        monitor.step(loss)
    ours = gradwatch_hooks(model)
    assert len(ours) >= 2  # every=1: the hooks are on the model between steps
    plain_types = [type(m) for m in make().modules()]
    if make is Seq2Seq:  # the decoder cell is watched by its class, not by a hook
        assert type(model.decoder) is not nn.LSTMCell
        assert isinstance(model.decoder, nn.LSTMCell)
        assert repr(model.decoder) == "LSTMCell(6, 6)"
    # what training code does with a model: keep the best one, average it, save it
    twin = copy.deepcopy(model)
    averaged = torch.optim.swa_utils.AveragedModel(model)
    averaged.update_parameters(model)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    with torch.no_grad():
        want = model(x)
        for other in (twin, averaged.module, loaded):
            torch.testing.assert_close(other(x), want, rtol=0.0, atol=0.0)
    # the copies carry a hook that does nothing in each place gradwatch had one, and
    # their cells are of the plain class
    for other in (twin, averaged.module, loaded):
        assert [type(m) for m in other.modules()] == plain_types
        mirrored = [(name, kind) for name, kind, _ in ours]
        kept = [(name, kind, getattr(dict(other.named_modules())[name], kind)) for name, kind in
                dict.fromkeys(mirrored)]
        assert gradwatch_hooks(other) == []
        assert sum(
            1 for _, _, hooks in kept for h in hooks.values()
            if h is inert or (isinstance(h, functools.partial) and h.func is inert)
        ) == len(ours)
    # a copy that trains reports nothing; the watched model records on as before
    twin(x).pow(2).mean().backward()
    loss = model(x).pow(2).mean()
    loss.backward()
    monitor.step(loss)
    assert monitor.close() is True
    steps = [r for r in records_of(tmp_path / "c.jsonl") if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [0, 1, 2, 3]
    assert all("timesteps" in r for r in steps)
    assert sorted(steps[3]["timesteps"]) == sorted(steps[2]["timesteps"])
    assert gradwatch_hooks(model) == []  # close() took gradwatch's own hooks off
    assert [type(m) for m in model.modules()] == plain_types


class CellLoop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(3, 6)
        self.out = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = c = x.new_zeros(x.shape[0], 6)
        for t in range(x.shape[1]):
            h, c = self.cell(x[:, t], (h, c))
        return self.out(h)


class Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            [nn.TransformerEncoderLayer(3, 1, 8, dropout=0.0, batch_first=True) for _ in range(2)]
        )
        self.out = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.out(x)


@pytest.mark.parametrize("make", [Seq2Seq, CellLoop, Blocks])
@pytest.mark.parametrize("early", [True, False])
def test_step_called_before_backward_is_said_once(
    tmp_path: Path, make: Any, early: bool
) -> None:
    torch.manual_seed(1)
    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with watch(model, run="order", spool=tmp_path / "o.jsonl", every=2, quiet=True) as monitor:
            for step in range(12):
                loss = model(torch.randn(4, 5, 3) * (1 + step % 3)).pow(2).mean()
                if early:  # the mistake: the step closes before its backward has run
                    monitor.step(loss)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if not early:
                    monitor.step(loss)
    ours = [str(w.message) for w in said if issubclass(w.category, GradwatchWarning)]
    if early:
        assert len(ours) == 1 and "call monitor.step() after loss.backward()" in ours[0]
    else:  # the same model in the right order: captured, and not a word
        assert ours == []
        records = records_of(tmp_path / "o.jsonl")
        heavy = [r for r in records if r["kind"] == "step" and r["step"] % 2 == 0]
        assert [bool(r.get("timesteps") or r.get("depth")) for r in heavy] == [True] * 6


def test_light_steps_run_with_no_gradwatch_hook_on_the_model_or_the_optimizers(
    tmp_path: Path,
) -> None:
    """Hooks that only return still cost a Python call per call on every light step:
    the model (a fused LSTM, a cell, a stack of blocks) and every optimizer carry
    gradwatch's hooks on capturing steps only, and the light steps still record."""
    from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

    torch.manual_seed(1)

    class Stacked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.seq = Seq2Seq()
            self.blocks = nn.ModuleList(nn.Linear(2, 2) for _ in range(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.seq(x)
            for block in self.blocks:
                y = y + torch.tanh(block(y))
            return y

    def heavy_hooks(model: Stacked) -> list[int]:
        """The hooks of the heavy quantities (the stale-state check's own pre-hooks on
        the recurrent modules follow their own pace)."""
        return [
            *(len(block._forward_pre_hooks) for block in model.blocks),
            len(model.seq.encoder._forward_hooks),
            len(model.seq.decoder._forward_hooks) + (type(model.seq.decoder) is not nn.LSTMCell),
            *(len(p._post_accumulate_grad_hooks or {}) for p in model.parameters()),
            len(_global_optimizer_pre_hooks),
            len(_global_optimizer_post_hooks),
        ]

    model = Stacked()
    plain = hook_state(model)
    unhooked = heavy_hooks(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    hooked: list[list[bool]] = []
    path = tmp_path / "light.jsonl"
    with watch(model, run="light", every=3, spool=path, diagnose=False) as monitor:
        for _ in range(7):
            hooked.append([n > before for n, before in zip(heavy_hooks(model), unhooked,
                                                           strict=True)])
            optimizer.zero_grad()
            loss = model(torch.randn(2, 4, 3)).pow(2).mean()
            loss.backward()
            optimizer.step()
            monitor.step(loss)
    assert [all(h) for h in hooked] == [True, False, False, True, False, False, True]
    assert [any(h) for h in hooked] == [True, False, False, True, False, False, True]
    assert hook_state(model) == plain and heavy_hooks(model) == unhooked
    steps = [r for r in records_of(path) if r["kind"] == "step"]
    assert [r["step"] for r in steps] == list(range(7))
    assert all(isinstance(r["loss"], float) for r in steps)
    heavy = [r["step"] for r in steps if "timesteps" in r]
    assert heavy == [0, 3, 6]
    assert all(set(steps[i]) >= {"depth", "update_ratios", "param_norms"} for i in heavy)


def test_no_grad_and_inference_mode_passes_capture_nothing(tmp_path: Path) -> None:
    model = Seq2Seq()
    path = tmp_path / "eval.jsonl"
    with watch(model, run="eval", every=1, spool=path, profile=True, diagnose=False) as monitor:
        with torch.no_grad():
            y = model(torch.randn(2, 4, 3))
        assert y.grad_fn is None and not y._backward_hooks
        monitor.step(None)
        with torch.inference_mode():
            y = model(torch.randn(2, 4, 3))
        monitor.step(None)
        loss = model(torch.randn(2, 4, 3)).sum()
        loss.backward()
        monitor.step(loss)
    steps = [r for r in records_of(path) if r["kind"] == "step"]
    heavy = {"param_norms", "timesteps", "profile", "graph_nodes"}
    assert [sorted(heavy & set(r)) for r in steps] == [[], [], sorted(heavy)]
    assert steps[0]["loss"] is None
    assert [r for r in records_of(path) if r["kind"] == "alert"] == []


def test_profile_shows_calls_per_step_and_where_the_time_goes(tmp_path: Path) -> None:
    model = Seq2Seq()
    path = tmp_path / "prof.jsonl"
    with watch(model, run="prof", every=1, spool=path, profile=True, diagnose=False) as monitor:
        for _ in range(2):
            loss = model(torch.randn(2, 4, 3), steps=9).sum()
            loss.backward()
            monitor.step(loss)
    for record in (r for r in records_of(path) if r["kind"] == "step"):
        profile = record["profile"]
        assert profile["decoder"]["calls"] == 9 and profile["out"]["calls"] == 9
        assert profile["encoder"]["calls"] == 1 and profile["Seq2Seq"]["calls"] == 1
        for name in ("decoder", "out", "encoder", "Seq2Seq"):
            assert profile[name]["forward_s"] > 0 and profile[name]["backward_s"] > 0
        # inclusive times: the model's forward contains its decoder's
        assert profile["Seq2Seq"]["forward_s"] >= profile["decoder"]["forward_s"]


def test_a_budget_no_interval_fits_uses_the_longest_interval(tmp_path: Path) -> None:
    model = Seq2Seq()
    plain, tight = tmp_path / "plain.jsonl", tmp_path / "tight.jsonl"
    for path, options in ((plain, {"every": 1}), (tight, {"overhead": 1e-9})):
        with watch(model, run="budget", spool=path, diagnose=False, **options) as monitor:
            for _ in range(30):
                loss = model(torch.randn(2, 4, 3)).sum()
                loss.backward()
                monitor.step(loss)
    heavy = {
        path: [r["step"] for r in records_of(path) if r["kind"] == "step" and "param_norms" in r]
        for path in (plain, tight)
    }
    assert heavy[plain] == list(range(30))
    # calibration takes every third step until 5 pairs are measured; then no
    # interval fits a budget of 1e-9 and the longest one is used
    assert heavy[tight] == [0, 3, 6, 9, 12, 15]


class SlowSink:
    """A real sink that holds the background thread until released."""

    def __init__(self, path: Path) -> None:
        self.inner = SpoolSink(path, {"type": "hello", "run_id": "r", "rank": 0})
        self.release = threading.Event()

    def send(self, records: list[dict[str, Any]]) -> None:
        self.release.wait(30)
        self.inner.send(records)

    def close(self, timeout: float | None = None) -> None:
        self.inner.close()


def test_a_full_queue_drops_records_with_one_warning_and_never_blocks(tmp_path: Path) -> None:
    sink = SlowSink(tmp_path / "slow.jsonl")
    pipeline = Pipeline(sink, quantities=[], maxsize=4, flush_interval=0.0)
    with pytest.warns(GradwatchWarning, match="queue is full") as caught:
        accepted = [pipeline.put(Item({"kind": "epoch", "epoch": i})) for i in range(50)]
    assert len(caught) == 1
    assert pipeline.dropped == accepted.count(False) > 0
    sink.release.set()
    assert pipeline.close(timeout=30)
    sent = [r["epoch"] for r in records_of(tmp_path / "slow.jsonl")]
    assert sent == [i for i, ok in enumerate(accepted) if ok]


def test_a_record_that_breaks_the_background_thread_is_lost_alone(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    pipeline = Pipeline(
        SpoolSink(path, {"type": "hello", "run_id": "r", "rank": 0}), quantities=[],
        flush_interval=0.0,
    )
    with pytest.warns(GradwatchWarning, match="a record was lost"):
        pipeline.put(Item({"kind": "epoch", "epoch": 0}))
        pipeline.put(Item(None))  # type: ignore[arg-type]  # not a record: dict(None) fails
        pipeline.put(Item({"kind": "epoch", "epoch": 1}))
        assert pipeline.close(timeout=30)
    assert [r["epoch"] for r in records_of(path)] == [0, 1]
