"""``include=`` / ``exclude=``: which parameters and modules ``watch()`` captures.

Patterns are shell-style (``fnmatch``: ``*``, ``?``, ``[seq]``), case-sensitive, matched
against the names of ``model.named_parameters()`` and ``model.named_modules()``. A
pattern matches a name or any module that contains it, so ``"decoder"`` covers
``decoder.lstm`` and ``decoder.lstm.weight_hh_l0``, and ``"*.bias"`` every bias. A
name is watched when it matches some ``include`` pattern (no ``include``: every
name) and no ``exclude`` pattern. Why: a model with thousands of parameters can be
narrowed to the blocks that matter, and every quantity agrees on what "watched"
means (gradient norms, update ratios, per-timestep and depth series).

A pattern that matches no parameter or module name is an error at ``watch()``: a
typo would otherwise silently watch nothing (or everything).

Example:
    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    >>> s = Selection(include=["1"], exclude=["*.bias"])
    >>> s.check(model)
    >>> [n for n, _ in model.named_parameters() if s(n)]
    ['1.weight']
"""

from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatchcase

from torch import nn


def _patterns(value: str | Sequence[str] | None, option: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(p, str) and p for p in value
    ):
        raise TypeError(
            f"expected {option}= to be a pattern or a list of patterns (non-empty strings), "
            f"got {value!r}"
        )
    return tuple(value)


def _prefixes(name: str) -> list[str]:
    """``a.b.c`` -> ``['a.b.c', 'a.b', 'a']``: the name and the modules that contain it."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


class Selection:
    """The watched names of a model: ``include`` and ``exclude`` fnmatch patterns.

    Example:
        >>> s = Selection(exclude="encoder")
        >>> s("encoder.layers.0.linear1.weight"), s("decoder.weight")
        (False, True)
    """

    def __init__(
        self,
        include: str | Sequence[str] | None = None,
        exclude: str | Sequence[str] | None = None,
    ) -> None:
        self.include = _patterns(include, "include")
        self.exclude = _patterns(exclude, "exclude")

    @property
    def everything(self) -> bool:
        """True when no pattern narrows anything (the default)."""
        return not self.include and not self.exclude

    @staticmethod
    def _hits(name: str, patterns: tuple[str, ...]) -> bool:
        return any(fnmatchcase(prefix, p) for prefix in _prefixes(name) for p in patterns)

    def __call__(self, name: str) -> bool:
        """Whether ``name`` (a parameter or module name) is watched."""
        if self.everything:
            return True
        if self.include and not self._hits(name, self.include):
            return False
        return not self._hits(name, self.exclude)

    def check(self, model: nn.Module) -> None:
        """ValueError for a pattern that matches no parameter or module name of ``model``."""
        names = [n for n, _ in model.named_modules() if n]
        names += [n for n, _ in model.named_parameters()]
        for option, patterns in (("include", self.include), ("exclude", self.exclude)):
            for pattern in patterns:
                if not any(self._hits(n, (pattern,)) for n in names):
                    shown = ", ".join(repr(n) for n in names[:20])
                    more = f", ... ({len(names)} names)" if len(names) > 20 else ""
                    raise ValueError(
                        f"expected {option}= pattern {pattern!r} to match a parameter or "
                        f"module name, got no match; names: {shown or '(none)'}{more}"
                    )
