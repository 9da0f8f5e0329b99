"""Scenario 1: "every epoch is slower than the last" (a hidden state never detached).

As in the report: LSTM(3→30) → LSTM(30→300) → LSTM(300→30) → Linear(30→3) →
LeakyReLU, batch 1, 25 timesteps; the input is one random 3-vector at t = 0 and
zeros after it, the target at every step is that vector rotated once more by a
fixed 3-D rotation; L2 loss. The three ``(h, c)`` pairs live on the module
(``self.hidden``) and are fed back every iteration.

- Bug: ``self.hidden`` is never detached and backward uses ``retain_graph=True``
  (PyTorch asks for it once the graph is shared). Every iteration's graph contains
  all the earlier ones, so backward walks them all again: graph size and step time
  grow together. gradwatch's capture names ``lstm1`` (it receives a hidden state
  still attached to the previous step's graph); the diagnoses add ``graph_growth``
  (nodes per step) and ``slowdown`` (the step-time trend, explained by the graph).

  The original used Adam; current PyTorch stops that recipe at iteration 1 with an
  in-place modification error (Adam's update changes weights that the retained graph
  saved). So the bug variant runs the same Adam through ``.data``
  (``_scenario.ThroughData``), which autograd does not see, as older code did: the
  growth then happens exactly as reported.
- Fixed (``--fixed``): ``model.detach()`` after ``optimizer.step()`` (the accepted
  fix); ``retain_graph`` is no longer needed, and plain ``torch.optim.Adam`` works.

Run:
    python examples/rotation_lstm.py [--fixed] [--steps 40]
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _scenario

TIMESTEPS = 25
State = tuple[torch.Tensor, torch.Tensor]


def rotation(angle: float = 0.3) -> torch.Tensor:
    """A fixed 3-D rotation (about the axis (1, 1, 1)/√3), Rodrigues' formula."""
    k = torch.ones(3) / math.sqrt(3.0)
    kx = torch.tensor([[0.0, -k[2], k[1]], [k[2], 0.0, -k[0]], [-k[1], k[0], 0.0]])
    return torch.eye(3) + math.sin(angle) * kx + (1 - math.cos(angle)) * kx @ kx


class RotationLSTM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm1 = nn.LSTM(3, 30)
        self.lstm2 = nn.LSTM(30, 300)
        self.lstm3 = nn.LSTM(300, 30)
        self.linear = nn.Linear(30, 3)
        self.act = nn.LeakyReLU()
        self.hidden = [self._zeros(30), self._zeros(300), self._zeros(30)]

    @staticmethod
    def _zeros(size: int) -> State:
        return torch.zeros(1, 1, size), torch.zeros(1, 1, size)

    def detach(self) -> None:
        """The accepted fix: cut the carried state loose from the last graph."""
        self.hidden = [(h.detach(), c.detach()) for h, c in self.hidden]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, h1 = self.lstm1(x, self.hidden[0])
        out, h2 = self.lstm2(out, self.hidden[1])
        out, h3 = self.lstm3(out, self.hidden[2])
        self.hidden = [h1, h2, h3]
        return self.act(self.linear(out))  # [25, 1, 3]


def sequence(rot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    v = torch.randn(3)
    x = torch.zeros(TIMESTEPS, 1, 3)
    x[0, 0] = v
    targets = []
    for _ in range(TIMESTEPS):
        v = rot @ v
        targets.append(v)
    return x, torch.stack(targets).unsqueeze(1)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = _scenario.parser("rotation_lstm", __doc__.splitlines()[0], steps=40)
    args = _scenario.parse(p, argv)
    model = RotationLSTM()
    rot = rotation()
    optimizer: Any
    if args.fixed:
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    else:
        optimizer = _scenario.ThroughData(list(model.parameters()), torch.optim.Adam, lr=1e-3)
    clock = _scenario.StepClock(args.max_seconds)
    losses = []
    with _scenario.start(model, args) as monitor:
        for step in range(args.steps):
            if clock.out_of_time():
                break
            x, y = sequence(rot)
            loss = (model(x) - y).square().sum()
            optimizer.zero_grad()
            loss.backward(retain_graph=not args.fixed)
            optimizer.step()
            if args.fixed:
                model.detach()
            monitor.step(loss)
            losses.append(loss.item())
            clock.lap()
            if (step + 1) % 10 == 0:
                monitor.epoch()
    first, last = clock.ends()
    lines = [
        f"rotation_lstm ({'detached' if args.fixed else 'hidden state never detached'}): "
        f"step time {first * 1e3:.1f} ms at the start, {last * 1e3:.1f} ms after "
        f"{len(clock.times)} steps ({last / first:.1f}x)",
    ]
    return _scenario.report(
        args,
        clock,
        lines,
        {"loss_first": losses[0], "loss_last": losses[-1], "step_s": [first, last]},
    )


if __name__ == "__main__":
    main()
