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

Stacked layers (``num_layers > 1``): the fused kernels never materialise one layer's
output sequence. On a heavy step the pre-hook therefore pushes a ``TorchFunctionMode``
for the duration of the module's forward; it catches the module's own kernel call
(``_VF.lstm`` / ``gru`` / ``rnn_*`` with the module's ``_flat_weights``) and computes
it one layer at a time, each layer through the same kernel with ``num_layers=1`` and
that layer's weights, inter-layer dropout applied as the kernel applies it. Nothing is
computed twice; the input of every layer i >= 1 is a tensor of its own with a hook:
series ``layer<i>``. Light steps are untouched (no mode, one fused call).

With ``exact_hidden`` on a sampled step, a forward hook instead replaces the module's
output with an unrolled re-computation (:mod:`.unrolled`) that exposes every h_t (and
every layer's input).
"""

from __future__ import annotations

import functools
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import _VF, nn
from torch.nn.utils.rnn import PackedSequence
from torch.overrides import TorchFunctionMode

from .calls import F64, Call, accumulate, checkpoint_signal, eager, hook_tensor, in_backward
from .module_hooks import OwnHook
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
        self._handles: list[Any] = []
        self._split: _LayerSplit | None = None  # active during a heavy call's forward
        # timestep index of each packed row, per (batch_sizes, device); built once per shape
        self._packed_index: OrderedDict[tuple[tuple[int, ...], str], torch.Tensor] = OrderedDict()

    def reset(self) -> None:
        self.calls = []
        self._last_state = None
        self._pending = None
        self._end_split()  # a forward that raised never reached the forward hook

    def reached(self, k: int) -> bool:
        """Whether a gradient reached call ``k`` in this step (one of its hooks fired)."""
        return self.calls[k].fired

    def _end_split(self) -> None:
        split, self._split = self._split, None
        if split is not None and not split.close():
            self.owner.warn_once(
                "layer_split_stack",
                f"gradwatch: another torch function mode was pushed inside {self.name}'s "
                "forward and not popped; its per-layer capture stays off for that call",
            )

    def register(self) -> list[Any]:
        """Hook the module now (``watch()``); :meth:`arm` then follows the schedule."""
        self.arm(True)
        return []

    def arm(self, on: bool) -> None:
        """Hook the module for a heavy step, unhook it for a light one: two hooks that
        only return still cost two Python calls and ``Module.__call__``'s slower
        hooked path on every call of a light step (~20 µs a step on a busy loop)."""
        if on and not self._handles:
            self._handles = [
                self.module.register_forward_pre_hook(OwnHook(self._pre), with_kwargs=True),
                # always_call: a forward that raises (checkpointing's stop signal among
                # others) still pops the per-layer mode the pre-hook pushed
                self.module.register_forward_hook(
                    OwnHook(self._post), with_kwargs=True, always_call=True
                ),
            ]
        elif not on and self._handles:
            handles, self._handles = self._handles, []
            for handle in handles:
                handle.remove()

    # -- forward ---------------------------------------------------------------------

    @eager
    def _pre(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        self._end_split()
        if not self.owner.capturing or not torch.is_grad_enabled():
            return None
        started = time.perf_counter()
        try:
            return self._swap_input(module, args, kwargs)
        except Exception as e:  # monitoring must never break the training step
            self.owner.warn_failure("fused input capture", e)
            return None
        finally:
            self.owner.cost_s += time.perf_counter() - started

    def _swap_input(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        x: Any = args[0] if args else kwargs.get("input")
        hx = args[1] if len(args) > 1 else kwargs.get("hx")
        packed = isinstance(x, PackedSequence)
        data = x.data if packed else x
        if not isinstance(data, torch.Tensor) or not data.is_floating_point():
            return None
        if not data.requires_grad and not any(
            w is not None and w.requires_grad for w in self.module._flat_weights
        ):
            # A frozen module on data: training sends no gradient through it. A leaf
            # here would make every heavy step's backward run through it, and its
            # series would judge a gradient nothing uses (vanishing on a frozen encoder).
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
        elif isinstance(module, nn.RNNBase) and module.num_layers > 1:
            # Popped by the forward hook; if the forward raises first, by the next call's
            # pre-hook or the next step (until then it passes every torch call through).
            self._split = _LayerSplit(
                module,
                lambda inputs: self._hook_layers(call, x, inputs),
                lambda e: self.owner.warn_failure("per-layer capture", e),
            )
            self._split.__enter__()  # type: ignore[no-untyped-call]
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

    def _hook_layers(self, call: Call, x: Any, inputs: list[torch.Tensor]) -> None:
        """A hook on the input of every layer i >= 1: series ``layer<i>``."""
        step = self.owner.generation
        packed = isinstance(x, PackedSequence)
        time_dim = 1 if self.module.batch_first else 0
        for layer, layer_input in enumerate(inputs, start=1):
            name, kept = f"layer{layer}", _Kept()
            call.series[name] = None
            hook_tensor(layer_input, functools.partial(self._on_grad, step, call, kept))
            if packed:
                index = self._index_for(x.batch_sizes, layer_input.device)
                call.finalizers.append(functools.partial(_packed_norms, call, kept, index, name))
            else:
                call.finalizers.append(functools.partial(_norms, call, kept, time_dim, name))

    @eager
    def _post(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> Any:
        pending, self._pending = self._pending, None
        self._end_split()
        if output is None or not self.owner.capturing or not torch.is_grad_enabled():
            return None  # None: the forward raised (always_call), nothing to replace
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
            if checkpoint_signal(e):
                raise  # checkpointing has what it needs: its recomputation stops here
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


def _norms(call: Call, kept: _Kept, time_dim: int, name: str = "input") -> None:
    if kept.grad is not None:
        with torch.no_grad():
            dims = [d for d in range(kept.grad.dim()) if d != time_dim]
            call.series[name] = torch.linalg.vector_norm(kept.grad, dim=dims, dtype=F64)


def _packed_norms(call: Call, kept: _Kept, index: torch.Tensor, name: str = "input") -> None:
    if kept.grad is not None:
        with torch.no_grad():
            rows = torch.linalg.vector_norm(kept.grad, dim=1, dtype=F64).square_()
            sums = torch.zeros(call.length, dtype=F64, device=rows.device)
            call.series[name] = sums.index_add_(0, index, rows).sqrt_()


_KERNELS: dict[str, Any] = {
    "LSTM": _VF.lstm, "GRU": _VF.gru, "RNN_TANH": _VF.rnn_tanh, "RNN_RELU": _VF.rnn_relu,
}  # fmt: skip
# what cuDNN says when it is given one layer's slice of the module's weight buffer
_NOT_ONE_CHUNK = "RNN module weights are not part of single contiguous chunk"


class _LayerSplit(TorchFunctionMode):
    """Active during one heavy forward of a stacked fused module (pushed by the pre-hook,
    popped by the forward hook): the module's own kernel call runs layer by layer.

    Every other torch call passes through unchanged, and so does the kernel call of any
    other module (it is recognised by the module's ``_flat_weights`` list itself).
    """

    def __init__(
        self,
        module: nn.RNNBase,
        on_layers: Callable[[list[torch.Tensor]], None],
        on_failure: Callable[[Exception], None],
    ) -> None:
        super().__init__()
        self.module = module
        self.kernel = _KERNELS[module.mode]
        self.on_layers = on_layers
        self.on_failure = on_failure
        self.done = False

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if self.done or func is not self.kernel or kwargs:
            return func(*args, **kwargs)
        weights = self.module._flat_weights
        if len(args) != 9 or (args[2] is not weights and args[3] is not weights):
            return func(*args, **kwargs)
        packed = args[3] is weights  # (data, batch_sizes, hx, weights, ...)
        self.done = True
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=_NOT_ONE_CHUNK)
                result, inputs = layer_by_layer(self.kernel, args, packed)
            self.on_layers(inputs)
        except Exception as e:  # the fused call as it was: an error of the user's is raised there
            if checkpoint_signal(e):
                raise  # checkpointing has what it needs: its recomputation stops here
            self.on_failure(e)
            return func(*args, **kwargs)
        return result

    def close(self) -> bool:
        """Pop this mode if it is the innermost one (False when it is not)."""
        self.done = True
        depth = torch._C._len_torch_function_stack()
        if depth and torch._C._get_function_stack_at(depth - 1) is self:
            self.__exit__(None, None, None)
            return True
        return False


def layer_by_layer(
    kernel: Any, args: tuple[Any, ...], packed: bool
) -> tuple[tuple[torch.Tensor, ...], list[torch.Tensor]]:
    """A fused kernel call computed one layer at a time; (its result, layer inputs i >= 1).

    ``args`` are those ``nn.LSTM``/``GRU``/``RNN.forward`` gives the kernel:
    ``(input, hx, weights, bias, num_layers, dropout, train, bidirectional,
    batch_first)``, or ``(data, batch_sizes, hx, weights, ...)`` for a packed input.
    Each layer is the same kernel with ``num_layers=1``, its slice of the weights and
    of the initial state, and no dropout inside; between layers, the layer's output
    goes through ``at::dropout`` in training mode, as in the kernel's own layer loop.
    The result is the kernel's: ``(output, h_n, c_n)`` for an LSTM, else
    ``(output, h_n)``.
    """
    if packed:
        data, batch_sizes, hx, weights, bias, layers, dropout, train, bidirectional = args
    else:
        data, hx, weights, bias, layers, dropout, train, bidirectional, batch_first = args
    lstm = isinstance(hx, (tuple, list))
    h0, c0 = (hx[0], hx[1]) if lstm else (hx, None)
    dirs = 2 if bidirectional else 1
    per_layer = len(weights) // layers
    layer_input = data
    inputs: list[torch.Tensor] = []
    last_h: list[torch.Tensor] = []
    last_c: list[torch.Tensor] = []
    for layer in range(layers):
        if layer:
            if dropout and train:
                layer_input = F.dropout(layer_input, dropout, training=True)
            inputs.append(layer_input)
        params = weights[layer * per_layer : (layer + 1) * per_layer]
        rows = slice(layer * dirs, (layer + 1) * dirs)
        state: Any = (h0[rows], c0[rows]) if c0 is not None else h0[rows]
        flags = (bias, 1, 0.0, train, bidirectional)
        if packed:
            result = kernel(layer_input, batch_sizes, state, params, *flags)
        else:
            result = kernel(layer_input, state, params, *flags, batch_first)
        layer_input = result[0]
        last_h.append(result[1])
        if lstm:
            last_c.append(result[2])
    if lstm:
        return (layer_input, torch.cat(last_h), torch.cat(last_c)), inputs
    return (layer_input, torch.cat(last_h)), inputs
