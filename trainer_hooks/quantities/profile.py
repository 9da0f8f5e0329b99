"""Opt-in (``profile=True``): per-module forward and backward time and calls per step.

Forward pre/post hooks time each call. For the backward, the forward post-hook of a
captured call puts two hooks on the autograd graph (not on the model): a pre-hook on
the nodes that made the call's outputs starts the clock when their gradient is ready,
and a pre-hook on the nodes that made its inputs stops it when the gradient reaches
them (for a module whose inputs need no gradient, such as the first layer fed raw
data or the model itself, the clock stops when the backward pass ends). Times are
inclusive (a module's time contains its children's) and summed over all calls in the
step; ``calls`` counts forward calls, so a decoder run once per target token shows
``calls: 20`` and where the time goes. Forward calls made while backward runs
(activation checkpointing recomputing a segment) are not counted. An input that
also feeds later modules stops the clock only when all of them have passed their
gradient back, so times of modules that share inputs overlap.

Cost: two Python hooks per module call and two per call in backward. On CUDA each of
them synchronises the device so that times are real: that is why profiling is opt-in
and, like every heavy quantity, follows ``every=``.

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


def _compiling() -> bool:
    # under torch.compile's tracing, time and graph hooks cannot be traced: stay out
    return bool(torch.compiler.is_compiling())


def _grad_fns(value: Any, depth: int = 0) -> list[Any]:
    if isinstance(value, torch.Tensor):
        return [value.grad_fn] if value.grad_fn is not None else []
    if depth < 3 and isinstance(value, (tuple, list)):
        return [n for item in value for n in _grad_fns(item, depth + 1)]
    if depth < 3 and isinstance(value, dict):
        return [n for item in value.values() for n in _grad_fns(item, depth + 1)]
    return []


class _BackwardClock:
    """Times one module call's backward; lives only as long as that call's graph."""

    __slots__ = ("generation", "key", "profile", "started", "waits_for_end")

    def __init__(self, key: int, profile: ModuleProfile, waits_for_end: bool) -> None:
        self.key = key
        self.profile = profile
        self.generation = profile.generation
        self.started: float | None = None
        self.waits_for_end = waits_for_end

    def start(self, grad_outputs: Any) -> None:
        p = self.profile
        if self.started is None and p.capturing and p.generation == self.generation:
            self.started = p.now()
            if self.waits_for_end:
                Variable._execution_engine.queue_callback(self.stop_at_end)

    def stop(self, grad_outputs: Any) -> None:
        if self.started is not None:
            self.profile.add_backward(self.key, self.profile.now() - self.started)
            self.started = None

    def stop_at_end(self) -> None:
        self.stop(None)


class ModuleProfile(Quantity):
    """Fills ``profile``: ``{module: {"forward_s", "backward_s", "calls"}}``."""

    name = "profile"
    heavy = True

    def __init__(self) -> None:
        super().__init__()
        self.generation = 0  # bumps every step: graph hooks of an earlier step stay quiet
        self._names: dict[int, str] = {}
        self._forward: dict[int, float] = {}
        self._backward: dict[int, float] = {}
        self._calls: dict[int, int] = {}
        self._started_f: dict[int, list[float]] = {}
        self._sync = False

    def attach(self, model: nn.Module) -> None:
        self._sync = any(p.is_cuda for p in model.parameters())
        for name, module in model.named_modules():
            self._names[id(module)] = name or type(module).__name__
            self._handles += [
                module.register_forward_pre_hook(self._pre_forward),
                module.register_forward_hook(self._post_forward),
            ]

    def detach(self) -> None:
        super().detach()
        self.capturing = False

    def start_step(self, capture: bool) -> None:
        super().start_step(capture)
        self.generation += 1
        for d in (self._forward, self._backward, self._calls, self._started_f):
            d.clear()

    def now(self) -> float:
        if self._sync:
            torch.cuda.synchronize()
        return time.perf_counter()

    def add_backward(self, key: int, seconds: float) -> None:
        self._backward[key] = self._backward.get(key, 0.0) + seconds

    def _pre_forward(self, module: nn.Module, args: Any) -> None:
        if _compiling():
            return
        if self.capturing and torch.is_grad_enabled() and not _in_backward():
            self._started_f.setdefault(id(module), []).append(self.now())

    def _post_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        if _compiling():
            return
        stack = self._started_f.get(id(module))
        if not (self.capturing and stack):
            return
        key = id(module)
        self._forward[key] = self._forward.get(key, 0.0) + self.now() - stack.pop()
        self._calls[key] = self._calls.get(key, 0) + 1
        outputs = set(_grad_fns(output))
        if not outputs:
            return
        inputs = set(_grad_fns(args)) - outputs
        clock = _BackwardClock(key, self, waits_for_end=not inputs)
        for node in outputs:
            node.register_prehook(clock.start)
        for node in inputs:
            node.register_prehook(clock.stop)

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
