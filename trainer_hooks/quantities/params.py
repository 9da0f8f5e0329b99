"""Per-parameter and per-gate gradient norms, the total norm, non-finite parameters.

The norms are taken at the end of every backward pass of a heavy step (an autograd
callback queued by a hook on the parameters), so they are the raw gradients as
backward left them: before any clipping, before an optimizer or ``GradScaler.step``
touches them, and, with gradient accumulation, summed over every backward of the
step (the last callback wins). One reduction per device covers every parameter and
every gate chunk; nothing reaches the host here. The norms are float64: float32
gradients on CPU are reduced in float32 (float32 rounding, ~1e-7 relative; exact in
float64 where float32 would underflow or overflow, ``norms.py``), everything else in
float64 (on CUDA one fused ``_foreach_norm``).

With ``scaler=`` (a ``torch.amp.GradScaler``), the norms are divided by the
scaler's scale tensor on the device (no ``.item()``), so they are the unscaled
gradient norms whatever the scale was. Overflowing now and then is how a GradScaler
finds its scale: it skips that step and halves the scale. So the scale is copied
(device ops) at the end of backward and again at ``step()``; a step whose gradients
are not finite and whose scale fell in between was skipped by the scaler, and its
record carries :data:`SCALER_SKIPPED`, on which the Monitor leaves out the step's
``nonfinite`` field (no alarm): up to :data:`EXPECTED_SKIPS` captured steps in a
row, beyond which the scaler is skipping every step and that is reported.

Example:
    >>> import torch
    >>> lstm = torch.nn.LSTM(2, 3)
    >>> q = ParamNorms(); q.attach(lstm); q.start_step(True)
    >>> lstm(torch.randn(5, 1, 2))[0].sum().backward()
    >>> record = q.encode(q.finish_step(None))
    >>> sorted(record["gate_norms"]["weight_ih_l0"])
    ['f', 'g', 'i', 'o']
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from functools import partial
from typing import Any, ClassVar

import torch
from torch import nn
from torch.autograd import Variable

from gradwatch.protocol.messages import GRU_GATES, LSTM_GATES

from .base import Quantity
from .norms import tensor_norms
from .sharded import Groups, is_sharded, local_part, reduce_groups, reduce_norms

_GATED_PREFIXES = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
#: a private key of this quantity's fields: the GradScaler skipped this step for its
#: non-finite gradients (records.expected_nonfinite drops it with ``nonfinite``)
SCALER_SKIPPED = "_scaler_skipped"
#: captured steps in a row a GradScaler may skip before they count as non-finite: a
#: default scaler (2**16) backs off from too high a start in fewer steps
EXPECTED_SKIPS = 24


def gate_names(module: nn.Module) -> tuple[str, ...]:
    """The gate names of a recurrent module's packed weights, or ``()``."""
    if isinstance(module, (nn.LSTM, nn.LSTMCell)):
        return LSTM_GATES
    if isinstance(module, (nn.GRU, nn.GRUCell)):
        return GRU_GATES
    return ()


def scale_tensor(scaler: Any) -> torch.Tensor | None:
    """A ``GradScaler``'s current loss scale as the tensor on its device (no ``.item()``,
    nothing waits), or None without an enabled scaler or before its first ``scale()``."""
    if scaler is None or not scaler.is_enabled():
        return None
    scale = getattr(scaler, "_scale", None)
    return scale.detach() if isinstance(scale, torch.Tensor) else None


