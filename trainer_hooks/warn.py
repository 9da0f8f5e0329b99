"""Trouble in monitoring is warned about once per kind; training carries on.

The category and the once-per-kind helper live in the torch-free protocol package
(``gradwatch.protocol.warnings``) so that the websocket sender and the capture side
raise the same :class:`GradwatchWarning`. This module re-exports them for the
capture side and adds :func:`guarded`, the wrapper every hook runs inside.

Example:
    >>> import warnings
    >>> once = WarnOnce()
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     guarded(once, "demo", lambda: 1 / 0)
    >>> caught[0].category.__name__
    'GradwatchWarning'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from gradwatch.protocol.warnings import GradwatchWarning, WarnOnce

T = TypeVar("T")

__all__ = ["GradwatchWarning", "WarnOnce", "guarded"]


def guarded(once: WarnOnce, kind: str, fn: Callable[[], T], default: T | None = None) -> T | None:
    """Run ``fn``; on any error warn once for ``kind`` and return ``default``.

    Monitoring must never raise into the training loop.
    """
    try:
        return fn()
    except Exception as e:  # monitoring failed; the training step must not
        once.warn(kind, f"gradwatch: {kind} failed and is skipped ({type(e).__name__}: {e})")
        return default
