"""watch(..., server=None, spool=...): what lands in the spool file, end to end."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from gradwatch.protocol import dumps, loads, messages, read_spool
from gradwatch.protocol.codec import pack_timesteps
from gradwatch.trainer_hooks import GradwatchWarning, Monitor, watch

STEP_FIELDS = set(messages.StepRecord.__annotations__)
CHEAP_FIELDS = {"kind", "step", "epoch", "t", "duration_s", "loss", "overhead", "rss_bytes"}


def spool_records(path: Path) -> list[dict[str, Any]]:
    return [r for m in read_spool(path) if m["type"] == "batch" for r in m["records"]]


class Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(3, 5, batch_first=True)
        self.head = nn.Linear(5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


def train(model: nn.Module, monitor: Monitor, steps: int, epochs: int = 1) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for _ in range(epochs):
        for _ in range(steps):
            x = torch.randn(2, 4, 3)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            monitor.step(loss)
            losses.append(loss.item())
        monitor.epoch()
    return losses


def test_spool_holds_hello_then_batches_of_protocol_records(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Tagger()
    path = tmp_path / "run.jsonl"
    with watch(model, run="tagger", every=1, spool=path, diagnose=False) as monitor:
        losses = train(model, monitor, steps=3, epochs=2)
    messages_ = list(read_spool(path))
    hello = messages_[0]
    assert hello["type"] == "hello" and hello["protocol"] == 1
    assert hello["run"] == "tagger" and hello["rank"] == 0 and hello["world_size"] == 1
    assert hello["model"]["parameters"] == sum(p.numel() for p in model.parameters())
    assert {"name": "lstm", "type": "LSTM"} in hello["model"]["modules"]
    assert hello["model"]["recurrent"] == ["lstm"]
    assert all(m["type"] == "batch" for m in messages_[1:])
    assert [m["seq"] for m in messages_[1:]] == list(range(len(messages_) - 1))
    assert {m["run_id"] for m in messages_} == {hello["run_id"]}

    records = spool_records(path)
    steps = [r for r in records if r["kind"] == "step"]
    assert [r["step"] for r in steps] == list(range(6))
    assert [r["epoch"] for r in steps] == [0, 0, 0, 1, 1, 1]
    assert [r["loss"] for r in steps] == pytest.approx(losses)
    for r in steps:
        assert set(r) <= STEP_FIELDS, set(r) - STEP_FIELDS
        assert set(r) >= CHEAP_FIELDS
        assert {"param_norms", "gate_norms", "total_norm", "timesteps"} <= set(r)
        # both threads' time: a tiny step may cost gradwatch more than itself
        assert r["duration_s"] > 0 and 0 <= r["overhead"] < float("inf")
        # the graph walk is paced: a graph that stays the same is walked less often
        assert r.get("graph_truncated") is (False if "graph_nodes" in r else None)
    assert [r["step"] for r in steps if "graph_nodes" in r][:3] == [0, 1, 2]
    epochs = [r for r in records if r["kind"] == "epoch"]
    assert [(e["epoch"], e["step"], e["steps"]) for e in epochs] == [(0, 2, 3), (1, 5, 3)]
    assert all(e["duration_s"] > 0 for e in epochs)
    assert records[-1]["kind"] == "end" and records[-1]["status"] == "finished"
    assert records[-1]["step"] == 5


def test_every_spool_line_validates_against_the_server_schema(tmp_path: Path) -> None:
    schema = pytest.importorskip("gradwatch.server.schema")
    model = Tagger()
    path = tmp_path / "run.jsonl"
    with watch(model, run="contract", spool=path, profile=True, every=2) as monitor:
        train(model, monitor, steps=4)
    lines = path.read_text().splitlines()
    assert len(lines) >= 2
    packed = 0
    for line in lines:
        schema.parse_message(line)
        # The same records as the websocket sender sends them: timestep series packed.
        message = loads(line)
        if message["type"] == "batch":
            message["records"] = pack_timesteps(message["records"])
            packed += dumps(message).count('"f64"')
            schema.parse_message(dumps(message))
    assert packed > 0


def test_every_n_captures_heavy_fields_on_every_nth_step_only(tmp_path: Path) -> None:
    model = Tagger()
    path = tmp_path / "run.jsonl"
    with watch(model, run="every", spool=path, every=3, diagnose=False) as monitor:
        train(model, monitor, steps=7)
    steps = [r for r in spool_records(path) if r["kind"] == "step"]
    heavy = [r["step"] for r in steps if "param_norms" in r]
    assert heavy == [0, 3, 6]
    assert [r["step"] for r in steps if "graph_nodes" in r] == [0, 3, 6]
    assert [r["step"] for r in steps if "timesteps" in r] == [0, 3, 6]
    for r in steps:
        assert set(r) >= CHEAP_FIELDS


def test_crash_inside_the_with_block_ends_the_run_as_crashed(tmp_path: Path) -> None:
    model = Tagger()
    path = tmp_path / "run.jsonl"
    with (
        pytest.raises(RuntimeError, match="boom"),
        watch(model, run="crash", spool=path, diagnose=False) as monitor,
    ):
        train(model, monitor, steps=1, epochs=1)
        raise RuntimeError("boom")
    end = spool_records(path)[-1]
    assert end == {"kind": "end", "status": "crashed", "step": 0, "t": end["t"]}


def test_run_id_comes_from_the_environment_and_names_the_default_spool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRADWATCH_RUN_ID", "0f0e0d0c-aaaa-bbbb-cccc-000000000001")
    monitor = watch(nn.Linear(2, 1), run="my run/1", diagnose=False)
    monitor.close()
    assert monitor.run_id == "0f0e0d0c-aaaa-bbbb-cccc-000000000001"
    expected = os.path.join(str(tmp_path), "gradwatch-my_run_1-0f0e0d0c-rank0.jsonl")
    assert monitor.spool_path == expected
    hello = next(iter(read_spool(monitor.spool_path)))
    assert hello["run_id"] == "0f0e0d0c-aaaa-bbbb-cccc-000000000001"


def test_rank_and_world_size_come_from_torchrun_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    path = tmp_path / "r.jsonl"
    watch(nn.Linear(2, 1), run="ddp", spool=path, diagnose=False).close()
    hello = next(iter(read_spool(path)))
    assert (hello["rank"], hello["world_size"]) == (3, 4)


def test_close_and_remove_twice_are_harmless_and_later_steps_are_ignored(tmp_path: Path) -> None:
    model = nn.Linear(2, 1)
    monitor = watch(model, run="twice", spool=tmp_path / "t.jsonl", diagnose=False)
    monitor.remove()
    monitor.remove()
    assert monitor.close() is True
    assert monitor.close() is True
    with pytest.warns(UserWarning, match="after close"):
        monitor.step(model(torch.ones(1, 2)).sum())


class CellLoop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.GRUCell(3, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.zeros(x.shape[0], 4)
        for t in range(x.shape[1]):
            h = self.cell(x[:, t], h)
        return h


def _encoder() -> nn.Module:
    layer = nn.TransformerEncoderLayer(3, 1, 8, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)


@pytest.mark.parametrize(
    ("make", "options"),
    [(Tagger, {}), (Tagger, {"profile": True}), (CellLoop, {"exact_hidden": True}),
     (_encoder, {})],
)
def test_a_closed_monitor_kept_around_does_not_keep_the_model_alive(
    tmp_path: Path, make: Any, options: dict[str, Any]
) -> None:
    import gc
    import weakref

    model = make()
    opt = torch.optim.Adam(model.parameters())
    monitor = watch(model, run="kept", spool=tmp_path / "k.jsonl", every=2, quiet=True,
                    **options)
    for step in range(5):  # heavy and light steps: every quantity has held something
        loss = model(torch.randn(2, 6, 3) * (step + 1)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        monitor.step(loss)
    assert monitor.model is model
    assert monitor.close() is True
    assert monitor.model is None
    parts = [weakref.ref(m) for m in model.modules()] + [weakref.ref(p) for p in model.parameters()]
    del model, opt, loss
    gc.collect()
    # a notebook keeps `monitor` after training; the model's memory must still go
    assert [ref() for ref in parts if ref() is not None] == []
    assert monitor.step_index == 5
    assert [r["kind"] for r in spool_records(tmp_path / "k.jsonl")][-1] == "end"


def test_a_monitor_dropped_without_close_takes_its_hooks_off_and_ends_its_run(
    tmp_path: Path,
) -> None:
    import gc
    import threading

    model = nn.LSTM(3, 4, num_layers=2)

    def train(monitor: Monitor, steps: int) -> None:
        for step in range(steps):
            loss = model(torch.randn(5, 2, 3) * (step + 1))[0].pow(2).mean()
            model.zero_grad()
            loss.backward()
            monitor.step(loss)

    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    monitor = watch(model, run="cell", spool=first, every=1, quiet=True)
    train(monitor, 2)
    # the notebook cell run again: the first monitor's last reference goes
    with pytest.warns(GradwatchWarning, match=r"run 'cell' was dropped without close\(\)"):
        monitor = watch(model, run="cell", spool=second, every=1, quiet=True)
        gc.collect()
    train(monitor, 3)
    assert monitor.close() is True
    ended = spool_records(first)
    assert [r["kind"] for r in ended].count("step") == 2
    assert ended[-1] | {"t": 0} == {"kind": "end", "status": "finished", "step": 1, "t": 0}
    steps = [r for r in spool_records(second) if r["kind"] == "step"]
    # alone on the model again: every step keeps the per-layer series
    assert [sorted(r["timesteps"]["LSTM"]) for r in steps] == [["input", "layer1"]] * 3
    assert (model._forward_pre_hooks, model._forward_hooks) == ({}, {})
    assert [t for t in threading.enumerate() if t.name == "gradwatch-pipeline"] == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"every": 0}, "expected every= to be an integer >= 1, got 0"),
        ({"overhead": 2.0}, "expected overhead= to be a fraction between 0 and 1"),
        ({"server": "http://x"}, "expected server= to be a ws:// or wss:// URL"),
        ({"run": ""}, "expected run= to be a non-empty name"),
        ({"cells": ["decodr"]}, "expected a module, name or class in the model, got 'decodr'"),
    ],
)
def test_bad_arguments_say_what_was_expected(
    tmp_path: Path, kwargs: dict[str, Any], message: str
) -> None:
    model = Tagger()
    with pytest.raises(ValueError, match=re.escape(message)):
        watch(model, spool=tmp_path / "x.jsonl", diagnose=False, **kwargs)
    assert not model.lstm._forward_pre_hooks and not model.lstm._forward_hooks


def test_watch_refuses_what_is_not_a_module() -> None:
    with pytest.raises(TypeError, match=r"expected a torch\.nn\.Module to watch, got function"):
        watch(lambda x: x)  # type: ignore[arg-type]


SCRIPT = """
import sys
import torch
from gradwatch.trainer_hooks import watch
model = torch.nn.Linear(2, 1)
monitor = watch(model, run="forgot-close", spool=sys.argv[1], diagnose=False)
for _ in range(3):
    loss = model(torch.ones(1, 2)).sum()
    loss.backward()
    monitor.step(loss)
