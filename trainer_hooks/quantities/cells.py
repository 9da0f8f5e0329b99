"""Per-call ‖∂L/∂h_k‖₂ of recurrent cells called step by step in a Python loop.

Code run after every call of the cell (from the cell's class for torch's own cells,
``watched_class.py``; a forward hook for any other) fixes the call's index ``k`` right
then (backward fires hooks in reverse order, so the index cannot be counted there)
and asks autograd to keep the gradient of the call's output h_k (and c_k when the
cell returns ``(h, c)``): ``Tensor.retain_grad()``, a hook autograd runs in C++, so
backward calls no Python per call. It receives the total derivative ∂L/∂h_k, through
every later call, and adds up over several backward passes as ``.grad`` does
(``retain_graph=True``, a double backward). ``finish_step`` reads every kept
gradient and turns a step's gradients into float64 norms with one stack and one norm
per shape (a seq2seq decoder with a shrinking batch has a few shapes), so the cost
per call is one Python call in forward and no tensor op, and nothing waits for the
device.

What the user can see: an output h_k now has ``h_k.retains_grad`` and, after backward,
``h_k.grad`` (the gradient autograd computed anyway; no value anywhere changes).
gradwatch does not set it back to None: a user who calls ``h.retain_grad()`` after
the call (the hook has run by then) relies on that ``.grad``, and cannot be told apart.
The outputs are hidden states the loop replaces at every call; their ``.grad`` lives
as long as they do.

Where ``retain_grad()`` would not be gradwatch's own (the output already retains its
gradient because the user asked, or it is a leaf), the capture falls back to a hook
on the autograd node that produced it (a tensor hook for a leaf), which only keeps a
reference to the gradient.

What a cell returns: a tensor is h; a tuple or list whose first two items are
tensors is ``(h, c)``; otherwise its first tensor item is h. A module that returns
something else first (a decoder step returning ``(logits, state)``) should be watched
through the cell inside it instead.
"""

from __future__ import annotations

import time
from functools import partial
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from .calls import accumulate, eager, graph_task_id, hook_tensor
from .module_hooks import OwnHook
from .norms import Scratch, norms_in_order
from .watched_class import unwatch, watch_class

if TYPE_CHECKING:
    from .owner import CaptureOwner

SERIES = ("hidden", "cell")