class ParamNorms(Quantity):
    """Fills ``param_norms``, ``gate_norms``, ``total_norm`` and ``nonfinite.parameters``.

    ``total_norm`` is the L2 norm over every gradient (the norm of the per-parameter
    norms). ``nonfinite.parameters`` lists, in ``named_parameters()`` order, the
    parameters whose gradient holds a NaN or infinity.

    Example:
        >>> import torch
        >>> model = torch.nn.Linear(2, 1)
        >>> q = ParamNorms(); q.attach(model); q.start_step(True)
        >>> model(torch.ones(1, 2)).sum().backward()
        >>> q.encode(q.finish_step(None))["param_norms"]["bias"]
        1.0
    """

    name = "param_norms"
    heavy = True
    idle_when_light: ClassVar[bool] = True

    def __init__(
        self,
        scaler: Any = None,
        select: Callable[[str], bool] | None = None,
        reduce_shards: bool = True,
        averaged: bool = False,
    ) -> None:
        super().__init__()
        self.scaler = scaler
        #: DistributedDataParallel: after DDP's own end-of-backward callback ``.grad``
        #: holds the gradient averaged over the ranks (what the optimizer steps with);
        #: its total norm is recorded too, as ``global_total_norm`` (no collective of
        #: ours: DDP's all-reduce made it)
        self.averaged = averaged
        #: sharded (FSDP2) gradients: all-reduce their squared norms so that the norms
        #: are global (a collective per heavy step: every rank must capture the same
        #: steps); False: each rank's shard norms, marked local (quantities/sharded.py)
        self.reduce_shards = reduce_shards
        self.select = select  # include=/exclude= of watch(), on parameter names
        self._names: list[str] = []
        self._params: list[nn.Parameter] = []
        # (index into self._params, gate names) for every packed recurrent weight
        self._gated: list[tuple[int, tuple[str, ...]]] = []
        self._pending: dict[str, Any] | None = None
        self._skipped = 0  # captured steps in a row the scaler skipped (encode's count)
        self._task: int | None = None  # graph task whose gradients are being collected
        self._order: list[int] = []  # parameter indices in the order backward finished them
        #: backward passes of this step that reached a parameter (ended), and the index
        #: of the first pass after the last time ``.grad`` was reset: the norms (the
        #: gradients after the last pass) describe passes ``since_reset ..passes-1``
        self.passes = 0
        self.since_reset = 0
        #: called at the end of every pass (after the norms): other quantities mark
        #: where a pass ended (the timesteps' call counts)
        self.listeners: list[Callable[[], None]] = []
        # (id, version) of every parameter's .grad as the last pass left it
        self._left: list[tuple[int, int] | None] = []
        self._sharded = False  # some watched parameter is a DTensor (FSDP2)

    def attach(self, model: nn.Module) -> None:
        index: dict[int, int] = {}
        for name, p in model.named_parameters():
            if p.requires_grad and (self.select is None or self.select(name)):
                index[id(p)] = len(self._params)
                self._names.append(name)
                self._params.append(p)
        self._sharded = any(is_sharded(p) for p in self._params)
        for _, module in model.named_modules():
            gates = gate_names(module)
            if not gates:
                continue
            for local, p in module.named_parameters(recurse=False):
                if local.startswith(_GATED_PREFIXES) and id(p) in index:
                    self._gated.append((index[id(p)], gates))
        self.arm(True)

    def hooks(self) -> list[Any]:
        """A post-accumulate-grad hook per parameter: one that only returned would
        still cost autograd a Python call per parameter per backward (a 4-layer
        transformer has 50 parameters), so they are on only for capturing steps."""
        return [
            p.register_post_accumulate_grad_hook(partial(self._on_grad, i))  # type: ignore[no-untyped-call]
            for i, p in enumerate(self._params)
        ]

    def _on_grad(self, index: int, param: torch.Tensor) -> None:
        # After each parameter's gradient is accumulated, in backward order. The first
        # of a backward pass queues the norms for the end of that pass.
        if not self.capturing:
            return
        task = torch._C._current_graph_task_id()
        if task != self._task:
            self._task = task
            self._order = []
            if self.passes and self._reset_since_last_pass(index):
                self.since_reset = self.passes
            Variable._execution_engine.queue_callback(self._capture)
        self._order.append(index)

    def _reset_since_last_pass(self, current: int) -> bool:
        """Whether ``.grad`` was reset between the last pass and this one.

        Runs at the first gradient of a pass, when only parameter ``current`` has
        been accumulated: any other whose ``.grad`` is gone (``zero_grad()``, which
        sets None) or changed in place (``zero_grad(set_to_none=False)``) since the
        last pass left it was reset, as a closure optimizer (LBFGS) does before each
        evaluation. Gradient accumulation leaves them as they were. Host-side reads
        of ``.grad`` and its version counter: no device work.
        """
        params = self._params
        for i, left in enumerate(self._left):
            if left is None or i == current:
                continue
            grad = params[i].grad
            if grad is None or id(grad) != left[0] or grad._version != left[1]:
                return True
        return False

    def _capture(self) -> None:
        started = time.perf_counter()
        try:
            with torch.no_grad():
                self._pending = self._norms()
                self._pending["order"] = self._order
            if self.averaged:
                # queued from a callback, it runs after the callbacks queued before it,
                # DDP's (which copies the averaged buckets into .grad) among them
                Variable._execution_engine.queue_callback(self._capture_averaged)
        except Exception as e:  # never into the training loop
            self._pending = {"error": f"{type(e).__name__}: {e}"}
        self._task = None
        self.passes += 1
        self._left = [None if p.grad is None else (id(p.grad), p.grad._version)
                      for p in self._params]
        for listener in self.listeners:
            try:
                listener()
            except Exception as e:  # an autograd callback: never into the training loop
                self._pending = {"error": f"{type(e).__name__}: {e}"}
        self.cost_s += time.perf_counter() - started

    def _capture_averaged(self) -> None:
        pending = self._pending
        if pending is None or "error" in pending:
            return
        started = time.perf_counter()
        try:
            by_device: dict[torch.device, list[torch.Tensor]] = {}
            for p in self._params:
                if p.grad is not None:
                    by_device.setdefault(p.grad.device, []).append(p.grad.detach())
            scale = scale_tensor(self.scaler)
            with torch.no_grad():
                pending["averaged"] = [
                    _unscaled_norms(grads, device, scale) for device, grads in by_device.items()
                ]
        except Exception as e:  # an autograd callback: never into the training loop
            pending["averaged_error"] = f"{type(e).__name__}: {e}"
        self.cost_s += time.perf_counter() - started

    def _norms(self) -> dict[str, Any]:
        grads = [p.grad for p in self._params]
        # per device: parameter slots, tensors to norm, and (slot, gate count) of the
        # gate chunks that follow the parameters in that device's tensor list
        groups: dict[torch.device, tuple[list[int], list[torch.Tensor], list[tuple[int, int]]]]
        groups = {}
        # A packed recurrent weight is normed per gate only; its own norm follows from
        # the gate norms on the host (sqrt of the sum of squares): the largest
        # gradients of an LSTM are then read once, not twice.
        # (A sharded one is normed whole: its gates straddle the shards.)
        sharded = self._sharded
        split = {
            i: len(gates)
            for i, gates in self._gated
            if grads[i] is not None and grads[i].shape[0] % len(gates) == 0  # type: ignore[union-attr]
            and not (sharded and is_sharded(grads[i]))
        }
        # FSDP2: each rank norms its shard (DTensor.to_local()); the squares are summed
        # over the shard groups below, per device, for all sharded gradients at once.
        reduce_at: dict[torch.device, dict[Groups, list[int]]] = {}
        scope = None
        for i, g in enumerate(grads):
            if g is not None:
                local = local_part(g) if sharded else g
                slots, tensors, _ = groups.setdefault(local.device, ([], [], []))
                if i in split:
                    continue
                if sharded and local is not g:
                    over = reduce_groups(g)
                    if over is None:  # Partial: not reduced yet, no norm from its parts
                        continue
                    scope = "global" if self.reduce_shards else "local"
                    reduce_at.setdefault(local.device, {}).setdefault(over, []).append(
                        len(tensors)
                    )
                slots.append(i)
                tensors.append(local)  # under no_grad: no detach needed (one op less each)
        packed: dict[torch.device, list[tuple[torch.Tensor, int]]] = {}
        for i, count in split.items():
            g = grads[i]
            assert g is not None
            groups[g.device][2].append((i, count))
            packed.setdefault(g.device, []).append((g, count))
        scale = scale_tensor(self.scaler)
        norms: list[torch.Tensor] = []
        for device, (_, tensors, _) in groups.items():
            vec = _unscaled_norms(tensors, device, scale, packed.get(device, []))
            if self.reduce_shards and device in reduce_at:
                vec = reduce_norms(vec, reduce_at[device])
            norms.append(vec)
        found: dict[str, Any] = {
            "scope": scope,
            "norms": norms,
            "slots": [slots for slots, _, _ in groups.values()],
            "gated": [gated for _, _, gated in groups.values()],
        }
        if scale is not None:  # the scale backward ran with (scaler.update() comes later)
            found["scale_before"] = scale.clone()
        return found

    def start_step(self, capture: bool) -> None:
        super().start_step(capture)
        self.arm(capture)
        self._pending = None
        self.passes = self.since_reset = 0
        self._left = []

    def detach(self) -> None:
        super().detach()
        self._params = []

    def finish_step(self, loss: torch.Tensor | None) -> dict[str, Any]:
        pending, self._pending = self._pending, None
        if pending and "error" not in pending:
            pending["passes"] = self.passes
            scale = scale_tensor(self.scaler) if "scale_before" in pending else None
            if scale is not None:  # after scaler.update(): lower when it skipped the step
                pending["scale_after"] = scale.clone()
        return pending or {}

    def encode(self, payload: dict[str, Any]) -> dict[str, Any]:
        if not payload:
            return {}
        if "error" in payload:
            raise RuntimeError(payload["error"])
        param_norms: dict[str, float] = {}
        gate_norms: dict[str, dict[str, float]] = {}
        gates_of = dict(self._gated)
        for vec, slots, gated in zip(
            payload["norms"], payload["slots"], payload["gated"], strict=True
        ):
            values = vec.tolist()
            for slot, value in zip(slots, values, strict=False):
                param_norms[self._names[slot]] = value
            position = len(slots)
            for i, count in gated:
                chunk = values[position : position + count]
                gate_norms[self._names[i]] = dict(zip(gates_of[i], chunk, strict=True))
                param_norms[self._names[i]] = math.sqrt(math.fsum(v * v for v in chunk))
                position += count
        fields: dict[str, Any] = {
            "param_norms": param_norms,
            "gate_norms": gate_norms,
            "total_norm": math.sqrt(math.fsum(v * v for v in param_norms.values())),
        }
        if payload.get("scope"):  # sharded gradients: their norms are global or local
            fields["norm_scope"] = payload["scope"]
        averaged = payload.get("averaged")
        if averaged:  # DDP: the total norm of the gradient averaged over the ranks
            fields["global_total_norm"] = math.sqrt(
                math.fsum(v * v for vec in averaged for v in vec.tolist())
            )
        # In the order backward produced them: the first is where the gradient first
        # went non-finite on its way back from the loss (everything before it in the
        # forward pass inherits the NaN); parameters never seen come last.
        order: dict[int, int] = {}
        for rank, slot in enumerate(payload.get("order", [])):
            order.setdefault(slot, rank)
        ranked = sorted(range(len(self._names)), key=lambda i: order.get(i, len(order) + i))
        bad = [
            self._names[i] for i in ranked
            if self._names[i] in param_norms and not math.isfinite(param_norms[self._names[i]])
        ]
        if bad:
            fields["nonfinite"] = {"parameters": bad}
        before, after = payload.get("scale_before"), payload.get("scale_after")
        skipped = bool(bad) and before is not None and after is not None and (
            float(after) < float(before)
        )
        self._skipped = self._skipped + 1 if skipped else 0
        if skipped and self._skipped <= EXPECTED_SKIPS:
            fields[SCALER_SKIPPED] = True
        # only when more than one: a step record with a field a column block lacks
        # travels whole in `records` (docs/PROTOCOL.md), so the usual step stays packed
        if payload.get("passes", 1) > 1:
            fields["backward_passes"] = payload["passes"]
        return fields


def _unscaled_norms(
    tensors: list[torch.Tensor],
    device: torch.device,
    scale: torch.Tensor | None,
    packed: list[tuple[torch.Tensor, int]] | None = None,
) -> torch.Tensor:
    """‖t‖₂ of each tensor of one device as float64, then of each gate of each packed
    recurrent gradient ``(g, gates)`` (its ``gates`` equal chunks along dim 0), divided
    by the AMP loss scale when there is one: device ops only (no sync).

    ``norms.tensor_norms``: float32 gradients on CPU in float32 (float32 rounding,
    float64 where float32 would underflow or overflow); CUDA and other dtypes in
    float64, on CUDA one fused ``_foreach_norm`` over the tensors and the gate chunks.
    """
    vec = tensor_norms(tensors, packed or ())
    if scale is not None:
        vec = vec / scale.to(device=device, dtype=torch.float64, non_blocking=True)
    return vec
