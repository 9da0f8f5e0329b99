"""Per-call ‖∂L/∂h_k‖₂ of recurrent cells called step by step in a Python loop.

A forward hook on the cell runs at every call. It fixes the call's index ``k`` right
then (backward fires hooks in reverse order, so the index cannot be counted there)
and hooks the autograd node that produced h_k (and c_k when the cell returns
``(h, c)``; one hook when both come from one node, as with CUDA's fused cell). In
backward that hook receives the total derivative ∂L/∂h_k, through every later call,
and only keeps a reference to it; ``finish_step`` turns all of a step's gradients
into float64 norms with one stack and one norm per shape (a seq2seq decoder with a
shrinking batch has a few shapes), so the cost per call is one hook and no tensor
op, and nothing waits for the device. The gradients are held until the step closes:
about the memory of the hidden states the graph held anyway.

What a cell returns: a tensor is h; a tuple or list whose first two items are
tensors is ``(h, c)``; otherwise its first tensor item is h. A module that returns
something else first (a decoder step returning ``(logits, state)``) should be watched
through the cell inside it instead.
"""

from __future__ import annotations

import time
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .calls import F64, accumulate, eager, hook_tensor, in_backward

if TYPE_CHECKING:
    from .timesteps import RecurrentTimesteps

SERIES = ("hidden", "cell")


def _split_output(output: Any) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    if isinstance(output, torch.Tensor):
        return output, None
    if isinstance(output, (tuple, list)) and output:
        first = output[0]
        second = output[1] if len(output) > 1 else None
        if isinstance(first, torch.Tensor):
            return first, second if isinstance(second, torch.Tensor) else None
    return None, None


