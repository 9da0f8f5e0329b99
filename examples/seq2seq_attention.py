"""Scenario 3: "adding attention made an epoch 25x slower" (a decoder called per token).

As in the report, at toy scale, on synthetic data (reverse the source sequence): an
encoder (2-layer bidirectional LSTM; the report had 4 layers, hidden 512), a decoder
LSTM with Luong dot attention over the encoder outputs, teacher forcing, RMSprop.
Run with ``profile=True``: per module, forward and backward time and calls per step.

- Bug: the decoder is called once per target token in a Python loop (as in the
  report; its shrinking ``batch_size_t`` is left out: every sequence here has the
  same length). gradwatch raises ``hotspot`` naming ``decoder``: most of the step,
  in 20 calls per step, and which of its children take the time.
- Fixed (``--fixed``): with teacher forcing every decoder input is known up front, so
  the same decoder runs once over the whole target: one fused LSTM call and the
  attention of all target positions in two batched matrix products. Same module,
  same weights, same loss (to float rounding).

Either way the example ends by timing both ways on the trained model, without
gradwatch, and prints both speeds.

Run:
    python examples/seq2seq_attention.py [--fixed] [--steps 30]
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

VOCAB, EMBED, HIDDEN, LENGTH, BOS = 40, 32, 64, 20, 0
State = tuple[torch.Tensor, torch.Tensor]


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, EMBED)
        self.lstm = nn.LSTM(EMBED, HIDDEN, num_layers=2, bidirectional=True, batch_first=True)
        self.project = nn.Linear(2 * HIDDEN, HIDDEN)
        self.bridge = nn.Linear(2 * HIDDEN, HIDDEN)

    def forward(self, src: torch.Tensor) -> tuple[torch.Tensor, State]:
        out, (h, _) = self.lstm(self.embedding(src))
        last = torch.cat([h[-2], h[-1]], dim=-1)  # the top layer, both directions
        h0 = torch.tanh(self.bridge(last)).unsqueeze(0)
        return self.project(out), (h0, torch.zeros_like(h0))


class LuongAttention(nn.Module):
    """Luong's global attention with the dot score: softmax(dec · enc) over the source."""

    def __init__(self) -> None:
        super().__init__()
        self.combine = nn.Linear(2 * HIDDEN, HIDDEN)

    def forward(self, dec: torch.Tensor, enc: torch.Tensor) -> torch.Tensor:
        weights = torch.softmax(torch.bmm(dec, enc.transpose(1, 2)), dim=-1)  # [B, T, S]
        context = torch.bmm(weights, enc)
        return torch.tanh(self.combine(torch.cat([context, dec], dim=-1)))


class Decoder(nn.Module):
    """Decodes any number of target positions at once: one, or all of them."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, EMBED)
        self.lstm = nn.LSTM(EMBED, HIDDEN, batch_first=True)
        self.attention = LuongAttention()
        self.out = nn.Linear(HIDDEN, VOCAB)

    def forward(
        self, tokens: torch.Tensor, state: State, enc: torch.Tensor
    ) -> tuple[torch.Tensor, State]:
        dec, state = self.lstm(self.embedding(tokens), state)
        return self.out(self.attention(dec, enc)), state


class Seq2Seq(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()
        self.decoder = Decoder()

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, looped: bool) -> torch.Tensor:
        enc, state = self.encoder(src)
        if not looped:
            return self.decoder(tgt_in, state, enc)[0]
        logits = []
        for t in range(tgt_in.shape[1]):  # the bug: one decoder call per target token
            step_logits, state = self.decoder(tgt_in[:, t : t + 1], state, enc)
            logits.append(step_logits)
        return torch.cat(logits, dim=1)


def batch(size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    src = torch.randint(1, VOCAB, (size, LENGTH))
    tgt = src.flip(1)
    tgt_in = torch.cat([torch.full((size, 1), BOS), tgt[:, :-1]], dim=1)
    return src, tgt_in, tgt


def train_step(model: Seq2Seq, optimizer: Any, data: Any, looped: bool) -> torch.Tensor:
    src, tgt_in, tgt = data
    logits = model(src, tgt_in, looped)
    loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tgt.reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = _scenario.parser("seq2seq_attention", __doc__.splitlines()[0], steps=30)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--compare", type=int, default=5, help="steps timed each way at the end")
    args = _scenario.parse(p, argv)
    model = Seq2Seq()
    optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-3)
    looped = not args.fixed
    losses = []
    clock = _scenario.StepClock(args.max_seconds)
    with _scenario.start(model, args, profile=True) as monitor:
        for step in range(args.steps):
            if clock.out_of_time():
                break
            loss = train_step(model, optimizer, batch(args.batch), looped)
            monitor.step(loss)
            losses.append(loss.item())
            clock.lap()
            if (step + 1) % 10 == 0:
                monitor.epoch()

    # Both ways on the trained model, gradwatch off: the same loss, two speeds.
    data = batch(args.batch)
    with torch.no_grad():
        same = [
            nn.functional.cross_entropy(
                model(data[0], data[1], way).reshape(-1, VOCAB), data[2].reshape(-1)
            ).item()
            for way in (True, False)
        ]
    sgd = torch.optim.SGD(model.parameters(), lr=0.0)  # time the step, leave the weights
    speeds = {
        "looped": _scenario.timed(lambda: train_step(model, sgd, data, True), args.compare),
        "batched": _scenario.timed(lambda: train_step(model, sgd, data, False), args.compare),
    }
    ratio = speeds["looped"] / speeds["batched"]
    lines = [
        f"seq2seq_attention ({'batched decoder' if args.fixed else 'decoder called per token'}): "
        f"loss {losses[0]:.3f} -> {losses[-1]:.3f} over {len(clock.times)} steps",
        f"  per-token decoder loop: {speeds['looped'] * 1e3:.1f} ms/step",
        f"  batched decoder:        {speeds['batched'] * 1e3:.1f} ms/step ({ratio:.1f}x faster)",
        f"  same loss both ways:    {same[0]:.6f} vs {same[1]:.6f}",
    ]
    return _scenario.report(
        args,
        clock,
        lines,
        {"speeds_s": speeds, "speedup": ratio, "same_loss": same, "loss_last": losses[-1]},
    )


if __name__ == "__main__":
    main()
