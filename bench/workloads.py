"""The training steps the overhead benchmarks time: a model, and a step for a copy of it.

bench/overhead.py's docstring says what each workload is; light_step.py,
quantity_cost.py and hook_floor.py time the same ones.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

# the four examples' models and data (long_lstm, rotation_lstm, tree_gru, seq2seq_attention)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

Step = Callable[[], torch.Tensor]


class CellDecoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(64, 128)
        self.head = nn.Linear(128, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = c = x.new_zeros(x.shape[1], 128)
        outs = []
        for t in range(x.shape[0]):
            h, c = self.cell(x[t], (h, c))
            outs.append(self.head(h))
        return torch.stack(outs)


class Fused2(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(64, 128, num_layers=2)
        self.head = nn.Linear(128, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(x)[0])


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(64, 4, dim_feedforward=256, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False)
        self.head = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


class LanguageModel(nn.Module):
    def __init__(self, vocab: int = 2000) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, 64)
        self.lstm = nn.LSTM(64, 128, num_layers=2, dropout=0.2)
        self.out = nn.Linear(128, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(self.lstm(self.embed(tokens))[0])


@dataclass
class Workload:
    """A model and a way to build a training step for a copy of it."""

    model: nn.Module
    make_step: Callable[[nn.Module], Step]
    options: dict[str, Any] = field(default_factory=dict)  # what watch() must be told


def _regression(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    opt: Callable[..., torch.optim.Optimizer] = torch.optim.Adam,
) -> Step:
    return _regression_over(model, [(x, y)], opt)


def _regression_over(
    model: nn.Module,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    opt: Callable[..., torch.optim.Optimizer] = torch.optim.Adam,
) -> Step:
    """MSE regression over ``batches`` in turn (one a step, round and round)."""
    optimizer = opt(model.parameters(), lr=1e-3)
    turn = itertools.count()

    def step() -> torch.Tensor:
        x, y = batches[next(turn) % len(batches)]
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    return step


def train(step: Step, monitor: Any, steps: int, flush: bool = True) -> None:
    """``steps`` steps, each closed by ``monitor`` if any, then (``flush``) its records
    handed over."""
    for _ in range(steps):
        loss = step()
        if monitor is not None:
            monitor.step(loss)
    if monitor is not None and flush:
        monitor.flush()


def workload(name: str, device: str = "cpu") -> Workload:
    """The workload ``name``; on another device than the CPU, one of DEVICE_WORKLOADS
    (the examples' own loops build tensors on the CPU)."""
    if device != "cpu" and name not in DEVICE_WORKLOADS:
        raise ValueError(f"expected one of {DEVICE_WORKLOADS} on {device}, got {name!r}")
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device)

    def on(model: nn.Module, make_step: Callable[[nn.Module], Step]) -> Workload:
        return Workload(model.to(device), make_step)

    if name == "cells":
        x, y = randn(24, 32, 64), randn(24, 32, 64)
        return on(CellDecoder(), lambda m: _regression(m, x, y))
    if name == "buckets":
        # Bucketed lengths, as a sequence data loader gives them: a different length
        # (and so a different autograd graph) from one step to the next.
        lengths = [12, 20, 28, 16, 24, 28, 12, 24, 16, 20, 16, 28, 20, 12, 24]
        pairs = [(randn(n, 32, 64), randn(n, 32, 64)) for n in (12, 16, 20, 24, 28)]
        batches = [pairs[(n - 12) // 4] for n in lengths]
        return on(CellDecoder(), lambda m: _regression_over(m, batches))
    if name == "fused2":
        x, y = randn(48, 32, 64), randn(48, 32, 64)
        return on(Fused2(), lambda m: _regression(m, x, y))
    if name == "transformer":
        x, y = randn(32, 48, 64), randn(32, 48, 64)
        return on(Encoder(), lambda m: _regression(m, x, y))
    if name == "lm":
        tokens = torch.randint(0, 2000, (36, 20), generator=gen).to(device)

        def lm_step(model: nn.Module) -> Step:
            optimizer = torch.optim.SGD(model.parameters(), lr=0.5)

            def step() -> torch.Tensor:
                logits = model(tokens[:-1])
                loss = nn.functional.cross_entropy(logits.reshape(-1, 2000), tokens[1:].reshape(-1))
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(model.parameters(), 0.25)
                optimizer.step()
                return loss

            return step

        return on(LanguageModel(), lm_step)
    if name == "long_lstm":
        import long_lstm

        x, y = (t.to(device) for t in long_lstm.batch(32))
        return on(long_lstm.LongLSTM(), lambda m: _regression(m, x, y))
    if name == "rotation_lstm":
        import rotation_lstm

        x, y = rotation_lstm.sequence(rotation_lstm.rotation())

        def rotation_step(model: Any) -> Step:
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

            def step() -> torch.Tensor:
                loss = (model(x) - y).square().sum()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                model.detach()  # the fixed twin
                return loss

            return step

        return Workload(rotation_lstm.RotationLSTM(), rotation_step)
    if name == "tree_gru":
        import tree_gru

        def tree_step(model: Any) -> Step:
            data = tree_gru.dataset(0, 8, size=9)  # each variant its own trees
            trees = [t for t, _ in data]
            labels = torch.tensor([label for _, label in data])
            optimizer = torch.optim.Adagrad(model.parameters(), lr=0.05)

            def step() -> torch.Tensor:
                for tree in trees:  # the fixed twin: no state kept across steps
                    tree.reset()
                loss = nn.functional.cross_entropy(model(trees), labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                return loss

            return step

        return Workload(tree_gru.TreeGRU(), tree_step, {"cells": ["cell"]})
    if name == "seq2seq_attention":
        import seq2seq_attention as s2s

        data = s2s.batch(32)

        def s2s_step(model: Any) -> Step:
            optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-3)
            return lambda: s2s.train_step(model, optimizer, data, looped=True)

        return Workload(s2s.Seq2Seq(), s2s_step)
    raise ValueError(f"expected a workload of {WORKLOADS}, got {name!r}")


WORKLOADS = (
    "cells",
    "buckets",
    "fused2",
    "transformer",
    "lm",
    "long_lstm",
    "rotation_lstm",
    "tree_gru",
    "seq2seq_attention",
)
#: the workloads whose model and data move to a GPU (bench/overhead.py --device cuda)
DEVICE_WORKLOADS = ("cells", "fused2", "transformer", "lm", "long_lstm")
