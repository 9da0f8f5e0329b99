"""Opt-in (``profile=True``): per-module forward and backward time and calls per step.

Forward pre/post hooks time each call; full backward pre/post hooks time the
module's backward, from the moment the gradient of its output is ready to the
moment the gradient of its input is computed (for a module whose inputs need no
gradient, such as the first layer fed raw data or the model itself, to the end of
the backward pass, where its parameters' gradients are complete). A module's backward
is seen through its top-level tensor outputs: when only tensors nested deeper are
used (``nn.LSTM``'s ``(h, c)``), its ``backward_s`` stays 0. Times are inclusive (a
module's time contains its children's) and summed over all calls in the step; ``calls`` counts
forward calls, so a decoder run once per target token shows ``calls: 20`` and where
the time goes. Forward calls made while backward runs (activation checkpointing
recomputing a segment) are not counted as calls and their time is not added.

Cost: four Python hooks per module call, and full backward hooks insert an identity
autograd node around each module's inputs and outputs (values and gradients are
unchanged). On CUDA, each hook synchronises the device so that times are real: that
is why profiling is opt-in and, like every heavy quantity, follows ``every=``.

Example:
    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    >>> q = ModuleProfile(); q.attach(model); q.start_step(True)
    >>> for _ in range(3): model(torch.randn(1, 2)).sum().backward()
    >>> q.encode(q.finish_step(None))["profile"]["0"]["calls"]
    3
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn
from torch.autograd import Variable

from .base import Quantity


def _in_backward() -> bool:
    return int(torch._C._current_graph_task_id()) != -1


class ModuleProfile(Quantity):
    """Fills ``profile``: ``{module: {"forward_s", "backward_s", "calls"}}``."""

    name = "profile"
    heavy = True

    def __init__(self) -> None:
        super().__init__()
        self._names: dict[int, str] = {}
        self._forward: dict[int, float] = {}
        self._backward: dict[int, float] = {}
        self._calls: dict[int, int] = {}
        self._started_f: dict[int, list[float]] = {}
        self._started_b: dict[int, list[float]] = {}
        self._sync = False

    def attach(self, model: nn.Module) -> None:
        self._sync = any(p.is_cuda for p in model.parameters())
        for name, module in model.named_modules():
            self._names[id(module)] = name or type(module).__name__
            self._handles += [
                module.register_forward_pre_hook(self._pre_forward),
                module.register_forward_hook(self._post_forward),
                module.register_full_backward_pre_hook(self._pre_backward),
                module.register_full_backward_hook(self._post_backward),
            ]

    def start_step(self, capture: bool) -> None:
        super().start_step(capture)
        for d in (self._forward, self._backward, self._calls, self._started_f, self._started_b):
            d.clear()

    def _now(self) -> float:
        if self._sync:
            torch.cuda.synchronize()
        return time.perf_counter()

    def _pre_forward(self, module: nn.Module, args: Any) -> None:
        if self.capturing and torch.is_grad_enabled() and not _in_backward():
            self._started_f.setdefault(id(module), []).append(self._now())

    def _post_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        stack = self._started_f.get(id(module))
        if self.capturing and stack:
            key = id(module)
            self._forward[key] = self._forward.get(key, 0.0) + self._now() - stack.pop()
            self._calls[key] = self._calls.get(key, 0) + 1

    def _pre_backward(self, module: nn.Module, grad_output: Any) -> None:
        if self.capturing:
            if not any(self._started_b.values()):
                # first module of this backward pass: close what is still open at its end
                Variable._execution_engine.queue_callback(self._close_open)
            self._started_b.setdefault(id(module), []).append(self._now())

    def _post_backward(self, module: nn.Module, grad_input: Any, grad_output: Any) -> None:
        if all(g is None for g in grad_input):
            # No input needs a gradient (raw data in, or the root): PyTorch calls this
            # hook as soon as the output gradient exists; the module's backward really
            # ends with the pass, so _close_open times it then.
            return
        stack = self._started_b.get(id(module))
        if self.capturing and stack:
            self._add_backward(id(module), stack.pop())

    def _add_backward(self, key: int, started: float) -> None:
        self._backward[key] = self._backward.get(key, 0.0) + self._now() - started

    def _close_open(self) -> None:
        for key, stack in self._started_b.items():
            while stack:
                self._add_backward(key, stack.pop())

    def finish_step(self, loss: torch.Tensor | None) -> dict[str, Any]:
        if not self.capturing or not self._calls:
            return {}
        return {
            "profile": {
                self._names[key]: {
                    "forward_s": self._forward.get(key, 0.0),
                    "backward_s": self._backward.get(key, 0.0),
                    "calls": calls,
                }
                for key, calls in self._calls.items()
            }
        }
