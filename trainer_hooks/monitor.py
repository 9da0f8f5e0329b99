"""The Monitor: the handle ``watch()`` returns; closes steps and epochs, owns the hooks.

On the training thread it only gathers each quantity's device payload, starts one
host copy and appends the record to the pipeline's list (``transfer.py``,
``pipeline.py``); everything else happens on the background thread. A light step
after a light step (most steps) visits only the quantities that have work on it
(``Quantity.idle_when_light`` false: the graph and stale-state checks), a list made
once; the record's ``overhead`` still counts all of ``step()``'s time and the hooks'.

Example:
    >>> import os, torch
    >>> from gradwatch.trainer_hooks import watch
    >>> model = torch.nn.GRU(3, 8)
    >>> monitor = watch(model, run="gru", spool=os.devnull, diagnose=False)
    >>> out, h = model(torch.randn(4, 1, 3)); out.sum().backward(); monitor.step()
    >>> monitor.step_index, monitor.close()
    (1, True)
"""

from __future__ import annotations

import atexit
import contextlib
import math
import sys
import time
import weakref
from types import TracebackType
from typing import Any

import torch
from torch import nn

from gradwatch.protocol.sink import Sink

from .pipeline import Item, Pipeline
from .quantities.base import Quantity
from .schedule import Schedule
from .transfer import pack
from .warn import WarnOnce


def _close_at_exit(ref: weakref.ref[Monitor]) -> None:
    """Close a monitor the program never closed; an uncaught exception means crashed."""
    monitor = ref()
    if monitor is not None:
        # the interpreter keeps the uncaught exception that is ending the program here
        crashed = getattr(sys, "last_value", None) is not None
        monitor.close(timeout=5.0, status="crashed" if crashed else "finished")


def _end_record(step_index: int, status: str) -> dict[str, Any]:
    """The ``end`` record of a monitor that has closed ``step_index`` steps."""
    return {"kind": "end", "status": status, "step": max(step_index - 1, 0), "t": time.time()}


