"""One host copy per recorded step: every tensor leaf of a payload, in one transfer.

On the training thread, :func:`pack` walks the step's payload (dicts, lists and
tuples of tensors and plain values), concatenates every tensor leaf of a device into
one float64 buffer (a single ``torch.cat``) and starts a non-blocking copy into
pinned host memory with a CUDA event behind it. Nothing waits. On the background
thread, :meth:`Packed.unpack` waits for the event, then rebuilds the payload with
host tensors of the original shapes and dtypes.

On CPU the concatenation is the copy (the payload's tensors may be reused buffers
that the next step overwrites, so a copy is needed anyway).

Example:
    >>> import torch
    >>> packed = pack({"a": torch.ones(2), "b": [torch.tensor(3), "x"]})
    >>> packed.unpack()
    {'a': tensor([1., 1.]), 'b': [tensor(3), 'x']}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class _Leaf:
    device: int  # index into Packed.buffers
    offset: int
    shape: torch.Size
    dtype: torch.dtype


class _Seq:
    """A list or tuple of the skeleton that holds a leaf somewhere (rebuilt on unpack)."""

    __slots__ = ("as_list", "items")

    def __init__(self, as_list: bool, items: list[Any]) -> None:
        self.as_list = as_list
        self.items = items


class _Map:
    """A dict of the skeleton that holds a leaf somewhere (rebuilt on unpack)."""

    __slots__ = ("items",)

    def __init__(self, items: dict[Any, Any]) -> None:
        self.items = items


@dataclass
class Packed:
    """A payload whose tensor leaves travel to the host as one buffer per device."""

    skeleton: Any
    buffers: list[torch.Tensor] = field(default_factory=list)
    events: list[Any] = field(default_factory=list)

    def unpack(self) -> Any:
        """Wait for the copies, then return the payload with host tensors."""
        for event in self.events:
            event.synchronize()
        return _rebuild(self.skeleton, self.buffers)


_CONTAINERS = (torch.Tensor, dict, list, tuple)
#: the plain values payloads are made of: no isinstance() for them (on a slow box each
#: Python call of the walk counts: a heavy step's payload is ~20 containers)
_PLAIN = frozenset({int, float, str, bool, type(None)})


def _holds_nothing(values: Any) -> bool:
    """Whether none of ``values`` is a tensor or a container (plain values only)."""
    for v in values:  # noqa: SIM110 (all() of a generator: a frame per value)
        if type(v) not in _PLAIN and isinstance(v, _CONTAINERS):
            return False
    return True


class _Flattener:
    """Collects tensor leaves per device; containers without one are kept as they are.

    A payload's plain parts (lists of parameter slots, backward order) are passed by
    reference rather than copied element by element on the training thread and again
    on the background thread: quantities hand over fresh containers every step and
    never touch them again (docs of ``Quantity.finish_step``).
    """

    def __init__(self) -> None:
        self.parts: dict[torch.device, list[torch.Tensor]] = {}
        self.sizes: dict[torch.device, int] = {}
        self.devices: list[torch.device] = []

    def flatten(self, value: Any) -> Any:
        kind = type(value)
        if kind in _PLAIN:
            return value
        if kind is dict or (kind is not list and kind is not tuple and isinstance(value, dict)):
            if _holds_nothing(value.values()):
                return value
            return _Map({k: self.flatten(v) for k, v in value.items()})
        if kind is list or kind is tuple or isinstance(value, (list, tuple)):
            if _holds_nothing(value):
                return value
            return _Seq(isinstance(value, list), [self.flatten(v) for v in value])
        if isinstance(value, torch.Tensor):
            return self._leaf(value)
        return value

    def _leaf(self, value: torch.Tensor) -> _Leaf:
        # each op here is a dispatch per leaf per heavy step: skip those that would
        # return the tensor as it is (the usual float64 1-D norms of a quantity)
        t = value.detach() if value.requires_grad else value
        device = t.device
        parts = self.parts.get(device)
        if parts is None:
            parts = self.parts[device] = []
            self.sizes[device] = 0
            self.devices.append(device)
        offset = self.sizes[device]
        self.sizes[device] = offset + t.numel()
        if t.dim() != 1:
            t = t.reshape(-1)
        parts.append(t if t.dtype == torch.float64 else t.to(torch.float64))
        return _Leaf(self.devices.index(device), offset, value.shape, value.dtype)


def _rebuild(value: Any, buffers: list[torch.Tensor]) -> Any:
    if isinstance(value, _Leaf):
        n = 1
        for size in value.shape:
            n *= size
        flat = buffers[value.device][value.offset : value.offset + n]
        rebuilt = flat.view(value.shape)
        return rebuilt if value.dtype == flat.dtype else rebuilt.to(value.dtype)
    if isinstance(value, _Map):
        return {k: _rebuild(v, buffers) for k, v in value.items.items()}
    if isinstance(value, _Seq):
        items = [_rebuild(v, buffers) for v in value.items]
        return items if value.as_list else tuple(items)
    return value


def pack(payload: Any) -> Packed:
    """Start moving ``payload``'s tensor leaves to the host; never synchronises."""
    flattener = _Flattener()
    skeleton = flattener.flatten(payload)
    packed = Packed(skeleton)
    for device in flattener.devices:
        parts = flattener.parts[device]
        flat = torch.cat(parts) if len(parts) > 1 else parts[0].clone()
        if device.type == "cuda":
            host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
            host.copy_(flat, non_blocking=True)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(torch.cuda.current_stream(device))
            packed.buffers.append(host)
            packed.events.append(event)
        elif device.type == "cpu":
            packed.buffers.append(flat)
        else:  # other accelerators: a plain copy (may synchronise)
            packed.buffers.append(flat.to("cpu"))
    return packed