class CellCapture:
    """The hook on one cell; ``grads[series][k]`` is ∂L/∂h_k once backward reached it."""

    def __init__(self, owner: RecurrentTimesteps, module: nn.Module, name: str) -> None:
        self.owner = owner
        self.module = module
        self.name = name
        self._handle: Any = None
        self.reset()

    def reset(self) -> None:
        self.count = 0
        self.device: torch.device | None = None
        self.grads: dict[str, list[torch.Tensor | None]] = {"hidden": [], "cell": []}
        self.used: set[str] = set()
        # calls made during backward (checkpoint recomputation) -> did a hook fire?
        self.recomputed: dict[int, bool] = {}

    def register(self) -> list[Any]:
        """Hook the cell now (``watch()``); :meth:`arm` then follows the schedule."""
        self.arm(True)
        return []

    def arm(self, on: bool) -> None:
        """Hook the cell for a heavy step, unhook it for a light one.

        A cell loop calls the hook on every call; on a light step (``every=N``) it
        would only return at once, but that still costs the call, the compile guard
        and the slower hooked path of ``Module.__call__`` (about 3 µs a call, 24 per
        step in a 24-token decoder). Adding or removing one hook costs about as much
        as one call, and happens only when a heavy step follows a light one or back.
        """
        if on and self._handle is None:
            self._handle = self.module.register_forward_hook(self._post)
        elif not on and self._handle is not None:
            handle, self._handle = self._handle, None
            handle.remove()

    @eager
    def _post(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if not self.owner.capturing or not torch.is_grad_enabled():
            return
        started = time.perf_counter()
        try:
            self._watch_call(output)
        except Exception as e:  # monitoring must never break the training step
            self.owner.warn_failure("cell capture", e)
        self.owner.cost_s += time.perf_counter() - started

    def _watch_call(self, output: Any) -> None:
        # the per-call cost of a cell loop is this function and the hooks it adds:
        # keep both lean (no per-call containers beyond the two list slots)
        h, c = _split_output(output)
        if h is None or not h.requires_grad:
            return
        k = self.count
        self.count = k + 1
        self.device = h.device
        hidden, cell = self.grads["hidden"], self.grads["cell"]
        hidden.append(None)
        cell.append(None)
        step = self.owner.generation
        self.used.add("hidden")
        if in_backward():
            self.recomputed[k] = False
        if c is None or not c.requires_grad:
            self._hook(h, step, k, hidden)
            return
        self.used.add("cell")
        node = h.grad_fn
        if node is not None and node is c.grad_fn:  # one node made both (CUDA's fused cell)
            node.register_prehook(
                partial(self._keep_pair, step, k, h.output_nr, c.output_nr, hidden, cell)
            )
            return
        self._hook(h, step, k, hidden)
        self._hook(c, step, k, cell)

    def _hook(
        self, tensor: torch.Tensor, step: int, k: int, slots: list[torch.Tensor | None]
    ) -> None:
        node = tensor.grad_fn
        if node is None:  # a leaf: only a tensor hook can see its gradient
            hook_tensor(tensor, partial(self._keep_leaf, step, k, slots))
        else:  # a node pre-hook costs less to add than a tensor hook
            node.register_prehook(partial(self._keep_one, step, k, tensor.output_nr, slots))

    # The backward side only keeps a reference: series() takes every norm at once.

    def _keep_one(
        self,
        step: int,
        k: int,
        index: int,
        slots: list[torch.Tensor | None],
        grads: tuple[torch.Tensor | None, ...],
    ) -> None:
        if step == self.owner.generation:  # else: a late backward of an earlier step
            slots[k] = accumulate(slots[k], grads[index])
            if self.recomputed and k in self.recomputed:
                self.recomputed[k] = True

    def _keep_pair(
        self,
        step: int,
        k: int,
        index_h: int,
        index_c: int,
        hidden: list[torch.Tensor | None],
        cell: list[torch.Tensor | None],
        grads: tuple[torch.Tensor | None, ...],
    ) -> None:
        if step == self.owner.generation:
            hidden[k] = accumulate(hidden[k], grads[index_h])
            cell[k] = accumulate(cell[k], grads[index_c])
            if self.recomputed and k in self.recomputed:
                self.recomputed[k] = True

    def _keep_leaf(
        self, step: int, k: int, slots: list[torch.Tensor | None], grad: torch.Tensor
    ) -> None:
        self._keep_one(step, k, 0, slots, (grad,))

    def series(self) -> dict[str, torch.Tensor]:
        """This step's float64 series, one entry per kept call (device ops, no sync)."""
        if self.count == 0 or self.device is None:
            return {}
        dropped = {k for k, fired in self.recomputed.items() if not fired}
        result = {}
        with torch.no_grad():
            for series in SERIES:
                if series in self.used:
                    grads = self.grads[series]
                    if dropped:
                        grads = [g for k, g in enumerate(grads) if k not in dropped]
                    result[series] = norms_in_order(grads, self.device)
        return result


def norms_in_order(grads: list[torch.Tensor | None], device: torch.device) -> torch.Tensor:
    """‖g‖₂ in float64 for each entry (0 for None), one stack and norm per shape."""
    first = grads[0] if grads else None
    if first is not None:  # the usual case, one shape and no gaps: no bookkeeping
        shape = first.shape
        if all(g is not None and g.shape == shape for g in grads):
            stacked: torch.Tensor = torch.stack(grads)  # type: ignore[arg-type]
            dims = tuple(range(1, stacked.dim()))
            norms: torch.Tensor = torch.linalg.vector_norm(stacked.detach(), dim=dims, dtype=F64)
            return norms
    groups: dict[tuple[Any, ...], list[int]] = {}
    for k, g in enumerate(grads):
        if g is not None:
            groups.setdefault((g.shape, g.dtype, g.device), []).append(k)
    results: list[torch.Tensor] = []
    position: dict[int, tuple[int, int]] = {}  # call -> (group, row in its norms)
    for members in groups.values():
        stacked = torch.stack([grads[k] for k in members])  # type: ignore[misc]
        dims = tuple(range(1, stacked.dim()))
        results.append(torch.linalg.vector_norm(stacked.detach(), dim=dims, dtype=F64))
        for row, k in enumerate(members):
            position[k] = (len(results) - 1, row)
    # stitch runs of consecutive calls from one group as slices (views, no copies)
    pieces: list[torch.Tensor] = []
    k, total = 0, len(grads)
    while k < total:
        end = k + 1
        if k not in position:
            while end < total and end not in position:
                end += 1
            pieces.append(torch.zeros(end - k, dtype=F64, device=device))
        else:
            group, row = position[k]
            while end < total and position.get(end) == (group, row + end - k):
                end += 1
            pieces.append(results[group][row : row + end - k])
        k = end
    if not pieces:
        return torch.zeros(0, dtype=F64, device=device)
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces)