#: ``CellCapture._handle`` while the cell's class is changed instead of hooked
_CLASS_SWAPPED = object()


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
    """The hook on one cell; call k's gradients are read at step end (:meth:`series`)."""

    def __init__(self, owner: CaptureOwner, module: nn.Module, name: str) -> None:
        self.owner = owner
        self.module = module
        self.name = name
        self._handle: Any = None
        self._scratch = Scratch()  # the step's gradients are stacked here (norms.py)
        self.reset()

    def reset(self) -> None:
        """Start a step: forget the last one's calls (and the outputs kept for them)."""
        self.count = 0
        self.device: torch.device | None = None
        # per call: the outputs (h, c) whose retained .grad holds its gradients (None
        # where a fallback hook keeps the gradient in `hooked` instead, or no c), and
        # their versions then (an in-place change later moves what .grad refers to)
        self.outputs: list[tuple[torch.Tensor | None, torch.Tensor | None]] = []
        self.versions: list[tuple[int, int]] = []
        self.hooked: dict[str, dict[int, torch.Tensor]] = {"hidden": {}, "cell": {}}
        self.used: set[str] = set()
        # calls made during backward (checkpoint recomputation) -> did a hook fire?
        self.recomputed: dict[int, bool] = {}
        # the last call's outputs, and the calls k > 0 that were not fed them
        self._previous: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)
        self.unfed: list[int] = []

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
        torch's own cells get no hook at all: their class changes while armed
        (``watched_class.py``), which keeps ``Module.__call__`` on its fast path.
        """
        if on and self._handle is None:
            # torch's own cells change class instead (watched_class.py): a forward hook
            # sends every call down the hooked call path, 4.8 µs a call more on a 2-core box
            if watch_class(self.module, self._post):
                self._handle = _CLASS_SWAPPED
            else:
                self._handle = self.module.register_forward_hook(OwnHook(self._post))
        elif not on and self._handle is not None:
            handle, self._handle = self._handle, None
            if handle is _CLASS_SWAPPED:
                unwatch(self.module)
            else:
                handle.remove()

    @eager
    def _post(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if not self.owner.capturing or not torch.is_grad_enabled():
            return
        started = time.perf_counter()
        try:
            self._watch_call(args, output)
        except Exception as e:  # monitoring must never break the training step
            self.owner.warn_failure("cell capture", e)
        self.owner.cost_s += time.perf_counter() - started

    def _watch_call(self, args: tuple[Any, ...], output: Any) -> None:
        # the per-call cost of a cell loop is this function: keep it lean (one tuple
        # per call, no Python hook left for backward, no grad_fn wrapper made, the
        # usual (h, c) and retain_grad() inline: each call saved is ~0.1 µs a call)
        if type(output) is tuple and len(output) == 2 and type(output[0]) is Tensor:
            h, c = output
            if type(c) is not Tensor:
                c = c if isinstance(c, Tensor) else None
        else:
            h, c = _split_output(output)
            if h is None:
                return
        if not h.requires_grad:
            return
        k = self.count
        self.count = k + 1
        if k:
            if not fed_by(args, self._previous):
                self.unfed.append(k)
        else:
            self.device = h.device
            self.used.add("hidden")
        self._previous = (h, c)
        if graph_task_id() != -1:  # a call during backward: a checkpoint's recomputation
            self.recomputed[k] = False
        if not h.is_leaf and not h.retains_grad:
            h.retain_grad()
            kept_h: Tensor | None = h
        else:
            kept_h = self._keep(h, k, "hidden")
        kept_c = None
        if c is not None and c.requires_grad:
            self.used.add("cell")
            if not c.is_leaf and not c.retains_grad:
                c.retain_grad()
                kept_c = c
            else:
                kept_c = self._keep(c, k, "cell")
        self.outputs.append((kept_h, kept_c))
        self.versions.append((h._version, kept_c._version if kept_c is not None else 0))

    def _keep(self, tensor: torch.Tensor, k: int, series: str) -> torch.Tensor | None:
        """Retain ``tensor``'s gradient (returns it), or hook it (returns None)."""
        if not tensor.is_leaf and not tensor.retains_grad:
            tensor.retain_grad()
            return tensor
        # a leaf, or the user retains it already: its .grad is not ours to read
        self._hook(tensor, self.owner.generation, k, self.hooked[series])
        return None

    def _hook(
        self, tensor: torch.Tensor, step: int, k: int, slots: dict[int, torch.Tensor]
    ) -> None:
        node = tensor.grad_fn
        if node is None:  # a leaf: only a tensor hook can see its gradient
            hook_tensor(tensor, partial(self._keep_leaf, step, k, slots))
        else:
            node.register_prehook(partial(self._keep_one, step, k, tensor.output_nr, slots))

    # The fallback hooks only keep a reference: series() takes every norm at once.

    def _keep_one(
        self,
        step: int,
        k: int,
        index: int,
        slots: dict[int, torch.Tensor],
        grads: tuple[torch.Tensor | None, ...],
    ) -> None:
        if step == self.owner.generation:  # else: a late backward of an earlier step
            kept = accumulate(slots.get(k), grads[index])
            if kept is not None:
                slots[k] = kept
            if self.recomputed and k in self.recomputed:
                self.recomputed[k] = True

    def _check_versions(self) -> None:
        """Warn (once) when user code changed a captured output in place after the call."""
        for (h, c), (vh, vc) in zip(self.outputs, self.versions, strict=True):
            if (h is not None and h._version != vh) or (c is not None and c._version != vc):
                self.owner.warn_once(
                    "cell_inplace",
                    f"gradwatch: an output of {self.name} was changed in place after the "
                    "call; its timestep norm is that of the changed tensor's gradient "
                    "(change a copy, h = h * mask, to keep the call's own)",
                )
                return

    def _keep_leaf(
        self, step: int, k: int, slots: dict[int, torch.Tensor], grad: torch.Tensor
    ) -> None:
        self._keep_one(step, k, 0, slots, (grad,))

    def reached(self, k: int) -> bool:
        """Whether a gradient reached call ``k``'s output h (or c) in this step: a
        retained ``.grad`` (or a fallback hook's) that is not None, zero or not."""
        if k >= len(self.outputs):
            return False
        for index, series in enumerate(SERIES):
            kept = self.outputs[k][index]
            if kept is not None:
                if kept.grad is not None:
                    return True
            elif self.hooked[series].get(k) is not None:
                return True
        return False

    def layout(self, spans: list[tuple[int, int]] | None = None) -> str:
        """``"chain"`` when every kept call after the first was fed the previous call's
        output state, ``"tree"`` otherwise.

        ``spans`` are the kept calls, ``(a, b)`` for calls ``a .. b-1`` (all calls when
        None). Calls left out between two spans break the chain: the call after them
        was checked against a call the step does not report.
        """
        spans = [(0, self.count)] if spans is None else spans
        if not spans:
            return "chain"
        if any(a > b for (_, b), (a, _) in pairwise(spans)):
            return "tree"
        first, stop = spans[0][0], spans[-1][1]
        return "tree" if any(first < k < stop for k in self.unfed) else "chain"

    def series(self, spans: list[tuple[int, int]] | None = None) -> dict[str, torch.Tensor]:
        """This step's float64 series, one entry per kept call, in call order: the calls
        ``a .. b-1`` of each span (the calls of the backward passes the step reports;
        all calls when None; device ops, no sync).

        Both series are reduced together (h and c of an LSTM cell have one shape):
        one stack and one norm for the step on CPU (``norms.py``).
        """
        spans = [(0, self.count)] if spans is None else spans
        calls = [(k, kept) for a, b in spans for k, kept in enumerate(self.outputs[a:b], a)]
        if not calls or self.device is None:
            return {}
        grads: dict[str, list[torch.Tensor | None]] = {}
        for index, series in enumerate(SERIES):
            if series in self.used:
                hooked = self.hooked[series]
                grads[series] = [
                    kept[index].grad if kept[index] is not None else hooked.get(k)  # type: ignore[union-attr]
                    for k, kept in calls
                ]
        # a call made during backward whose gradient never came (non-reentrant
        # checkpointing recomputes the forward only to refill saved tensors) is dropped
        dropped: set[int] = set()
        if self.recomputed:
            dropped = {
                at for at, (k, _) in enumerate(calls)
                if self.recomputed.get(k) is False
                and all(values[at] is None for values in grads.values())
            }
        self._check_versions()
        if dropped:
            grads = {
                series: [g for at, g in enumerate(values) if at not in dropped]
                for series, values in grads.items()
            }
        everything = [g for values in grads.values() for g in values]
        norms = norms_in_order(everything, self.device, self._scratch)
        result, at = {}, 0
        for series, values in grads.items():
            result[series] = norms[at : at + len(values)]
            at += len(values)
        return result


