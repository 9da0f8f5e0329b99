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


def _flatten(
    value: Any, groups: dict[torch.device, list[torch.Tensor]], devices: list[torch.device]
) -> Any:
    if isinstance(value, torch.Tensor):
        t = value.detach()
        if t.device not in groups:
            groups[t.device] = []
            devices.append(t.device)
        parts = groups[t.device]
        offset = sum(p.numel() for p in parts) if parts else 0
        parts.append(t.reshape(-1).to(torch.float64))
        return _Leaf(devices.index(t.device), offset, t.shape, t.dtype)
    if isinstance(value, dict):
        return {k: _flatten(v, groups, devices) for k, v in value.items()}
    if isinstance(value, list):
        return [_flatten(v, groups, devices) for v in value]
    if isinstance(value, tuple):
        return tuple(_flatten(v, groups, devices) for v in value)
    return value


def _rebuild(value: Any, buffers: list[torch.Tensor]) -> Any:
    if isinstance(value, _Leaf):
        n = 1
        for size in value.shape:
            n *= size
        flat = buffers[value.device][value.offset : value.offset + n]
        return flat.reshape(value.shape).to(value.dtype)
    if isinstance(value, dict):
        return {k: _rebuild(v, buffers) for k, v in value.items()}
    if isinstance(value, list):
        return [_rebuild(v, buffers) for v in value]
    if isinstance(value, tuple):
        return tuple(_rebuild(v, buffers) for v in value)
    return value


def pack(payload: Any) -> Packed:
    """Start moving ``payload``'s tensor leaves to the host; never synchronises."""
    groups: dict[torch.device, list[torch.Tensor]] = {}
    devices: list[torch.device] = []
    skeleton = _flatten(payload, groups, devices)
    packed = Packed(skeleton)
    for device in devices:
        parts = groups[device]
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
