"""``depth``: ‖∂L/∂x_l‖₂ at the input of every block l of a stack, in float64.

The depth analogue of ``timesteps[...]["input"]``: in a stack of identical blocks
(transformer layers, residual stages) the gradient flows back through depth as it
flows back through time in an LSTM, and the input of block l carries the residual
stream's gradient, everything that flowed back from the blocks above it.

What is found: every ``nn.ModuleList`` or ``nn.Sequential`` with two or more
children, all of one class and holding parameters (``nn.TransformerEncoder.layers``,
a GPT's ``blocks``, a ModuleList of residual MLP blocks). ``watch(blocks=[...])``
names others: a container (its children, in order, are the blocks) by module or
name, or ``{"name": [module or name, ...]}`` for blocks that sit in no container.

How: a forward pre-hook on each block swaps the block's input for a view of it (no
copy) with a tensor hook, as :mod:`.fused` does for recurrent inputs; raw data that
needs no gradient gets a detached leaf that does. In backward the hook takes the
gradient's float64 norm on the device (no ``.item()``: nothing reaches the host
until the Monitor's one copy per step) and returns ``None``, so no gradient
changes. Because the hook sits on a view, the value is the gradient flowing into
this block, even when its input also feeds something else.

Several calls of a block in one step (gradient-accumulation micro-batches, a block
applied twice) combine as the root of the sum of squares: the norm over the union
of their batches. Like ``timesteps``, the step's values describe the backward
passes after the last reset of ``.grad`` (LBFGS: the last evaluation). A block
called in the step whose input got no gradient reads 0.

Example:
    >>> import torch
    >>> stack = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
    >>> q = DepthSeries(); q.attach(stack); q.start_step(True)
    >>> stack(torch.randn(4, 3)).sum().backward()
    >>> record = q.encode(q.finish_step(None))
    >>> list(record["depth"]), len(record["depth"]["Sequential"])
    (['Sequential'], 2)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from gradwatch.trainer_hooks.warn import WarnOnce

from .base import Quantity
from .calls import F64, hook_tensor
from .module_hooks import OwnHook

if TYPE_CHECKING:
    from .params import ParamNorms

BlockRef = nn.Module | str
BlockSpec = BlockRef | Mapping[str, Sequence[BlockRef]]


def _holds_parameters(module: nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def is_stack(module: nn.Module) -> bool:
    """A ModuleList or Sequential of two or more blocks of one class, with parameters."""
    if not isinstance(module, (nn.ModuleList, nn.Sequential)):
        return False
    children = list(module.children())
    return (
        len(children) >= 2
        and all(type(c) is type(children[0]) for c in children)
        and all(_holds_parameters(c) for c in children)
    )


def _lookup(model: nn.Module, ref: BlockRef, named: dict[str, nn.Module]) -> tuple[str, nn.Module]:
    if isinstance(ref, nn.Module):
        for name, module in named.items():
            if module is ref:
                return name, module
    elif isinstance(ref, str):
        if ref in named:
            return ref, named[ref]
    else:
        raise TypeError(
            "expected blocks= entries to be modules, module names or "
            f"{{name: [modules or names]}}, got {ref!r} ({type(ref).__name__})"
        )
    names = ", ".join(repr(n) for n in list(named)[1:21]) or "(none)"
    what = f"a {type(ref).__name__} module" if isinstance(ref, nn.Module) else repr(ref)
    raise ValueError(f"expected a module or module name in the model, got {what}; modules: {names}")


def find_stacks(
    model: nn.Module,
    blocks: Sequence[BlockSpec] | None = None,
    select: Callable[[str], bool] | None = None,
) -> dict[str, list[nn.Module]]:
    """Every stack of ``model``: label -> blocks in order (found and named ones).

    Labels are ``named_modules()`` names; a model that is itself a stack is labelled
    by its class (``"Sequential"``). ``select`` (include=/exclude=) filters labels.
    """
    named = dict(model.named_modules())
    stacks: dict[str, list[nn.Module]] = {}
    for name, module in named.items():
        if is_stack(module):
            stacks[name or type(module).__name__] = list(module.children())
    if blocks is not None and not isinstance(blocks, (list, tuple)):
        raise TypeError(f"expected blocks= to be a list, got {type(blocks).__name__}")
    for spec in blocks or []:
        if isinstance(spec, Mapping):
            for label, refs in spec.items():
                if not isinstance(label, str) or not isinstance(refs, (list, tuple)) or (
                    len(refs) < 1
                ):
                    raise TypeError(
                        "expected blocks= {name: [modules or names]} with a non-empty list, "
                        f"got {label!r}: {refs!r}"
                    )
                stacks[label] = [_lookup(model, r, named)[1] for r in refs]
            continue
        name, module = _lookup(model, spec, named)
        children = list(module.children())
        if not children:
            raise ValueError(
                f"expected blocks= {name!r} to be a container of blocks (a module with "
                "children), got a module without children; name its blocks as "
                f"{{'{name or 'blocks'}': [...]}} instead"
            )
        stacks[name or type(module).__name__] = children
    if select is not None:
        stacks = {label: mods for label, mods in stacks.items() if select(label)}
    return stacks


class DepthSeries(Quantity):
    """Fills ``depth``: {stack: [‖∂L/∂x_l‖ for every block l, in order]} on heavy steps.

    Args:
        blocks: more stacks to watch (see the module's docstring).
        select: include=/exclude= of ``watch()``, applied to the stacks' labels.

    Example:
        >>> class Residual(nn.Module):
        ...     def __init__(self): super().__init__(); self.f = nn.Linear(4, 4)
        ...     def forward(self, x): return x + self.f(x)
        >>> model = nn.ModuleDict({"blocks": nn.ModuleList([Residual() for _ in range(3)])})
        >>> q = DepthSeries(); q.attach(model); q.start_step(True)
        >>> x = torch.randn(2, 4)
        >>> for block in model["blocks"]: x = block(x)
        >>> x.sum().backward()
        >>> len(q.encode(q.finish_step(None))["depth"]["blocks"])
        3
    """

    name: ClassVar[str] = "depth"
    heavy: ClassVar[bool] = True
    idle_when_light: ClassVar[bool] = True

    def __init__(
        self,
        blocks: Sequence[BlockSpec] | None = None,
        select: Callable[[str], bool] | None = None,
        scaler: Any = None,
    ) -> None:
        super().__init__()
        self.block_specs = blocks
        self.select = select
        #: a GradScaler: backward carries the scaled loss's gradients, so the norms are
        #: divided by the scale backward ran with (copied on the device at the step's
        #: first gradient: scaler.update() changes it in place before monitor.step())
        self.scaler = scaler
        self._scale: torch.Tensor | None = None
        self.stacks: dict[str, list[nn.Module]] = {}
        self._labels: list[str] = []
        self.generation = 0  # bumps every step; hooks of an earlier step ignore themselves
        # (stack, block, backward pass, float64 norm) per gradient that arrived
        self._seen: list[tuple[int, int, int, torch.Tensor]] = []
        self._called: dict[int, torch.device] = {}  # stacks called this step, and where
        self._passes: ParamNorms | None = None
        self._once = WarnOnce()

    def attach(self, model: nn.Module) -> None:
        self.stacks = find_stacks(model, self.block_specs, self.select)
        self._labels = list(self.stacks)

    def hooks(self) -> list[Any]:
        """A forward pre-hook per block, on capturing steps only (:meth:`arm`)."""
        return [
            block.register_forward_pre_hook(OwnHook(self._pre, s, b), with_kwargs=True)
            for s, label in enumerate(self._labels)
            for b, block in enumerate(self.stacks[label])
        ]

    def block_names(self, model: nn.Module) -> dict[str, list[str]]:
        """Each stack's blocks by their ``named_modules()`` names, in order (the
        dashboard's labels; ``hello.config.depth_blocks``)."""
        names = {id(module): name for name, module in model.named_modules()}
        return {
            label: [names.get(id(block), f"{label}[{b}]") for b, block in enumerate(blocks)]
            for label, blocks in self.stacks.items()
        }

    def follow(self, passes: ParamNorms) -> None:
        """Report the backward passes ``passes`` reports (after the last ``.grad`` reset)."""
        self._passes = passes

    def detach(self) -> None:
        super().detach()
        # the blocks go too: a monitor kept after close() must not keep the model alive
        self._seen, self._called, self.stacks, self._labels = [], {}, {}, []

    # -- hooks ------------------------------------------------------------------------

    def _pre(
        self, stack: int, block: int, module: nn.Module, args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        # Inside torch.compile's tracing: return at once, so the compiled graph holds no
        # trace of the hook and no graph break (a break per block would cost a compiled
        # transformer dearly, and fullgraph=True would refuse it). Blocks inside a
        # compiled region therefore report no depth.
        if torch.compiler.is_compiling() or not self.capturing or not torch.is_grad_enabled():
            return None
        started = time.perf_counter()
        try:
            return self._swap_input(stack, block, args, kwargs)
        except Exception as e:  # monitoring must never break the training step
            self._once.warn("depth", f"gradwatch: depth capture failed and is skipped ({e!r})")
            return None
        finally:
            self.cost_s += time.perf_counter() - started

    def _swap_input(
        self, stack: int, block: int, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        key: int | str
        if args:
            key, x = 0, args[0]
        else:  # called with keywords only: the first tensor keyword is the input
            found = next(((k, v) for k, v in kwargs.items() if isinstance(v, torch.Tensor)), None)
            if found is None:
                return None
            key, x = found
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            return None
        probe = x.view_as(x) if x.requires_grad else x.detach().requires_grad_()
        self._called.setdefault(stack, probe.device)
        generation = self.generation
        hook_tensor(probe, lambda g: self._on_grad(generation, stack, block, g))
        if isinstance(key, int):
            return (probe, *args[1:]), kwargs
        return args, {**kwargs, key: probe}

    def _on_grad(self, generation: int, stack: int, block: int, grad: torch.Tensor) -> None:
        if generation != self.generation:  # a late backward of an earlier step
            return
        started = time.perf_counter()
        try:
            with torch.no_grad():
                norm = torch.linalg.vector_norm(grad.detach(), dtype=F64)
                if self.scaler is not None and self._scale is None:
                    self._scale = _scale_of(self.scaler)
            passes = self._passes.passes if self._passes is not None else 0
            self._seen.append((stack, block, passes, norm))
        except Exception as e:  # an autograd hook: never into the training loop
            self._once.warn("depth", f"gradwatch: depth capture failed and is skipped ({e!r})")
        finally:
            self.cost_s += time.perf_counter() - started

    # -- per step -----------------------------------------------------------------------

    def start_step(self, capture: bool) -> None:
        super().start_step(capture)
        self.arm(capture)
        self.generation += 1
        self._seen, self._called = [], {}
        self._scale = None

    def finish_step(self, loss: torch.Tensor | None) -> dict[str, Any]:
        """``{"depth": {stack: float64 device tensor (blocks,)}}``; never syncs."""
        if not self.capturing or not self._called:
            return {}
        first = self._passes.since_reset if self._passes is not None else 0
        kept: dict[tuple[int, int], list[torch.Tensor]] = {}
        for stack, block, passes, norm in self._seen:
            if passes >= first:
                kept.setdefault((stack, block), []).append(norm)
        result: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            for stack, device in self._called.items():
                values = []
                for block in range(len(self.stacks[self._labels[stack]])):
                    norms = kept.get((stack, block))
                    if not norms:
                        values.append(torch.zeros((), dtype=F64, device=device))
                    elif len(norms) == 1:
                        values.append(norms[0])
                    else:  # several calls: the norm over the union of their batches
                        values.append(torch.linalg.vector_norm(torch.stack(norms)))
                series = torch.stack([v.to(device) for v in values])
                if self._scale is not None:
                    series = series / self._scale.to(device=device, dtype=F64, non_blocking=True)
                result[self._labels[stack]] = series
        self._seen = []
        return {"depth": result}

    def encode(self, payload: dict[str, Any]) -> dict[str, Any]:
        stacks = payload.get("depth")
        if not stacks:
            return {}
        out = {label: [float(v) for v in torch.as_tensor(values).tolist()]
               for label, values in stacks.items()}
        return {"depth": out}


def _scale_of(scaler: Any) -> torch.Tensor | None:
    """A device copy of a GradScaler's current scale, or None when it is off (no sync)."""
    if not scaler.is_enabled():
        return None
    scale = getattr(scaler, "_scale", None)
    return scale.detach().clone() if isinstance(scale, torch.Tensor) else None
