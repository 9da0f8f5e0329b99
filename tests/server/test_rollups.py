"""History from the rollups kept at ingest (store/rollups.py) on a real database:
the answer equals the reference downsampling of the values sent, whatever the batches."""

from __future__ import annotations

import json
import random

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gradwatch.server.downsample import minmax
from gradwatch.server.schema import parse_message
from gradwatch.server.settings import Settings
from gradwatch.server.store import open_store
from gradwatch.server.store.rollups import LEVELS, ROW_DTYPES, array_blocks


def _store_run(store, run: str, steps: list[int], values: list, batch_sizes: list[int]) -> None:
    """Send ``steps`` in batches of the given sizes (repeated), in shuffled order."""
    store.submit_hello(
        parse_message(json.dumps({"type": "hello", "protocol": 1, "run_id": run}))
    ).result()
    records = [
        {"kind": "step", "step": s, "loss": v, "graph_nodes": s % 97, "param_norms": {"w": v}}
        for s, v in zip(steps, values, strict=True)
    ]
    batches, at = [], 0
    while at < len(records):
        size = batch_sizes[len(batches) % len(batch_sizes)]
        batches.append(records[at : at + size])
        at += size
    order = list(range(len(batches)))
    random.Random(len(steps)).shuffle(order)  # a later block may arrive first
    for seq in order:
        batch = {"type": "batch", "run_id": run, "rank": 0, "seq": seq, "records": batches[seq]}
        assert store.submit_batch(parse_message(json.dumps(batch))).result()


def test_history_from_rollups_equals_the_reference_across_batches_and_ranges(gradwatch_db):
    store = open_store(Settings(db=gradwatch_db))
    runs = iter(range(10**6))

    @settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        steps=st.lists(st.integers(0, 40_000), min_size=1, max_size=600, unique=True),
        batch_sizes=st.lists(st.integers(1, 200), min_size=1, max_size=8),
        nan_at=st.integers(0, 800),
        bounds=st.tuples(st.integers(0, 40_000), st.integers(0, 40_000)),
        ranged=st.booleans(),
        max_points=st.integers(2, 30),
        data=st.data(),
    )
    def check(steps, batch_sizes, nan_at, bounds, ranged, max_points, data):
        steps = sorted(steps)
        values = data.draw(
            st.lists(st.floats(-1e9, 1e9), min_size=len(steps), max_size=len(steps), unique=True)
        )
        if nan_at < len(values):
            values[nan_at] = "NaN"
        run = f"r-{next(runs)}"
        _store_run(store, run, steps, values, batch_sizes)
        lo, hi = sorted(bounds) if ranged else (None, None)
        inside = [i for i, s in enumerate(steps) if lo is None or lo <= s <= hi]
        got = store.steps(
            run,
            start=lo,
            stop=hi,
            fields=["loss", "param_norms/w", "graph_nodes"],
            max_points=max_points,
        )
        assert got["total"] == len(inside)
        kept = [steps[i] for i in inside]
        for name, series in (
            ("loss", [values[i] for i in inside]),
            ("param_norms/w", [values[i] for i in inside]),
            ("graph_nodes", [steps[i] % 97 for i in inside]),
        ):
            want_steps, want_values = minmax(kept, series, max_points)
            assert got["fields"][name]["step"] == want_steps, name
            assert got["fields"][name]["value"] == want_values, name
            # Integers stay integers (PostgreSQL keeps rollups in float8).
            if name == "graph_nodes":
                assert all(type(v) is int for v in got["fields"][name]["value"])

    try:
        check()
    finally:
        store.close()


def test_history_reads_the_rollups_not_the_chunks(gradwatch_db, store_sql):
    """Guards the fast path: a 2e4-step answer comes from the set rollup rows (here made
    to disagree with the chunks on purpose), not from scanning the chunks."""
    steps = list(range(20_000))
    store = open_store(Settings(db=gradwatch_db))
    try:
        _store_run(store, "fast", steps, [1.0] * len(steps), [5000])
        found = store_sql.execute(
            gradwatch_db,
            [
                (
                    "SELECT r.set_id, r.level, r.block, r.data, m.kind FROM set_rollups r"
                    " JOIN rollup_members m ON m.set_id = r.set_id AND m.position = 0",
                    (),
                )
            ],
        )
        found = [row[:4] for row in found if row[4] == "f"]  # the sets of floats
        assert found
        changed = []
        for set_id, level, block, data in found:
            row = np.frombuffer(bytes(data), ROW_DTYPES["f"]).copy()
            row["hv"] = 42.0
            changed.append(
                (
                    "UPDATE set_rollups SET data = ? WHERE set_id = ? AND level = ? AND block = ?",
                    (row.tobytes(), set_id, level, block),
                )
            )
        store_sql.execute(gradwatch_db, changed)
        loss = store.steps("fast", fields=["loss"], max_points=100)["fields"]["loss"]
    finally:
        store.close()
    assert 42.0 in loss["value"]


def test_rollup_rows_keep_the_earliest_step_of_equal_extremes():
    for order in ("sqlite", "postgresql"):
        matrix = np.array([[2.0], [2.0], [np.nan], [np.nan]])
        found, rows = array_blocks(np.array([5, 3, 4, 6]), matrix, order)
        assert found[0] == (LEVELS[0], 0, 4, 3, 6)
        ((lo_step, lo, hi_step, hi),) = rows[0].tolist()
        assert (lo_step, lo, hi_step) == (3, 2.0, 4) and hi != hi
        assert [f[0] for f in found] == list(LEVELS)


def test_history_of_repeating_values_keeps_the_earliest_step_of_each_extreme(gradwatch_db):
    """Every rollup block holds the same min and max (a sawtooth), so each bucket's
    extremes tie across its blocks: the answer keeps the earliest step of each, as the
    reference does, with plain numbers and with a non-finite value in the series."""
    steps = list(range(20_000))
    for nonfinite in (False, True):
        values: list = [float(s % 16) for s in steps]
        if nonfinite:
            values[5_000] = "Infinity"
        run = f"saw-{nonfinite}"
        store = open_store(Settings(db=gradwatch_db))
        try:
            _store_run(store, run, steps, values, [5000])
            for max_points in (40, 300):
                got = store.steps(run, fields=["loss", "param_norms/w"], max_points=max_points)
                want_steps, want_values = minmax(steps, values, max_points)
                for name in ("loss", "param_norms/w"):
                    assert got["fields"][name]["step"] == want_steps, (name, max_points)
                    assert got["fields"][name]["value"] == want_values, (name, max_points)
        finally:
            store.close()
