"""What a per-module capture (cells.py, fused.py) needs of the quantity that owns it.

The captures are built by :class:`~gradwatch.trainer_hooks.quantities.timesteps.
RecurrentTimesteps`, which imports them; they see their owner through this protocol
only, so the imports point one way (timesteps -> cells, fused -> owner).

Example:
    >>> from gradwatch.trainer_hooks.quantities.timesteps import RecurrentTimesteps
    >>> {"capturing", "generation", "warn_once"} <= set(dir(RecurrentTimesteps()))
    True
"""

from __future__ import annotations

from typing import Protocol


class CaptureOwner(Protocol):
    """The owner's state a capture reads (and the time it adds to ``cost_s``)."""

    capturing: bool
    cost_s: float
    generation: int
    exact_now: bool

    def warn_once(self, kind: str, message: str) -> None:
        """Warn once per ``kind``; training goes on."""

    def warn_failure(self, kind: str, error: Exception) -> None:
        """Warn once that a capture failed; training goes on."""
