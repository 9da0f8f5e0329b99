"""The calls of one recurrent module within one training step, and how they combine.

A module can run several times in one step: truncated-BPTT chunks that carry the
state from one call to the next, gradient-accumulation micro-batches, a sub-module
called once per decoded token. Each forward call is one :class:`Call`; its hooks
fill ``Call.series`` during backward; :func:`combine_calls` turns a step's calls
into one series per name.

The rule (docs/CAPTURE.md, "Several calls in one step"):

- a call that *continues* the previous one (it was given the state the previous call
  returned, detached or not) appends its timesteps: chunks of one long sequence read
  as that sequence;
- a call that starts a new sequence (no state given, or a fresh one) is combined with
  the step's other sequences per timestep as the root of the sum of squares, aligned
  at t = 0: the norm over the union of their batches, as if the micro-batches had been
  one batch. Sequences of different lengths are zero-padded at the end.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import torch

F64 = torch.float64


#: -1 outside a backward pass (what in_backward() reads; hooks on every call read it)
graph_task_id = torch._C._current_graph_task_id


def in_backward() -> bool:
    """True while autograd runs a backward pass on this thread.

    A forward call made then is a checkpoint recomputation: non-reentrant
    checkpointing recomputes only to refill saved tensors (the gradient flows through
    the original call, so the recomputed call's hooks never fire and it is dropped);
    reentrant checkpointing recomputes and back-propagates through the recomputation
    (its hooks fire, and it is kept).
    """
    return bool(graph_task_id() != -1)


def checkpoint_signal(error: BaseException) -> bool:
    """Whether ``error`` is non-reentrant checkpointing's own signal, not a failure.

    While it recomputes a region in backward, ``torch.utils.checkpoint`` raises
    ``_StopRecomputationError`` from its saved-tensor hook once it has every tensor it
    needs, and catches it around the region. A capture that computes inside the region
    (the per-layer split, the exact-hidden unroll) must let it through: caught and
    retried, the region runs on past the stop and checkpointing fails backward with
    ``AssertionError: Unexpected state: target_frame.early_stop is set``.
    """
    return type(error).__name__ == "_StopRecomputationError" and type(error).__module__ == (
        "torch.utils.checkpoint"
    )


Fn = TypeVar("Fn", bound=Callable[..., Any])


def _inside_compile() -> Any:
    """Without dynamo's frame callback to read, every call is taken for one inside a
    compiled region: the disabled wrapper, as before the check."""
    return True


# dynamo's frame callback on this thread: None, or False (disabled), outside compile
_frame_callback: Callable[[], Any] = getattr(
    getattr(getattr(torch._C, "_dynamo", None), "eval_frame", None),
    "get_eval_frame_callback",
    _inside_compile,
)


_MODULES = sys.modules
_is_compiling = torch.compiler.is_compiling
_OUTSIDE = (None, False)  # the frame callback outside a compiled region


def eager(fn: Fn) -> Fn:
    """Run ``fn`` eagerly even inside ``torch.compile`` (a graph break, not a trace).

    The hooks keep per-step Python bookkeeping (call counters, step numbers); traced,
    dynamo would guard on those values and recompile at every call. Wrapping is
    deferred until dynamo has been imported by someone (``torch.compile`` imports it
    before it traces anything): importing it here would add seconds to ``watch()``
    for everyone who never compiles.

    Outside a compiled region (no frame callback set: what torch's own ``set_stance``
    checks) ``fn`` is called as it is. Any ``torch.optim`` optimizer imports dynamo,
    and the disabled wrapper cost a cell loop's hook, which runs on every call, ~0.75
    µs a call (BENCHMARKS.md, "Capture cost").
    """
    disabled: Fn | None = None

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        nonlocal disabled
        # while dynamo traces, is_compiling() is a constant True and the callback is
        # never read (dynamo could not trace that C call); eagerly inside a compiled
        # region (after a graph break) the callback is set: both take the wrapper
        if "torch._dynamo" not in _MODULES or (
            not _is_compiling() and _frame_callback() in _OUTSIDE
        ):
            return fn(*args, **kwargs)
        if disabled is None:
            disabled = cast(Fn, torch.compiler.disable(fn))  # type: ignore[no-untyped-call]
        return disabled(*args, **kwargs)

    return cast(Fn, call)


def accumulate(old: torch.Tensor | None, grad: torch.Tensor | None) -> torch.Tensor | None:
    """``old + grad`` as autograd accumulates ``.grad`` over several backward passes.

    Hooks keep the gradient itself (detached), not its norm, so that a second
    backward through the same graph (``retain_graph=True``, a double backward after
    ``create_graph=True``) adds up as ``.grad`` does; the norm is taken at step end.
    """
    if grad is None:
        return old
    grad = grad.detach()
    if old is None:
        return grad
    with torch.no_grad():
        return old + grad


def hook_tensor(tensor: torch.Tensor, hook: Callable[[torch.Tensor], None]) -> Any:
    """``tensor.register_hook`` with a type (torch leaves it untyped)."""
    return tensor.register_hook(hook)  # type: ignore[no-untyped-call]


@dataclass(eq=False)
class Call:
    """One forward call of a watched module within a step.

    ``series`` maps a series name to ``None`` until its hook fires, then to a float64
    tensor of shape ``(length,)`` or ``(directions, length)`` (per-direction norms
    that combine as the root of the sum of squares).
    """

    length: int
    device: torch.device
    continues: bool = False
    recomputed: bool = False
    series: dict[str, torch.Tensor | None] = field(default_factory=dict)
    fired: bool = False
    #: turn gradients kept by the hooks into series when the step closes (idempotent:
    #: they recompute from what the hooks kept)
    finalizers: list[Callable[[], None]] = field(default_factory=list)


def _series_of(call: Call, name: str) -> torch.Tensor:
    value = call.series[name]
    if value is None:  # no gradient reached it: dL/dx is zero there
        return torch.zeros(call.length, dtype=F64, device=call.device)
    if value.dim() == 2:  # one row per direction of a bidirectional layer
        return value[0] if value.shape[0] == 1 else value.square().sum(0).sqrt()
    return value


def combine_calls(calls: list[Call]) -> dict[str, torch.Tensor]:
    """One float64 series per name from a step's calls (device ops only, no sync)."""
    kept = [c for c in calls if c.fired or not c.recomputed]
    for call in kept:
        for finalize in call.finalizers:
            finalize()
    names: dict[str, None] = {}
    for call in kept:
        names.update(dict.fromkeys(call.series))
    result: dict[str, torch.Tensor] = {}
    for name in names:
        sequences: list[list[torch.Tensor]] = []
        for call in kept:
            if name not in call.series:
                continue
            part = _series_of(call, name)
            if call.continues and sequences:
                sequences[-1].append(part)
            else:
                sequences.append([part])
        joined = [parts[0] if len(parts) == 1 else torch.cat(parts) for parts in sequences]
        if len(joined) == 1:
            result[name] = joined[0]
            continue
        total = torch.zeros(max(s.shape[0] for s in joined), dtype=F64, device=joined[0].device)
        for s in joined:
            total[: s.shape[0]] += s.square()
        result[name] = total.sqrt_()
    return result
