"""Float64 L2 norms of many gradients in few device ops: the cells' series, exactly.

Every float32 (or half) value squares without underflow or rounding in float64, so
accumulating in float64 is exact to float64 rounding; float64 gradients, whose
squares underflow below ~1e-154, are scaled (``s * ||g / s||``, ``s = max|g|``).

How many ops matters more than how many bytes for a cell loop's gradients (48 of
32 x 128 a step): each op costs a dispatch and an allocation, and PyTorch's CPU
``_foreach_norm`` is a loop over the tensors, each cast to float64 on its own. On
CPU the gradients are therefore stacked (one float32 copy) and reduced by one
``vector_norm(..., dim=1, dtype=float64)`` per ``STACK_LIMIT`` elements: 48 gradients
of 32 x 128 took 105-163 µs against 199-225 µs for ``_foreach_norm`` (timeit, the
2-core box), and the series at ``step()`` 486 against 602 µs inside the training
loop. Gradients too large to stack two per reduction, and CUDA, keep
``_foreach_norm(dtype=float64)`` (on CUDA one fused kernel, with no copy).

Example:
    >>> grad_norms([torch.full((2, 2), 1e-300, dtype=torch.float64)])
    tensor([2.0000e-300], dtype=torch.float64)
"""

from __future__ import annotations

from typing import Any

import torch

from .calls import F64

#: elements stacked for one reduction on CPU: 128 KiB of float32 and its float64 copy.
#: Stacking all 48 gradients of the cell loop at once (2.3 MiB of temporaries) made
#: glibc hand the memory back and fault it in again: up to 64 page faults a step
#: against ~1, and the step's series 8 % faster than ``_foreach_norm`` instead of 19 %.
STACK_LIMIT = 1 << 15


def grad_norms(grads: list[torch.Tensor]) -> torch.Tensor:
    """‖g‖₂ of each of ``grads`` (one shape, dtype and device), float64, in order.

    Device ops only, no sync; exact to float64 rounding from float32's largest
    values to its subnormals, and for float64 gradients down to 1e-300 and below.
    """
    with torch.no_grad():
        first = grads[0]
        if first.dtype == F64:
            return _scaled(grads)
        if first.device.type != "cpu":
            return torch.stack(torch._foreach_norm(grads, 2, dtype=F64))
        size = first.numel()
        per = STACK_LIMIT // max(size, 1)
        if per < 2:  # a gradient fills a reduction alone: stacking saves nothing
            return torch.stack(torch._foreach_norm(grads, 2, dtype=F64))
        parts = []
        for i in range(0, len(grads), per):
            chunk = grads[i : i + per]
            rows = torch.stack(chunk).view(len(chunk), size)
            parts.append(torch.linalg.vector_norm(rows, dim=1, dtype=F64))
        return parts[0] if len(parts) == 1 else torch.cat(parts)


def _scaled(grads: list[torch.Tensor]) -> torch.Tensor:
    flat = torch.stack([g.reshape(-1) for g in grads])
    plain: torch.Tensor = torch.linalg.vector_norm(flat, dim=1)
    if flat.shape[1] == 0:
        return plain
    scale = flat.abs().amax(dim=1, keepdim=True)
    usable = torch.isfinite(scale) & (scale > 0)  # inf/NaN and zeros: the plain norm
    scale = torch.where(usable, scale, torch.ones_like(scale))
    scaled = torch.linalg.vector_norm(flat / scale, dim=1) * scale.view(-1)
    return torch.where(usable.view(-1), scaled, plain)


def norms_in_order(grads: list[torch.Tensor | None], device: torch.device) -> torch.Tensor:
    """‖g‖₂ in float64 for each entry (0 for None), one reduction per shape."""
    first = grads[0] if grads else None
    if first is not None:  # the usual case, one shape and no gaps: no bookkeeping
        dtype = first.dtype
        # shapes and devices are left to the stack to check (it raises where they
        # differ): reading them in Python cost ~1 µs a gradient, 50 µs a step
        if all(g is not None and g.dtype == dtype for g in grads):
            try:
                return grad_norms(grads)  # type: ignore[arg-type]
            except RuntimeError:
                pass  # several shapes or devices: one reduction each, below
    groups: dict[tuple[Any, ...], list[int]] = {}
    for k, g in enumerate(grads):
        if g is not None:
            groups.setdefault((g.shape, g.dtype, g.device), []).append(k)
    results: list[torch.Tensor] = []
    position: dict[int, tuple[int, int]] = {}  # call -> (group, row in its norms)
    for members in groups.values():
        results.append(grad_norms([grads[k] for k in members]))  # type: ignore[misc]
        for row, k in enumerate(members):
            position[k] = (len(results) - 1, row)
    # stitch runs of consecutive calls from one group as slices (views, no copies)
    pieces: list[torch.Tensor] = []
    k, total = 0, len(grads)
    while k < total:
        end = k + 1
        if k not in position:
            while end < total and end not in position:
                end += 1
            pieces.append(torch.zeros(end - k, dtype=F64, device=device))
        else:
            group, row = position[k]
            while end < total and position.get(end) == (group, row + end - k):
                end += 1
            pieces.append(results[group][row : row + end - k])
        k = end
    if not pieces:
        return torch.zeros(0, dtype=F64, device=device)
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces)
