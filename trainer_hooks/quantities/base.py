"""The base of every captured quantity.

One small class per quantity, in the spirit of Cockpit's ``quantities/``: the
quantity's ``name`` is the record field it fills (``timesteps``, ``param_norms``,
``graph_nodes``...), the same name on the wire, in the database and in the chart.
Computation (on the training thread, tensors on the device) and encoding (on the
background thread, plain Python) never meet.

Life cycle, driven by the Monitor:

1. ``attach(model)`` once, from ``watch()``: register hooks, keep their handles.
   Hooks that only a capturing step needs come from ``hooks()`` instead: ``arm()``
   adds them for a capturing step and takes them off for a light one, where a hook
   that only returns would still cost a Python call (and ``Module.__call__``'s slower
   hooked path) on every call of every light step.
2. ``start_step(capture)`` when a training step begins (at ``watch()`` and right
   after every ``monitor.step()``). ``capture=False`` means this step is not a heavy
   one: hooks must return at once and hold nothing.
3. ``finish_step(loss)`` from ``monitor.step(loss)``, after backward. Returns a
   *payload*: a dict whose leaves are device tensors or plain Python values. It must
   not synchronise with the device (no ``.item()``, ``.tolist()``, ``.cpu()``): the
   Monitor moves every tensor leaf to the host in one non-blocking copy. Containers
   without a tensor inside reach ``encode`` as they are (not copied): hand over fresh
   ones every step and do not change them afterwards.
4. ``encode(payload)`` on the background thread, with every tensor leaf now a host
   tensor (same shape and dtype): returns the record fields (JSON-able: floats, ints,
   lists, dicts). Two keys are merged rather than copied: ``nonfinite`` dicts of all
   quantities are deep-merged, and an ``alerts`` list holds alert records
   (docs/PROTOCOL.md) that the Monitor sends right after the step record.
5. ``detach()`` from ``monitor.remove()``: remove every hook; idempotent.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch.utils.hooks import RemovableHandle


class Quantity:
    """One captured quantity; subclasses set ``name`` and override what they need.

    Example:
        >>> class LossScale(Quantity):
        ...     name = "loss_scale"
        ...     def finish_step(self, loss):
        ...         return {"loss_scale": loss.detach().abs()}
        ...     def encode(self, payload):
        ...         return {"loss_scale": float(payload["loss_scale"])}
    """

    name: ClassVar[str] = ""
    #: heavy quantities are captured only on the steps the schedule picks (``every=``);
    #: cheap ones on every step.
    heavy: ClassVar[bool] = True
    #: ``start_step(False)`` and ``finish_step()`` do nothing on a light step that follows
    #: a light step (its hooks only check ``capturing``): the Monitor skips both then,
    #: a few µs a quantity on every light step of a short training step.
    idle_when_light: ClassVar[bool] = False

    def __init__(self) -> None:
        self._handles: list[RemovableHandle] = []
        self.capturing = False
        #: whether this step captures the heavy quantities (set by the Monitor for
        #: light quantities too: heavy steps build a few more autograd nodes)
        self.heavy_step = False
        #: seconds this quantity's hooks spent on the training thread since the Monitor
        #: last read it; hooks may add to it (``time.perf_counter()`` deltas) and the
        #: Monitor sums it into the step's ``overhead`` and resets it.
        self.cost_s = 0.0
        self._detached = False

    def attach(self, model: torch.nn.Module) -> None:
        """Register this quantity's hooks on ``model`` (keep them in ``self._handles``)."""

    def start_step(self, capture: bool) -> None:
        self.capturing = capture

    def finish_step(self, loss: torch.Tensor | None) -> dict[str, Any]:
        """Return this step's payload (device tensors or plain values); never sync."""
        return {}

    def encode(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Turn a host-side payload into record fields (runs on the background thread)."""
        return payload

    def hooks(self) -> list[RemovableHandle]:
        """Register the hooks a capturing step needs and return their handles."""
        return []

    def arm(self, on: bool) -> None:
        """Hook for a capturing step (:meth:`hooks`), unhook for a light one.

        Adding or removing them happens only where a heavy step follows a light one
        or back (every step with ``every=1``: the hooks then stay on).
        """
        if on and not self._handles and not self._detached:
            self._handles = list(self.hooks())
        elif not on:
            self._unhook()

    def detach(self) -> None:
        """Remove every hook this quantity registered; safe to call twice."""
        self._detached = True
        self._unhook()

    def _unhook(self) -> None:
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()
