"""The hand-over to the background thread: at once when it is idle, bounded when busy."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from gradwatch.protocol import read_spool
from gradwatch.protocol.sink import SpoolSink
from gradwatch.trainer_hooks.pipeline import (
    BACKLOG_WAKE,
    BUDGET_WINDOW,
    MAX_GAP_S,
    MIN_GAP_S,
    QUIET_GAP_S,
    Item,
    Pipeline,
)
from gradwatch.trainer_hooks.quantities.base import Quantity
from gradwatch.trainer_hooks.transfer import pack


class CountingSpool(SpoolSink):
    """A real spool that also counts batches and signals the first one."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, {"type": "hello", "run_id": "r", "rank": 0})
        self.batches: list[int] = []
        self.first = threading.Event()

    def send(self, records: list[dict[str, Any]]) -> None:
        super().send(records)
        self.batches.append(len(records))
        self.first.set()


def wait_idle(pipeline: Pipeline, timeout: float = 10.0) -> None:
    done = threading.Event()
    # poll on the thread's own flag, bounded: it turns True once min_gap has passed
    for _ in range(int(timeout / 0.01)):
        if pipeline._idle:
            return
        done.wait(0.01)
    raise AssertionError("the pipeline thread never went idle")


def test_an_idle_thread_takes_a_step_record_at_once_not_at_its_next_poll(tmp_path: Path) -> None:
    sink = CountingSpool(tmp_path / "idle.jsonl")
    # a 60 s poll: without the idle wake the record would wait that long
    pipeline = Pipeline(sink, quantities=[], flush_interval=60.0, min_gap=0.01)
    try:
        wait_idle(pipeline)
        pipeline.put(Item({"kind": "step", "step": 0}))
        assert sink.first.wait(10.0), "an idle thread was not woken by put()"
    finally:
        assert pipeline.close(timeout=30)
    records = [r for m in read_spool(tmp_path / "idle.jsonl") if m["type"] == "batch"
               for r in m["records"]]
    assert [r["step"] for r in records] == [0]


def test_a_burst_of_steps_wakes_the_thread_once_per_gap_not_per_step(tmp_path: Path) -> None:
    sink = CountingSpool(tmp_path / "burst.jsonl")
    pipeline = Pipeline(sink, quantities=[], flush_interval=60.0, min_gap=0.01)
    try:
        wait_idle(pipeline)
        # from its next wake on, the thread is not wakeable by steps for 30 s
        pipeline.min_gap = 30.0
        for i in range(300):
            pipeline.put(Item({"kind": "step", "step": i}))
        assert pipeline.flush(timeout=30)
    finally:
        assert pipeline.close(timeout=30)
    # the first put wakes the idle thread (one batch); the other 299 wake nobody and
    # wait for the flush (a wake per step would have sent up to 300 batches)
    assert sum(sink.batches) == 300
    assert len(sink.batches) <= 2, sink.batches


def test_step_records_carry_the_background_threads_cpu_in_their_overhead(tmp_path: Path) -> None:
    sink = CountingSpool(tmp_path / "cpu.jsonl")
    pipeline = Pipeline(sink, quantities=[])
    try:
        for i in range(5):
            # a step of one microsecond: any CPU this thread spends on it shows
            pipeline.put(Item({"kind": "step", "step": i, "duration_s": 1e-6, "overhead": 0.0}))
        assert pipeline.flush(timeout=30)
    finally:
        assert pipeline.close(timeout=30)
    records = [r for m in read_spool(tmp_path / "cpu.jsonl") if m["type"] == "batch"
               for r in m["records"]]
    assert [r["step"] for r in records] == list(range(5))
    assert all(r["overhead"] > 0 for r in records), [r["overhead"] for r in records]
    assert pipeline.cpu_per_record(heavy=False) > 0
    assert pipeline.cpu_per_record(heavy=True) == 0  # no heavy record came


class BusySpool(CountingSpool):
    """A real spool whose send also burns CPU (as a slow encoder on a busy box would),
    taken as watched live (the pace a live viewer gets)."""

    viewed = True

    def send(self, records: list[dict[str, Any]]) -> None:
        started = time.thread_time()
        while time.thread_time() - started < 0.004:
            pass
        super().send(records)


def test_the_gap_between_wakes_grows_with_the_cpu_a_wake_takes(tmp_path: Path) -> None:
    sink = BusySpool(tmp_path / "busy.jsonl")
    pipeline = Pipeline(sink, quantities=[], min_gap=0.001)
    try:
        assert pipeline.gap() == 0.001  # nothing measured yet: the floor
        for i in range(5):
            pipeline.put(Item({"kind": "step", "step": i, "duration_s": 0.01}))
            assert pipeline.flush(timeout=30)  # one wake (and one 4 ms send) each
        # 4 ms of CPU a wake: BUSY_RATIO times that is far above the floor, and the
        # live latency bound caps it
        assert pipeline.gap() == MAX_GAP_S
        pipeline.min_gap = 0.2  # a floor above the cap wins
        assert pipeline.gap() == 0.2
    finally:
        assert pipeline.close(timeout=30)
    assert sum(sink.batches) == 5


class Viewed(CountingSpool):
    """A real spool whose ``viewed`` the test sets, as a server's acks would."""

    def __init__(self, path: Path, viewed: bool) -> None:
        super().__init__(path)
        self.viewed = viewed


