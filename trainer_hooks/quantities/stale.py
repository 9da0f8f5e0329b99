"""``stale_state``: the direct check for graph growth through state kept attached
across steps (losses kept alive: quantities/retention.py).

:class:`StaleState` puts a forward pre-hook on every recurrent module (``nn.LSTM``,
``nn.GRU``, ``nn.RNN``, the ``*Cell`` classes and the cells named with ``cells=``)
that checks whether an incoming tensor (the hidden state, typically) was produced in
an earlier training step and is still attached to that step's autograd graph. That is
the bug behind "every epoch is slower than the last": each backward walks every
earlier step again. It emits one ``graph_growth`` alert naming the module and the fix.

How a node's step is known without tagging every output: autograd numbers its nodes
in creation order (``grad_fn._sequence_nr()``, per thread). At the start of each step
we read the next number from a one-element probe; a node numbered below that mark was
built in an earlier step. (When the step's loss has a ``grad_fn``, the number after
the loss's serves as the mark and the probe is skipped: it is the cheaper read, and
only a node built after the loss, outside it, would be counted to the next step.)
The check reads the incoming tensor's ``grad_fn`` on every
call and, on a module's first call in a step, walks at most ``WALK_LIMIT`` nodes
upstream (the state may have passed through a few ops since it was produced).

Paced by what it detects: the pre-hooks are on the modules only on checked steps
(a cell loop otherwise pays a hooked call per cell call on every step). Checked are
the first ``FIRST_CHECKS`` steps, then steps at doubling gaps up to every
``MAX_PACE``-th, and the step after any structure change: the number of autograd
nodes a step creates (the loss's node number less the step's mark, read in O(1)) is
none of the last ``RECENT_COUNTS`` numbers seen, or training moved to another
thread. A stale state built in from the start shows at step 1; one that appears
later comes with a graph of a size not seen lately (a tree keeping last epoch's
states builds fewer nodes) or is caught within ``MAX_PACE`` steps. "Not seen lately"
rather than "not the last step's": with sequences bucketed by length (a data loader's
usual batches) every step builds another graph than the step before, yet only a few
graphs in all: a cell loop over five lengths, checked on every step, took 1.050x the
plain step time on light steps, against 1.024x paced (BENCHMARKS.md, ``buckets``).

Example:
    >>> import torch
    >>> rnn = torch.nn.RNN(2, 3)
    >>> q = StaleState(); q.attach(rnn)
    >>> q.start_step(True); _, h = rnn(torch.randn(4, 1, 2))
    >>> q.start_step(True); _ = rnn(torch.randn(4, 1, 2), h)   # h from the last step
    >>> q.finish_step(None)["alerts"][0]["subject"]
    'RNN'
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from .base import Quantity
from .module_hooks import OwnHook
from .recent import Recent

#: nodes walked upstream of an incoming tensor on a module's first call in a step
WALK_LIMIT = 32
#: the first steps are always checked (state carried from step 0 shows at step 1)
FIRST_CHECKS = 4
#: the longest gap between two checked steps once nothing changes
MAX_PACE = 64
#: a step whose graph size (autograd nodes created) is one of the last this many
#: distinct sizes seen is no structure change: bucketed sequence lengths repeat, and
#: so do unbucketed natural ones, mostly within a few hundred
RECENT_COUNTS = 256
#: a node whose sequence number is this large is a leaf (AccumulateGrad), not an op
_LEAF_SEQUENCE = 2**63

CellSpec = nn.Module | str | type


def find_recurrent(
    model: nn.Module, cells: Sequence[CellSpec] | None = None
) -> list[tuple[str, nn.Module]]:
    """The recurrent modules of ``model``: fused layers, ``*Cell`` classes, named cells.

    ``cells`` items are modules, names as in ``named_modules()``, or classes; one that
    matches nothing raises ``ValueError``.

    Example:
        >>> model = torch.nn.Sequential(torch.nn.LSTM(2, 3), torch.nn.Linear(3, 1))
        >>> [name for name, _ in find_recurrent(model)]
        ['0']
    """
    named = list(model.named_modules())
    chosen: dict[int, tuple[str, nn.Module]] = {}
    for name, module in named:
        if isinstance(module, (nn.RNNBase, nn.RNNCellBase)):
            chosen[id(module)] = (name, module)
    for spec in cells or ():
        hits = [
            (name, module)
            for name, module in named
            if module is spec
            or (isinstance(spec, str) and name == spec)
            or (isinstance(spec, type) and isinstance(module, spec))
        ]
        if not hits:
            listing = ", ".join(repr(name) for name, _ in named[1:21])
            raise ValueError(
                f"expected a module, name or class in the model, got {spec!r}; "
                f"modules: {listing}"
            )
        for name, module in hits:
            chosen[id(module)] = (name, module)
    order = {id(module): i for i, (_, module) in enumerate(named)}
    return sorted(chosen.values(), key=lambda item: order[id(item[1])])


def _grad_fns(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """``grad_fn`` of every tensor argument, one level into tuples/lists (``(h, c)``).

    Plain loops, no generators: this runs on every call of every recurrent module.
    """
    found = []
    for value in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(value, torch.Tensor):
            if value.grad_fn is not None:
                found.append(value.grad_fn)
        elif isinstance(value, (tuple, list)):
            for item in value:
                if isinstance(item, torch.Tensor) and item.grad_fn is not None:
                    found.append(item.grad_fn)
    return found


def _compiling() -> bool:
    # Inside torch.compile's tracing a hook must not read grad_fn or clocks: it returns
    # at once, so the compiled graph holds no trace of it (and no graph break).
    return bool(torch.compiler.is_compiling())


class _StepMarks:
    """Maps autograd sequence numbers to the training step that created the node."""

    def __init__(self) -> None:
        self._probe = torch.zeros((), requires_grad=True)
        self.marks: list[int] = []  # sequence number at the start of step i
        self.steps: list[int] = []

    def start(self, step: int, after: int | None = None) -> int | None:
        """Record where ``step`` starts: after the node numbered ``after``, else at a
        fresh probe node."""
        if after is not None:
            mark = after + 1
        else:
            with torch.enable_grad():
                node = self._probe.view_as(self._probe).grad_fn
            if node is None:  # inference mode: no numbering, keep the last mark
                return self.marks[-1] if self.marks else None
            mark = int(node._sequence_nr())
        self.marks.append(mark)
        self.steps.append(step)
        if len(self.marks) > 4096:
            del self.marks[:2048], self.steps[:2048]
        return mark

    def step_of(self, sequence: int) -> int:
        """The step during which the node numbered ``sequence`` was built (-1: before)."""
        i = bisect.bisect_right(self.marks, sequence) - 1
        return self.steps[i] if i >= 0 else -1


class StaleState(Quantity):
    """Alerts ``graph_growth`` when a recurrent module gets state from an earlier step.

    Example: see the module docstring.
    """

    name = "stale_state"
    heavy = False

    def __init__(self, cells: Sequence[CellSpec] | None = None) -> None:
        super().__init__()
        self.cells = cells
        self.step = -1
        self._mark: int | None = None
        self._marks = _StepMarks()
        self._last_number: int | None = None  # the last loss node's sequence number
        self._thread = threading.get_ident()
        self._names: dict[int, str] = {}
        self._seen_this_step: set[int] = set()
        self._alerted: set[str] = set()
        self._alerts: list[dict[str, Any]] = []
        self.modules: list[str] = []
        self._watched: list[nn.Module] = []
        self._armed = False
        #: steps checked so far (``checked`` is this step's); the next due and the gap
        self.checked = 0
        self.checking = False
        self._due = 0
        self._pace = 1
        # the last RECENT_COUNTS distinct numbers of autograd nodes light and heavy
        # steps created (heavy steps' capture adds a few of its own), oldest first
        self._created = {False: Recent(RECENT_COUNTS), True: Recent(RECENT_COUNTS)}

    def attach(self, model: nn.Module) -> None:
        for name, module in find_recurrent(model, self.cells):
            # the watched model itself has the empty name; alerts need a subject
            name = name or type(module).__name__
            self._names[id(module)] = name
            self.modules.append(name)
            self._watched.append(module)
        self._arm(True)

    def _arm(self, on: bool) -> None:
        """Put the pre-hooks on the modules for a checked step, take them off else."""
        if on and not self._armed:
            for module in self._watched:
                self._handles.append(
                    module.register_forward_pre_hook(OwnHook(self._pre_forward), with_kwargs=True)
                )
        elif not on and self._armed:
            self._unhook()
        self._armed = on

    def detach(self) -> None:
        self._arm(False)
        self._watched = []

    def start_step(self, capture: bool) -> None:
        # Runs on every light step, where each call and attribute read shows in a short
        # training step (BENCHMARKS.md, "What a light step costs"): what rarely changes
        # is compared before anything is called.
        self.capturing = capture
        self.step += 1
        thread = threading.get_ident()
        if thread != self._thread:
            # Training moved to another thread than watch()'s: node numbers are per
            # thread, so marks start over there (the calls of this step, marked in the
            # old thread, are skipped by the thread check in the hook).
            self._thread = thread
            self._marks = _StepMarks()
            self._last_number = None
            self._created = {False: Recent(RECENT_COUNTS), True: Recent(RECENT_COUNTS)}
            self._due, self._pace = self.step, 1
        self._mark = self._marks.start(self.step, self._last_number)
        self._last_number = None
        if self._seen_this_step:
            self._seen_this_step.clear()
        checking = self.checking = self.step < FIRST_CHECKS or self.step >= self._due
        if checking:
            self.checked += 1
            if self.step >= FIRST_CHECKS:
                self._due = self.step + self._pace
                self._pace = min(2 * self._pace, MAX_PACE)
        if self._watched:
            on = checking and len(self._alerted) < len(self._watched)
            if on != self._armed:
                self._arm(on)

    def _pre_forward(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        if self._mark is None or not torch.is_grad_enabled() or _compiling():
            return None
        if threading.get_ident() != self._thread:  # numbering is per thread
            return None
        started = time.perf_counter()
        try:
            key = id(module)
            name = self._names.get(key, "")
            if name not in self._alerted:
                first = key not in self._seen_this_step
                self._seen_this_step.add(key)
                old = self._oldest(_grad_fns(args, kwargs), walk=first)
                if old is not None:
                    self._raise(name, old)
        except Exception:  # noqa: S110 - a failed check must never break training
            pass
        self.cost_s += time.perf_counter() - started
        return None

    def _oldest(self, roots: list[Any], walk: bool) -> int | None:
        """Sequence number of a node from an earlier step upstream of ``roots``."""
        assert self._mark is not None
        mark = self._mark
        for node in roots:
            sequence = node._sequence_nr()
            if sequence < mark:
                return int(sequence)
        if not walk:
            return None
        seen = set(roots)
        queue = list(roots)
        while queue and len(seen) < WALK_LIMIT:
            node = queue.pop(0)
            for child, _ in node.next_functions:
                if child is None or child in seen:
                    continue
                sequence = child._sequence_nr()
                if sequence < mark:
                    return int(sequence)
                if sequence < _LEAF_SEQUENCE:
                    seen.add(child)
                    queue.append(child)
        return None

    def _raise(self, name: str, sequence: int) -> None:
        self._alerted.add(name)
        then = self._marks.step_of(sequence)
        when = f"step {then}'s" if then >= 0 else "a"
        before = "" if then >= 0 else " built before watch()"
        self._alerts.append(
            {
                "kind": "alert",
                "step": self.step,
                "code": "graph_growth",
                "severity": "error",
                "state": "raised",
                "subject": name,
                "message": (
                    f"{name} received a hidden state still attached to "
                    f"{when} autograd graph{before}: every backward walks the earlier "
                    "steps again, so steps get slower and memory grows"
                ),
                "hint": (
                    "Detach the carried state at the start of each sequence: "
                    "h = h.detach() (for an LSTM, both h and c); then retain_graph=True "
                    "is no longer needed"
                ),
                "evidence": {"state_step": then, "steps_back": self.step - then},
                "t": time.time(),
            }
        )

    def finish_step(self, loss: torch.Tensor | None) -> dict[str, Any]:
        node = loss.grad_fn if isinstance(loss, torch.Tensor) else None
        # only its number is needed: holding the node would keep the step's graph
        number = None
        if node is not None and threading.get_ident() == self._thread:
            number = int(node._sequence_nr())
        self._last_number = number
        if number is not None and self._mark is not None:
            created = number + 1 - self._mark
            recent = self._created[self.heavy_step]
            # the size the step before built (most steps): see() would change nothing
            if created != recent.last:
                first = not recent  # the first graph of its kind is no change
                if recent.see(created) and not first:
                    self._due, self._pace = self.step + 1, 1  # a new graph: check next step
        if not self._alerts:
            return {}
        alerts, self._alerts = self._alerts, []
        return {"alerts": alerts}
