"""`timestep_layout`: a cell's calls form a chain (call k fed call k-1's state) or not.

A cell applied over trees (children first, a node fed its children's states) is
marked "tree"; a loop is a chain, also when the state passes through a few ops on its
way. Series stay exact against plain autograd either way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from gradwatch.protocol import read_spool
from gradwatch.trainer_hooks import watch

F64 = torch.float64


def steps_of(path: Path) -> list[dict[str, Any]]:
    return [
        r for m in read_spool(path) if m["type"] == "batch"
        for r in m["records"] if r["kind"] == "step"
    ]


def norms(grads: tuple[torch.Tensor | None, ...]) -> torch.Tensor:
    return torch.stack([
        torch.zeros((), dtype=F64) if g is None else torch.linalg.vector_norm(g.to(F64))
        for g in grads
    ])


Tree = tuple[int, list[Any]]  # (word, children)


class ChildSumTreeGRU(nn.Module):
    """nn.GRUCell over a tree, children first; a node's state is its children's sum."""

    def __init__(self, hidden: int = 4) -> None:
        super().__init__()
        self.hidden = hidden
        self.embed = nn.Embedding(10, 3)
        self.cell = nn.GRUCell(3, hidden)
        self.head = nn.Linear(hidden, 1)

    def encode(self, tree: Tree, keep: list[torch.Tensor]) -> torch.Tensor:
        word, children = tree
        states = [self.encode(child, keep) for child in children]
        h = torch.stack(states).sum(0) if states else torch.zeros(1, self.hidden, dtype=F64)
        out: torch.Tensor = self.cell(self.embed(torch.tensor([word])), h)
        keep.append(out)
        return out

    def forward(self, tree: Tree, keep: list[torch.Tensor]) -> torch.Tensor:
        out: torch.Tensor = self.head(self.encode(tree, keep)).sum()
        return out


TREES: list[Tree] = [
    (1, [(2, []), (3, [(4, []), (5, [])])]),  # 5 nodes, depth 3
    (0, [(6, [(7, [(8, [])])]), (9, [])]),  # a chain of 3 under the root, and a leaf
]


@pytest.mark.parametrize("tree", TREES)
def test_a_cell_over_a_tree_is_marked_tree_and_its_series_are_exact(
    tmp_path: Path, tree: Tree
) -> None:
    torch.manual_seed(0)
    model = ChildSumTreeGRU().double()
    path = tmp_path / "tree.jsonl"
    with watch(model, run="tree", spool=path, diagnose=False) as monitor:
        outputs: list[torch.Tensor] = []
        loss = model(tree, outputs)
        loss.backward()
        monitor.step(loss)
    (record,) = steps_of(path)
    assert record["timestep_layout"] == {"cell": "tree"}
    got = torch.tensor(record["timesteps"]["cell"]["hidden"], dtype=F64)
    fresh: list[torch.Tensor] = []
    expected = norms(torch.autograd.grad(model(tree, fresh), fresh))
    assert got.shape == (len(fresh),)  # one entry per node, in call (post) order
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=0.0)


class Loop(nn.Module):
    """A chain; ``through`` is what the state goes through between calls."""

    def __init__(self, cell: nn.Module, through: Any) -> None:
        super().__init__()
        self.cell, self.through = cell, through

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        state: Any = None
        for t in range(x.shape[0]):
            state = self.cell(x[t]) if state is None else self.cell(x[t], self.through(state))
        h = state[0] if isinstance(state, tuple) else state
        out: torch.Tensor = h.sum()
        return out


@pytest.mark.parametrize(
    ("cell", "through"),
    [
        (nn.GRUCell(2, 3), lambda h: h),
        (nn.RNNCell(2, 3), lambda h: torch.tanh(h * 0.5 + 0.1)),  # a few ops on the way
        (nn.LSTMCell(2, 3), lambda s: (s[0] * 0.9, s[1])),
    ],
)
def test_a_loop_is_a_chain_and_sends_no_layout(
    tmp_path: Path, cell: nn.Module, through: Any
) -> None:
    model = Loop(cell.double(), through)
    path = tmp_path / "chain.jsonl"
    with watch(model, run="chain", spool=path, diagnose=False) as monitor:
        loss = model(torch.randn(6, 4, 2, dtype=F64))
        loss.backward()
        monitor.step(loss)
    (record,) = steps_of(path)
    assert len(record["timesteps"]["cell"]["hidden"]) == 6
    assert "timestep_layout" not in record  # absent means chain


def test_two_sequences_through_one_cell_in_one_pass_are_not_one_chain(tmp_path: Path) -> None:
    model = Loop(nn.GRUCell(2, 3).double(), lambda h: h)
    path = tmp_path / "two.jsonl"
    with watch(model, run="two", spool=path, diagnose=False) as monitor:
        loss = model(torch.randn(4, 1, 2, dtype=F64)) + model(torch.randn(3, 1, 2, dtype=F64))
        loss.backward()
        monitor.step(loss)
    (record,) = steps_of(path)
    assert record["timestep_layout"] == {"cell": "tree"}  # call 4 started afresh
