"""profile=True: a module's backward time is measured, and ends at its own last gradient.

The reference is the clock a user would hold: time around ``loss.backward()``. Every
module's ``backward_s`` lies inside that call, so it can never exceed it; a module fed
no gradient (an embedding) stops at its own node, not at the end of the pass.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from gradwatch.protocol import read_spool
from gradwatch.trainer_hooks import watch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def steps_of(path: Path) -> list[dict[str, Any]]:
    return [
        r for m in read_spool(path) if m["type"] == "batch"
        for r in m["records"] if r["kind"] == "step"
    ]


def example(name: str) -> Any:
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(f"profile_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("looped", [True, False])
def test_seq2seq_backward_times_never_exceed_the_backward_they_are_part_of(
    tmp_path: Path, looped: bool
) -> None:
    s2s = example("seq2seq_attention")
    torch.manual_seed(0)
    model = s2s.Seq2Seq()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    path = tmp_path / "s2s.jsonl"
    walls: list[float] = []
    with watch(model, run="s2s", every=1, spool=path, profile=True, diagnose=False) as monitor:
        for _ in range(4):
            src, tgt_in, tgt = s2s.batch(16)
            logits = model(src, tgt_in, looped)
            loss = nn.functional.cross_entropy(logits.reshape(-1, s2s.VOCAB), tgt.reshape(-1))
            optimizer.zero_grad()
            started = time.perf_counter()
            loss.backward()
            walls.append(time.perf_counter() - started)
            optimizer.step()
            monitor.step(loss)
    steps = steps_of(path)
    assert len(steps) == 4
    for wall, step in zip(walls, steps, strict=True):
        profile = step["profile"]
        assert profile["decoder.embedding"]["calls"] == (20 if looped else 1)
        for name, entry in profile.items():
            assert 0.0 <= entry["backward_s"] <= wall, (name, entry, wall)
        # every module's backward runs inside the model's: none takes longer
        root = profile["Seq2Seq"]["backward_s"]
        assert all(e["backward_s"] <= root for e in profile.values()), (root, profile)
        assert profile["decoder.embedding"]["backward_s"] > 0.0


class LateEmbedding(nn.Module):
    """An embedding made last in forward: its node runs first in backward, and the
    long branch made before it (a 100-step LSTM fed a leaf that needs a gradient) runs
    after it."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(16, 128)
        self.embedding = nn.Embedding(50, 128)

    def forward(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return (out[-1] * self.embedding(tokens)).sum()


def test_an_embedding_stops_its_clock_at_its_own_gradient_not_at_the_end_of_backward(
    tmp_path: Path,
) -> None:
    torch.manual_seed(1)
    model = LateEmbedding()
    path = tmp_path / "late.jsonl"
    spans: list[float] = []
    with watch(model, run="late", every=1, spool=path, profile=True, diagnose=False) as monitor:
        for _ in range(3):
            x = torch.randn(100, 16, 16, requires_grad=True)
            loss = model(x, torch.randint(0, 50, (16,)))
            # the user's own clock on the LSTM's part of the backward
            marks: dict[str, float] = {}

            def reached(grad: torch.Tensor, marks: dict[str, float] = marks) -> None:
                marks["x"] = time.perf_counter()

            x.register_hook(reached)
            started = time.perf_counter()
            loss.backward()
            spans.append(marks["x"] - started)
            monitor.step(loss)
    for span, step in zip(spans, steps_of(path), strict=True):
        embedding = step["profile"]["embedding"]["backward_s"]
        lstm = step["profile"]["lstm"]["backward_s"]
        assert 0.0 < embedding <= span
        # before: the embedding's clock ran to the end of the pass, through the LSTM's
        # backward; now it holds only its own node, a small part of the LSTM's time
        assert embedding < 0.5 * lstm, (embedding, lstm)


def test_a_module_too_big_to_time_leaves_its_backward_out(tmp_path: Path) -> None:
    deep = nn.Sequential(*[nn.Linear(4, 4) for _ in range(200)])  # 400+ own nodes
    model = nn.Sequential(deep, nn.Linear(4, 1))
    path = tmp_path / "deep.jsonl"
    with watch(model, run="deep", every=1, spool=path, profile=True, diagnose=False) as monitor:
        loss = model(torch.randn(2, 4)).sum()
        loss.backward()
        monitor.step(loss)
    (step,) = steps_of(path)
    profile = step["profile"]
    assert "backward_s" not in profile["0"] and profile["0"]["calls"] == 1
    assert profile["0.0"]["backward_s"] >= 0.0  # the first layer: two own nodes
    assert profile["Sequential"]["backward_s"] > 0.0  # the model: to the end of the pass
    assert profile["1"]["backward_s"] > 0.0  # fed a gradient-needing input