def test_nobody_watching_stretches_the_gap_and_a_viewer_brings_it_back(tmp_path: Path) -> None:
    sink = Viewed(tmp_path / "viewed.jsonl", viewed=False)
    pipeline = Pipeline(sink, quantities=[])
    try:
        assert pipeline.gap() == QUIET_GAP_S
        sink.viewed = True
        assert pipeline.gap() == MIN_GAP_S
        pipeline.quiet_gap = 2.0
        sink.viewed = False
        assert pipeline.gap() == 2.0
        del sink.viewed  # the class's own: a spool file nobody can watch live
        assert pipeline.gap() == 2.0
    finally:
        assert pipeline.close(timeout=30)


class ListSink:
    """The smallest sink (the Sink protocol alone): says nothing of viewers."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def send(self, records: list[dict[str, Any]]) -> None:
        self.records.extend(records)

    def close(self, timeout: float | None = None) -> None:
        pass


def test_a_sink_that_does_not_say_is_taken_as_watched() -> None:
    sink = ListSink()
    pipeline = Pipeline(sink, quantities=[])
    try:
        assert pipeline.gap() == MIN_GAP_S
        pipeline.put(Item({"kind": "step", "step": 0}))
        assert pipeline.flush(timeout=30)
    finally:
        assert pipeline.close(timeout=30)
    assert [r["step"] for r in sink.records] == [0]


def test_a_backlog_wakes_the_thread_however_long_the_gap(tmp_path: Path) -> None:
    sink = Viewed(tmp_path / "backlog.jsonl", viewed=False)
    pipeline = Pipeline(sink, quantities=[], flush_interval=600.0)
    try:
        pipeline.quiet_gap = 600.0  # from its next wake on, no step wakes it for 10 min
        pipeline.put(Item({"kind": "step", "step": 0}), urgent=True)
        assert sink.first.wait(30)
        sink.first.clear()
        for i in range(1, BACKLOG_WAKE + 1):
            pipeline.put(Item({"kind": "step", "step": i}))
        # the BACKLOG_WAKE-th queued item woke it: no flush, no close
        assert sink.first.wait(30), "a full backlog did not wake the thread"
    finally:
        assert pipeline.close(timeout=30)
    records = [r for m in read_spool(tmp_path / "backlog.jsonl") if m["type"] == "batch"
               for r in m["records"]]
    assert [r["step"] for r in records] == list(range(BACKLOG_WAKE + 1))


def test_what_records_are_charged_for_the_wakes_is_what_the_wakes_cost(tmp_path: Path) -> None:
    # Wakes of 1 record and of 120 in turns (a flush after the first step of a block,
    # then after the block), each send burning 4 ms: a mean per wake would charge
    # every record of the large wakes for the small one's whole wake.
    sink = BusySpool(tmp_path / "charged.jsonl")
    pipeline = Pipeline(sink, quantities=[])
    thread = pipeline._thread
    clock = time.pthread_getcpuclockid(thread.ident)  # type: ignore[arg-type]
    step, spent = 0, 0.0
    try:
        for cycle in range(6):
            if cycle == 3:  # the first cycles set the running means
                spent = -time.clock_gettime(clock)
                first_measured = step
            for size in (1, 120):
                for _ in range(size):
                    pipeline.put(Item({"kind": "step", "step": step, "duration_s": 1.0,
                                       "overhead": 0.0}))
                    step += 1
                assert pipeline.flush(timeout=30)
        spent += time.clock_gettime(clock)
    finally:
        assert pipeline.close(timeout=30)
    records = [r for m in read_spool(tmp_path / "charged.jsonl") if m["type"] == "batch"
               for r in m["records"]]
    assert [r["step"] for r in records] == list(range(step))
    # a 1 s step: its overhead is the seconds of this thread's CPU it was charged
    charged = sum(r["overhead"] for r in records if r["step"] >= first_measured)
    assert 0.5 * spent < charged < 2.0 * spent, (charged, spent)


class Encoding(Quantity):
    """A heavy quantity whose encoding takes the CPU seconds its payload names: what a
    slow encode (a garbage collection, a cold cache) costs this thread."""

    name = "encoding"

    def encode(self, payload: dict[str, Any]) -> dict[str, Any]:
        started = time.thread_time()
        while time.thread_time() - started < payload["burn_s"]:
            pass
        return {}


def test_the_budgets_background_figure_is_a_median_one_slow_record_does_not_move(
    tmp_path: Path,
) -> None:
    # Heavy records costing 2 ms each, one at a time (a flush after each), with a
    # 60 ms one among them: the schedule's figure stays near 2 ms (a running mean
    # with weight 0.2 read 13 ms). Then every record costs 8 ms: the figure follows
    # within BUDGET_WINDOW // 2 + 1 records.
    sink = CountingSpool(tmp_path / "median.jsonl")
    pipeline = Pipeline(sink, quantities=[Encoding()])
    costs = [0.002] * 10 + [0.06] + [0.002] * 2 + [0.008] * (BUDGET_WINDOW // 2 + 1)
    read: list[float] = []
    try:
        for step, burn in enumerate(costs):
            record = {"kind": "step", "step": step, "duration_s": 1.0, "overhead": 0.0}
            assert pipeline.put(Item(record, pack({"encoding": {"burn_s": burn}}), heavy=True))
            assert pipeline.flush(timeout=30)
            read.append(pipeline.cpu_per_record(heavy=True))
    finally:
        assert pipeline.close(timeout=30)
    assert pipeline.cpu_per_record(heavy=False) == 0  # no light record came
    slow = costs.index(0.06)
    for figure in read[slow : slow + 3]:
        assert 0.002 <= figure < 0.004, read
    assert 0.008 <= read[-1] < 0.010, read
    records = [r for m in read_spool(tmp_path / "median.jsonl") if m["type"] == "batch"
               for r in m["records"]]
    # each record's own overhead still carries what it cost, the slow one included
    assert [r["step"] for r in records] == list(range(len(costs)))
    assert records[slow]["overhead"] >= 0.06
