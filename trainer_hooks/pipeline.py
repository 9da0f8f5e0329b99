"""The background thread: host copies, encoding, diagnoses, batching, the sink.

The training thread only ever calls :meth:`Pipeline.put`, which never blocks: when
the bounded queue is full (the thread cannot keep up) the item is dropped and that
is warned about once. Everything else happens here, off the training thread: wait
for a step's host copy, let each quantity encode its part, merge the parts into one
step record, run the diagnoses, and hand batches to the sink.

Batching: the training thread appends items to a deque (atomic, no lock). Waking a
thread on every step cost tens of microseconds and, worse, made the training thread
wait for a lock and the GIL inside ``step()`` (2-4 ms on a busy box). So a step wakes
the thread only when it is *idle*: it had nothing to do, and it last woke at least
``min_gap`` seconds ago (epoch, flush and close wake it at once). A slow step rate
(the thread idle between steps) then hands each record over at once; a fast one
costs at most one wake per ``min_gap``, and the records that came meanwhile go
together in the next batch. An idle thread sleeps until a put() wakes it
(``flush_interval`` is only a safety net): polling an empty queue cost the training
thread too. The thread sends what it found (at most ``max_batch`` records, about
``max_bytes`` of JSON per batch).

A wake costs more than the records' own work, and more on a loaded box: on this
repository's 2-core VM, while a cell loop trains, a wake with nothing to do took
~220 µs of this thread's CPU and a 2 µs read of ``/proc/self/statm`` ~90 µs
(BENCHMARKS.md, "The background thread's wakes"), and each wake makes the training
thread wait for the GIL. So while someone watches the run live the gap between wakes
is ``MIN_GAP_S`` = 50 ms, the most a live viewer may wait for it: with 5-25 ms gaps
the wakes alone cost a light cell-loop step 3-6 % of CPU on the 2-core box, with 50
ms about 1 %. While nobody does (the sink's ``viewed`` is False: the server's acks
say the run has no live viewer, or a spool file that no one can watch), the gap is
``QUIET_GAP_S`` = 0.5 s: a light ``long_lstm`` step then costs 1.4-2.2 points less
(BENCHMARKS.md, "Watched or not"), and a viewer who opens the run waits at most one
quiet gap, plus an ack, for the 50 ms pace. A sink that does not say is taken as
viewed. However long the gap, ``BACKLOG_WAKE`` queued items wake the thread, so the
queue never fills for want of a wake. A smaller ``min_gap`` (tests) adapts: at least
``BUSY_RATIO`` times the CPU the recent wakes took, at most ``MAX_GAP_S``. Records
carry this thread's CPU for them in their ``overhead`` (their own work plus their
share of the wake and the send). Memory is read once per wake (the records of one
wake are milliseconds apart).

Light step records in a row (no heavy capture, nothing to copy from the device) go
as one run of up to ``LIGHT_RUN`` (``records.finish_light``): two clock reads for the
run, its CPU shared evenly among its records' ``overhead``, the diagnoses record by
record as before (the same alerts, in the same place). A run yields the GIL every
``LIGHT_YIELD_AFTER_S``: in a training loop every wake meets cold caches (the idle
vCPU's caches go to other work), so a light record costs 30-60 µs there against
5-10 µs warm, and a yield ~30 µs; yielding between every two records cost as much as
the records (BENCHMARKS.md, "What a light step costs").

Example:
    >>> from gradwatch.protocol.sink import SpoolSink
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "run.jsonl")
    >>> sink = SpoolSink(path, {"type": "hello", "run_id": "r", "rank": 0})
    >>> p = Pipeline(sink, quantities=[])
    >>> p.put(Item({"kind": "epoch", "epoch": 0}), urgent=True)
    True
    >>> p.close(timeout=5)
    True
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from gradwatch.protocol.messages import MAX_MESSAGE_BYTES, MAX_RECORDS_PER_BATCH
from gradwatch.protocol.sink import Sink

from .quantities.base import Quantity
from .quantities.memory import memory_fields
from .quantities.params import SCALER_SKIPPED
from .records import expected_nonfinite, finish_light, loss_value, merge_fields
from .transfer import Packed
from .warn import WarnOnce


@dataclass
class Item:
    """One record to finish on the background thread.

    ``record`` holds the fields known on the training thread; ``packed`` the step's
    payloads (``{quantity name: payload}``) on their way to the host.
    """

    record: dict[str, Any]
    packed: Packed | None = None
    #: captured the heavy quantities (the schedule's pick): its cost is kept apart
    heavy: bool = False


@dataclass
class _Flush:
    done: threading.Event = field(default_factory=threading.Event)


_STOP = object()
#: at most one wake per this many seconds while steps keep coming (see the docstring)
MIN_GAP_S = 0.05
#: the gap between wakes is at least this many times the CPU a wake takes...
BUSY_RATIO = 50
#: ...but never longer than this (seconds): what it may add to the live latency
MAX_GAP_S = 0.05
#: the gap while nobody watches the run live (the sink's ``viewed`` is False)
QUIET_GAP_S = 0.5
#: this many queued items wake the thread whatever the gap (the queue holds ``maxsize``)
BACKLOG_WAKE = 1024
#: this thread's CPU seconds of record work between two yields of the GIL
YIELD_AFTER_S = 50e-6
#: weight of the newest wake in the running means of a wake's CPU
_SMOOTHING = 0.2
#: the budget's figure for a heavy (or light) record is the median of this thread's
#: CPU for the last this-many of them (a run of light records counts once): one slow
#: wake (a garbage collection, a cold cache, a preempted encode) leaves it where it
#: was, and a lasting change moves it within 8 records
BUDGET_WINDOW = 15
#: at most this many light step records in one run, which yields the GIL after
#: LIGHT_YIELD_AFTER_S seconds (see the docstring)
LIGHT_RUN = 64
LIGHT_YIELD_AFTER_S = 200e-6


def _light(item: Any) -> bool:
    """A light step record with nothing to copy from the device: one of a run."""
    return (
        isinstance(item, Item)
        and not item.heavy
        and item.packed is None
        and isinstance(item.record, dict)
        and item.record.get("kind") == "step"
    )


class Pipeline:
    """A bounded deque and one daemon thread that turns items into sent batches."""

    def __init__(
        self,
        sink: Sink,
        quantities: Sequence[Quantity],
        diagnoser: Any = None,
        once: WarnOnce | None = None,
        maxsize: int = 4096,
        flush_interval: float = 1.0,
        min_gap: float = MIN_GAP_S,
        quiet_gap: float = QUIET_GAP_S,
        max_batch: int = 1000,
        max_bytes: int = MAX_MESSAGE_BYTES // 2,
    ) -> None:
        self.sink = sink
        self.quantities = list(quantities)
        self.diagnoser = diagnoser
        self.once = once or WarnOnce()
        self.maxsize = maxsize
        self.flush_interval = flush_interval
        self.min_gap = min_gap
        self.quiet_gap = quiet_gap
        self.max_batch = min(max_batch, MAX_RECORDS_PER_BATCH)
        self.max_bytes = max_bytes
        self.dropped = 0
        # This thread's CPU seconds per step record (medians of the recent ones, heavy
        # and light; each record's own work and its share of the wakes and the sends):
        # the schedule's budget counts them. Set once per wake, read per step.
        self._cpu = {True: 0.0, False: 0.0}
        self._recent: dict[bool, deque[float]] = {
            True: deque(maxlen=BUDGET_WINDOW), False: deque(maxlen=BUDGET_WINDOW)
        }
        self._shared_cpu = 0.0  # per record: the wake and the send, spread
        # the wakes' CPU beyond their records' own and the records they handled, both
        # decayed by _SMOOTHING a wake: their ratio is a mean per record, so a wake
        # for one record (a flush, the first step after a pause) weighs as one record
        self._shared_total = 0.0
        self._shared_records = 0.0
        self._wake_cpu = 0.0  # per wake that handled records
        # deque.append/popleft are atomic: the training thread takes no lock and wakes
        # nobody on an ordinary step.
        self._items: deque[Any] = deque()
        self._wake = threading.Event()
        # True while the thread waits with nothing queued and min_gap has passed since
        # it last woke: then (only) a put() wakes it. A plain bool: the GIL orders it.
        self._idle = False
        self._closed = False
        self._last: dict[str, Any] | None = None
        self._memory: dict[str, Any] | None = None
        self._thread = threading.Thread(target=self._run, name="gradwatch-pipeline", daemon=True)
        self._thread.start()

    def put(self, item: Item, urgent: bool = False) -> bool:
        """Queue one item; never blocks. False when dropped (queue full or closed).

        ``urgent`` wakes the thread now instead of at its next poll.
        """
        if self._closed:
            return False
        if len(self._items) >= self.maxsize:
            self.dropped += 1
            self.once.warn(
                "queue_full",
                "gradwatch: the record queue is full (the background thread cannot keep "
                "up); records are dropped until it catches up",
            )
            return False
        items = self._items
        items.append(item)
        if urgent or self._idle or len(items) == BACKLOG_WAKE:
            self._idle = False  # one wake per idle spell, however many steps come
            self._wake.set()
        return True

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything queued so far has been handed to the sink."""
        if self._closed or not self._thread.is_alive():
            return False
        marker = _Flush()
        self._items.append(marker)
        self._wake.set()
        return marker.done.wait(timeout)

    def close(self, timeout: float | None = None, last: dict[str, Any] | None = None) -> bool:
        """Finish queued items, run the diagnoses' last word, send ``last``, close the sink.

        True when every queued item was handled within ``timeout``.
        """
        if self._closed:
            return True
        self._closed = True
        self._last = last
        deadline = None if timeout is None else time.monotonic() + timeout
        self._items.append(_STOP)
        self._wake.set()
        self._thread.join(timeout)
        finished = not self._thread.is_alive()
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            self.sink.close(remaining)
        except Exception as e:
            self.once.warn("sink_close", f"gradwatch: closing the sink failed: {e}")
        return finished

    # -- background thread ------------------------------------------------------

    def gap(self) -> float:
        """Seconds from one wake to the next while steps keep coming (see above)."""
        gap = max(self.min_gap, min(BUSY_RATIO * self._wake_cpu, MAX_GAP_S))
        if getattr(self.sink, "viewed", True) is False:
            return max(gap, self.quiet_gap)
        return gap

    def _wait(self) -> None:
        """Sleep for the gap (only epoch, flush and close cut it short), then until a
        put() wakes the idle thread."""
        interval = max(self.flush_interval, 0.001)  # never a busy loop
        gap = min(max(self.gap(), 0.0), interval)
        if gap > 0 and self._wake.wait(gap):  # not wakeable by steps yet: rate bound
            self._wake.clear()
            return
        # Idle from here: the flag before the queue check, so a put() in between
        # either sees the flag (and wakes us) or its item is seen here.
        self._idle = True
        if not self._items:
            self._wake.wait(interval - gap)
        self._idle = False
        self._wake.clear()

    def _run(self) -> None:
        while True:
            cycle = time.thread_time()  # CPU only: the sleep itself is not counted
            self._wait()
            self._memory = None  # read again at most once per wake
            batch: list[dict[str, Any]] = []
            size = 0
            handled, own = 0, 0.0
            seen: set[bool] = set()  # the kinds of step record this wake charged
            unyielded = YIELD_AFTER_S  # the wake's first record yields first
            while self._items:
                item = self._items.popleft()
                if item is _STOP:
                    batch.extend(self._finish_diagnoses())
                    if self._last is not None:
                        batch.append(self._last)
                    self._send(batch)
                    return
                if isinstance(item, _Flush):
                    batch, size = self._send(batch), 0
                    item.done.set()
                    continue
                # Give the GIL back between records: a training thread that returns
                # from a GIL-free op (backward) waits for at most YIELD_AFTER_S of this
                # thread's work instead of a whole switch interval (5 ms). Light records
                # take ~10 µs each: yielding after every one cost more handoffs than work.
                if unyielded >= YIELD_AFTER_S:
                    time.sleep(0)
                    unyielded = 0.0
                run = [item] if _light(item) else None
                if run is not None:  # light records in a row: one run (see above)
                    while len(run) < LIGHT_RUN and self._items and _light(self._items[0]):
                        run.append(self._items.popleft())
                started = time.thread_time()
                try:
                    if run is None:
                        records = self._records(item)
                    else:
                        if self._memory is None:
                            self._memory = memory_fields()
                        records = finish_light(
                            [dict(i.record) for i in run], self._memory, self.diagnoser,
                            self._diagnosis_failed, LIGHT_YIELD_AFTER_S,
                        )
                except Exception as e:  # a bug here must not stop the thread
                    self.once.warn("pipeline", f"gradwatch: a record was lost: {e!r}")
                    continue
                spent = time.thread_time() - started
                unyielded += spent
                if run is not None:
                    # the run's CPU shared evenly: every record carries its part
                    each = spent / len(run)
                    steps = [r for r in records if r.get("kind") == "step"]
                    charged = None
                    for record in steps:
                        charged = self._charge(record, each)
                    if charged is not None:  # once per run: its records cost alike
                        self._recent[False].append(charged)
                        seen.add(False)
                    handled += len(steps)
                    own += spent
                else:
                    charged = self._charge(records[0], spent)
                    if charged is not None:
                        self._recent[item.heavy].append(charged)
                        seen.add(item.heavy)
                        handled += 1
                        own += spent
                for record in records:
                    if run is not None:
                        n = 200 if record.get("kind") == "step" else self._size(record)
                    else:
                        n = self._size(record) if item.heavy or record is not records[0] else 200
                    if batch and (len(batch) >= self.max_batch or size + n > self.max_bytes):
                        batch, size = self._send(batch), 0
                    batch.append(record)
                    size += n
            self._send(batch)
            if handled:
                whole = time.thread_time() - cycle
                self._wake_cpu += _SMOOTHING * (whole - self._wake_cpu)
                keep = 1.0 - _SMOOTHING
                self._shared_total = keep * self._shared_total + max(whole - own, 0.0)
                self._shared_records = keep * self._shared_records + handled
                self._shared_cpu = self._shared_total / self._shared_records
            for heavy in seen:
                self._cpu[heavy] = statistics.median(self._recent[heavy])

    @staticmethod
    def _size(record: dict[str, Any]) -> int:
        """A cheap upper estimate of the record's JSON size (no encoding)."""
        n = 200
        for key in ("param_norms", "gate_norms", "profile"):
            n += 120 * len(record.get(key) or ())
        for series in (record.get("timesteps") or {}).values():
            n += 100 + sum(28 * len(values) for values in series.values())
        return n

    def cpu_per_record(self, heavy: bool) -> float:
        """This thread's CPU seconds per heavy (or light) step record, its share of
        the sink's encoding and writing included: the median of the last
        ``BUDGET_WINDOW`` (0 before the first)."""
        return self._cpu[heavy]

    def _charge(self, record: dict[str, Any], cpu_s: float) -> float | None:
        """Add this thread's time for a step record to its ``overhead``: its own work,
        and its share of a wake and a send from the recent wakes. Returns the seconds
        charged (None for a record that is not a step's)."""
        if record.get("kind") != "step":
            return None
        cpu_s += self._shared_cpu
        duration = record.get("duration_s")
        if isinstance(duration, float) and duration > 0:
            record["overhead"] = record.get("overhead", 0.0) + cpu_s / duration
        return cpu_s

    def _send(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if batch:
            time.sleep(0)  # as above: let a waiting training thread run first
            try:
                self.sink.send(batch)
            except Exception as e:
                self.once.warn("sink_send", f"gradwatch: the sink failed; records lost: {e}")
        return []

    def _records(self, item: Item) -> list[dict[str, Any]]:
        record = dict(item.record)
        alerts: list[dict[str, Any]] = []
        if item.packed is not None:
            try:
                payloads = item.packed.unpack()
            except Exception as e:
                self.once.warn("host_copy", f"gradwatch: copying a step to the host failed: {e}")
                payloads = {}
            monitor = payloads.pop("_monitor", {})
            if "loss" in monitor:
                record["loss"] = loss_value(monitor["loss"])
            for q in self.quantities:
                payload = payloads.get(q.name)
                if not payload:
                    continue
                try:
                    # encode returns plain values (base.py): no walk over long series here
                    merge_fields(record, q.encode(payload), alerts)
                except Exception as e:
                    self.once.warn(
                        f"encode:{q.name}",
                        f"gradwatch: encoding {q.name} failed and is left out: "
                        f"{type(e).__name__}: {e}",
                    )
        if record.get("kind") == "step":
            expected_nonfinite(record, SCALER_SKIPPED)
            if self._memory is None:
                self._memory = memory_fields()
            record.update(self._memory)
            if isinstance(record.get("loss"), torch.Tensor):
                record["loss"] = loss_value(record["loss"])
        out = [record, *alerts]
        if self.diagnoser is not None:
            for r in list(out):
                try:
                    out.extend(self.diagnoser.observe(r))
                except Exception as e:
                    self._diagnosis_failed(e)
        return out

    def _diagnosis_failed(self, e: Exception) -> None:
        self.once.warn("diagnoses", f"gradwatch: a diagnosis failed: {e}")

    def _finish_diagnoses(self) -> list[dict[str, Any]]:
        if self.diagnoser is None:
            return []
        try:
            return list(self.diagnoser.finish())
        except Exception as e:
            self.once.warn("diagnoses", f"gradwatch: a diagnosis failed: {e}")
            return []
