"""Scenario 4: "the first ~100 of 121 LSTM timesteps get zero gradient".

One LSTM layer over 121 timesteps (batch_first, 1 input feature), as in the report.
The task: at every timestep, predict the running mean of the inputs so far.

- Bug: the loss is on the last timestep only. The gradient reaching timestep t is a
  product of ~(121 - t) per-step factors below 1, so it vanishes long before t = 0:
  gradwatch raises ``vanishing`` naming ``lstm``, with the horizon and a truncation
  length for truncated BPTT.
- Fixed (``--fixed``): a loss at every timestep, so every timestep gets gradient of
  its own.

Run:
    python examples/long_lstm.py            # the bug, recorded to .gradwatch/examples/
    python examples/long_lstm.py --fixed    # the twin
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _scenario

TIMESTEPS = 121


class LongLSTM(nn.Module):
    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.lstm = nn.LSTM(1, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(out)  # [batch, 121, 1]


def batch(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(size, TIMESTEPS, 1)
    steps = torch.arange(1, TIMESTEPS + 1, dtype=x.dtype).view(1, -1, 1)
    return x, x.cumsum(dim=1) / steps  # target: running mean so far


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = _scenario.parser("long_lstm", __doc__.splitlines()[0], steps=60)
    p.add_argument("--batch", type=int, default=32)
    args = _scenario.parse(p, argv)
    model = LongLSTM()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    clock = _scenario.StepClock(args.max_seconds)
    losses = []
    with _scenario.start(model, args) as monitor:
        for step in range(args.steps):
            if clock.out_of_time():
                break
            x, y = batch(args.batch)
            pred = model(x)
            if args.fixed:
                loss = nn.functional.mse_loss(pred, y)  # a loss at every timestep
            else:
                loss = nn.functional.mse_loss(pred[:, -1], y[:, -1])  # the last one only
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            monitor.step(loss)
            losses.append(loss.item())
            clock.lap()
            if (step + 1) % 20 == 0:
                monitor.epoch()
    first, last = clock.ends()
    variant = "loss at every timestep" if args.fixed else "loss on the last timestep only"
    lines = [
        f"long_lstm ({variant}): {len(clock.times)} steps over {TIMESTEPS} timesteps, "
        f"loss {losses[0]:.4f} -> {losses[-1]:.4f}, {last * 1e3:.1f} ms/step",
    ]
    return _scenario.report(
        args,
        clock,
        lines,
        {"loss_first": losses[0], "loss_last": losses[-1], "step_s": [first, last]},
    )


if __name__ == "__main__":
    main()
