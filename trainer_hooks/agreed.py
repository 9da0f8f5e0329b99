"""A budget schedule the ranks agree on: the same heavy steps on every rank.

Under FSDP2 the gradient norms are made global by a collective on heavy steps
(``quantities/sharded.py``), so every rank must capture the same steps. A budget
(:class:`~gradwatch.trainer_hooks.schedule.Schedule`) measures each rank's own costs
and would pick each rank's own steps; :class:`AgreedSchedule` keeps those
measurements (each rank proposes the interval its budget allows) and makes the
choice of steps a function of the step number and of an interval all ranks share:

- a step is heavy when ``interval`` steps have passed since the last heavy one (step
  0 is heavy): every rank decides from the same intervals at the same steps, so the
  same; counting from the last heavy step (rather than ``step % interval == 0``) a
  changed interval never skips heavy steps for long. With an interval below 3 (no
  light step after a light one to measure against), steps 60, 61 and 63 of every 64
  are light (the probe: light, light, heavy, light);
- every ``AGREE_EVERY`` (16) steps, at the start of the step, each rank starts an
  asynchronous all-reduce (MAX) of its proposed interval on a process group of
  gradwatch's own (gloo, CPU: it never interleaves with the training's collectives,
  and reading its result is no device sync), and waits for the one it started
  ``AGREE_EVERY`` steps before, whose result becomes the interval from this step on.
  The MAX keeps every rank within its budget (the dearest rank decides). A rank
  reaching step ``s + 16`` has been through the training's own collectives of step
  ``s``, which the other ranks reached after starting their all-reduce of step
  ``s``: in steady state the wait finds it done. Until the first result, the
  interval is the calibration's 3.

Before the group is made (``new_group`` waits for every rank, as long as the store's
timeout, often 30 minutes), the ranks meet on the process group's store: each adds
one to a counter, the last to arrive decides "go"; one that has waited ``JOIN_S``
(30 s) decides "no" instead. The first decision stands (``compare_set``), so every
rank obeys the same one: where some rank never calls ``watch()`` (rank 0 watching
alone), the others give up the agreement after ``JOIN_S`` and keep norms local,
where a group would have waited for that rank, and that rank for them in training.

If the wait fails or times out (``WAIT_S``: a rank left, or stopped monitoring) or
the all-reduce cannot start, the schedule warns once, goes on as the rank's own
budget schedule and calls :attr:`AgreedSchedule.on_fallback` (``watch()`` then
keeps sharded norms local, ``norm_scope: "local"``): training never waits for
monitoring for more than ``WAIT_S`` once.

Example (one process: a group of one rank agrees with itself):
    >>> import os, tempfile, torch.distributed as dist
    >>> init = "file://" + os.path.join(tempfile.mkdtemp(), "init")
    >>> dist.init_process_group("gloo", init_method=init, rank=0, world_size=1)
    >>> s = AgreedSchedule(every=1, overhead=0.02)
    >>> [step for step in range(10) if s.capture(step)]
    [0, 3, 6, 9]
    >>> s.close(); dist.destroy_process_group()
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from .schedule import Schedule
from .warn import WarnOnce


class AgreedSchedule(Schedule):
    """A :class:`Schedule` under a budget whose heavy steps every rank shares.

    Args:
        every: as :class:`Schedule`: the shortest interval.
        overhead: the budget (required: without one, ``every=N`` is already shared).
        max_interval: as :class:`Schedule`.
        once: where the fallback's warning goes (one per monitor).
        wait_s: how long a rank waits for the others' proposals before it gives up
            the agreement (default :attr:`WAIT_S`).

    Creating one is a collective (a new process group): every rank creates it, in
    the same order relative to the training's own ``new_group`` calls, as
    ``watch()`` does on every rank; where some rank does not within ``JOIN_S``,
    creating it raises RuntimeError on every rank that did.
    """

    #: steps between agreements (and between starting one and reading it)
    AGREE_EVERY = 16
    #: longest wait for the other ranks' proposals, in seconds
    WAIT_S = 10.0
    #: with an interval below 3, the steps of every PROBE_AFTER kept light
    PROBE_LIGHT = (60, 61, 63)
    #: longest wait at creation for every rank to create one too, in seconds
    JOIN_S = 30.0

    def __init__(
        self,
        every: int = 1,
        overhead: float | None = None,
        max_interval: int | None = None,
        once: WarnOnce | None = None,
        wait_s: float | None = None,
    ) -> None:
        super().__init__(every=every, overhead=overhead, max_interval=max_interval)
        if self.budget is None:
            raise ValueError("expected overhead= for an agreed schedule (every=N alone is "
                             "already the same on every rank), got None")
        self._once = once or WarnOnce()
        self.wait_s = self.WAIT_S if wait_s is None else float(wait_s)
        #: the interval every rank uses now
        self.agreed = self.interval
        #: called once when the agreement is given up (the ranks' steps then differ)
        self.on_fallback: list[Callable[[], None]] = []
        self.failed = False
        self._shared_heavy = -self.max_interval  # the last heavy step (step 0 is one)
        self._work: Any = None
        self._proposal = torch.zeros(1, dtype=torch.float64)
        self._join()
        timeout = datetime.timedelta(seconds=max(self.wait_s, 1.0))
        self._group: Any = dist.new_group(backend="gloo", timeout=timeout)

    def _join(self) -> None:
        """Meet the other ranks on the store; RuntimeError unless all came (module doc)."""
        if not all_ranks_came("agreed", self.JOIN_S):
            raise RuntimeError(f"not every rank created its agreed schedule (called watch()) "
                               f"within {self.JOIN_S:g} s")

    def capture(self, step: int) -> bool:
        """True when ``step`` is a heavy step on every rank; call once per step, in order."""
        if not self.failed and step % self.AGREE_EVERY == 0:
            self._agree()
        if self.failed:
            return super().capture(step)
        if self.agreed < 3 and step % self.PROBE_AFTER in self.PROBE_LIGHT:
            return False
        if step - self._shared_heavy >= self.agreed:
            self._shared_heavy = step
            return True
        return False

    def _agree(self) -> None:
        """Read the agreement started AGREE_EVERY steps ago; start the next one."""
        work, self._work = self._work, None
        try:
            if work is not None:
                work.wait(datetime.timedelta(seconds=self.wait_s))
                proposed = int(self._proposal.item())
                self.agreed = max(self.every, min(self.max_interval, proposed))
            # a new tensor: the one just read may still be referenced by its work
            self._proposal = torch.tensor([float(self.interval)], dtype=torch.float64)
            self._work = dist.all_reduce(
                self._proposal, op=dist.ReduceOp.MAX, group=self._group, async_op=True
            )
        except Exception as e:  # never into training: go on with this rank's own steps
            self._fall_back(f"{type(e).__name__}: {str(e)[:200]}")

    def _fall_back(self, why: str) -> None:
        self.failed = True
        self._work = None
        # the budget schedule counts its next heavy step from the last one
        self._next = self._last_heavy + self.interval
        self._once.warn(
            "agreed_schedule",
            "gradwatch: the ranks could not agree on heavy steps (" + why + "); each rank"
            " now picks its own, and gradient norms of sharded parameters are each"
            " rank's shard norms (norm_scope 'local')",
        )
        for callback in self.on_fallback:
            try:
                callback()
            except Exception as e:
                self._once.warn("agreed_fallback", f"gradwatch: {type(e).__name__}: {e}")

    def close(self) -> None:
        """Stop agreeing (a monitor's close): nothing is waited for."""
        self.failed = True
        self._work = None


_meetings: dict[str, int] = {}  # meetings of each kind in this process: the n-th of a
# rank pairs with the n-th of the others, each under its own store keys


def all_ranks_came(kind: str, join_s: float) -> bool:
    """Meet the other ranks of the default process group on its store: True when every
    rank came within ``join_s`` seconds (module doc). The store, not a collective: a
    rank that never comes costs the others this wait once, never a hang, and nothing
    pairs with the training's own collectives. Every rank gets the same answer."""
    _meetings[kind] = _meetings.get(kind, 0) + 1
    prefix = f"gradwatch/{kind}/{_meetings[kind]}/"
    store = dist.distributed_c10d._get_default_store()
    if store.add(prefix + "joined", 1) == dist.get_world_size():
        decision = store.compare_set(prefix + "decision", "", "go")
    else:
        # a timeout raises: then "no", unless another rank said "go" meanwhile
        with contextlib.suppress(Exception):
            store.wait([prefix + "decision"], datetime.timedelta(seconds=join_s))
        decision = store.compare_set(prefix + "decision", "", "no")
    return bool(decision == b"go")