def _abandoned(state: dict[str, Any]) -> None:
    """A monitor dropped without close(): a notebook cell that called ``watch()`` run
    again, a ``watch()`` whose handle was not kept. Nothing can close its steps any
    more, yet its hooks stayed on the model (on a captured step, keeping every call's
    gradients for good) and its run never ended. So its hooks come off and its run
    ends, with one warning. ``state`` is the monitor's ``__dict__``: it outlives the
    instance, and holding it costs the step nothing."""
    run = state["hello"].get("run", "?")
    state["_once"].warn(
        "abandoned",
        f"gradwatch: the monitor of run {run!r} was dropped without close() (a notebook "
        "cell run again?): its hooks are off and its run has ended; keep the handle and "
        "call close(), or use `with watch(...) as monitor:`",
    )
    # at collection time there is no one left to tell of a failure: each part on its own
    for q in state["quantities"]:
        with contextlib.suppress(Exception):
            q.detach()
    with contextlib.suppress(Exception):
        state["schedule"].close()
        state["_pipeline"].close(timeout=5.0, last=_end_record(state["step_index"], "finished"))


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
        #: the watched module; None once closed, so that a monitor kept after training
        #: (a notebook's) does not keep the model, its memory or its process group alive
        self.model: nn.Module | None = model
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
        self._carry = 0.0  # step()'s seconds after the last record was made
        self._charged = 0.0  # seconds charge() counted since the last record
        self._record_made = time.perf_counter()
        self._heavy = False
        # the quantities with work on a light step after a light one (most steps)
        self._busy_light = [q for q in quantities if not q.idle_when_light]
        self._begin_step()
        ref = weakref.ref(self)
        self._at_exit = lambda: _close_at_exit(ref)
        atexit.register(self._at_exit)
        # collected unclosed: hooks off, run ended (at exit, _close_at_exit does that)
        self._finalizer = weakref.finalize(self, _abandoned, self.__dict__)
        self._finalizer.atexit = False

    # -- the training loop's calls ------------------------------------------------

    def step(
        self, loss: torch.Tensor | float | None = None, graph: torch.Tensor | None = None
    ) -> None:
        """Close one training step; ``loss`` is recorded as the step's loss.

        ``graph`` is the tensor the step's backward ran from, for when ``loss`` is a
        value without its autograd graph (a framework's detached or accumulated loss):
        the graph's size and the stale-state and kept-loss checks read it. By default
        they read ``loss``.

        Never waits for the device or the network: tensors go to the host in one
        non-blocking copy and everything else happens on a background thread.

        Example:
            >>> import os, torch
            >>> from gradwatch.trainer_hooks import watch
            >>> model = torch.nn.GRU(3, 8)
            >>> monitor = watch(model, run="gru", spool=os.devnull, diagnose=False)
            >>> out, h = model(torch.randn(4, 1, 3)); loss = out.square().mean()
            >>> loss.backward()
            >>> monitor.step(loss.detach().clone(), graph=loss)  # as a framework's callback
            >>> monitor.close()
            True
        """
        entered = time.perf_counter()
        if self.closed:
            self._once.warn("step_after_close", "gradwatch: step() after close() is ignored")
            return
        try:
            self._record_step(loss, graph, entered)
        except Exception as e:  # never into the training loop
            self._once.warn("step", f"gradwatch: recording a step failed: {type(e).__name__}: {e}")
            self._record_made = time.perf_counter()
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

    def charge(self, seconds: float) -> None:
        """Count ``seconds`` of the training thread's time, spent for gradwatch outside
        its hooks and ``step()``, in the next step record's ``overhead``: a framework
        callback's own work around ``step()`` (gradwatch.integrations time theirs).

        Example:
            >>> import os, time, torch
            >>> from gradwatch.trainer_hooks import watch
            >>> monitor = watch(torch.nn.Linear(2, 2), spool=os.devnull, diagnose=False)
            >>> started = time.perf_counter()  # a callback's own work begins
            >>> monitor.charge(time.perf_counter() - started)
            >>> monitor.step(0.5)
            >>> monitor.close()
            True
        """
        if seconds > 0 and math.isfinite(seconds):
            self._charged += seconds

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
        """Remove the hooks, send the ``end`` record, flush and close the sink, and let
        go of the model (``monitor.model`` is None after it).

        Waits at most ``timeout`` seconds; True when everything was handed over and
        the server refused nothing (no batch set aside, no field left out: see
        ``stats()["rejected_batches"]`` and ``["repaired_batches"]`` of the sink).
        Safe to call twice.
        """
        if self.closed:
            return True
        self._finalizer.detach()
        self.remove()
        self.closed = True
        self.model = None
        self.schedule.close()
        atexit.unregister(self._at_exit)
        handed_over = self._pipeline.close(timeout, last=_end_record(self.step_index, status))
        return handed_over and not getattr(self._pipeline.sink, "refused", 0)

    def __enter__(self) -> Monitor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(status="finished" if exc_type is None else "crashed")

    def _repr_html_(self) -> str:
        """Jupyter shows a monitor as its run's live view, or where its records are
        (gradwatch.notebook); never raises into the notebook."""
        try:
            from gradwatch.notebook import view_of

            return view_of(self)._repr_html_()
        except Exception as e:
            return f"<p>gradwatch: cannot show this run ({type(e).__name__})</p>"

    @property
    def dropped(self) -> int:
        """Records dropped because the background thread could not keep up."""
        return self._pipeline.dropped

    # -- internals --------------------------------------------------------------------

    def _begin_step(self) -> None:
        capture = not self.removed and self.schedule.capture(self.step_index)
        # a light step after a light step: quantities idle on light steps stay as they are
        steady = not capture and not self._heavy and self.step_index > 0
        self._heavy = capture
        for q in self._busy_light if steady else self.quantities:
            try:
                q.heavy_step = capture
                q.start_step(capture if q.heavy else not self.removed)
            except Exception as e:
                self._once.warn(f"start:{q.name}", f"gradwatch: {q.name} failed: {e}")

    def _number(self, loss: Any) -> float | None:
        """A loss that is no tensor as a float; one that is no number either (a dict of
        losses, a model's output) is left out with one warning, and the rest of the
        record kept."""
        if loss is None:
            return None
        try:
            return float(loss)
        except (TypeError, ValueError, OverflowError) as e:
            got = f"{type(loss).__name__} beyond a float" if isinstance(
                e, OverflowError) else type(loss).__name__
            self._once.warn(
                "loss_type",
                "gradwatch: step(loss) expected a tensor or a number a float can hold as "
                f"the loss, got {got}: the step records no loss (pass e.g. outputs.loss)",
            )
            return None

    def _record_step(
        self,
        loss: torch.Tensor | float | None,
        graph: torch.Tensor | None,
        entered: float,
    ) -> None:
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
            if value is not None and not value.is_cpu:
                payloads["_monitor"] = {"loss": value}  # to the host with the rest
            else:
                # A CPU scalar is read now (0.1 µs, no sync on a CPU) rather than kept
                # as a tensor until the background thread's next wake (up to 0.5 s):
                # its allocation then stays in this thread's malloc arena among the
                # step's large tensors, which are freed and allocated again every step
                record["loss"] = None if value is None else value.item()
        else:
            record["loss"] = self._number(loss)
        hooks_cost = 0.0
        for q in self.quantities:
            hooks_cost += q.cost_s
            q.cost_s = 0.0
        # what the graph's quantities read: the tensor backward ran from
        tensor_loss = graph if isinstance(graph, torch.Tensor) else (
            loss if isinstance(loss, torch.Tensor) else None)
        # a quantity idle on light steps has nothing to hand over from one
        finishing = () if self.removed else self.quantities if self._heavy else self._busy_light
        for q in finishing:
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
        made = time.perf_counter()
        span, self._record_made = made - self._record_made, made
        # step()'s own part by the wall clock, as the hooks time theirs: a CPU clock is
        # a system call, and three a step cost a light step() ~4 µs in a training loop
        # (BENCHMARKS.md, "What a light step costs"). A step() preempted by another
        # process reads longer, as the training code around it does: over many steps
        # the share stays what training loses. The GIL: in a 1.6 ms loop, 2-4 of 4,000
        # step() calls waited for it (> 50 µs).
        spent = hooks_cost + self._carry + self._charged + (made - entered)
        self._charged = 0.0
        # What the hooks slow down that no timer sees (measured against light steps by
        # the schedule, with a budget) counts too: the field is what training loses.
        unseen = self.schedule.hidden_s() if self._heavy else 0.0
        overhead = (spent + unseen) / duration if duration > 0 else 0.0
        record["overhead"] = overhead if math.isfinite(overhead) else 0.0
        self._pipeline.put(Item(record, packed, heavy=self._heavy))
        self.schedule.observe(
            self.step_index,
            self._heavy,
            spent,
            span_s=span,
            background_s=self._pipeline.cpu_per_record(self._heavy),
        )
