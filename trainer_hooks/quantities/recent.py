"""The last few distinct numbers a paced check has seen, each with what it found.

The stale-state check and the graph walk pace themselves by whether a step built a
graph like one seen lately (a number of autograd nodes): sequences bucketed by length
build another graph than the step before on nearly every step, yet only a few in all.
Both keep the last ``size`` distinct numbers here, the one seen most lately last.

Example:
    >>> r = Recent(2)
    >>> [r.see(n) for n in (7, 3, 7, 5)]
    [True, True, False, True]
    >>> list(r.values)  # 3 was seen longest ago: forgotten
    [7, 5]
    >>> r.last  # a caller that sees this key again may skip see(): nothing would move
    5
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

#: ``Recent.last`` before any key: equal to no key a caller has
_NOTHING = object()


class Recent:
    """At most ``size`` distinct keys, oldest first, each with a value (None until set)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.values: dict[Hashable, Any] = {}
        #: the key seen most lately (a placeholder equal to no key before any): most
        #: steps repeat the step before, and a check that compares with it first
        #: skips a call on each
        self.last: Hashable = _NOTHING

    def __len__(self) -> int:
        return len(self.values)

    def see(self, key: Hashable) -> bool:
        """Note ``key`` as seen most lately; True when it was not among the last ``size``."""
        values = self.values
        new = key not in values
        value = None if new else values.pop(key)  # and back at the end: seen most lately
        if new and len(values) >= self.size:
            del values[next(iter(values))]
        values[key] = value
        self.last = key
        return new
