"""Per-call ‖∂L/∂h_k‖₂ of recurrent cells called step by step in a Python loop.

A forward hook on the cell runs at every call. It fixes the call's index ``k`` right
then (backward fires hooks in reverse order, so the index cannot be counted there)
and registers a tensor hook on the returned h_k (and c_k when the cell returns
``(h, c)``). In backward that hook receives the total derivative ∂L/∂h_k, through
every later call, and writes its float64 norm into a device buffer at index k: one
tensor op, no Python float per call, no host sync. The buffer is allocated once per
step with the capacity the previous step needed (doubling when a step needs more).

What a cell returns: a tensor is h; a tuple or list whose first two items are
tensors is ``(h, c)``; otherwise its first tensor item is h. A module that returns
something else first (a decoder step returning ``(logits, state)``) should be watched
through the cell inside it instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .calls import F64, hook_tensor, in_backward

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
    """The hook on one cell; this step's norms live in ``buffers``."""

    def __init__(self, owner: RecurrentTimesteps, module: nn.Module, name: str) -> None:
        self.owner = owner
        self.module = module
        self.name = name
        self.capacity = 64
        self.reset()

    def reset(self) -> None:
        self.count = 0
        self.buffers: dict[str, torch.Tensor] = {}
        self.used: set[str] = set()
        # calls made during backward (checkpoint recomputation) -> did a hook fire?
        self.recomputed: dict[int, bool] = {}

    def register(self) -> list[Any]:
        return [self.module.register_forward_hook(self._post)]

    def _post(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if not self.owner.capturing or not torch.is_grad_enabled():
            return
        try:
            self._watch_call(output)
        except Exception as e:  # monitoring must never break the training step
            self.owner.warn_failure("cell capture", e)

    def _watch_call(self, output: Any) -> None:
        h, c = _split_output(output)
        if h is None or not h.requires_grad:
            return
        k = self.count
        self.count += 1
        self._ensure(k + 1, h.device)
        step = self.owner.generation
        hook_tensor(h, lambda g: self._write(step, "hidden", k, g))
        self.used.add("hidden")
        if c is not None and c.requires_grad:
            hook_tensor(c, lambda g: self._write(step, "cell", k, g))
            self.used.add("cell")
        if in_backward():
            self.recomputed[k] = False

    def _ensure(self, size: int, device: torch.device) -> None:
        if self.buffers and size <= self.buffers["hidden"].shape[0]:
            return
        while self.capacity < size:
            self.capacity *= 2
        for series in SERIES:
            grown = torch.zeros(self.capacity, dtype=F64, device=device)
            old = self.buffers.get(series)
            if old is not None:  # norms an earlier backward of this step already wrote
                grown[: old.shape[0]] = old
            self.buffers[series] = grown

    def _write(self, step: int, series: str, k: int, grad: torch.Tensor) -> None:
        if step != self.owner.generation:
            return  # a late backward of an earlier step
        try:
            with torch.no_grad():
                torch.linalg.vector_norm(grad.detach(), dtype=F64, out=self.buffers[series][k])
            if k in self.recomputed:
                self.recomputed[k] = True
        except Exception as e:
            self.owner.warn_failure("cell gradient norm", e)

    def series(self) -> dict[str, torch.Tensor]:
        """This step's series (views of the step's own buffers; never reused)."""
        if self.count == 0:
            return {}
        dropped = [k for k, fired in self.recomputed.items() if not fired]
        keep: torch.Tensor | None = None
        if dropped:
            gone = set(dropped)
            index = [k for k in range(self.count) if k not in gone]
            keep = torch.tensor(index, dtype=torch.long).to(self.buffers["hidden"].device)
        result = {}
        for series in SERIES:
            if series not in self.used:
                continue
            values = self.buffers[series][: self.count]
            result[series] = values if keep is None else values.index_select(0, keep)
        return result
