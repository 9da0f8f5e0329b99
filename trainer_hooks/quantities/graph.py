"""``graph_nodes``: the size of the autograd graph behind the loss.

A bounded walk over ``grad_fn.next_functions`` from ``loss.grad_fn`` counts the
distinct autograd nodes reachable from the loss, ``AccumulateGrad`` leaves included
(``(w * x).sum()`` has three: ``SumBackward0``, ``MulBackward0`` and ``w``'s
``AccumulateGrad``). A graph that grows step over step while the model stays the
same means earlier steps' graphs are still attached: the stale hidden state of
``stale.py`` is the usual cause. The walk stops at ``limit`` nodes and then says so
with ``graph_truncated``, so a huge graph costs a bounded time.

The walk runs on the training thread (node objects cannot leave it safely), on
heavy steps only; it reads the graph and never changes it. It is paced by what it
finds. The number of nodes a step built (the loss's node number less the previous
loss's, read in O(1) on every step) tells one graph from another: a heavy step walks
when that number is none of the last ``RECENT_BUILT`` ones, or when the last walk of
a graph built alike found another count than the walk before it (the graph grows);
otherwise the gap between walks doubles, up to every ``MAX_PACE``-th heavy step. A
growing graph is walked on every heavy step; a steady one rarely (466 nodes of a cell
loop cost ~100-150 µs a walk), and so are the few graphs of sequences bucketed by
length, which differ from one step to the next (compared with the last step's only,
every heavy step walked there). Steps not walked carry no ``graph_nodes``.

Example:
    >>> import torch
    >>> w = torch.ones(3, requires_grad=True)
    >>> count_nodes((w * 2.0).sum().grad_fn)
    (3, False)
"""

from __future__ import annotations

from typing import Any

import torch

from .base import Quantity
from .recent import Recent

DEFAULT_LIMIT = 100_000
#: a steady graph is walked at least every this many heavy steps
MAX_PACE = 16
#: how many distinct numbers of nodes built per step (light and heavy steps apart)
#: count as seen lately, with the count the last walk of each found
RECENT_BUILT = 256


def count_nodes(root: Any, limit: int = DEFAULT_LIMIT) -> tuple[int, bool]:
    """Distinct autograd nodes reachable from ``root`` (a ``grad_fn``), and truncation.

    Returns ``(count, truncated)``; when ``truncated`` the count equals ``limit`` and
    is a lower bound.
    """
    if root is None:
        return 0, False
    # Holding every visited node keeps its Python wrapper alive, so identity is stable.
    # None (an input that needs no gradient) sits in the set from the start, so the
    # inner loop is one membership test per edge; the limit is checked once per node
    # (a node's few children may overshoot it before the walk stops).
    seen = {root, None}
    stack = [root]
    add, push, pop = seen.add, stack.append, stack.pop  # ~0.2 µs an edge: every lookup shows
    while stack:
        for child, _ in pop().next_functions:
            if child not in seen:
                add(child)
                push(child)
        if len(seen) > limit + 1:
            return limit, True
    return len(seen) - 1, False


class GraphSize(Quantity):
    """Fills ``graph_nodes`` and ``graph_truncated`` on heavy steps.

    Example:
        >>> import torch
        >>> q = GraphSize(); q.start_step(True)
        >>> w = torch.ones(3, requires_grad=True)
        >>> q.encode(q.finish_step((w * 2.0).sum()))
        {'graph_nodes': 3, 'graph_truncated': False}
    """

    name = "graph_nodes"
    heavy = True

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        super().__init__()
        if limit < 1:
            raise ValueError(f"expected a graph walk limit >= 1, got {limit!r}")
        self.limit = limit
        self._last_number: int | None = None  # the previous step's loss node number
        # the last RECENT_BUILT numbers of nodes built between two losses, after light
        # and after heavy steps (capture adds a few nodes of its own), oldest first,
        # each with the count its last walk found (None: not walked)
        self._recent = {False: Recent(RECENT_BUILT), True: Recent(RECENT_BUILT)}
        self._skip = 0  # heavy steps left before the next walk of a steady graph
        self._pace = 1

    def finish_step(self, loss: torch.Tensor | None) -> dict[str, Any]:
        if not isinstance(loss, torch.Tensor) or loss.grad_fn is None:
            return {}
        number = int(loss.grad_fn._sequence_nr())
        built = None if self._last_number is None else number - self._last_number
        self._last_number = number
        recent = self._recent[self.heavy_step]
        if not self.capturing:
            # most light steps build what the step before did: see() would move nothing
            if built != recent.last and recent.see(built):
                self._skip = 0  # walk at the next heavy step
            return {}
        changed = recent.see(built)
        last = recent.values[built]  # what the last walk of a graph built alike found
        if self._skip > 0 and not changed:
            self._skip -= 1
            return {}
        count, truncated = count_nodes(loss.grad_fn, self.limit)
        if count == last and not changed:
            self._pace = min(2 * self._pace, MAX_PACE)
        else:
            self._pace = 1
        self._skip, recent.values[built] = self._pace - 1, count
        return {"graph_nodes": count, "graph_truncated": truncated}
