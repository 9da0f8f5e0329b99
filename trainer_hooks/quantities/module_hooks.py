"""The hooks gradwatch puts on the user's modules, and what a copy of a module gets.

A module hook lives in the module's own hook dicts, so ``copy.deepcopy(model)`` and
``torch.save(model)`` take it along, and with it the quantity it is bound to: its
Monitor, locks and background thread, which neither can copy (``TypeError: cannot
pickle '_thread.lock' object``). Training code copies models all the time: the best
model so far (``best = copy.deepcopy(model)``), an EMA or SWA average
(``torch.optim.swa_utils.AveragedModel(model)`` deep-copies it), a whole-model
checkpoint. With hooks that come and go with the schedule, such a line failed on some
steps only.

So every module hook is an :class:`OwnHook`: a ``functools.partial`` (called in C, no
extra Python frame on a hook that runs on every call) whose copies are :func:`inert`.
A copy of a watched model behaves as the model without gradwatch and reports nothing
to the monitor; ``torch.save(model)`` stores ``inert`` by reference, so loading such
a file needs gradwatch installed (a ``state_dict`` does not).

Example:
    >>> import copy, torch
    >>> seen = []
    >>> model = torch.nn.Linear(2, 1)
    >>> _ = model.register_forward_hook(OwnHook(lambda m, args, out: seen.append(m)))
    >>> twin = copy.deepcopy(model)
    >>> _ = model(torch.ones(2)), twin(torch.ones(2))
    >>> seen == [model]
    True
"""

from __future__ import annotations

import functools
from typing import Any


def inert(*args: Any, **kwargs: Any) -> None:
    """What a copy of a watched module has where gradwatch's hook was: a hook that
    changes nothing (returns None) and records nothing."""
    return None


class OwnHook(functools.partial):  # type: ignore[type-arg]
    """A gradwatch hook on a user's module: calls ``func``; copied or pickled, it is
    :func:`inert` (see the module docstring)."""

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return inert

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return functools.partial, (inert,)