if sys.argv[2] == "raise":
    raise RuntimeError("training failed")
"""


@pytest.mark.parametrize(("how", "status"), [("return", "finished"), ("raise", "crashed")])
def test_a_monitor_never_closed_is_closed_at_exit(tmp_path: Path, how: str, status: str) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    path = tmp_path / "run.jsonl"
    done = subprocess.run(
        [sys.executable, "-W", "ignore", str(script), str(path), how],
        capture_output=True, timeout=100, check=False,
    )
    assert done.returncode == (1 if how == "raise" else 0), done.stderr.decode()
    records = spool_records(path)
    assert [r["step"] for r in records if r["kind"] == "step"] == [0, 1, 2]
    assert records[-1]["kind"] == "end" and records[-1]["status"] == status


def test_flush_hands_every_step_so_far_to_the_sink(tmp_path: Path) -> None:
    model = nn.Linear(2, 1)
    path = tmp_path / "flush.jsonl"
    monitor = watch(model, run="flush", spool=path, diagnose=False)
    for _ in range(5):
        loss = model(torch.ones(1, 2)).sum()
        loss.backward()
        monitor.step(loss)
    assert monitor.flush(timeout=30)
    assert [r["step"] for r in spool_records(path) if r["kind"] == "step"] == [0, 1, 2, 3, 4]
    monitor.close()


def test_a_loss_of_one_element_in_any_shape_is_recorded_as_its_number(tmp_path: Path) -> None:
    """``loss.view(1)`` or a one-device DataParallel's ``(1,)`` loss is a number in the
    record, on light and heavy steps, as the server's schema and the diagnoses need."""
    schema = pytest.importorskip("gradwatch.server.schema")
    model = Tagger()
    path = tmp_path / "run.jsonl"
    shapes: list[tuple[int, ...]] = [(), (1,), (1, 1), (3,), (1,), (1, 1, 1), ()]
    expected = []
    with watch(model, run="shapes", spool=path, every=2) as monitor:
        for n, shape in enumerate(shapes):
            out = model(torch.randn(2, 4, 3))
            loss = (out.pow(2).mean() + n).expand(shape).clone()  # one value, or 3 alike
            loss.sum().backward()
            monitor.step(loss)
            expected.append(loss.detach().double().mean().item())
    steps = [r for r in spool_records(path) if r["kind"] == "step"]
    assert [r["loss"] for r in steps] == pytest.approx(expected, rel=1e-6)
    assert all(type(r["loss"]) is float for r in steps)
    for line in path.read_text().splitlines():
        schema.parse_message(line)


