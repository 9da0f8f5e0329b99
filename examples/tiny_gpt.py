"""Scenario 5: "the loss of my small GPT spiked out of nowhere".

A GPT-style transformer (byte-level, 3 pre-norm blocks in an ``nn.ModuleList``)
learns to continue text that ships with gradwatch (its own docs; no download). Its
blocks are a stack, so gradwatch records ``depth``: ‖∂L/∂x_l‖ at the input of every
block, the gradient flowing back down the residual stream.

- Bug: at step ``--poison-step`` (80) a batch of short documents arrives, three
  quarters padding (byte 0, from a collate function that pads them to the context
  length), and the loss does not mask it: the model is trained to predict padding.
  gradwatch raises ``spike`` on ``loss`` at that step; it would name the block the
  gradient spike entered first on its way back, had one (cross-entropy bounds each
  token's gradient, so here the blocks' ‖∂L/∂x_l‖ stay in their band).
- Fixed (``--fixed``): the loss ignores the padding (``ignore_index=0``), so the
  same batch trains on its real text only: no spike.

Run:
    python examples/tiny_gpt.py            # the bug, recorded to .gradwatch/examples/
    python examples/tiny_gpt.py --fixed    # the twin
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

PAD = 0  # the padding byte; the text has none
CONTEXT = 32


def corpus() -> torch.Tensor:
    """The project's own docs as bytes (this script's source where they are absent)."""
    docs = Path(__file__).resolve().parents[1] / "docs"
    texts = [p.read_bytes() for p in sorted(docs.glob("*.md"))] if docs.is_dir() else []
    data = b"\n".join(texts) or Path(__file__).read_bytes()
    return torch.tensor(list(data.replace(b"\0", b" ")), dtype=torch.long)


class Block(nn.Module):
    """Pre-norm transformer block: x + attention(norm(x)), then x + MLP(norm(x))."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, width: int = 48, heads: int = 4, depth: int = 3) -> None:
        super().__init__()
        self.tokens = nn.Embedding(256, width)
        self.positions = nn.Embedding(CONTEXT, width)
        self.blocks = nn.ModuleList([Block(width, heads) for _ in range(depth)])
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, 256)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        length = idx.shape[1]
        x = self.tokens(idx) + self.positions(torch.arange(length))
        mask = nn.Transformer.generate_square_subsequent_mask(length)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln_f(x))


def batch(data: torch.Tensor, size: int, poisoned: bool) -> tuple[torch.Tensor, torch.Tensor]:
    starts = torch.randint(0, data.numel() - CONTEXT - 1, (size,))
    rows = torch.stack([data[s : s + CONTEXT + 1] for s in starts.tolist()])
    if poisoned:  # short documents: every row is padded after its first quarter
        rows[:, CONTEXT // 4 :] = PAD
    return rows[:, :-1], rows[:, 1:]


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = _scenario.parser("tiny_gpt", __doc__.splitlines()[0], steps=120)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--poison-step", type=int, default=80,
                   help="the step whose batch is mostly padding (default 80)")
    args = _scenario.parse(p, argv)
    data = corpus()
    model = TinyGPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    clock = _scenario.StepClock(args.max_seconds)
    losses = []
    ignore = PAD if args.fixed else -100  # -100: cross_entropy's default, nothing ignored
    with _scenario.start(model, args) as monitor:
        for step in range(args.steps):
            if clock.out_of_time():
                break
            x, y = batch(data, args.batch, poisoned=step == args.poison_step)
            logits = model(x)
            loss = nn.functional.cross_entropy(
                logits.reshape(-1, 256), y.reshape(-1), ignore_index=ignore
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            monitor.step(loss)
            losses.append(loss.item())
            clock.lap()
            if (step + 1) % 50 == 0:
                monitor.epoch()
    variant = "padding masked" if args.fixed else "padding trained on"
    poisoned = losses[args.poison_step] if len(losses) > args.poison_step else None
    lines = [
        f"tiny_gpt ({variant}): {len(clock.times)} steps, loss {losses[0]:.3f} -> "
        f"{losses[-1]:.3f}"
        + (f", {poisoned:.3f} at the padded batch (step {args.poison_step})"
           if poisoned is not None else ""),
    ]
    return _scenario.report(
        args, clock, lines,
        {"loss_first": losses[0], "loss_last": losses[-1], "losses": losses,
         "poison_step": args.poison_step},
    )


if __name__ == "__main__":
    main()
