"""``watch(model)``: the one call that starts monitoring, and the Monitor it returns.

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

import atexit
import math
import os
import sys
import time
import weakref
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import torch
from torch import nn

from gradwatch.protocol.sink import Sink, SpoolSink

from .identity import default_spool_path, make_hello, rank_and_world, run_identity
from .pipeline import Item, Pipeline
from .quantities.base import Quantity
from .quantities.graph import DEFAULT_LIMIT, GraphSize
from .quantities.params import ParamNorms
from .quantities.profile import ModuleProfile
from .quantities.stale import CellSpec, LossRetention, StaleState
from .schedule import Schedule
from .transfer import pack
from .warn import WarnOnce


def _timesteps_quantity(
    cells: Sequence[CellSpec] | None, exact_hidden: bool | int
) -> Quantity | None:
    try:
        from .quantities.timesteps import RecurrentTimesteps
    except ImportError:  # pragma: no cover - only while that part is missing
        return None
    return RecurrentTimesteps(cells=list(cells) if cells else None, exact_hidden=exact_hidden)


def _diagnoser(diagnose: bool, thresholds: dict[str, Any] | None, once: WarnOnce) -> Any:
    if not diagnose:
        return None
    try:
        from .diagnoses import DiagnosisEngine
    except ImportError as e:  # pragma: no cover - only while that part is missing
        once.warn("diagnoses_missing", f"gradwatch: diagnoses are unavailable ({e})")
        return None
    return DiagnosisEngine(thresholds)


def _make_sink(
    server: str | None, spool: str | os.PathLike[str] | None, token: str | None,
    hello: dict[str, Any], once: WarnOnce,
) -> tuple[Sink, str | None]:
    if server is not None:
        try:
            from gradwatch.protocol.sender import WebSocketSink
        except ImportError as e:  # pragma: no cover - only while the sender is missing
            once.warn(
                "no_sender",
                f"gradwatch: cannot stream to {server} ({e}); recording to the spool instead",
            )
        else:
            return WebSocketSink(server, hello, token=token, spool=spool), None
    path = os.fspath(spool) if spool is not None else default_spool_path(
        hello["run"], hello["run_id"], hello["rank"]
    )
    return SpoolSink(path, hello), path


def _close_at_exit(ref: weakref.ref[Monitor]) -> None:
    """Close a monitor the program never closed; an uncaught exception means crashed."""
    monitor = ref()
    if monitor is not None:
        # the interpreter keeps the uncaught exception that is ending the program here
        crashed = getattr(sys, "last_value", None) is not None
        monitor.close(timeout=5.0, status="crashed" if crashed else "finished")


class Monitor:
    """The handle ``watch()`` returns: owns every hook, closes steps and epochs.

    Call :meth:`step` once per training step after ``optimizer.step()`` (or after
    backward), :meth:`epoch` at the end of each epoch, and :meth:`close` at the end
    (or use ``with watch(...) as monitor:``). :meth:`remove` takes every hook off;
    the model then behaves exactly as before ``watch()``.

    Monitoring never raises into training: a failing quantity is warned about once
    (:class:`~gradwatch.protocol.warnings.GradwatchWarning`) and left out.
    """

    def __init__(
        self,
        model: nn.Module,
        quantities: list[Quantity],
        schedule: Schedule,
        hello: dict[str, Any],
        sink: Sink,
        diagnoser: Any,
        once: WarnOnce,
        spool_path: str | None,
    ) -> None:
        self.model = model
        self.quantities = quantities
        self.schedule = schedule
        self.hello = hello
        self.run_id: str = hello["run_id"]
        self.spool_path = spool_path
        self.step_index = 0
        self.epoch_index = 0
        self.removed = False
        self.closed = False
        self._once = once
        self._pipeline = Pipeline(sink, quantities, diagnoser=diagnoser, once=once)
        self._epoch_started = self._step_started = time.perf_counter()
        self._epoch_first_step = 0
        self._carry = 0.0  # gradwatch time spent after the last record was made
        self._record_made = time.perf_counter()
        self._heavy = False
        self._begin_step()
        ref = weakref.ref(self)
        self._at_exit = lambda: _close_at_exit(ref)
        atexit.register(self._at_exit)

    # -- the training loop's calls ------------------------------------------------

    def step(self, loss: torch.Tensor | float | None = None) -> None:
        """Close one training step; ``loss`` is recorded as the step's loss.

        Never waits for the device or the network: tensors go to the host in one
        non-blocking copy and everything else happens on a background thread.
        """
        entered = time.perf_counter()
        if self.closed:
            self._once.warn("step_after_close", "gradwatch: step() after close() is ignored")
            return
        self._record_made = entered
        try:
            self._record_step(loss, entered)
        except Exception as e:  # never into the training loop
            self._once.warn("step", f"gradwatch: recording a step failed: {type(e).__name__}: {e}")
        self.step_index += 1
        self._begin_step()
        # what step() spent after the record's overhead was fixed counts to the next step
        self._carry = time.perf_counter() - self._record_made

    def epoch(self) -> None:
        """Close one epoch: sends an ``epoch`` record with its duration and step count."""
        if self.closed:
            return
        now = time.perf_counter()
        self._pipeline.put(
            urgent=True,
            item=Item(
                {
                    "kind": "epoch",
                    "epoch": self.epoch_index,
                    "step": max(self.step_index - 1, 0),
                    "t": time.time(),
                    "duration_s": now - self._epoch_started,
                    "steps": self.step_index - self._epoch_first_step,
                }
            )
        )
        self.epoch_index += 1
        self._epoch_started = now
        self._epoch_first_step = self.step_index

    def flush(self, timeout: float | None = 10.0) -> bool:
        """Wait until every record so far has been handed to the sink."""
        return self._pipeline.flush(timeout)

    def remove(self) -> None:
        """Take every hook off the model; safe to call twice. Steps still record timing."""
        if self.removed:
            return
        self.removed = True
        for q in self.quantities:
            try:
                q.detach()
            except Exception as e:
                self._once.warn("detach", f"gradwatch: removing {q.name}'s hooks failed: {e}")

    def close(self, timeout: float | None = 10.0, status: str = "finished") -> bool:
        """Remove the hooks, send the ``end`` record, flush and close the sink.

        Waits at most ``timeout`` seconds; True when everything was handed over.
        Safe to call twice.
        """
        if self.closed:
            return True
        self.remove()
        self.closed = True
        atexit.unregister(self._at_exit)
        end = {
            "kind": "end",
            "status": status,
            "step": max(self.step_index - 1, 0),
            "t": time.time(),
        }
        return self._pipeline.close(timeout, last=end)

    def __enter__(self) -> Monitor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(status="finished" if exc_type is None else "crashed")

    @property
    def dropped(self) -> int:
        """Records dropped because the background thread could not keep up."""
        return self._pipeline.dropped

    # -- internals --------------------------------------------------------------------

    def _begin_step(self) -> None:
        capture = not self.removed and self.schedule.capture(self.step_index)
        self._heavy = capture
        for q in self.quantities:
            try:
                q.start_step(capture if q.heavy else not self.removed)
            except Exception as e:
                self._once.warn(f"start:{q.name}", f"gradwatch: {q.name} failed: {e}")

    def _record_step(self, loss: torch.Tensor | float | None, entered: float) -> None:
        duration = entered - self._step_started
        self._step_started = entered
        record: dict[str, Any] = {
            "kind": "step",
            "step": self.step_index,
            "epoch": self.epoch_index,
            "t": time.time(),
            "duration_s": duration,
        }
        payloads: dict[str, Any] = {}
        if isinstance(loss, torch.Tensor):
            value: torch.Tensor | None = loss.detach()
            if loss.numel() != 1:
                # not a scalar: its mean stands for it (an empty one for nothing)
                value = loss.detach().double().mean() if loss.numel() else None
            if value is not None and value.device.type != "cpu":
                payloads["_monitor"] = {"loss": value}  # to the host with the rest
            else:
                record["loss"] = value  # a CPU scalar is read on the background thread
        else:
            record["loss"] = None if loss is None else float(loss)
        hooks_cost = 0.0
        tensor_loss = loss if isinstance(loss, torch.Tensor) else None
        for q in self.quantities:
            hooks_cost += q.cost_s
            q.cost_s = 0.0
            if self.removed:
                continue
            try:
                payload = q.finish_step(tensor_loss)
            except Exception as e:
                self._once.warn(
                    f"finish:{q.name}", f"gradwatch: {q.name} failed and is left out: {e}"
                )
                continue
            if payload:
                payloads[q.name] = payload
        packed = pack(payloads) if payloads else None
        self._record_made = time.perf_counter()
        spent = hooks_cost + self._carry + (self._record_made - entered)
        overhead = spent / duration if duration > 0 else 0.0
        record["overhead"] = overhead if math.isfinite(overhead) else 0.0
        self._pipeline.put(Item(record, packed))
        self.schedule.observe(self.step_index, self._heavy, overhead)


def watch(
    model: nn.Module,
    run: str = "run",
    server: str | None = None,
    spool: str | os.PathLike[str] | None = None,
    *,
    token: str | None = None,
    every: int = 1,
    overhead: float | None = None,
    profile: bool = False,
    cells: Sequence[CellSpec] | None = None,
    exact_hidden: bool | int = False,
    scaler: Any = None,
    diagnose: bool = True,
    thresholds: dict[str, Any] | None = None,
    run_id: str | None = None,
    graph_limit: int = DEFAULT_LIMIT,
) -> Monitor:
    """Start monitoring ``model``; returns the :class:`Monitor` that owns every hook.

    Args:
        model: the ``torch.nn.Module`` being trained (a ``DistributedDataParallel`` or
            ``DataParallel`` wrapper is looked through: names have no ``module.``).
        run: the run's name in the dashboard.
        server: ``ws://host:port`` of a gradwatch server, or None to record to a spool.
        spool: the spool file (JSON Lines). With ``server=None`` it defaults to
            ``./gradwatch-<run>-<run_id[:8]>-rank<rank>.jsonl``; with a server it is
            where undelivered batches wait.
        token: ingest token of the server.
        every: capture the heavy quantities (gradient norms, per-timestep norms, graph
            size, profile) every ``every`` steps; step time, loss, memory and overhead
            are in every step record.
        overhead: optional budget as a fraction of step time (``0.02`` = 2 %): heavy
            captures become rarer when gradwatch's own time would exceed it.
        profile: per-module forward/backward time and calls per step (opt-in).
        cells: more modules to treat as recurrent cells called in a loop (modules,
            names from ``named_modules()``, or classes).
        exact_hidden: also capture the exact ∂L/∂h_t of fused LSTMs (docs/CAPTURE.md).
        scaler: a ``torch.amp.GradScaler``; gradient norms are then unscaled.
        diagnose: run the diagnoses (docs/DIAGNOSES.md) and send their alerts.
        thresholds: diagnosis thresholds by name.
        run_id: the run's id (default ``$GRADWATCH_RUN_ID`` or a new UUID4).
        graph_limit: the graph walk stops after this many nodes.

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
    # DDP/DataParallel wrap the model as `.module`: watch the model itself, so names are
    # the same as in a single-process run (no "module." prefix) and hooks are the same.
    wrappers = (nn.parallel.DistributedDataParallel, nn.DataParallel)
    while isinstance(model, wrappers):
        model = model.module
    if not isinstance(graph_limit, int) or graph_limit < 1:
        raise ValueError(f"expected graph_limit= to be an integer >= 1, got {graph_limit!r}")
    schedule = Schedule(every=every, overhead=overhead)
    once = WarnOnce()
    diagnoser = _diagnoser(diagnose, thresholds, once)

    timesteps = _timesteps_quantity(cells, exact_hidden)
    quantities: list[Quantity] = [ParamNorms(scaler=scaler)]
    if timesteps is not None:
        quantities.append(timesteps)
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

    run_id = run_identity(run_id)
    rank, world_size = rank_and_world()
    recurrent = list(getattr(timesteps, "modules", None) or [])
    config = {
        "every": every,
        "overhead": overhead,
        "profile": profile,
        "diagnose": diagnose,
        "exact_hidden": exact_hidden,
        "cells": [c if isinstance(c, str) else getattr(c, "__name__", type(c).__name__)
                  for c in cells or ()],
        "graph_limit": graph_limit,
        "scaler": scaler is not None,
    }
    hello = make_hello(model, run, run_id, config, recurrent, rank, world_size)
    try:
        sink, spool_path = _make_sink(server, spool, token, hello, once)
    except Exception:
        for q in attached:
            q.detach()
        raise
    return Monitor(model, quantities, schedule, hello, sink, diagnoser, once, spool_path)
