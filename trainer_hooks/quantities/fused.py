"""Per-timestep ‖∂L/∂x_t‖₂ of a fused ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN``.

A forward pre-hook swaps the module's input sequence ``x`` for a view of it that
carries a tensor hook (a view costs no copy; raw data that does not require grad gets
a detached leaf that does, so there is no upstream to lose). In backward the hook
receives ∂L/∂x, which already contains everything that flowed back through the
recurrence and, for bidirectional layers, both directions; it keeps it (summed over
backward passes, as ``.grad`` would be) and returns ``None``, so no gradient changes.
When the step closes it becomes one float64 norm per timestep in one tensor op.
``PackedSequence`` inputs are reduced per timestep with ``batch_sizes``.

The view (rather than a hook on ``x`` itself) makes the series this module's own: an
``x`` also used elsewhere still gives only the gradient flowing into this module.

With ``exact_hidden`` on a sampled step, a forward hook also replaces the module's
output with an unrolled re-computation (:mod:`.unrolled`) that exposes every h_t.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence

from .calls import F64, Call, accumulate, eager, hook_tensor, in_backward
from .unrolled import unrolled_forward

if TYPE_CHECKING:
    from .owner import CaptureOwner


def _first_state(hx: Any) -> torch.Tensor | None:
    if isinstance(hx, torch.Tensor):
        return hx
    if isinstance(hx, (tuple, list)) and hx and isinstance(hx[0], torch.Tensor):
        return hx[0]
    return None


class FusedCapture:
    """The hooks on one fused recurrent module; ``calls`` are this step's calls."""

    def __init__(self, owner: CaptureOwner, module: nn.RNNBase, name: str) -> None:
        self.owner = owner
        self.module = module
        self.name = name
        self.calls: list[Call] = []
        self._last_state: torch.UntypedStorage | None = None  # what the previous call returned
        self._pending: tuple[Call, torch.Tensor] | None = None  # pre-hook -> forward hook
        # timestep index of each packed row, per (batch_sizes, device); built once per shape
        self._packed_index: OrderedDict[tuple[tuple[int, ...], str], torch.Tensor] = OrderedDict()

    def reset(self) -> None:
        self.calls = []
        self._last_state = None
        self._pending = None

    def register(self) -> list[Any]:
        return [
            self.module.register_forward_pre_hook(self._pre, with_kwargs=True),
            self.module.register_forward_hook(self._post, with_kwargs=True),
        ]

    # -- forward ---------------------------------------------------------------------

    @eager
    def _pre(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        if not self.owner.capturing or not torch.is_grad_enabled():
            return None
        started = time.perf_counter()
        try:
            return self._swap_input(args, kwargs)
        except Exception as e:  # monitoring must never break the training step
            self.owner.warn_failure("fused input capture", e)
            return None
        finally:
            self.owner.cost_s += time.perf_counter() - started

    def _swap_input(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        x: Any = args[0] if args else kwargs.get("input")
        hx = args[1] if len(args) > 1 else kwargs.get("hx")
        packed = isinstance(x, PackedSequence)
        data = x.data if packed else x
        if not isinstance(data, torch.Tensor) or not data.is_floating_point():
            return None
        probe = data.view_as(data) if data.requires_grad else data.detach().requires_grad_()
        if packed:
            length, time_dim = len(x.batch_sizes), -1
        elif probe.dim() == 2:  # unbatched (T, features)
            length, time_dim = probe.shape[0], 0
        else:
            time_dim = 1 if self.module.batch_first else 0
            length = probe.shape[time_dim]
        state = _first_state(hx)
        continues = (
            state is not None
            and self._last_state is not None
            and state.untyped_storage().data_ptr() == self._last_state.data_ptr()
        )
        call = Call(length, probe.device, continues=continues, recomputed=in_backward())
        call.series["input"] = None
        self.calls.append(call)
        step = self.owner.generation
        kept = _Kept()
        hook_tensor(probe, lambda g: self._on_grad(step, call, kept, g))
        if packed:
            index = self._index_for(x.batch_sizes, probe.device)
            call.finalizers.append(lambda: _packed_norms(call, kept, index))
        else:
            call.finalizers.append(lambda: _norms(call, kept, time_dim))
        if self.owner.exact_now and not packed and self._can_unroll():
            self._pending = (call, probe)
        new_x: Any = (
            PackedSequence(probe, x.batch_sizes, x.sorted_indices, x.unsorted_indices)
            if packed
            else probe
        )
        if args:
            return (new_x, *args[1:]), kwargs
        return args, {**kwargs, "input": new_x}

    def _can_unroll(self) -> bool:
        if getattr(self.module, "proj_size", 0):
            self.owner.warn_once(
                "exact_hidden_proj",
                f"gradwatch: exact_hidden does not support LSTM proj_size; {self.name} "
                "reports only its input series",
            )
            return False
        return True

    @eager
    def _post(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> Any:
        pending, self._pending = self._pending, None
        if not self.owner.capturing or not torch.is_grad_enabled():
            return None
        started = time.perf_counter()
        try:
            replaced = None
            if pending is not None:
                call, probe = pending
                hx = args[1] if len(args) > 1 else kwargs.get("hx")
                replaced = unrolled_forward(self.module, probe, hx, call)
            final = replaced if replaced is not None else output
            state = _first_state(final[1]) if isinstance(final, tuple) else None
            self._last_state = state.untyped_storage() if state is not None else None
            return replaced
        except Exception as e:
            self.owner.warn_failure("exact hidden capture", e)
            return None
        finally:
            self.owner.cost_s += time.perf_counter() - started

    # -- backward (tensor hooks: they only keep the gradient, and return None) -------

    def _on_grad(self, step: int, call: Call, kept: _Kept, grad: torch.Tensor) -> None:
        if step != self.owner.generation:
            return  # a late backward of an earlier step
        started = time.perf_counter()
        kept.grad = accumulate(kept.grad, grad)
        call.fired = True
        self.owner.cost_s += time.perf_counter() - started

    def _index_for(self, batch_sizes: torch.Tensor, device: torch.device) -> torch.Tensor:
        # batch_sizes lives on the CPU, so reading it never waits for the device
        key = (tuple(int(b) for b in batch_sizes.tolist()), str(device))
        index = self._packed_index.get(key)
        if index is None:
            steps = torch.arange(len(key[0]))
            index = torch.repeat_interleave(steps, batch_sizes.cpu()).to(device)
            self._packed_index[key] = index
            if len(self._packed_index) > 16:
                self._packed_index.popitem(last=False)
        return index


class _Kept:
    """∂L/∂x of one call, summed over the backward passes that reach it."""

    grad: torch.Tensor | None = None


def _norms(call: Call, kept: _Kept, time_dim: int) -> None:
    if kept.grad is not None:
        with torch.no_grad():
            dims = [d for d in range(kept.grad.dim()) if d != time_dim]
            call.series["input"] = torch.linalg.vector_norm(kept.grad, dim=dims, dtype=F64)


def _packed_norms(call: Call, kept: _Kept, index: torch.Tensor) -> None:
    if kept.grad is not None:
        with torch.no_grad():
            rows = torch.linalg.vector_norm(kept.grad, dim=1, dtype=F64).square_()
            sums = torch.zeros(call.length, dtype=F64, device=rows.device)
            call.series["input"] = sums.index_add_(0, index, rows).sqrt_()
