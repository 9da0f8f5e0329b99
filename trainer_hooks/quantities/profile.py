"""Opt-in (``profile=True``): per-module forward and backward time and calls per step.

Forward pre/post hooks time each call. For the backward, the forward post-hook of a
captured call puts hooks on the autograd graph (not on the model): a pre-hook on the
nodes that made the call's outputs starts the clock when their gradient is ready.
Where the call's inputs need a gradient, a pre-hook on the nodes that made them stops
it when the gradient reaches them. Where they do not (an embedding, the first layer
fed raw data), the call's own nodes are the ones reachable from its outputs before
the parameters' leaves: each gets a post-hook, and the clock stops at the last of
them to finish, the call's own last gradient. A call with more than
``OWN_NODES_MAX`` own nodes is not timed in backward (its module's ``backward_s`` is
left out), except the model itself, whose own graph is the whole backward pass: its
clock stops when the pass ends.

Times are inclusive (a module's time contains its children's). A module's
``backward_s`` is the time during which at least one of its calls' backward was in
progress (the union of their intervals, so calls whose backward overlap are not
counted twice, and it never exceeds the backward pass); ``calls`` counts forward
calls, so a decoder run once per target token shows ``calls: 20`` and where the time
goes. Forward calls made while backward runs (activation checkpointing recomputing a
segment) are not counted. An input that also feeds later modules stops the clock
only when all of them have passed their gradient back, so times of modules that
share inputs overlap.

Same input on every call: the pre-hook also notes, per module and step, which
positional tensor arguments were the very same tensor on every call (the same
object, held by a weak reference; unchanged: same version counter and shape; the
module's own parameters unchanged too), so its work on them gives the same result. A
module called more than once with every tensor argument the same (attention's key
projection ``Ua(keys)`` inside a decoder's per-token loop) can be computed once
before the loop. Host-side reads only (object identity, ``_version``, ``shape``): no
device work. Such modules are listed in the step field ``same_input`` (absent when
there are none): ``{module: {"args": [argument names], "of": tensor arguments,
"calls": n, "from": {argument: "ancestor:argument"}}}``, where ``from`` names the
argument of an enclosing module that passed in that same tensor.

Cost: two Python hooks per module call and two per call in backward (one per own
node for a call whose inputs need no gradient, after a walk of them in forward). On
CUDA each of
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

import inspect
import time
import weakref
from typing import Any, ClassVar

import torch
from torch import nn
from torch.autograd import Variable

from .base import Quantity
from .calls import in_backward
from .module_hooks import OwnHook


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


#: own autograd nodes a call may have for its backward to be timed by post-hooks
OWN_NODES_MAX = 256


def _own_nodes(outputs: set[Any]) -> list[Any] | None:
    """The nodes reachable from ``outputs`` short of parameter leaves, or None when
    there are more than ``OWN_NODES_MAX`` (only for a call whose inputs need no
    gradient: everything upstream of its outputs is its own)."""
    seen: set[Any] = set()
    queue = list(outputs)
    while queue:
        node = queue.pop()
        if node in seen or type(node).__name__ == "AccumulateGrad":  # a parameter's leaf
            continue
        seen.add(node)
        if len(seen) > OWN_NODES_MAX:
            return None
        queue.extend(n for n, _ in node.next_functions if n is not None)
    return list(seen)


class _BackwardClock:
    """Times one module call's backward; lives only as long as that call's graph.

    ``own`` True: the clock stops at the last of the call's own nodes to finish (their
    post-hooks note the time), read when the pass ends. ``to_end`` True: it stops when
    the pass ends (the model itself). Else a pre-hook on an input's node stops it.
    """

    __slots__ = ("generation", "key", "last", "own", "profile", "started", "to_end")

    def __init__(self, key: int, profile: ModuleProfile, own: bool, to_end: bool) -> None:
        self.key = key
        self.profile = profile
        self.generation = profile.generation
        self.started: float | None = None
        self.last: float | None = None
        self.own = own
        self.to_end = to_end

    def start(self, grad_outputs: Any) -> None:
        p = self.profile
        if self.started is None and p.capturing and p.generation == self.generation:
            self.started = p.now()
            self.last = None
            if self.own or self.to_end:
                Variable._execution_engine.queue_callback(self.stop_at_end)

    def stop(self, grad_outputs: Any) -> None:
        if self.started is not None:
            self.profile.add_backward(self.key, self.started, self.profile.now())
            self.started = None

    def finished(self, grad_inputs: Any, grad_outputs: Any) -> None:
        if self.started is not None:
            self.last = self.profile.now()

    def stop_at_end(self) -> None:
        if self.started is None:
            return
        if self.to_end:
            self.stop(None)
            return
        if self.last is not None:
            self.profile.add_backward(self.key, self.started, self.last)
        self.started = None


def union_length(spans: list[tuple[float, float]]) -> float:
    """Total length of the union of ``(start, end)`` intervals.

    Example:
        >>> union_length([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)])
        4.0
    """
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


class ModuleProfile(Quantity):
    """Fills ``profile``: ``{module: {"forward_s", "backward_s", "calls"}}``."""

    name = "profile"
    heavy = True
    idle_when_light: ClassVar[bool] = True

    def __init__(self) -> None:
        super().__init__()
        self.generation = 0  # bumps every step: graph hooks of an earlier step stay quiet
        self._names: dict[int, str] = {}
        self._forward: dict[int, float] = {}
        self._backward: dict[int, list[tuple[float, float]]] = {}
        self._untimed: set[int] = set()  # modules with a call too big to time in backward
        self._root = 0
        self._calls: dict[int, int] = {}
        self._started_f: dict[int, list[float]] = {}
        self._sync = False
        self._modules: dict[int, nn.Module] = {}
        #: per module, this step: (positional tensor arguments of its first call as
        #: (index, object id, version, shape), its own parameters' versions), and the
        #: indices still the same tensor on every call since
        self._first: dict[int, tuple[list[tuple[int, int, int, Any]], tuple[int, ...]]] = {}
        self._same: dict[int, set[int]] = {}
        self._arg_names: dict[int, list[str]] = {}
        self._ancestors: dict[int, list[int]] = {}  # nearest first, the model last
        self._params: dict[int, tuple[nn.Parameter, ...]] = {}  # each module's own
        #: per module, this step: {argument index: "ancestor:argument"} of the tensors
        #: its first call got from the first call of an enclosing module
        self._from: dict[int, dict[int, str]] = {}
        self._refs: dict[int, list[weakref.ref[torch.Tensor]]] = {}

    def attach(self, model: nn.Module) -> None:
        self._sync = any(p.is_cuda for p in model.parameters())
        self._root = id(model)
        keys = {name: id(module) for name, module in model.named_modules()}
        for name, module in model.named_modules():
            self._names[id(module)] = name or type(module).__name__
            self._modules[id(module)] = module
            self._params[id(module)] = tuple(module.parameters(recurse=False))
            parts = name.split(".") if name else []
            self._ancestors[id(module)] = [
                keys[".".join(parts[:cut])]
                for cut in range(len(parts) - 1, -1, -1)
                if ".".join(parts[:cut]) in keys
            ]
            self._handles += [
                module.register_forward_pre_hook(OwnHook(self._pre_forward)),
                module.register_forward_hook(OwnHook(self._post_forward)),
            ]

    def detach(self) -> None:
        super().detach()
        self.capturing = False
        # a monitor kept after close() (a notebook's) must not keep the model alive
        self._modules.clear()
        self._params.clear()
        self._first.clear()
        self._refs.clear()

    def start_step(self, capture: bool) -> None:
        super().start_step(capture)
        self.generation += 1
        for d in (self._forward, self._backward, self._calls, self._started_f):
            d.clear()
        self._first.clear()
        self._same.clear()
        self._from.clear()
        self._refs.clear()
        self._untimed.clear()

    def now(self) -> float:
        if self._sync:
            torch.cuda.synchronize()
        return time.perf_counter()

    def add_backward(self, key: int, started: float, stopped: float) -> None:
        self._backward.setdefault(key, []).append((started, stopped))

    def _pre_forward(self, module: nn.Module, args: Any) -> None:
        if _compiling():
            return
        if self.capturing and torch.is_grad_enabled() and not in_backward():
            try:
                self._note_inputs(module, args)
            except Exception:  # an odd tensor type: claim nothing, never fail the forward
                self._first[id(module)] = ([], ())
                self._same[id(module)] = set()
            self._started_f.setdefault(id(module), []).append(self.now())

    def _note_inputs(self, module: nn.Module, args: Any) -> None:
        # Host-side only: object identity, version counter, shape (no device work).
        key = id(module)
        first = self._first.get(key)
        if first is not None:
            same = self._same[key]
            if not same:  # the usual case after a loop's second call: nothing to check
                return
            if any(p._version != v for p, v in zip(self._params[key], first[1], strict=True)):
                same.clear()  # its weights changed between calls: not the same work
                return
            refs = self._refs[key]
            for n, (i, _, version, size) in enumerate(first[0]):
                if i in same and not (
                    i < len(args)
                    and args[i] is refs[n]()
                    and args[i]._version == version
                    and args[i].shape == size
                ):
                    same.discard(i)
            return
        tensors = [
            (i, id(a), a._version, a.shape)
            for i, a in enumerate(args)
            if isinstance(a, torch.Tensor)
        ]
        # a weak reference tells the same object from a new one that reuses a freed one's
        # id (a view made and dropped per call), without keeping it alive
        self._refs[key] = [weakref.ref(args[i]) for i, _, _, _ in tensors]
        self._first[key] = (tensors, tuple(p._version for p in self._params[key]))
        self._same[key] = {i for i, _, _, _ in tensors}
        if tensors:
            self._from[key] = self._passed_in_by(key, tensors)

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
        own: list[Any] | None = []
        if not inputs:
            own = _own_nodes(outputs)
            if own is None and key != self._root:
                self._untimed.add(key)  # no clock: a time that is not its own is worse
                return
        clock = _BackwardClock(key, self, own=bool(own), to_end=own is None)
        for node in outputs:
            node.register_prehook(clock.start)
        for node in inputs:
            node.register_prehook(clock.stop)
        for node in own or ():
            node.register_hook(clock.finished)

    def finish_step(self, loss: torch.Tensor | None) -> dict[str, Any]:
        if not self.capturing or not self._calls:
            return {}
        profile: dict[str, dict[str, float]] = {}
        for key, calls in self._calls.items():
            entry = {"forward_s": self._forward.get(key, 0.0)}
            if key not in self._untimed:
                entry["backward_s"] = union_length(self._backward.get(key, []))
            entry["calls"] = calls
            profile[self._names[key]] = entry
        payload: dict[str, Any] = {"profile": profile}
        same = self._same_input()
        if same:
            payload["same_input"] = same
        return payload

    def _same_input(self) -> dict[str, dict[str, Any]]:
        """Modules called more than once this step with tensor arguments that were the
        same tensor on every call (see the module docstring)."""
        out: dict[str, dict[str, Any]] = {}
        for key, same in self._same.items():
            calls = self._calls.get(key, 0)
            if calls < 2 or not same:
                continue
            name = self._names[key]
            tensors = self._first[key][0]
            names = self._names_of_args(key)
            args = [names[i] if i < len(names) else f"argument {i}" for i in sorted(same)]
            entry: dict[str, Any] = {"args": args, "of": len(tensors), "calls": calls}
            sources = {
                (names[i] if i < len(names) else f"argument {i}"): source
                for i, source in self._from.get(key, {}).items()
                if i in same
            }
            if sources:
                entry["from"] = sources
            out[name] = entry
        return out

    def _passed_in_by(self, key: int, tensors: list[tuple[int, int, int, Any]]) -> dict[int, str]:
        """{argument index: "ancestor:argument"}: the nearest enclosing module, still in
        its first call of the step (so the tensors its call got are alive and their
        object ids unique), that got the same tensor object."""
        found: dict[int, str] = {}
        for ancestor in self._ancestors.get(key, ()):
            first = self._first.get(ancestor)
            if first is None or self._calls.get(ancestor, 0) or not self._started_f.get(ancestor):
                continue  # not running, or past its first call
            for i, ident, _, _ in tensors:
                if i in found:
                    continue
                for j, other, _, _ in first[0]:
                    if other == ident:
                        names = self._names_of_args(ancestor)
                        arg = names[j] if j < len(names) else f"argument {j}"
                        found[i] = f"{self._names[ancestor]}:{arg}"
                        break
        return found

    def _names_of_args(self, key: int) -> list[str]:
        """The positional parameter names of a module's ``forward`` (cached)."""
        names = self._arg_names.get(key)
        if names is None:
            try:
                params = inspect.signature(self._modules[key].forward).parameters.values()
                names = [
                    p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                ]
            except (TypeError, ValueError):  # a forward without a readable signature
                names = []
            self._arg_names[key] = names
        return names
