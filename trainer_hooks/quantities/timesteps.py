"""``timesteps``: per-timestep gradient norms of recurrent modules, in float64.

Why float64: an fp32 square underflows below about 1e-19, and the early timesteps of
a long LSTM sit near 1e-29, exactly where vanishing gradient shows. Every gradient is
cast to float64 before it is squared.

- Fused ``nn.LSTM``/``nn.GRU``/``nn.RNN`` (:mod:`.fused`): series ``"input"``,
  ‖∂L/∂x_t‖₂ over batch and features of the module's input sequence, t in sequence
  order; stacked layers also ``"layer<i>"`` (input of layer i ≥ 1), the module's
  kernel call run layer by layer on heavy steps. With ``exact_hidden`` on sampled
  steps also ``"hidden"``/``"cell"`` (top layer, total ∂L/∂h_t, both directions),
  through an unrolled re-computation (:mod:`.unrolled`).
- Cells called in a loop (:mod:`.cells`): ``nn.LSTMCell``/``GRUCell``/``RNNCell``
  and any module named in ``cells``: series ``"hidden"`` (and ``"cell"``), the
  norm of ∂L/∂h_k for the k-th call within the step.

Module names are those of ``model.named_modules()``; a model that is itself a
recurrent module is reported under its class name (``"LSTM"``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from gradwatch.protocol.messages import MAX_TIMESTEPS
from gradwatch.trainer_hooks.warn import WarnOnce

from .base import Quantity
from .calls import combine_calls
from .cells import CellCapture
from .fused import FusedCapture

if TYPE_CHECKING:
    from .params import ParamNorms

CELL_TYPES = (nn.LSTMCell, nn.GRUCell, nn.RNNCell)
FUSED_TYPES = (nn.LSTM, nn.GRU, nn.RNN)
CellSpec = nn.Module | str | type


def _describe(spec: object) -> str:
    if isinstance(spec, type):
        return spec.__name__
    if isinstance(spec, nn.Module):
        return f"a {type(spec).__name__} module"
    return repr(spec)


def resolve_cells(model: nn.Module, cells: list[CellSpec]) -> dict[str, nn.Module]:
    """The named cells in ``model``, by module, name or class; name -> module.

    Raises ValueError for a spec that matches nothing in the model, TypeError for a
    spec that is not a module, a name or a class.
    """
    named = list(model.named_modules())
    found: dict[str, nn.Module] = {}
    for spec in cells:
        if isinstance(spec, nn.Module):
            hits = [(n, m) for n, m in named if m is spec]
        elif isinstance(spec, str):
            hits = [(n, m) for n, m in named if n == spec]
        elif isinstance(spec, type) and issubclass(spec, nn.Module):
            hits = [(n, m) for n, m in named if isinstance(m, spec)]
        else:
            raise TypeError(
                "expected cells to be modules, module names or nn.Module classes, "
                f"got {spec!r} ({type(spec).__name__})"
            )
        if not hits:
            names = ", ".join(repr(n) for n, _ in named if n) or "(none)"
            raise ValueError(
                f"expected a module, name or class in the model, got {_describe(spec)}; "
                f"modules: {names}"
            )
        found.update(hits)
    return found


class RecurrentTimesteps(Quantity):
    """Per-timestep gradient norms of every recurrent module in a model.

    Args:
        cells: more modules to treat as cells called in a loop (modules, names from
            ``named_modules()`` or classes); ``nn.LSTMCell``/``GRUCell``/``RNNCell``
            are always found.
        exact_hidden: also capture the exact ∂L/∂h_t of fused modules: ``True`` on every
            captured step, an int N on every N-th captured step (it re-runs the module
            unrolled on those steps; docs/CAPTURE.md gives the cost).

    Example:
        >>> lstm = nn.LSTM(1, 8, batch_first=True)
        >>> q = RecurrentTimesteps(); q.attach(lstm); q.start_step(True)
        >>> out, _ = lstm(torch.randn(2, 5, 1)); out[:, -1].sum().backward()
        >>> record = q.encode(q.finish_step(None))
        >>> len(record["timesteps"]["LSTM"]["input"])
        5
    """

    name: ClassVar[str] = "timesteps"
    heavy: ClassVar[bool] = True
    idle_when_light: ClassVar[bool] = True

    def __init__(
        self,
        cells: list[CellSpec] | None = None,
        exact_hidden: bool | int = False,
        select: Callable[[str], bool] | None = None,
    ):
        super().__init__()
        self.select = select  # include=/exclude= of watch(), on module names
        if isinstance(exact_hidden, bool):
            every = 1 if exact_hidden else 0
        elif isinstance(exact_hidden, int) and exact_hidden >= 0:
            every = exact_hidden  # 0: off
        else:
            raise ValueError(
                f"expected exact_hidden to be True, False or an int >= 0, got {exact_hidden!r}"
            )
        if cells is not None and not isinstance(cells, (list, tuple)):
            raise TypeError(f"expected cells to be a list, got {type(cells).__name__}")
        self.cell_specs: list[CellSpec] = list(cells or [])
        self.exact_every = every
        self.exact_now = False
        self.generation = 0  # bumps every step; hooks of an earlier step ignore themselves
        self.modules: list[str] = []
        self._fused: list[FusedCapture] = []
        self._cells: list[CellCapture] = []
        self._captured = 0
        self._once = WarnOnce()
        # the step's backward passes (ParamNorms, when the Monitor links it) and, at
        # the end of each, how many calls each fused module and each cell had made
        self._passes: ParamNorms | None = None
        self._ends: list[tuple[list[int], list[int]]] = []

    # -- set-up ----------------------------------------------------------------------

    def attach(self, model: nn.Module) -> None:
        """Find the recurrent modules of ``model`` and hook them (ValueError on a bad cell)."""
        named_cells = resolve_cells(model, self.cell_specs)
        for name, module in model.named_modules():
            label = name or type(module).__name__
            if self.select is not None and not self.select(label):
                continue
            if isinstance(module, FUSED_TYPES):
                fused = FusedCapture(self, module, label)
                self._fused.append(fused)
                self._handles.extend(fused.register())
            elif isinstance(module, CELL_TYPES) or name in named_cells:
                cell = CellCapture(self, module, label)
                self._cells.append(cell)
                self._handles.extend(cell.register())
            else:
                continue
            self.modules.append(label)

    def follow(self, passes: ParamNorms) -> None:
        """Report only the calls of the backward passes ``passes`` reports.

        ``passes`` counts a step's backward passes and knows the last one after which
        ``.grad`` was reset. With a closure optimizer (LBFGS: forward and backward
        several times per step, ``.grad`` reset before each) the step's series are
        those of the last evaluation, as ``param_norms`` are; with gradient
        accumulation, every micro-batch's calls (k continues). Calls no gradient reached
        that come before the first call a gradient reached, within the calls of each
        pass (a forward no backward ran through: an evaluation with grad on, a
        discarded forward), are left out, as are the calls made after the last
        backward pass (nothing flowed back through them).
        """
        self._passes = passes
        passes.listeners.append(self._pass_ended)

    def _pass_ended(self) -> None:
        if self.capturing:
            self._ends.append(
                ([len(f.calls) for f in self._fused], [c.count for c in self._cells])
            )

    def _kept(self, which: int, index: int, total: int) -> tuple[int, int]:
        """The calls ``start .. end-1`` of one module that the step reports."""
        ends, tracker = self._ends, self._passes
        if tracker is None or not ends:  # no pass seen (autograd.grad, no Monitor)
            return 0, total
        end = ends[-1][which][index]
        reset = min(tracker.since_reset, len(ends))
        start = ends[reset - 1][which][index] if reset else 0
        if start >= end:  # no forward since the reset: a retained graph run again
            start = 0
        return start, end

    def _spans(
        self, which: int, index: int, total: int, reached: Callable[[int], bool]
    ) -> list[tuple[int, int]]:
        """The calls of one module that the step reports, as spans ``(a, b)``: ``a .. b-1``.

        The calls of the reported passes (:meth:`_kept`), cut where a pass ended: each
        pass's calls are those made since the pass before it ended. In each, the calls
        before the first one a gradient reached (``reached``) are left out: forward calls
        no backward ran through (an evaluation with grad on before the training forward,
        a discarded forward), as the calls after the last pass are. A call that got a
        gradient, zero or not, is kept, and so is every call after it within its pass;
        a pass that reached none of the module's calls keeps them all (zeros: the module
        got no gradient). Once per step, on the host; it reads the calls it leaves out
        and one more.
        """
        start, end = self._kept(which, index, total)
        cuts = sorted({cut for ends in self._ends if start < (cut := ends[which][index]) < end})
        spans: list[tuple[int, int]] = []
        for a, b in zip([start, *cuts], [*cuts, end], strict=True):
            first = a
            while first < b and not reached(first):
                first += 1
            # none reached: the module got no gradient in this pass (its output detached
            # on the way to the loss), and its zeros say so (no_gradient names it)
            spans.append((a if first == b else first, b))
        return [(a, b) for a, b in spans if a < b]

    def detach(self) -> None:
        super().detach()
        for fused in self._fused:
            fused.arm(False)
            fused.reset()  # pops a per-layer mode left by a forward that raised
        for cell in self._cells:
            cell.arm(False)
            cell.reset()  # drops the outputs it kept
        self._fused, self._cells, self.modules = [], [], []

    # -- per step --------------------------------------------------------------------

    def start_step(self, capture: bool) -> None:
        super().start_step(capture)
        self.generation += 1
        every = self.exact_every
        self.exact_now = bool(capture and every and self._captured % every == 0)
        if capture:
            self._captured += 1
        self._ends = []
        for fused in self._fused:
            fused.reset()
            fused.arm(capture)
        for cell in self._cells:
            cell.reset()
            cell.arm(capture)

    def finish_step(self, loss: torch.Tensor | None) -> dict[str, Any]:
        """``{"timesteps": {module: {series: float64 device tensor}}}``; never syncs."""
        if not self.capturing:
            return {}
        result: dict[str, dict[str, torch.Tensor]] = {}
        layout: dict[str, str] = {}
        try:
            for i, fused in enumerate(self._fused):
                spans = self._spans(0, i, len(fused.calls), fused.reached)
                kept = [call for a, b in spans for call in fused.calls[a:b]]
                if kept:
                    series = combine_calls(kept)
                    if series:
                        result[fused.name] = series
            for i, cell in enumerate(self._cells):
                spans = self._spans(1, i, cell.count, cell.reached)
                series = cell.series(spans)
                if series:
                    result[cell.name] = series
                    layout[cell.name] = cell.layout(spans)
        except Exception as e:
            self.warn_failure("timesteps payload", e)
            return {}
        if not result:
            return {}
        payload: dict[str, Any] = {"timesteps": result}
        # only when a cell's calls are not one chain ("absent means chain"): a field
        # a column block lacks sends the record whole, in `records`
        if "tree" in layout.values():
            payload["timestep_layout"] = layout
        return payload

    def encode(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Host tensors -> lists of floats, and the first non-finite index per series."""
        modules = payload.get("timesteps")
        if not modules:
            return {}
        out: dict[str, dict[str, list[float]]] = {}
        nonfinite: dict[str, dict[str, int]] = {}
        for module, series in modules.items():
            for key, values in series.items():
                floats = [float(v) for v in torch.as_tensor(values).tolist()]
                if len(floats) > MAX_TIMESTEPS:
                    self.warn_once(
                        "timesteps_truncated",
                        f"gradwatch: {module}.{key} has {len(floats)} timesteps; only the "
                        f"first {MAX_TIMESTEPS} are sent (the protocol's limit)",
                    )
                    floats = floats[:MAX_TIMESTEPS]
                out.setdefault(module, {})[key] = floats
                first = next((i for i, v in enumerate(floats) if not math.isfinite(v)), None)
                if first is not None:
                    nonfinite.setdefault(module, {})[key] = first
        record: dict[str, Any] = {"timesteps": out}
        if nonfinite:
            record["nonfinite"] = {"timesteps": nonfinite}
        if payload.get("timestep_layout"):
            record["timestep_layout"] = dict(payload["timestep_layout"])
        return record

    # -- trouble ---------------------------------------------------------------------

    def warn_once(self, kind: str, message: str) -> None:
        self._once.warn(kind, message)

    def warn_failure(self, kind: str, error: Exception) -> None:
        self._once.warn(
            kind, f"gradwatch: {kind} failed and is skipped ({type(error).__name__}: {error})"
        )
