"""Gradient norms of sharded parameters (FSDP2 ``fully_shard``: DTensor parameters).

Under FSDP2 a parameter and its gradient are DTensors: each rank holds a shard (its
``to_local()``). A norm taken on the DTensor itself stays a DTensor (``.tolist()``
refuses it), and a norm taken on the shard alone is the rank's part only (off by up
to sqrt(shards): torchtitan and others reported such norms). The global norm of a
gradient is the root of the sum, over the ranks that hold its shards, of each
shard's squared norm: :func:`reduce_norms` all-reduces those squares, one collective
per process group for every sharded gradient of a device at once.

Placements: ``Shard`` mesh dimensions are summed over (their process group);
``Replicate`` ones are not (every rank there holds the same values: HSDP's replicas).
Another placement (``Partial``: a gradient not yet reduced) has no norm from its
local parts; :func:`reduce_groups` returns None for it and the caller leaves it out.

The reduction is a collective: every rank of a group must take part for the same
step, so ``watch()`` reduces only where every rank captures the same steps
(``every=N`` without a budget, or the default budget, whose heavy steps the ranks
agree on: ``agreed.py``; docs/CAPTURE.md, "Sharded training").

Example (one process, no process group needed: a plain tensor passes through):
    >>> import torch
    >>> local_part(torch.ones(2)), reduce_groups(torch.ones(2))
    (tensor([1., 1.]), ())
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, TypeGuard

import torch

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

# A gradient's reduction: the process groups its squared norm is summed over.
Groups = tuple[Any, ...]


def is_sharded(tensor: Any) -> TypeGuard[DTensor]:
    """Whether ``tensor`` is a DTensor (a parameter or gradient FSDP2 sharded).

    ``torch.distributed.tensor`` is not imported for it: it took ~0.45 s of every
    ``import gradwatch.trainer_hooks`` (sympy among its imports), and no tensor can be
    a DTensor before someone has imported it.
    """
    module = sys.modules.get("torch.distributed.tensor")
    dtensor = getattr(module, "DTensor", None)
    return dtensor is not None and isinstance(tensor, dtensor)


def local_part(tensor: torch.Tensor) -> torch.Tensor:
    """The rank's own part of a DTensor (no copy, no communication); else the tensor."""
    return tensor.to_local() if is_sharded(tensor) else tensor


def reduce_groups(tensor: torch.Tensor) -> Groups | None:
    """The process groups ``tensor``'s squared norm is summed over: one per ``Shard``
    mesh dimension (``()`` for a plain tensor or a replicated DTensor); None for a
    placement whose local parts give no norm (``Partial``)."""
    if not is_sharded(tensor):
        return ()
    from torch.distributed.tensor import Replicate, Shard  # loaded: tensor is a DTensor

    sharded: Any = tensor  # a DTensor
    mesh = sharded.device_mesh
    groups = []
    for dim, placement in enumerate(sharded.placements):
        if isinstance(placement, Shard):
            groups.append(mesh.get_group(dim))
        elif not isinstance(placement, Replicate):
            return None
    return tuple(groups)


def reduce_norms(vec: torch.Tensor, positions: dict[Groups, list[int]]) -> torch.Tensor:
    """``vec`` (float64 local norms) with the entries at ``positions[groups]`` made
    global: the root of their squares all-reduced (summed) over each group in turn.

    One all_reduce per group for all the entries it holds; on CUDA (NCCL) it is queued
    on the stream like the norms, so nothing waits for the host here.
    """
    import torch.distributed as dist  # only where there are groups to reduce over

    out = vec
    for groups, where in positions.items():
        if not groups or not where:
            continue
        index = torch.tensor(where, device=vec.device)
        squares = out.index_select(0, index).square()
        for group in groups:
            dist.all_reduce(squares, op=dist.ReduceOp.SUM, group=group)
        out = out.index_copy(0, index, squares.sqrt())
    return out
