"""Rollups per set of series (store/rollups.py): records that came as columns,
mixed with records sent one by one (turned into columns at ingest), in any order and
grouping of transactions, with ties and non-finite values, read back exactly as the
same records sent one by one, and as the reference downsampling. (That history reads
the set rows, not the chunks: tests/server/test_rollups.py.)"""

from __future__ import annotations

import json
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gradwatch.protocol.columns import to_columns
from gradwatch.server.downsample import minmax
from gradwatch.server.schema import parse_message
from gradwatch.server.settings import Settings
from gradwatch.server.store import open_store

# Mostly finite (a chunk with a non-finite value rolls up in Python, the others in
# numpy), with repeats for ties.
VALUES = st.one_of(st.floats(-1e9, 1e9), st.sampled_from([0.5, 2.0]))
TIES = st.sampled_from([0.5, 2.0, -1.0])
NONFINITE = st.sampled_from(["NaN", "Infinity", "-Infinity"])


def _record(step: int, value: object) -> dict[str, object]:
    return {
        "kind": "step",
        "step": step,
        "loss": value,
        "graph_nodes": step % 97,
        "param_norms": {"w": value, "v": 1.0},
    }


def _send_all(
    store, run: str, batches: list[list[dict]], as_columns: list[bool], waits: list[bool]
) -> None:
    """Batches submitted before the earlier ones are waited for, except where
    ``waits`` says: the writer commits whatever waits together, so a run's batches
    share transactions in varying groups, and blocks of a set are written again by
    later transactions."""
    store.submit_hello(
        parse_message(json.dumps({"type": "hello", "protocol": 1, "run_id": run}))
    ).result()
    futures = []
    for seq, (records, columns) in enumerate(zip(batches, as_columns, strict=True)):
        message = {"type": "batch", "run_id": run, "rank": 0, "seq": seq, "records": records}
        if columns:
            message["records"], message["columns"] = to_columns(records)
            assert message["columns"] and not message["records"]
        futures.append(store.submit_batch(parse_message(json.dumps(message))))
        if waits[seq % len(waits)]:
            assert all(f.result(timeout=60) for f in futures)
    assert all(f.result(timeout=60) for f in futures)


def test_history_from_set_rollups_equals_the_reference(gradwatch_db):
    store = open_store(Settings(db=gradwatch_db))
    runs = iter(range(10**6))

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        spread=st.sampled_from([1_000, 8_000, 40_000]),
        count=st.integers(1, 700),
        sizes=st.lists(st.integers(1, 250), min_size=1, max_size=6),
        columns=st.lists(st.booleans(), min_size=1, max_size=6),
        waits=st.lists(st.booleans(), min_size=1, max_size=6),
        nonfinite=st.lists(st.tuples(st.integers(0, 699), NONFINITE), max_size=40),
        ties=st.booleans(),
        bounds=st.tuples(st.integers(0, 40_000), st.integers(0, 40_000)),
        ranged=st.booleans(),
        max_points=st.integers(2, 30),
        data=st.data(),
    )
    def check(
        spread, count, sizes, columns, waits, nonfinite, ties, bounds, ranged, max_points, data
    ):
        steps = sorted(random.Random(count).sample(range(spread), min(count, spread)))
        drawn = TIES if ties else VALUES
        values = data.draw(st.lists(drawn, min_size=len(steps), max_size=len(steps)))
        for at, value in nonfinite:
            if at < len(values):
                values[at] = value
        records = [_record(s, v) for s, v in zip(steps, values, strict=True)]
        batches, at = [], 0
        while at < len(records):
            size = sizes[len(batches) % len(sizes)]
            batches.append(records[at : at + size])
            at += size
        order = list(range(len(batches)))
        random.Random(len(steps)).shuffle(order)  # a later block may arrive first
        mixed, reference = f"s-{next(runs)}", f"r-{next(runs)}"
        shuffled = [batches[i] for i in order]
        _send_all(store, mixed, shuffled, [columns[i % len(columns)] for i in order], waits)
        _send_all(store, reference, shuffled, [False] * len(batches), [True])
        lo, hi = sorted(bounds) if ranged else (None, None)
        fields = ["loss", "param_norms/w", "graph_nodes"]
        got = store.steps(mixed, start=lo, stop=hi, fields=fields, max_points=max_points)
        assert got == store.steps(
            reference, start=lo, stop=hi, fields=fields, max_points=max_points
        )
        inside = [i for i, s in enumerate(steps) if lo is None or lo <= s <= hi]
        assert got["total"] == len(inside)
        # The reference downsampling orders all non-finite strings alike, above every
        # number; SQLite orders them by their text, PostgreSQL puts -inf below every
        # number (store/rollups.py): compare where that is the same.
        found = {v for v in values if isinstance(v, str)}
        postgres = gradwatch_db.startswith("postgresql")
        if len(found) <= 1 and not (postgres and "-Infinity" in found):
            kept = [steps[i] for i in inside]
            for name, series in (
                ("loss", [values[i] for i in inside]),
                ("graph_nodes", [steps[i] % 97 for i in inside]),
            ):
                assert (got["fields"][name]["step"], got["fields"][name]["value"]) == minmax(
                    kept, series, max_points
                ), name
        assert all(type(v) is int for v in got["fields"]["graph_nodes"]["value"])

    try:
        check()
    finally:
        store.close()
