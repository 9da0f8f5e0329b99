"""``watch(model)``: the one call that starts monitoring.

It checks the arguments (bad ones fail here, with the value that was expected),
builds the quantities, attaches their hooks, makes the ``hello`` and the sink, and
returns the :class:`~gradwatch.trainer_hooks.monitor.Monitor` that owns it all.

Example:
    >>> import os, tempfile, torch
    >>> from gradwatch.protocol.spool import read_spool
    >>> model = torch.nn.LSTM(2, 4)
    >>> path = os.path.join(tempfile.mkdtemp(), "run.jsonl")
    >>> with watch(model, run="demo", spool=path, diagnose=False) as monitor:
    ...     for _ in range(3):
    ...         loss = model(torch.randn(5, 1, 2))[0].pow(2).mean()
    ...         loss.backward()
    ...         monitor.step(loss)
    ...     monitor.epoch()
    >>> [r["kind"] for m in read_spool(path) if m["type"] == "batch" for r in m["records"]]
    ['step', 'step', 'step', 'epoch', 'end']
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from functools import partial
from typing import Any

from torch import nn

from gradwatch.protocol.sender import WebSocketSink
from gradwatch.protocol.sink import Sink, SpoolSink

from .agreed import AgreedSchedule, all_ranks_came
from .diagnoses import DiagnosisEngine
from .identity import default_spool_path, make_hello, rank_and_world, run_identity
from .monitor import Monitor
from .quantities.base import Quantity
from .quantities.depth import BlockSpec, DepthSeries
from .quantities.graph import DEFAULT_LIMIT, GraphSize
from .quantities.params import ParamNorms
from .quantities.profile import ModuleProfile
from .quantities.retention import LossRetention
from .quantities.sharded import is_sharded
from .quantities.stale import CellSpec, StaleState
from .quantities.timesteps import RecurrentTimesteps
from .quantities.updates import UpdateRatios
from .schedule import DEFAULT_BUDGET, Schedule
from .select import Selection
from .warn import WarnOnce


def _timesteps_quantity(
    cells: Sequence[CellSpec] | None, exact_hidden: bool | int, select: Selection
) -> RecurrentTimesteps:
    return RecurrentTimesteps(
        cells=list(cells) if cells else None, exact_hidden=exact_hidden,
        select=None if select.everything else select,
    )


def _schedule(
    model: nn.Module, every: int | None, overhead: float | None, once: WarnOnce
) -> tuple[Schedule, bool]:
    """The heavy-step schedule, and whether every rank captures the same steps (so
    sharded norms can be made global by a collective on them): the ranks' agreed
    budget where the model's parameters are sharded over several ranks, else each
    process's own. DDP keeps its own: nothing gradwatch takes there is a collective,
    and an agreement would need watch() on every rank."""
    if every is None and overhead is None:
        overhead = DEFAULT_BUDGET  # the default: heavy capture under a budget
    every = 1 if every is None else every
    _, world_size = rank_and_world()
    if world_size < 2 or not any(is_sharded(p) for p in model.parameters()):
        return Schedule(every=every, overhead=overhead), True
    schedule = Schedule(every=every, overhead=overhead)  # bad arguments fail as usual
    try:
        if overhead is not None:
            return AgreedSchedule(every=every, overhead=overhead, once=once), True
        # every=N is the same steps on every rank that watches: the reductions on them
        # need every rank to watch, or they pair with the other ranks' FSDP collectives
        if all_ranks_came("fixed", AgreedSchedule.JOIN_S):
            return schedule, True
        raise RuntimeError(f"not every rank called watch() within {AgreedSchedule.JOIN_S:g} s")
    except Exception as e:  # no process group: each rank's own steps, local norms
        once.warn("sharded", "gradwatch: the model's parameters are sharded (FSDP2) and the"
                  f" ranks cannot agree on heavy steps ({type(e).__name__}: {e}), so gradient"
                  " norms are each rank's shard norms (norm_scope 'local'); global norms"
                  " need watch() on every rank")
        return schedule, False


def _keep_local(params: ParamNorms, updates: UpdateRatios) -> None:
    """The ranks' heavy steps no longer agree: no collective from here on."""
    params.reduce_shards = updates.reduce_shards = False


