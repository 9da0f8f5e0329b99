"""``update_ratios``: ‖w_after − w_before‖ / ‖w_before‖ of the optimizer step just taken.

The rule of thumb says an update of about 1e-3 of the weights is healthy; far above
it the optimizer is rewriting the layer every step, far below it the layer does not
learn. This is that ratio per parameter, measured rather than inferred from the
learning rate: whatever the optimizer did (momentum, Adam's normalisation, weight
decay) is in ``w_after − w_before``.

How: PyTorch's global optimizer step hooks
(``torch.optim.optimizer.register_optimizer_step_pre_hook`` / ``..._post_hook``),
which every ``torch.optim`` optimizer runs around ``step()``. On heavy steps only,
the pre-hook copies the watched parameters this optimizer holds (one foreach op:
``w * 1.0`` is bitwise ``w``); the post-hook takes ‖w_before‖, subtracts the new
weights from the copy in place and takes that norm, then drops the copy. Both norms
are float64 (``norms.tensor_norms``): float32 weights on CPU are reduced in float32
(float32 rounding, ~1e-7 relative), exact in float64 where float32 would underflow or
overflow (a tiny learning rate's 1e-20-scale Δw); CUDA and other dtypes in float64.
All on the device, nothing reaches the host until the Monitor's one copy per step. On
light steps both hooks return at once. Memory: one copy of the parameters for the
length of ``optimizer.step()`` on heavy steps. ``monitor.remove()`` removes both hooks.

What a step record's ratios describe: the optimizer steps taken between the previous
``monitor.step()`` and this one (the last one per parameter when there were several),
so call ``monitor.step()`` after ``optimizer.step()``. A parameter whose weights were
all zero before the step reads ``Infinity`` (``NaN`` if it did not move either).

Example:
    >>> import torch
    >>> model = torch.nn.Linear(2, 1)
    >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> q = UpdateRatios(); q.attach(model); q.start_step(True)
    >>> model(torch.ones(1, 2)).sum().backward(); optimizer.step()
    >>> sorted(q.encode(q.finish_step(None))["update_ratios"])
    ['bias', 'weight']
    >>> q.detach()
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import nn
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from gradwatch.trainer_hooks.warn import WarnOnce

from .base import Quantity
from .norms import tensor_norms
from .sharded import Groups, is_sharded, local_part, reduce_groups, reduce_norms


class UpdateRatios(Quantity):
    """Fills ``update_ratios``: {parameter: ‖Δw‖/‖w‖} of the step's optimizer update.

    Args:
        select: include=/exclude= of ``watch()``, applied to parameter names.
        reduce_shards: sharded (FSDP2) parameters: all-reduce the squared norms of
            their shards so the ratios are global (a collective per heavy step: every
            rank must capture the same steps); False: each rank's shard ratio.
    """

    name: ClassVar[str] = "update_ratios"
    heavy: ClassVar[bool] = True
    idle_when_light: ClassVar[bool] = True

    def __init__(
        self, select: Callable[[str], bool] | None = None, reduce_shards: bool = True
    ) -> None:
        super().__init__()
        self.select = select
        self.reduce_shards = reduce_shards
        self._over: dict[int, Groups] = {}  # slot -> shard groups, sharded ones only
        self._sharded = False  # some watched parameter is a DTensor (FSDP2)
        self._index: dict[int, int] = {}  # id(parameter) -> slot
        self._names: list[str] = []
        # id(optimizer) -> (slots, parameters, copies before the step)
        self._before: dict[int, tuple[list[int], list[torch.Tensor], list[torch.Tensor]]] = {}
        # (slots, float64 ratios) per optimizer step and device, in the order taken
        self._ratios: list[tuple[list[int], torch.Tensor]] = []
        self._once = WarnOnce()

    def attach(self, model: nn.Module) -> None:
        for name, p in model.named_parameters():
            if p.requires_grad and (self.select is None or self.select(name)):
                self._sharded = self._sharded or is_sharded(p)
                groups = reduce_groups(p)
                if groups is None:  # a Partial parameter: no norm from its parts
                    continue
                if groups:
                    self._over[len(self._names)] = groups
                self._index[id(p)] = len(self._names)
                self._names.append(name)

    def hooks(self) -> list[Any]:
        """Every optimizer's step pre- and post-hook, on capturing steps only (:meth:`arm`)."""
        return [register_optimizer_step_pre_hook(self._pre),
                register_optimizer_step_post_hook(self._post)]

    def detach(self) -> None:
        super().detach()
        self._before, self._ratios = {}, []

    def start_step(self, capture: bool) -> None:
        super().start_step(capture)
        self.arm(capture)
        self._ratios = []

    def _pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self.capturing:
            return
        started = time.perf_counter()
        try:
            slots: list[int] = []
            params: list[torch.Tensor] = []
            for group in optimizer.param_groups:
                for p in group["params"]:
                    slot = self._index.get(id(p))
                    if slot is not None:
                        slots.append(slot)
                        # FSDP2: the rank's shard (its local tensor, updated in place)
                        params.append(local_part(p.detach()) if self._sharded else p.detach())
            if params:
                with torch.no_grad():
                    copies = list(torch._foreach_mul(params, 1.0))
                self._before[id(optimizer)] = (slots, params, copies)
        except Exception as e:  # never into the training loop
            self._once.warn("update_ratios", f"gradwatch: update_ratios failed ({e!r})")
        finally:
            self.cost_s += time.perf_counter() - started

    def _post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        entry = self._before.pop(id(optimizer), None)
        if entry is None or not self.capturing:
            return
        started = time.perf_counter()
        try:
            slots, params, copies = entry
            groups: dict[torch.device, list[int]] = {}
            for i, p in enumerate(params):
                groups.setdefault(p.device, []).append(i)
            with torch.no_grad():
                for members in groups.values():
                    before = [copies[i] for i in members]
                    after = [params[i] for i in members]
                    weight = tensor_norms(before)
                    torch._foreach_sub_(before, after)  # the copies now hold -Δw
                    update = tensor_norms(before)
                    member_slots = [slots[i] for i in members]
                    if self._over and self.reduce_shards:
                        weight, update = self._global(member_slots, weight, update)
                    self._ratios.append((member_slots, update / weight))
        except Exception as e:  # never into the training loop
            self._once.warn("update_ratios", f"gradwatch: update_ratios failed ({e!r})")
        finally:
            self.cost_s += time.perf_counter() - started

    def _global(
        self, slots: list[int], weight: torch.Tensor, update: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Both norms of the sharded parameters made global, in one reduction each
        group: the weight norms and the update norms side by side."""
        n = len(slots)
        positions: dict[Groups, list[int]] = {}
        for k, slot in enumerate(slots):
            groups = self._over.get(slot)
            if groups:
                positions.setdefault(groups, []).extend((k, n + k))
        both = reduce_norms(torch.cat([weight, update]), positions)
        return both[:n], both[n:]

    def finish_step(self, loss: torch.Tensor | None) -> dict[str, Any]:
        """``{"groups": [(slots, float64 device tensor), ...]}``; never syncs."""
        if not self.capturing or not self._ratios:
            return {}
        groups, self._ratios = self._ratios, []
        return {"groups": groups}

    def encode(self, payload: dict[str, Any]) -> dict[str, Any]:
        groups = payload.get("groups")
        if not groups:
            return {}
        by_slot: dict[int, float] = {}
        for slots, ratios in groups:  # in the order taken: the last step per parameter wins
            by_slot.update(zip(slots, map(float, ratios.tolist()), strict=True))
        return {"update_ratios": {self._names[s]: by_slot[s] for s in sorted(by_slot)}}