#: autograd nodes looked at, per call, to find the previous call's state upstream
FED_WALK = 32


def fed_by(args: Any, previous: tuple[torch.Tensor | None, torch.Tensor | None]) -> bool:
    """Whether a call's arguments hold the previous call's output state.

    Object identity first (``h = cell(x, h)``, ``cell(x, (h, c))``): a loop over the
    arguments, no allocation, on every captured call. Else a few autograd nodes
    upstream of each argument (``h = dropout(h)``, ``(h * mask, c)``): a state combined
    from several earlier calls (a tree cell summing its children's states) holds the
    previous call's only when that call is one of them. Host-side only.
    """
    h, c = previous
    if h is None:
        return False
    if c is None:
        c = h
    for arg in args:
        if arg is h or arg is c:
            return True
        if type(arg) is tuple or type(arg) is list:
            for item in arg:
                if item is h or item is c:
                    return True
    return _fed_upstream(args, (h, c))


def _fed_upstream(args: Any, targets: tuple[torch.Tensor, torch.Tensor]) -> bool:
    tensors: list[torch.Tensor] = []
    for arg in args:
        if isinstance(arg, torch.Tensor):
            tensors.append(arg)
        elif isinstance(arg, (tuple, list)):
            tensors.extend(a for a in arg if isinstance(a, torch.Tensor))
    wanted = {t.grad_fn for t in targets if t.grad_fn is not None}
    queue = [t.grad_fn for t in tensors if t.grad_fn is not None]
    seen: set[Any] = set()
    while queue and len(seen) < FED_WALK:
        node = queue.pop()
        if node in wanted:
            return True
        if node in seen:
            continue
        seen.add(node)
        queue.extend(n for n, _ in node.next_functions if n is not None)
    return False
