"""L2 norms of many tensors in few ops, as float64: the cells' series, the parameter
norms and the update ratios.

Precision. Float32 tensors on CPU are reduced in float32 with no float64 copy: each
sum of squares is float32 rounding (~1e-7 relative: ``x * x`` then ``sum``, whose
CPU kernel adds pairwise; a float32 ``vector_norm`` keeps one running sum and lost
3e-6 on 4,096 equal values, 5e-4 on 1e6; BLAS ``dot`` 2e-6 and 6e-4). The rows
float32 cannot give to that precision are recomputed in float64, which squares every
float32 value exactly: a non-finite sum (an element beyond ~1.8e19 squares to
infinity; a NaN or an infinity in the tensor reads as it does in float64) and a sum
small enough that underflowed squares could matter (below ``n * UNDERFLOW_SUM``, see
there). So zeros read 0, vanishing gradients (1e-30-scale elements) their float64
norm, NaN reads NaN. Reading whether a row needs it is a host read of a CPU tensor:
nothing to wait for. Everything else is reduced in float64, exact to float64
rounding: float64 tensors, scaled where their squares would underflow
(``s * ||g / s||``, ``s = max|g|``, down to 1e-300 and below), half and bfloat16
tensors, mixed dtypes, and CUDA, where ``_foreach_norm(dtype=float64)`` is one fused
kernel with no copy and nothing may wait for the device.

Why: ``vector_norm(..., dtype=float64)`` writes a float64 copy of its input first.
48 cell gradients of 32 x 128: 126-183 µs against 173-254 µs before; the cell loop's
parameter norms 77-117 against 93-119 µs, one update norm of its 6 weights 57-87
against 70-89 µs (timeit, 1 thread, three runs on the 2-core box at load 1.8-2.2).
Inside the training loop, where the data and the code are cold, the gain is smaller
and ops count more than bytes (docs/CAPTURE.md, cells in a loop).

How many ops matters more than how many bytes for a cell loop's gradients: each op
costs a dispatch and an allocation, and PyTorch's CPU ``_foreach_norm`` is a loop
over the tensors. On CPU same-shape gradients are therefore stacked (one float32
copy, squared in place) and reduced by one ``sum(dim=1)``: into a :class:`Scratch`
buffer its owner keeps from step to step (up to ``SCRATCH_LIMIT`` elements), else
one stack per ``STACK_LIMIT`` elements. Lists of tensors of several shapes
(parameters, weights) are squared and summed one by one, a packed recurrent tensor
as ``(gates, -1)`` rows.

Example:
    >>> grad_norms([torch.full((2, 2), 1e-300, dtype=torch.float64)])
    tensor([2.0000e-300], dtype=torch.float64)
    >>> grad_norms([torch.full((2, 2), 1e-30), torch.full((2, 2), 3.0)])
    tensor([2.0000e-30, 6.0000e+00], dtype=torch.float64)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .calls import F64

F32 = torch.float32

#: elements stacked for one reduction on CPU (128 KiB of float32). Stacking all 48
#: gradients of the cell loop at once (then with a float64 copy, 2.3 MiB of
#: temporaries) made glibc hand the memory back and fault it in again: up to 64 page
#: faults a step against ~1.
STACK_LIMIT = 1 << 15

#: A float32 square below float32's smallest normal (1.18e-38) loses precision, or
#: all of it where denormals are flushed, so n elements lose at most n * 1.18e-38 of
#: a sum of squares. A sum of n squares at or above n times this (1.18e-32: a norm
#: of 7e-15 for 4,096 elements, 1.1e-12 for 1e8) has lost at most 1e-6 of itself to
#: underflow (5e-7 of the norm); a smaller one is recomputed in float64.
UNDERFLOW_SUM = torch.finfo(F32).tiny / 1e-6

#: elements a :class:`Scratch` holds at most (16 MiB of float32); a step with more
#: cell gradients is stacked in ``STACK_LIMIT`` chunks
SCRATCH_LIMIT = 1 << 22


class Scratch:
    """A float32 CPU buffer kept from one step to the next, which :func:`grad_norms`
    stacks a step's gradients into: one stack, one square and one sum, with nothing
    allocated and no page touched for the first time.

    Chunks of a fresh stack cost 6 stacks, squares and sums for the cell loop's 48
    gradients of 32 x 128 (219 µs against 113 µs in timeit, 1 thread, on the 2-core
    box; ``bench/phases.py --stack-limits 32768`` compares whole steps); one fresh
    stack of them all (786 KiB, beyond glibc's ``mmap`` threshold) is handed back to
    the system when freed and faulted in again the next step. The buffer grows to the
    largest step seen (at most ``SCRATCH_LIMIT`` elements) and lives as long as its
    owner.

    Example:
        >>> scratch = Scratch()
        >>> grad_norms([torch.full((2, 2), 3.0), torch.ones(2, 2)], scratch).tolist()
        [6.0, 2.0]
    """

    def __init__(self) -> None:
        self.buffer: torch.Tensor | None = None

    def rows(self, count: int, shape: torch.Size) -> torch.Tensor | None:
        """A ``(count, *shape)`` float32 view of the buffer, or None beyond the limit."""
        size = count * shape.numel()
        if size > SCRATCH_LIMIT:
            return None
        if self.buffer is None or self.buffer.numel() < size:
            self.buffer = torch.empty(size, dtype=F32)
        return self.buffer[:size].view(count, *shape)


def grad_norms(grads: list[torch.Tensor], scratch: Scratch | None = None) -> torch.Tensor:
    """‖g‖₂ of each of ``grads`` (one shape, dtype and device), float64, in order.

    Never waits for a device: on CUDA device ops only; float32 on CPU reads its sums
    on the host (nothing to wait for there) and is float32 rounding, exact in float64
    where float32 would underflow or overflow (module docstring); otherwise exact to
    float64 rounding, for float64 gradients down to 1e-300 and below. ``scratch``:
    float32 on CPU is stacked there (:class:`Scratch`).
    """
    with torch.no_grad():
        first = grads[0]
        if first.dtype == F64:
            return _scaled(grads)
        if first.device.type != "cpu" or first.dtype != F32:
            return torch.stack(torch._foreach_norm(grads, 2, dtype=F64))
        size = first.numel()
        out = None if scratch is None else scratch.rows(len(grads), first.shape)
        if out is not None:
            # the stack raises where shapes differ, as the fresh one does
            rows = torch.stack(grads, out=out).view(len(grads), size)
            squares = rows.mul_(rows).sum(dim=1)
            return _settle(squares, size, lambda k: _float64_norm(grads[k]))
        per = STACK_LIMIT // max(size, 1)
        if per < 2:  # a gradient fills a reduction alone: stacking saves nothing
            return tensor_norms(grads)
        parts = []
        for i in range(0, len(grads), per):
            chunk = grads[i : i + per]
            rows = torch.stack(chunk).view(len(chunk), size)  # our copy: square in place
            parts.append(rows.mul_(rows).sum(dim=1))
        squares = parts[0] if len(parts) == 1 else torch.cat(parts)
        return _settle(squares, size, lambda k: _float64_norm(grads[k]))


def tensor_norms(
    tensors: list[torch.Tensor], packed: Sequence[tuple[torch.Tensor, int]] = ()
) -> torch.Tensor:
    """‖t‖₂ of each of ``tensors`` (one device, any shapes), then of each gate of each
    packed recurrent tensor ``(t, gates)`` (its ``gates`` equal chunks along dim 0), as
    one float64 vector; never waits for a device (the host read is on CPU only).

    Float32 on CPU: float32 rounding, exact in float64 where float32 would underflow
    or overflow. Otherwise (CUDA, other or mixed dtypes) float64 accumulation: on CUDA
    one ``_foreach_norm`` over the tensors and the gate chunks is one fused kernel;
    on CPU a packed tensor is reduced as ``(gates, -1)`` rows in one norm instead of
    a cast and a norm per gate (an LSTM cell's 4 packed gradients: 4 ops, not 16).
    """
    first = tensors[0] if tensors else packed[0][0] if packed else None
    if first is None:
        return torch.zeros(0, dtype=F64)
    device = first.device
    if device.type == "cpu" and all(t.dtype == F32 for t in tensors) and all(
        t.dtype == F32 for t, _ in packed
    ):
        return _float32_norms(tensors, packed)
    if device.type == "cpu" and packed:
        parts = []
        if tensors:
            parts.append(torch.stack(torch._foreach_norm(tensors, 2, dtype=F64)))
        for g, gates in packed:
            rows = g.reshape(gates, g.numel() // gates)
            parts.append(torch.linalg.vector_norm(rows, dim=1, dtype=F64))
        return torch.cat(parts)
    chunks = tensors + [c for g, gates in packed for c in g.chunk(gates, dim=0)]
    return torch.stack(torch._foreach_norm(chunks, 2, dtype=F64))


def _float32_norms(
    tensors: list[torch.Tensor], packed: Sequence[tuple[torch.Tensor, int]]
) -> torch.Tensor:
    size = max((t.numel() for t in tensors), default=0)
    parts = [torch.stack([torch.mul(t, t).sum() for t in tensors])] if tensors else []
    for g, gates in packed:
        rows = g.reshape(gates, g.numel() // gates)
        parts.append(torch.mul(rows, rows).sum(dim=1))
        size = max(size, g.numel() // gates)
    squares = parts[0] if len(parts) == 1 else torch.cat(parts)

    def exact(k: int) -> torch.Tensor:  # row k: a tensor, or a gate of a packed one
        if k < len(tensors):
            return _float64_norm(tensors[k])
        k -= len(tensors)
        for g, gates in packed:
            if k < gates:
                return _float64_norm(g.reshape(gates, -1)[k])
            k -= gates
        raise IndexError(k)

    return _settle(squares, size, exact)


def _float64_norm(t: torch.Tensor) -> torch.Tensor:
    """‖t‖₂ accumulated in float64: exact for any float32 tensor (its squares neither
    underflow nor overflow in float64)."""
    norm: torch.Tensor = torch.linalg.vector_norm(t, dtype=F64)
    return norm


def _settle(
    squares: torch.Tensor, size: int, exact: Callable[[int], torch.Tensor]
) -> torch.Tensor:
    """Float32 sums of at most ``size`` squares (CPU) as float64 norms; the rows float32
    cannot give (non-finite, or below ``size * UNDERFLOW_SUM``) are ``exact(row)``.

    On the host, where reading a CPU tensor waits for nothing: one read, a Python
    check and one new tensor are 2 ops where the check on tensors (``aminmax``, two
    reads, a cast, a square root) took 6. Inside the training loop an op costs ~4 µs
    however small, and the cell loop's parameter norms took 145-191 µs this way
    against 173-221 µs (paired in the real callback, 150-200 steps)."""
    values = squares.tolist()
    least = size * UNDERFLOW_SUM
    if min(values, default=least) >= least and max(values, default=0.0) < math.inf:
        # The usual case, every row fine: two ops on the tensor instead of a Python
        # loop and a new tensor from a list. min() and max() pass over a NaN unless it
        # comes first, and then this test fails; a NaN row reads NaN either way (its
        # float64 norm is NaN too), an infinite or tiny one always takes exact().
        return squares.to(F64).sqrt_()
    norms = [math.sqrt(v) if least <= v < math.inf else -1.0 for v in values]  # NaN: -1
    for k, norm in enumerate(norms):
        if norm < 0:
            norms[k] = exact(k).item()
    return torch.tensor(norms, dtype=F64)


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


def norms_in_order(
    grads: list[torch.Tensor | None], device: torch.device, scratch: Scratch | None = None
) -> torch.Tensor:
    """‖g‖₂ in float64 for each entry (0 for None), one reduction per shape;
    ``scratch`` takes the stack where every entry has one shape."""
    first = grads[0] if grads else None
    if first is not None:  # the usual case, one shape and no gaps: no bookkeeping
        dtype = first.dtype
        # shapes and devices are left to the stack to check (it raises where they
        # differ): reading them in Python cost ~1 µs a gradient, 50 µs a step
        if all(g is not None and g.dtype == dtype for g in grads):
            try:
                return grad_norms(grads, scratch)  # type: ignore[arg-type]
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
