"""History from the rollups kept at ingest (store/rollups.py) on a real database: the
answer equals the reference downsampling of the stored rows, whatever the batches."""

from __future__ import annotations

import json
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gradwatch.server.downsample import minmax
from gradwatch.server.schema import parse_message
from gradwatch.server.settings import Settings
from gradwatch.server.store import open_store
from gradwatch.server.store.rollups import LEVELS, aggregate, merge_buckets, sqlite_key


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


def test_history_of_a_run_older_than_the_rollups_is_read_from_its_rows(gradwatch_db):
    """A database written before rollups existed: its runs have none, and must not be
    answered from the (empty) rollups."""
    steps = list(range(0, 200_000, 7))
    values = [float((s * 7919) % 1000) for s in steps]
    values[20_000] = 5000.0  # one spike
    store = open_store(Settings(db=gradwatch_db))
    try:
        _store_run(store, "old", steps, values, [5000])
        want = minmax(steps, values, 200)
        fast = store.steps("old", fields=["loss"], max_points=200)["fields"]["loss"]
        assert (fast["step"], fast["value"]) == (list(want[0]), list(want[1]))
        assert steps[20_000] in fast["step"]
        # As if it were written by the previous version: no rollups, and a database
        # that has kept them only since after the run started.
        _execute(
            gradwatch_db,
            [
                "DELETE FROM rollups",
                "UPDATE meta SET value = '9e18' WHERE key = 'rollups_from'",
            ],
        )
    finally:
        store.close()
    reopened = open_store(Settings(db=gradwatch_db))
    try:
        slow = reopened.steps("old", fields=["loss"], max_points=200)["fields"]["loss"]
        assert slow == fast
    finally:
        reopened.close()


def test_history_reads_the_rollups_not_the_rows(gradwatch_db):
    """Guards the fast path: a 2e4-step answer comes from the rollup rows (here made
    to disagree with the step rows on purpose), not from scanning the steps."""
    steps = list(range(20_000))
    store = open_store(Settings(db=gradwatch_db))
    try:
        _store_run(store, "fast", steps, [1.0] * len(steps), [5000])
        _execute(gradwatch_db, ["UPDATE rollups SET max_v = 42.0"])
        loss = store.steps("fast", fields=["loss"], max_points=100)["fields"]["loss"]
    finally:
        store.close()
    assert 42.0 in loss["value"]


def test_rollup_rows_keep_the_earliest_step_of_equal_extremes():
    rows = aggregate([(1, 5, 2.0), (1, 3, 2.0), (1, 4, "NaN"), (1, 6, "NaN")], sqlite_key)
    finest = [r for r in rows if r[1] == LEVELS[0]]
    assert finest == [(1, LEVELS[0], 0, 3, 2.0, 4, "NaN", 4)]
    assert [r[1] for r in rows] == list(LEVELS)


def _execute(db: str, statements: list[str]) -> None:
    if db.startswith("postgresql"):
        import psycopg

        with psycopg.connect(db, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)
        return
    import sqlite3

    conn = sqlite3.connect(db)
    try:
        for statement in statements:
            conn.execute(statement)
        conn.commit()
    finally:
        conn.close()


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


def test_rollup_buckets_merge_ties_to_the_earliest_step():
    rows = [(0, 3, 1.0, 5, 9.0), (1, 70, 1.0, 66, 9.0), (2, 130, 0.5, 140, 9.0)]
    assert merge_buckets(rows, 1, sqlite_key) == {0: (3, 1.0, 5, 9.0), 1: (130, 0.5, 140, 9.0)}
    with_text = [(0, 3, 1.0, 5, "NaN"), (1, 70, 1.0, 66, "NaN")]
    assert merge_buckets(with_text, 1, sqlite_key) == {0: (3, 1.0, 5, "NaN")}
