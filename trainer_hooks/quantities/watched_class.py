"""A torch cell's forward followed by a capture, without a module hook.

A forward hook sends every call of its module down ``Module._call_impl``'s hooked path
(hook lists built and walked, a closure, the backward-hook checks): 4.8 µs a call more
than this class's path on this repository's 2-core box (``bench/cell_call.py``, a 78
µs call), 24 calls a step in a 24-token decoder. A cell loop calls its cell on every
token, so for torch's own cells (``nn.LSTMCell``, ``nn.GRUCell``, ``nn.RNNCell``,
exactly those classes) the capture instead changes the instance's class, while it is
armed, to a subclass whose ``forward`` calls the cell's own and then the capture:
``_call_impl`` keeps its hook-free path, as ``torch.nn.utils.parametrize`` does for
its modules.

What stays as it was:

- ``isinstance``, the class's name, ``repr`` and ``__module__`` (``torch.fx`` takes the
  cell as a leaf module still); parameters, buffers, ``state_dict``;
- copies: ``copy.deepcopy(cell)``, ``copy.copy`` and ``torch.save`` reduce to the
  original class, so a copy is a plain cell, and a shallow copy that shares the
  instance's ``__dict__`` (``nn.DataParallel``'s replicas) is not the watched instance:
  the capture runs for the watched instance only (looked up by identity);
- an instance whose ``forward`` was replaced on the instance (``cell.forward = f``) or
  whose class is already another (a parametrized cell) gets a forward hook instead.

What differs while armed: ``type(cell) is nn.LSTMCell`` is False, so a mapping keyed by
the exact class (``torch.ao.quantization``'s module mappings) does not find the cell:
convert or quantize after ``monitor.remove()``. :func:`unwatch` puts the original class
back (when nothing changed it since).

Example:
    >>> import copy, torch
    >>> seen = []
    >>> cell = torch.nn.GRUCell(2, 3)
    >>> watch_class(cell, lambda module, args, out: seen.append(out.shape))
    True
    >>> _ = cell(torch.ones(1, 2))
    >>> type(copy.deepcopy(cell)) is torch.nn.GRUCell, isinstance(cell, torch.nn.GRUCell)
    (True, True)
    >>> unwatch(cell); type(cell) is torch.nn.GRUCell, seen
    (True, [torch.Size([1, 3])])
"""

from __future__ import annotations

import copyreg
from collections.abc import Callable
from typing import Any

from torch import nn

#: the classes whose instances may change class while watched (torch's own cells:
#: no user ``__init_subclass__`` runs, nothing pickles them by a name of ours)
SWAPPABLE: tuple[type[nn.Module], ...] = (nn.LSTMCell, nn.GRUCell, nn.RNNCell)

After = Callable[[nn.Module, tuple[Any, ...], Any], None]

# id(instance) -> (the instance, what runs after its forward): a watched instance is
# its own key, so a shallow copy (same __dict__, new identity) finds nothing
_AFTER: dict[int, tuple[nn.Module, After]] = {}
_SUBCLASSES: dict[type[nn.Module], type[nn.Module]] = {}
_NEWOBJ = getattr(copyreg, "__newobj__")  # noqa: B009 (not in the stubs)


def _subclass(base: type[nn.Module]) -> type[nn.Module]:
    cached = _SUBCLASSES.get(base)
    if cached is not None:
        return cached
    forward = base.forward

    def watched_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        output = forward(self, *args, **kwargs)
        entry = _AFTER.get(id(self))
        if entry is not None and entry[0] is self:
            entry[1](self, args, output)
        return output

    watched: type[nn.Module] = type(
        base.__name__,
        (base,),
        {
            "forward": watched_forward,
            "__module__": base.__module__,
            "__qualname__": base.__qualname__,
            "__doc__": base.__doc__,
        },
    )

    def __reduce_ex__(self: nn.Module, protocol: Any) -> Any:
        # copy, deepcopy and pickle build the original class: a copy is a plain cell
        reduced = list(super(watched, self).__reduce_ex__(protocol))
        args = reduced[1]
        if isinstance(args, tuple) and args and args[0] is watched:
            reduced[1] = (base, *args[1:])
            if reduced[0] is _NEWOBJ:  # pickle wants type(self) there
                reduced[0] = object.__new__  # what __newobj__ calls for these classes
        return tuple(reduced)

    setattr(watched, "__reduce_ex__", __reduce_ex__)  # noqa: B010 (a method of a made class)
    _SUBCLASSES[base] = watched
    return watched


def watch_class(module: nn.Module, after: After) -> bool:
    """Run ``after(module, args, output)`` after each call of ``module``'s forward by
    changing its class; False (nothing changed) where that does not apply: the caller
    then puts a forward hook on it."""
    base = type(module)
    if base not in SWAPPABLE or "forward" in module.__dict__:
        return False
    _AFTER[id(module)] = (module, after)
    module.__class__ = _subclass(base)
    return True


def unwatch(module: nn.Module) -> None:
    """Stop what :func:`watch_class` started; idempotent."""
    entry = _AFTER.get(id(module))
    if entry is not None and entry[0] is module:
        del _AFTER[id(module)]
    for base, watched in _SUBCLASSES.items():
        if type(module) is watched:
            module.__class__ = base
            return