def test_a_loss_copied_from_a_device_is_recorded_as_its_number(tmp_path: Path) -> None:
    """The path a GPU loss takes (packed with the step's payloads, unpacked on the
    background thread), shown with CPU tensors: a ``(1,)`` loss is its number."""
    from gradwatch.protocol.sink import SpoolSink
    from gradwatch.trainer_hooks.pipeline import Item, Pipeline
    from gradwatch.trainer_hooks.transfer import pack

    path = tmp_path / "packed.jsonl"
    pipeline = Pipeline(SpoolSink(path, {"type": "hello", "run_id": "r", "rank": 0}), [])
    losses = [torch.tensor([0.75]), torch.tensor(1.5), torch.tensor([[2.25]])]
    for n, loss in enumerate(losses):
        record = {"kind": "step", "step": n, "t": 1.0 + n, "duration_s": 0.01}
        assert pipeline.put(Item(record, pack({"_monitor": {"loss": loss}}), heavy=True))
    assert pipeline.close(timeout=30)
    steps = [r for r in spool_records(path) if r["kind"] == "step"]
    assert [r["loss"] for r in steps] == [0.75, 1.5, 2.25]


def test_a_loss_that_is_no_number_costs_only_the_loss_field(tmp_path: Path) -> None:
    """A dict of losses (or a model's whole output), or an int beyond a float, passed as
    the loss: one warning, and every step still records its time, heavy fields and the
    other steps' losses."""
    model = Tagger()
    path = tmp_path / "run.jsonl"
    given: list[Any] = [
        torch.tensor(0.5), {"nll": 1.0}, 2.5, ["x"], np.float32(3.5), 10**400, torch.tensor(4.5)
    ]
    warned = pytest.warns(GradwatchWarning, match="expected a tensor or a number.*got dict")
    with warned, watch(model, run="losses", spool=path, every=2) as monitor:
        for loss in given:
            model(torch.randn(2, 4, 3)).sum().backward()
            monitor.step(loss)
    steps = [r for r in spool_records(path) if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [0, 1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in steps] == [0.5, None, 2.5, None, 3.5, None, 4.5]
    assert all(r["duration_s"] > 0 for r in steps)
    assert [r["step"] for r in steps if "param_norms" in r] == [0, 2, 4, 6]


def test_charged_seconds_count_in_the_next_step_record_and_only_there(
    tmp_path: Path, spend: Callable[[float], float]
) -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "run.jsonl"
    # a step charged nothing between charged ones: charged time carried over would show
    charges = [0.0, 0.06, 0.0, 0.04, 0.0, 0.08, 0.02, 0.0]
    spent = []
    with watch(model, spool=path, every=10**9, diagnose=False) as monitor:
        for seconds in charges:
            loss = model(torch.randn(4, 3)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            took = spend(seconds)
            monitor.charge(took)
            monitor.charge(-1.0)  # nothing negative or undefined is counted
            monitor.charge(float("nan"))
            spent.append(took)
            monitor.step(loss)
    steps = [r for r in spool_records(path) if r["kind"] == "step"]
    assert [r["step"] for r in steps] == list(range(len(charges)))
    counted = [r["overhead"] * r["duration_s"] for r in steps]
    for i, (seconds, took) in enumerate(zip(counted, spent, strict=True)):
        assert seconds >= took, (i, seconds, took)
        if i > 0:  # step 0 is a heavy step; a light one of a 3-weight model costs ~0.1 ms
            assert seconds < took + 0.019, (i, seconds, took)
