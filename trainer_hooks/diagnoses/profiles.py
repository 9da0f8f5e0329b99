"""Reading the ``profile`` field (``profile=True``): per-module seconds and calls.

Two things in it say nothing about where a step's time goes:

- the whole model (the root: ``""``, or its class name), which always holds all of
  it. Without a ``""`` entry, the root is the entry run once per step whose forward
  time covers the forward times of all other top-level entries together;
- backward times longer than the step itself: the backward clock of a module whose
  inputs need no gradient (an embedding fed token ids) runs until the end of
  backward, so one called 20 times in a loop adds up 20 overlapping intervals
  (docs/CAPTURE.md). Such a backward time is dropped (read as 0, ``backward_ok``
  False); the forward time, which is exact, stays.

Example:
    >>> prof = {"Model": {"forward_s": 0.05, "backward_s": 0.04, "calls": 1},
    ...         "emb": {"forward_s": 0.001, "backward_s": 0.9, "calls": 20},
    ...         "rnn": {"forward_s": 0.02, "backward_s": 0.03, "calls": 1}}
    >>> rows, root = read_profile(prof, duration_s=0.1)
    >>> sorted(rows), root.forward_s, rows["emb"].backward_ok
    (['emb', 'rnn'], 0.05, False)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from .base import as_float

#: an entry longer than the step by more than this is a measurement artefact
_SLACK = 1.05


class Row(NamedTuple):
    forward_s: float
    backward_s: float
    calls: int
    backward_ok: bool = True

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s


def read_profile(profile: Any, duration_s: float | None) -> tuple[dict[str, Row], Row | None]:
    """Per-module rows of one step's profile without the root and impossible entries,
    and the root's row (the whole model) when there is one."""
    rows: dict[str, Row] = {}
    if not isinstance(profile, Mapping):
        return rows, None
    for name, entry in profile.items():
        if not isinstance(entry, Mapping):
            continue
        calls = entry.get("calls")
        rows[str(name)] = Row(
            as_float(entry.get("forward_s")) or 0.0,
            as_float(entry.get("backward_s")) or 0.0,
            calls if isinstance(calls, int) and not isinstance(calls, bool) else 0,
        )
    root = rows.pop("", None)
    if root is None and rows:
        top = max(rows, key=lambda n: rows[n].forward_s)
        others = sum(r.forward_s for n, r in rows.items() if n != top and "." not in n)
        if rows[top].calls == 1 and "." not in top and rows[top].forward_s >= 0.95 * others:
            root = rows.pop(top)
    if duration_s:
        rows = {
            n: r
            if r.total_s <= _SLACK * duration_s
            else r._replace(backward_s=0.0, backward_ok=False)
            for n, r in rows.items()
        }
    return rows, root


def module_rows(profile: Any, duration_s: float | None) -> dict[str, Row]:
    """Per-module rows of one step's profile, without the root and impossible entries."""
    return read_profile(profile, duration_s)[0]
