"""Gradient flow through depth, read back: ``/depth`` and ``/update_ratios`` (docs/API.md).

The store keeps a stack's ``depth`` series as column chunks of the family ``depth``
(module: the stack, series: ``input``), as it keeps ``timesteps``, and each
parameter's ``update_ratios`` as the named scalar ``update_ratios/<parameter>``, as
``param_norms`` (store/split.py, store/chunks.py). This module reads them through
the store's chunk reads, so it adds no query of its own to the store.

A model with thousands of parameters is summed up per *block*: a parameter belongs to
the block of a stack whose module name prefixes it (``blocks.3.attn.qkv.weight`` ->
``blocks.3``), else to its own module (``head.weight`` -> ``head``). A block's ratio
at a step is the largest finite ratio of its parameters (the update that moved its
weights most, the one the ~1e-3 rule of thumb warns about); ``"Infinity"`` only when
every one is infinite (weights that were all zero before the step), ``"NaN"`` when all
are NaN.

Example:
    >>> block_of("blocks.3.attn.qkv.weight", ["blocks.3", "blocks.30"])
    'blocks.3'
    >>> block_of("head.weight", []), block_of("scale", [])
    ('head', 'scale')
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from gradwatch.protocol.codec import protocol_number

from .column_checks import floats
from .downsample import pick_rows


def block_of(param: str, blocks: Sequence[str]) -> str:
    """The block ``param`` belongs to: the longest of ``blocks`` that is a module
    holding it, else the parameter's own module (its name less the last part)."""
    best = ""
    for block in blocks:
        if len(block) > len(best) and param.startswith(block + "."):
            best = block
    if best:
        return best
    return param.rpartition(".")[0] or param


def stack_blocks(hello: dict[str, Any], stacks: Iterable[str]) -> dict[str, list[str]]:
    """Each stack's block names, in order, as the trainer's hello says them
    (``config.depth_blocks``); an older trainer's stacks get none (empty lists)."""
    config = hello.get("config") if isinstance(hello, dict) else None
    said = config.get("depth_blocks") if isinstance(config, dict) else None
    said = said if isinstance(said, dict) else {}
    out: dict[str, list[str]] = {}
    for stack in stacks:
        names: Any = said.get(stack)
        ok = isinstance(names, list) and all(isinstance(n, str) for n in names)
        out[stack] = list(names) if ok else []
    return out


def _hello(detail: dict[str, Any], rank: int) -> dict[str, Any]:
    hellos = detail.get("hello") or {}
    found: Any = hellos.get(str(rank)) or next(iter(hellos.values()), {})
    return found if isinstance(found, dict) else {}


def depth_matrix(
    store: Any,
    run_id: str,
    stack: str,
    rank: int = 0,
    max_steps: int = 500,
    start: int | None = None,
    stop: int | None = None,
) -> dict[str, Any]:
    """The depth x training-step matrix of one stack: ``values[i][l]`` is
    ‖∂L/∂x_l‖ at ``steps[i]`` (at most ``max_steps`` rows, evenly spaced, always the
    first and last), ``blocks`` the blocks' module names where the trainer said them."""
    detail = store.run_detail(run_id)  # RunNotFound first
    lo = 0 if start is None else start
    hi = 2**62 if stop is None else stop
    key = ("depth", stack, "input")
    total, picked, rows = store.series_rows(run_id, rank, key, lo, hi, max_steps)
    values = [[protocol_number(v) for v in floats(packed)] for packed in rows]
    blocks = stack_blocks(_hello(detail, rank), [stack])[stack]
    return {
        "stack": stack,
        "rank": rank,
        "steps": [step for step, _ in picked],
        "total_steps": total,
        "values": values,
        "blocks": blocks,
        "max_blocks": max((len(r) for r in values), default=0),
    }


def block_ratio(values: Sequence[float]) -> float:
    """A block's ratio from its parameters': the largest finite one, else infinity
    when any is infinite, else NaN (NaN for no values).

    >>> block_ratio([1e-3, float("inf"), 2e-3]), block_ratio([float("nan"), float("inf")])
    (0.002, inf)
    """
    finite = [v for v in values if math.isfinite(v)]
    if finite:
        return max(finite)
    return math.inf if any(math.isinf(v) for v in values) else math.nan


def update_ratio_blocks(
    store: Any,
    run_id: str,
    rank: int = 0,
    max_steps: int = 500,
    start: int | None = None,
    stop: int | None = None,
) -> dict[str, Any]:
    """Update-to-weight ratios summed up per block (module docstring): ``steps``
    (at most ``max_steps`` of the steps that carry ratios, evenly spaced), and per
    block its ``name``, ``stack`` (or None), ``parameters`` and ``values`` (one per
    step, None where none of its parameters has a ratio at that step)."""
    detail = store.run_detail(run_id)
    stacks = stack_blocks(_hello(detail, rank), detail.get("depth", []))
    owner = {block: stack for stack, names in stacks.items() for block in names}
    known = list(owner)
    lo = 0 if start is None else start
    hi = 2**62 if stop is None else stop
    ratios = store.named_matrix(run_id, rank, lambda n: n.startswith("update_ratios/"), lo, hi)
    steps, names, values, present = ratios
    pick = pick_rows(len(steps), max_steps)
    values, present = values[pick], present[pick]
    members: dict[str, list[int]] = {}
    for k, name in enumerate(names):
        members.setdefault(block_of(name.removeprefix("update_ratios/"), known), []).append(k)
    order = {block: i for i, block in enumerate(known)}
    out = []
    for block in sorted(members, key=lambda b: (order.get(b, len(order)), b)):
        cols = members[block]
        out.append({
            "name": block,
            "stack": owner.get(block),
            "parameters": sorted(names[k].removeprefix("update_ratios/") for k in cols),
            "values": block_ratios(values[:, cols], present[:, cols]),
        })
    return {"rank": rank, "steps": [steps[i] for i in pick], "total_steps": len(steps),
            "blocks": out}


def block_ratios(values: Any, present: Any) -> list[Any]:
    """:func:`block_ratio` of each row of a block's ratios (``present``: which are
    there), as the protocol writes numbers; None for a row with none.

    >>> import numpy as np
    >>> block_ratios(np.array([[1e-3, np.inf], [np.nan, np.inf], [0.0, 0.0]]),
    ...              np.array([[True, True], [True, True], [False, False]]))
    [0.001, 'Infinity', None]
    """
    finite = present & np.isfinite(values)
    top = np.where(finite, values, -np.inf).max(axis=1, initial=-np.inf)
    infinite = (present & np.isinf(values)).any(axis=1)
    out: list[Any] = []
    for row, any_finite, any_inf, any_at_all in zip(
        top.tolist(), finite.any(axis=1).tolist(), infinite.tolist(), present.any(axis=1).tolist(),
        strict=True,
    ):
        if any_finite:
            out.append(row)
        elif any_at_all:
            out.append("Infinity" if any_inf else "NaN")
        else:
            out.append(None)
    return out
