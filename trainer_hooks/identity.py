"""Who is reporting: the ``hello`` message, run id, rank, default spool path.

- ``run_id``: ``run_id=`` if given, else the environment variable
  ``GRADWATCH_RUN_ID``, else, in an initialised ``torch.distributed`` job, a UUID4
  drawn by rank 0 and handed to the other ranks through the process group's store (so
  the ranks of a ``torchrun`` job join one run), else a fresh UUID4.
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

import datetime
import os
import re
import socket
import uuid
import warnings
from typing import Any

import torch
from torch import nn

from gradwatch.protocol.messages import MAX_NAME_CHARS, PROTOCOL_VERSION
from gradwatch.protocol.names import identity_problem, short_name
from gradwatch.protocol.warnings import GradwatchWarning

# The full names of what was shortened travel in the hello, each cut at this length.
MAX_FULL_NAME_CHARS = 4096


def run_identity(run_id: str | None) -> str:
    """The run id: the argument, else ``$GRADWATCH_RUN_ID``, else one chosen by rank 0.

    In a distributed job (``torch.distributed`` initialised with more than one rank),
    rank 0 draws a UUID4 and puts it in the process group's store, where the other
    ranks' ``watch()`` reads it, so every rank of a ``torchrun`` job streams into one
    run with no configuration. The store, not a collective: a job where only rank 0
    calls ``watch()`` (``if rank == 0: watch(model)``) must not have a broadcast of
    gradwatch's matched against its own next collective, which hangs or corrupts it.
    Rank 0 never waits; another rank waits up to :data:`RUN_ID_WAIT_S` for rank 0's
    id, then warns and takes its own. Alone, a fresh UUID4.
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
        return _run_id_of_rank_0(dist)
    return str(uuid.uuid4())


# How long a rank other than 0 waits in watch() for rank 0's run id (rank 0 may reach
# watch() later, after loading its data); past it the rank streams as a run of its own.
RUN_ID_WAIT_S = 60.0
_asked = 0  # watch() calls in this process that took rank 0's id: the n-th pairs with
# rank 0's n-th, each under its own store key


def _run_id_of_rank_0(dist: Any) -> str:
    global _asked
    _asked += 1
    key = f"gradwatch/run_id/{_asked}"
    chosen = str(uuid.uuid4())
    try:
        store = dist.distributed_c10d._get_default_store()
        if dist.get_rank() == 0:
            store.set(key, chosen)
            return chosen
        store.wait([key], datetime.timedelta(seconds=RUN_ID_WAIT_S))
        return bytes(store.get(key)).decode()
    except Exception as error:  # no store, or rank 0 never called watch() in time
        warnings.warn(
            f"gradwatch: rank {dist.get_rank()} could not read rank 0's run id "
            f"({type(error).__name__}: {error}); it streams as run {chosen} of its own. "
            "Call watch() on every rank, or give every rank the same run_id=",
            GradwatchWarning,
            stacklevel=4,
        )
        return chosen


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
