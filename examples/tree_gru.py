"""Scenario 2: "training gets slower over time" (a tree GRU that keeps state on its trees).

As in the report, at toy scale: a hand-written GRU cell applied recursively over
trees, children first; an attention gate over each node's children; node states
stored on the tree objects (``node.state``); a random ``leaf_h`` initial state;
Adagrad, lr 0.05; 16 trees of 9 nodes, 8 per step (two steps an epoch), labelled by
the summed polarity of their words with 15% of the labels flipped afresh every epoch.
It trains like the reported model: the loss falls from 0.69 and settles around the
noise's entropy (0.2-0.8 per step over 40 steps), with gradient norms of 0.3-2.

Two choices keep it there. The cell's update is the textbook GRU's,
``h = z * h_prev + (1 - z) * h_cand``, a convex mix that keeps states in [-1, 1]
(the report's ``r * h_prev + (1 - z) * h_cand`` lets the kept states grow every
epoch until the logits saturate: loss exactly 0 within a few epochs, gradients near 1e-22,
which is not what the report saw). And the label
noise: without it, 16 trees are memorised within a few epochs and the loss goes to 0
in the healthy twin too.

- Bug: a node's gate also takes the state it was left with (``node.state``) when
  one is there, so from the second epoch on every tree's graph hangs on to the graph
  of the epoch before: each epoch's backward walks all earlier epochs again (with
  ``retain_graph=True``, which PyTorch then asks for). Steps get slower epoch after
  epoch. gradwatch's capture names ``cell`` (it receives a state still attached to an
  earlier step's graph); the diagnoses add ``graph_growth`` and ``slowdown``.

  Adagrad's in-place update would make current PyTorch refuse the second epoch
  (in-place modification error), so the bug variant runs the same Adagrad through
  ``.data`` (``_scenario.ThroughData``), which autograd does not see.
- Fixed (``--fixed``): the states are reset at the start of every epoch
  (``tree.reset()``), so leaves start from ``leaf_h`` and nodes see only their
  children; plain Adagrad.

Run:
    python examples/tree_gru.py [--fixed] [--steps 40]
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _scenario

VOCAB, DIM, HIDDEN = 100, 32, 32
LABEL_NOISE = 0.15


class Tree:
    """A node of a dependency-like tree; ``state`` is where the model leaves its output."""

    def __init__(self, word: int) -> None:
        self.word = word
        self.children: list[Tree] = []
        self.state: torch.Tensor | None = None

    def nodes(self) -> Iterator[Tree]:
        yield self
        for child in self.children:
            yield from child.nodes()

    def reset(self) -> None:
        for node in self.nodes():
            node.state = None


def random_tree(rng: random.Random, size: int) -> Tree:
    nodes = [Tree(rng.randrange(VOCAB)) for _ in range(size)]
    for i in range(1, size):
        nodes[rng.randrange(i)].children.append(nodes[i])
    return nodes[0]


class TreeGRUCell(nn.Module):
    """A hand-written GRU cell: z, r, candidate; h = z*h_prev + (1-z)*h_cand."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Linear(DIM, 3 * HIDDEN)
        self.u = nn.Linear(HIDDEN, 3 * HIDDEN, bias=False)

    def forward(self, x: torch.Tensor, h_prev: torch.Tensor) -> torch.Tensor:
        wz, wr, wh = self.w(x).chunk(3, dim=-1)
        uz, ur, uh = self.u(h_prev).chunk(3, dim=-1)
        z = torch.sigmoid(wz + uz)
        r = torch.sigmoid(wr + ur)
        h_cand = torch.tanh(wh + r * uh)
        return z * h_prev + (1 - z) * h_cand


class ChildAttention(nn.Module):
    """One gate per child: a softmax over the children's states."""

    def __init__(self) -> None:
        super().__init__()
        self.score = nn.Linear(HIDDEN, 1)

    def forward(self, children: torch.Tensor) -> torch.Tensor:  # [k, hidden]
        weights = torch.softmax(self.score(torch.tanh(children)), dim=0)
        return (weights * children).sum(dim=0)


