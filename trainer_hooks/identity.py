"""Who is reporting: the ``hello`` message, run id, rank, default spool path.

- ``run_id``: ``run_id=`` if given, else the environment variable
  ``GRADWATCH_RUN_ID``, else, in an initialised ``torch.distributed`` job, a UUID4
  drawn by rank 0 and broadcast to every rank (so the ranks of a ``torchrun`` job join
  one run), else a fresh UUID4.
- ``rank``/``world_size``: from ``torch.distributed`` when it is initialised, else the
  ``RANK``/``WORLD_SIZE`` environment variables (torchrun sets them), else 0 and 1.
- Default spool path (``server=None`` and no ``spool=``):
  ``./gradwatch-<run>-<first 8 of run_id>-rank<rank>.jsonl``, so two runs of the same
  name never write into one file.

Example:
    >>> import torch
    >>> hello = make_hello(torch.nn.Linear(2, 1), run="demo", run_id="r1", config={})
    >>> hello["type"], hello["run"], hello["model"]["parameters"]
    ('hello', 'demo', 3)
"""

from __future__ import annotations

import os
import re
import socket
import uuid
from typing import Any

import torch
from torch import nn

from gradwatch.protocol.messages import MAX_NAME_CHARS, PROTOCOL_VERSION
from gradwatch.protocol.names import identity_problem, short_name

# The full names of what was shortened travel in the hello, each cut at this length.
MAX_FULL_NAME_CHARS = 4096


def run_identity(run_id: str | None) -> str:
    """The run id: the argument, else ``$GRADWATCH_RUN_ID``, else one chosen by rank 0.

    In a distributed job (``torch.distributed`` initialised with more than one rank),
    rank 0 draws a UUID4 and broadcasts it, so every rank of a ``torchrun`` job streams
    into one run with no configuration. ``watch()`` is then a collective call: every
    rank must call it, as every rank builds its model. Alone, a fresh UUID4.
    """
    if run_id is not None:
        if not isinstance(run_id, str) or not run_id:
            raise ValueError(f"expected run_id= to be a non-empty string, got {run_id!r}")
        return checked_run_id(run_id, "run_id=")
    from_env = os.environ.get("GRADWATCH_RUN_ID")
    if from_env:
        return checked_run_id(from_env, "$GRADWATCH_RUN_ID")
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        chosen: list[str | None] = [str(uuid.uuid4()) if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(chosen, src=0)
        if isinstance(chosen[0], str):
            return chosen[0]
    return str(uuid.uuid4())


def checked_run_id(run_id: str, source: str) -> str:
    """``run_id`` when the server can store it; else ValueError saying why.

    A run id is never shortened (it is the run's key and part of every URL), so one
    the server would refuse is refused here, before training starts.
    """
    problem = identity_problem(run_id, "run_id")
    if problem is not None:
        raise ValueError(f"{source}: {problem.removeprefix('run_id: ')}")
    return run_id


def rank_and_world() -> tuple[int, int]:
    """This process's rank and the number of ranks."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank()), int(dist.get_world_size())
    try:
        return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 0, 1


def default_spool_path(run: str, run_id: str, rank: int) -> str:
    """``gradwatch-<run>-<run_id[:8]>-rank<rank>.jsonl`` in the working directory."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", run).strip("._") or "run"
    return os.path.join(os.getcwd(), f"gradwatch-{safe[:64]}-{run_id[:8]}-rank{rank}.jsonl")


def make_hello(
    model: nn.Module,
    run: str,
    run_id: str,
    config: dict[str, Any],
    recurrent: list[str] | None = None,
    rank: int = 0,
    world_size: int = 1,
) -> dict[str, Any]:
    """The ``hello`` message of docs/PROTOCOL.md for ``model``."""
    if "\x00" in run:
        raise ValueError(f"expected run= without NUL (U+0000), got {run!r}")
    # Over-long names are shortened exactly as the server shortens the names in
    # records (gradwatch.protocol.names), so both agree; the full ones go along.
    full_names: dict[str, str] = {}

    def shortened(name: str) -> str:
        short = short_name(name)
        if short != name:
            full_names[short] = name[:MAX_FULL_NAME_CHARS]
        return short

    modules = [
        {"name": shortened(name or type(module).__name__),
         "type": short_name(type(module).__name__)}
        for name, module in model.named_modules()
    ]
    for name, _ in model.named_parameters():
        shortened(name)
    short_recurrent = [shortened(name) for name in recurrent or []]
    model_info: dict[str, Any] = {
        "modules": modules,
        "parameters": sum(p.numel() for p in model.parameters()),
        "recurrent": short_recurrent,
    }
    if full_names:
        model_info["full_names"] = full_names
    if len(run) > MAX_NAME_CHARS:
        model_info.setdefault("full_names", {})[short_name(run)] = run[:MAX_FULL_NAME_CHARS]
    return {
        "type": "hello",
        "protocol": PROTOCOL_VERSION,
        "run_id": run_id,
        "run": short_name(run),
        "rank": rank,
        "world_size": world_size,
        # one per process: a resumed process of the same run and rank counts seq from
        # 0 again, and the server deduplicates on (run_id, rank, session, seq)
        "session": str(uuid.uuid4()),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "model": model_info,
        "config": config,
    }
