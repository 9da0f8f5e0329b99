"""Reconnect delays: exponential backoff with full jitter.

Full jitter (a uniform draw between 0 and the exponential bound) spreads the
reconnects of many trainers after a server restart, instead of having them all
knock at once (see the AWS architecture blog, "Exponential Backoff And Jitter").

Example:
    >>> b = Backoff(base=0.1, cap=5.0, rng=lambda lo, hi: hi)  # no jitter, for show
    >>> [b.next_delay() for _ in range(4)]
    [0.1, 0.2, 0.4, 0.8]
    >>> b.reset(); b.next_delay()
    0.1
"""

from __future__ import annotations

import random
from collections.abc import Callable


class Backoff:
    """The delay before the next attempt: ``uniform(0, min(cap, base * 2**n))``."""

    def __init__(
        self,
        base: float = 0.05,
        cap: float = 5.0,
        rng: Callable[[float, float], float] | None = None,
    ) -> None:
        if base <= 0 or cap < base:
            raise ValueError(f"expected 0 < base <= cap, got base={base!r}, cap={cap!r}")
        self.base = base
        self.cap = cap
        # A generator of its own: drawing from the `random` module's would move the
        # training program's own random stream (shuffles, dropout seeds of its own) from
        # a background thread, whenever the server is away
        self._rng = rng or random.Random().uniform  # noqa: S311 - jitter, not a secret
        self.attempts = 0

    def bound(self) -> float:
        """The upper bound of the next delay (before jitter)."""
        # min() before the power would overflow for a very long outage.
        return min(self.cap, self.base * 2.0 ** min(self.attempts, 60))

    def next_delay(self) -> float:
        delay = self._rng(0.0, self.bound())
        self.attempts += 1
        return delay

    def reset(self) -> None:
        self.attempts = 0