def _diagnoser(diagnose: bool, thresholds: dict[str, Any] | None) -> DiagnosisEngine | None:
    return DiagnosisEngine(thresholds) if diagnose else None


def _make_sink(
    server: str | None, spool: str | os.PathLike[str] | None, token: str | None,
    hello: dict[str, Any], quiet: bool = False,
) -> tuple[Sink, str | None]:
    if server is not None:
        return WebSocketSink(server, hello, token=token, spool=spool, announce=not quiet), None
    path = os.fspath(spool) if spool is not None else default_spool_path(
        hello["run"], hello["run_id"], hello["rank"]
    )
    return SpoolSink(path, hello), path


def _compiled(model: nn.Module) -> bool:
    """Whether ``model`` is ``torch.compile``'s wrapper. Dynamo is looked up, not
    imported: importing it costs seconds, and torch.compile has always imported it."""
    frames = sys.modules.get("torch._dynamo.eval_frame")
    wrapper = getattr(frames, "OptimizedModule", None)
    return wrapper is not None and isinstance(model, wrapper)


def watch(
    model: nn.Module,
    run: str = "run",
    server: str | None = None,
    spool: str | os.PathLike[str] | None = None,
    *,
    token: str | None = None,
    every: int | None = None,
    overhead: float | None = None,
    profile: bool = False,
    cells: Sequence[CellSpec] | None = None,
    exact_hidden: bool | int = False,
    scaler: Any = None,
    diagnose: bool = True,
    thresholds: dict[str, Any] | None = None,
    run_id: str | None = None,
    graph_limit: int = DEFAULT_LIMIT,
    quiet: bool = False,
    blocks: Sequence[BlockSpec] | None = None,
    include: str | Sequence[str] | None = None,
    exclude: str | Sequence[str] | None = None,
) -> Monitor:
    """Start monitoring ``model``; returns the :class:`Monitor` that owns every hook.

    Args:
        model: the ``torch.nn.Module`` being trained (a ``DistributedDataParallel`` or
            ``DataParallel`` wrapper and ``torch.compile``'s are looked through: names
            have no ``module.`` or ``_orig_mod.``).
        run: the run's name in the dashboard.
        server: ``ws://host:port`` of a gradwatch server, or None to record to a spool.
        spool: the spool file (JSON Lines). With ``server=None`` it defaults to
            ``./gradwatch-<run>-<run_id[:8]>-rank<rank>.jsonl``; with a server it is
            where undelivered batches wait.
        token: ingest token of the server.
        every: capture the heavy quantities (gradient norms, per-timestep norms, graph
            size, profile) every ``every`` steps (``every=1``: every step); step time,
            loss, memory and overhead are in every step record. With neither
            ``every`` nor ``overhead`` given, heavy quantities are captured as often
            as a budget of 2 % of step time allows (docs/CAPTURE.md, "Schedule").
        overhead: a budget as a fraction of step time (``0.02`` = 2 %): heavy
            captures become rarer as their measured cost rises; ``every`` is then
            the shortest interval.
        profile: per-module forward/backward time and calls per step (opt-in).
        cells: more modules to treat as recurrent cells called in a loop (modules,
            names from ``named_modules()``, or classes).
        exact_hidden: also capture the exact ∂L/∂h_t of fused LSTMs (docs/CAPTURE.md).
        scaler: a ``torch.amp.GradScaler``; gradient norms are then unscaled.
        diagnose: run the diagnoses (docs/DIAGNOSES.md) and send their alerts.
        thresholds: diagnosis thresholds by name.
        run_id: the run's id (default ``$GRADWATCH_RUN_ID`` or a new UUID4).
        graph_limit: the graph walk stops after this many nodes.
        quiet: with a server, do not print the line with the run's link when it
            connects (``GRADWATCH_QUIET=1`` does the same).
        blocks: more stacks of blocks for the ``depth`` series, beyond the
            ModuleLists/Sequentials of two or more blocks of one class found by
            themselves: a container (module or name; its children are the blocks) or
            ``{"name": [modules or names]}`` (docs/CAPTURE.md, "Depth").
        include: fnmatch patterns of the parameter and module names to watch (a
            pattern covers the modules inside a matching one); default: all.
        exclude: fnmatch patterns of names not to watch. A pattern that matches no
            parameter or module name is an error.

    Example:
        >>> import torch
        >>> model = torch.nn.GRU(3, 8)
        >>> monitor = watch(model, run="gru", spool=os.devnull, diagnose=False)
        >>> out, h = model(torch.randn(4, 1, 3)); out.sum().backward(); monitor.step()
        >>> monitor.close()
        True
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected a torch.nn.Module to watch, got {type(model).__name__}")
    if not isinstance(run, str) or not run:
        raise ValueError(f"expected run= to be a non-empty name, got {run!r}")
    if server is not None and (
        not isinstance(server, str) or not server.startswith(("ws://", "wss://"))
    ):
        raise ValueError(f"expected server= to be a ws:// or wss:// URL or None, got {server!r}")
    # DDP/DataParallel wrap the model as `.module`, torch.compile as `._orig_mod`: watch
    # the model itself, so names are the same as in a plain single-process run (no
    # "module." or "_orig_mod." prefix: runs compare by name) and hooks are the same.
    wrappers = (nn.parallel.DistributedDataParallel, nn.DataParallel)
    averaged = False  # DDP averages the ranks' gradients: their total is recorded too
    while True:
        if isinstance(model, wrappers):
            averaged = averaged or isinstance(model, nn.parallel.DistributedDataParallel)
            model = model.module
        elif _compiled(model):
            model = model._orig_mod  # type: ignore[assignment]
        else:
            break
    if not isinstance(graph_limit, int) or graph_limit < 1:
        raise ValueError(f"expected graph_limit= to be an integer >= 1, got {graph_limit!r}")
    run_id = run_identity(run_id)  # before any hook: a run id the server refuses raises here
    once = WarnOnce()
    schedule, shared = _schedule(model, every, overhead, once)
    diagnoser = _diagnoser(diagnose, thresholds)
    select = Selection(include, exclude)
    select.check(model)
    chosen = None if select.everything else select

    timesteps = _timesteps_quantity(cells, exact_hidden, select)
    # Sharded (FSDP2) gradients' norms are made global by a collective per heavy step,
    # which needs every rank to capture the same steps (``shared``): a fixed interval
    # every rank watches with, or a budget the ranks agree on (agreed.py); else they
    # stay local (quantities/sharded.py).
    params = ParamNorms(scaler=scaler, select=chosen, reduce_shards=shared, averaged=averaged)
    updates = UpdateRatios(select=chosen, reduce_shards=shared)
    if isinstance(schedule, AgreedSchedule):
        schedule.on_fallback.append(partial(_keep_local, params, updates))
    depth = DepthSeries(blocks, select=chosen, scaler=scaler)
    quantities: list[Quantity] = [params]
    timesteps.follow(params)  # the series describe the passes param_norms describe
    depth.follow(params)
    quantities += [timesteps, depth, updates]
    quantities += [GraphSize(graph_limit), StaleState(cells), LossRetention()]
    if profile:
        quantities.append(ModuleProfile())
    attached: list[Quantity] = []
    try:
        for q in quantities:
            q.attach(model)
            attached.append(q)
    except Exception:
        for q in attached:
            q.detach()
        raise

    rank, world_size = rank_and_world()
    recurrent = list(getattr(timesteps, "modules", None) or [])
    config = {
        "every": schedule.every,
        "overhead": schedule.budget,
        "profile": profile,
        "diagnose": diagnose,
        "exact_hidden": exact_hidden,
        "cells": [c if isinstance(c, str) else getattr(c, "__name__", type(c).__name__)
                  for c in cells or ()],
        "graph_limit": graph_limit,
        "scaler": scaler is not None,
        "depth": list(depth.stacks),
        "depth_blocks": depth.block_names(model),
        "include": list(select.include),
        "exclude": list(select.exclude),
    }
    try:
        hello = make_hello(model, run, run_id, config, recurrent, rank, world_size)
        sink, spool_path = _make_sink(server, spool, token, hello, quiet)
    except Exception:
        for q in attached:
            q.detach()
        raise
    return Monitor(model, quantities, schedule, hello, sink, diagnoser, once, spool_path)
