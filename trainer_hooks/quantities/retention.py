"""``loss_retention``: graphs kept alive by the losses themselves (``total += loss``,
``losses.append(loss)``).

Each step's loss node carries a sentinel in its metadata; a weak reference to it says
whether the node is still alive. When the loss node of ``AGE`` steps ago is alive,
something holds it, and with it every earlier step's autograd graph: one
``graph_growth`` alert (subject ``loss``) with the fix. Cheap enough for every step;
quantities/stale.py catches the other way graphs grow (a hidden state carried across
steps without ``detach()``).

The sentinel goes on the loss node below a scaling by a constant (``loss / 4``, a
GradScaler's ``loss * scale``; two at most): what a framework hands to backward is
often its own scaled copy, which the user's code never holds.

The loss nodes of the first ``ORDER_CHECKS`` steps also say whether a backward runs
from them after ``monitor.step(loss)`` closed their step: ``step()`` called before
``loss.backward()``, which leaves every captured step's series empty (the capture
collects gradients during the step's backward). On the second such step: one warning.
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from functools import partial
from typing import Any

import torch

from gradwatch.trainer_hooks.warn import WarnOnce

from .base import Quantity

#: the first steps whose loss node is watched for a backward after step() (see above)
ORDER_CHECKS = 8
#: what the capture needs of the training loop, said when it is not done
STEP_AFTER_BACKWARD = (
    "gradwatch: the backward of a step's loss ran after monitor.step(loss) had closed "
    "the step (steps {steps}): call monitor.step() after loss.backward() (and "
    "optimizer.step()); the gradients of a step are captured during its backward, so "
    "until then the per-timestep and depth series stay empty"
)


#: the nodes of a loss scaled by a constant (a framework's ``loss / accumulate`` or a
#: GradScaler's ``loss * scale``): the loss the user's code holds is the one below
_SCALING = frozenset({"DivBackward0", "MulBackward0"})


def _unscaled(node: Any, hops: int = 2) -> Any:
    """The loss node under at most ``hops`` scalings by a constant: Lightning runs
    backward from ``loss / normalize`` (and, under 16-mixed, that times the scale), so
    a sentinel on the root would watch a node only Lightning holds, while a module
    that keeps its loss (``self.outputs.append(loss)``) holds the one below."""
    for _ in range(hops):
        if type(node).__name__ not in _SCALING:
            break
        inputs = [child for child, _ in node.next_functions if child is not None]
        if len(inputs) != 1:  # a product or quotient of two graphs: no scaling
            break
        node = inputs[0]
    return node


class _Sentinel:
    """Lives in a loss node's metadata; its weakref says whether the node is alive."""


class LossRetention(Quantity):
    """Alerts ``graph_growth`` (subject ``loss``) when old loss graphs stay alive.

    Example:
        >>> import torch
        >>> q = LossRetention(); w = torch.ones(1, requires_grad=True); total = 0
        >>> for _ in range(3):
        ...     q.start_step(True); loss = (w * 2).sum(); total = total + loss
        ...     out = q.finish_step(loss)
        >>> out["alerts"][0]["subject"]
        'loss'
    """

    name = "loss_retention"
    heavy = False
    #: a loss node this many steps old and still alive is being held on purpose
    AGE = 2

    def __init__(self) -> None:
        super().__init__()
        self.step = -1
        self._refs: deque[tuple[int, weakref.ref[_Sentinel]]] = deque()
        self._alerted = False
        self._late: list[int] = []  # checked steps whose backward came after step()
        self._once = WarnOnce()

    def start_step(self, capture: bool) -> None:
        super().start_step(capture)
        self.step += 1

    def finish_step(self, loss: torch.Tensor | None) -> dict[str, Any]:
        node: Any = loss.grad_fn if isinstance(loss, torch.Tensor) else None
        if node is None:
            return {}
        if self.step < ORDER_CHECKS:  # fires only if a backward starts here from now on
            node.register_prehook(partial(self._backward_after_step, self.step))
        if self._alerted:
            return {}
        sentinel = _Sentinel()
        if type(node).__name__ in _SCALING:  # most losses are not scaled: no call for them
            node = _unscaled(node)
        node.metadata["gradwatch_step"] = sentinel
        refs = self._refs
        refs.append((self.step, weakref.ref(sentinel)))
        oldest = None
        while self.step - refs[0][0] >= self.AGE:  # each loss is looked at once, AGE old
            then, ref = refs.popleft()
            if oldest is None and ref() is not None:
                oldest = then
        if oldest is None:
            return {}
        self._alerted = True
        return {
            "alerts": [
                {
                    "kind": "alert",
                    "step": self.step,
                    "code": "graph_growth",
                    "severity": "error",
                    "state": "raised",
                    "subject": "loss",
                    "message": (
                        f"the loss graph of step {oldest} is still alive at step {self.step}: "
                        "something keeps earlier losses (such as total += loss), and with "
                        "them every earlier step's autograd graph"
                    ),
                    "hint": (
                        "Accumulate plain numbers, not tensors: total += loss.item() "
                        "(or loss.detach())"
                    ),
                    "evidence": {"held_step": oldest, "steps_back": self.step - oldest},
                    "t": time.time(),
                }
            ]
        }

    def _backward_after_step(self, step: int, grads: Any) -> None:
        if step not in self._late:
            self._late.append(step)
            if len(self._late) == 2:  # one can be a loss kept and used later on purpose
                steps = " and ".join(map(str, self._late))
                self._once.warn("step_order", STEP_AFTER_BACKWARD.format(steps=steps))