class TreeGRU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, DIM)
        self.cell = TreeGRUCell()
        self.attention = ChildAttention()
        self.leaf_h = nn.Parameter(torch.randn(HIDDEN) * 0.1)
        self.classifier = nn.Linear(HIDDEN, 2)

    def encode(self, node: Tree) -> torch.Tensor:
        states = [self.encode(child) for child in node.children]
        if node.state is not None:
            # The bug: the state left on the tree by the last epoch, graph and all,
            # joins the children's states as one more input to the gate.
            states.append(node.state)
        h_prev = self.attention(torch.stack(states)) if states else self.leaf_h
        x = self.embedding(torch.tensor(node.word))
        node.state = self.cell(x, h_prev)
        return node.state

    def forward(self, trees: Sequence[Tree]) -> torch.Tensor:
        return self.classifier(torch.stack([self.encode(t) for t in trees]))


def dataset(seed: int, trees: int, size: int) -> list[tuple[Tree, int]]:
    rng = random.Random(seed)
    polarity = [rng.choice((-1, 1)) for _ in range(VOCAB)]
    out = []
    for _ in range(trees):
        tree = random_tree(rng, size)
        label = int(sum(polarity[n.word] for n in tree.nodes()) > 0)
        out.append((tree, label))
    return out


def noisy(labels: list[int], rng: random.Random) -> torch.Tensor:
    """The labels with each one flipped with probability ``LABEL_NOISE``, drawn afresh
    every epoch: the polarity is learnt, the noise cannot be, so the loss settles near
    the noise's entropy instead of going to 0 on a data set small enough to memorise."""
    return torch.tensor([1 - y if rng.random() < LABEL_NOISE else y for y in labels])


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = _scenario.parser("tree_gru", __doc__.splitlines()[0], steps=40)
    p.add_argument("--trees", type=int, default=16, help="trees in the data set (default 16)")
    p.add_argument("--batch", type=int, default=8, help="trees per step (default 8)")
    p.add_argument("--profile", action="store_true", help="per-module time (watch profile=True)")
    args = _scenario.parse(p, argv)
    data = dataset(args.seed, args.trees, size=9)
    model = TreeGRU()
    optimizer: Any
    if args.fixed:
        optimizer = torch.optim.Adagrad(model.parameters(), lr=0.05)
    else:
        optimizer = _scenario.ThroughData(list(model.parameters()), torch.optim.Adagrad, lr=0.05)
    batches = [data[i : i + args.batch] for i in range(0, len(data), args.batch)]
    clock = _scenario.StepClock(args.max_seconds)
    epoch_times: list[float] = []
    losses: list[float] = []
    noise = random.Random(args.seed + 1)
    step = 0
    with _scenario.start(model, args, cells=["cell"], profile=args.profile) as monitor:
        while step < args.steps and not clock.out_of_time():
            if args.fixed:
                for tree, _ in data:
                    tree.reset()
            epoch_time = 0.0
            for chunk in batches:
                if step == args.steps or clock.out_of_time():
                    break
                trees = [t for t, _ in chunk]
                labels = noisy([label for _, label in chunk], noise)
                loss = nn.functional.cross_entropy(model(trees), labels)
                losses.append(loss.item())
                optimizer.zero_grad()
                loss.backward(retain_graph=not args.fixed)
                optimizer.step()
                monitor.step(loss)
                epoch_time += clock.lap()
                step += 1
            monitor.epoch()
            epoch_times.append(epoch_time)
    first, last = clock.ends()
    lines = [
        f"tree_gru ({'state reset every epoch' if args.fixed else 'state kept on the trees'}): "
        f"epoch time {epoch_times[0] * 1e3:.0f} ms in epoch 1, {epoch_times[-1] * 1e3:.0f} ms "
        f"in epoch {len(epoch_times)}; step time {first * 1e3:.1f} -> {last * 1e3:.1f} ms; "
        f"loss {losses[0]:.3f} -> {losses[-1]:.3f}",
    ]
    summary = {"epoch_s": epoch_times, "step_s": [first, last], "loss": losses}
    return _scenario.report(args, clock, lines, summary)


if __name__ == "__main__":
    main()
