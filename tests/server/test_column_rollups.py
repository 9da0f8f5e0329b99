"""Rollups and buckets computed in Python for the packed named scalars: the column-wise
rollups of a batch equal rollups.aggregate (the previous writer's), and the min/max
of edge and fine buckets read from packed rows equal what SQL answers over rows
holding the same values."""

from __future__ import annotations

import itertools
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gradwatch.protocol.messages import NONFINITE_STRINGS
from gradwatch.server.schema import parse_message
from gradwatch.server.store.columns import aggregate_columns
from gradwatch.server.store.rollups import STEP_SERIES, aggregate, postgres_key, sqlite_key
from gradwatch.server.store.rows import INTEGER_FIELDS, SCALAR_FIELDS, split_batch
from gradwatch.server.store.scalar_writes import rollup_groups

# A few values that tie, signed zeros, huge ones, the non-finite strings, an integer.
VALUES = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, 2.0, -1.0, 1e300, -1e300, 3, "NaN", "Infinity", "-Infinity"]),
    st.floats(allow_nan=False, allow_infinity=False),
)


def _norm(value: Any) -> tuple[str, str]:
    """Compares NaN with NaN and tells -0.0 from 0.0 (and 3 from 3.0)."""
    return type(value).__name__, repr(value)


def _as_dict(rows: list[tuple[Any, ...]]) -> dict[tuple[int, int, int], tuple[Any, ...]]:
    out = {}
    for series, level, block, lo_step, lo, hi_step, hi, n in rows:
        assert (series, level, block) not in out, "one row per block"
        out[series, level, block] = (lo_step, _norm(lo), hi_step, _norm(hi), n)
    return out


@st.composite
def _records(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Step records with several name sets, shuffled steps, gaps and repeats."""
    records = []
    for _ in range(draw(st.integers(1, 40))):
        record: dict[str, Any] = {
            "kind": "step",
            # Small steps tie and repeat; large ones cross the coarse levels' blocks.
            "step": draw(st.one_of(st.integers(0, 150), st.integers(0, 2**20))),
        }
        params = draw(st.lists(st.sampled_from(["a", "b", "c"]), unique=True, max_size=3))
        if params:
            record["param_norms"] = {p: draw(VALUES) for p in params}
        if draw(st.booleans()):
            record["gate_norms"] = {"a": {g: draw(VALUES) for g in ("i", "f")}}
        if draw(st.booleans()):
            keys = draw(st.lists(st.sampled_from(["forward_s", "backward_s"]), unique=True))
            entry: dict[str, Any] = {k: draw(VALUES) for k in keys}
            if draw(st.booleans()):
                entry["calls"] = draw(st.integers(0, 3))
            record["profile"] = {"m": entry}
        if draw(st.booleans()):
            record["loss"] = draw(VALUES)
        if draw(st.booleans()):
            record["graph_nodes"] = draw(st.integers(0, 5))
        records.append(record)
    return records


def _reference_values(batch: Any, scalar: Any, ids: dict[str, int]) -> list[tuple[Any, ...]]:
    """(series, step, value) of every series of the batch, in batch order, as the
    previous writer handed them to rollups.aggregate."""
    named: list[tuple[Any, ...]] = []
    plain: list[tuple[Any, ...]] = []
    for r in batch.records:
        for p, v in (r.param_norms or {}).items():
            named.append((f"param_norms/{p}", r.step, scalar(v)))
        for p, gates in (r.gate_norms or {}).items():
            named.extend((f"gate_norms/{p}/{g}", r.step, scalar(v)) for g, v in gates.items())
        for m, entry in (r.profile or {}).items():
            for key in ("forward_s", "backward_s", "calls"):
                if getattr(entry, key) is not None:
                    named.append((f"profile/{m}/{key}", r.step, scalar(getattr(entry, key))))
    for name in (STEP_SERIES, *SCALAR_FIELDS):
        for r in batch.records:
            value = r.step if name == STEP_SERIES else getattr(r, name)
            if value is not None:
                plain.append((name, r.step, value if name in INTEGER_FIELDS else scalar(value)))
    return [(ids.setdefault(name, len(ids)), step, value) for name, step, value in named + plain]


@settings(max_examples=300, deadline=None)
@given(records=_records(), postgres=st.booleans(), seq=st.integers(0, 50))
def test_column_rollups_equal_the_reference_aggregate(records, postgres, seq):
    batch = parse_message(
        json.dumps({"type": "batch", "run_id": "r", "rank": 0, "seq": seq, "records": records})
    )

    def to_pg(v: Any) -> Any:
        return NONFINITE_STRINGS[v] if isinstance(v, str) else v

    scalar, key = (to_pg, postgres_key) if postgres else ((lambda v: v), sqlite_key)
    ids: dict[str, int] = {}
    want = aggregate(_reference_values(batch, scalar, ids), key)
    split = split_batch(batch, scalar, "a-session")
    got = aggregate_columns(
        rollup_groups(split, lambda names: [ids[n] for n in names], lambda name: ids[name]),
        key,
    )
    assert _as_dict(got) == _as_dict(want)


def test_python_bucket_extremes_match_the_sql_ones(store_sql, gradwatch_db):
    """Edge and fine buckets come from the packed rows in Python: each bucket's min and
    max equal what the SQL path (``bucket_extremes`` over ``scalars`` rows holding the
    same values) answers, non-finite values, ties and empty buckets included."""
    postgres = gradwatch_db.startswith("postgresql")
    store = store_sql.open(gradwatch_db, "x")
    runs = iter(range(10**6))

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        points=st.dictionaries(st.integers(0, 400), VALUES, min_size=1, max_size=120),
        cuts=st.lists(st.integers(0, 400), unique=True, max_size=12),
    )
    def check(points, cuts):
        run, series = f"b-{next(runs)}", 10**9 + len(cuts) * 1000 + len(points)
        store.submit_hello(
            parse_message(json.dumps({"type": "hello", "protocol": 1, "run_id": run}))
        ).result()
        steps = sorted(points)
        store_sql.send(
            store,
            run,
            0,
            [{"kind": "step", "step": s, "param_norms": {"w": points[s]}} for s in steps],
        )
        stored = {
            s: (NONFINITE_STRINGS[v] if postgres and isinstance(v, str) else v)
            for s, v in points.items()
        }
        store_sql.execute(
            gradwatch_db,
            [("DELETE FROM scalars WHERE series = ?", (series,))]
            + [
                (
                    "INSERT INTO scalars (series, step, value) VALUES (?, ?, ?)",
                    (series, s, v if not isinstance(v, int) else float(v)),
                )
                for s, v in stored.items()
            ],
        )
        edges = sorted({0, 401, *cuts})
        bounds = [(a, b - 1) for a, b in itertools.pairwise(edges) if a <= b - 1]
        sql = store.bucket_extremes(
            "scalars",
            "series = ? AND step >= ? AND step <= ?",
            (series, 0, 400),
            "value",
            bounds,
        )
        python = store.named_extremes(run, 0, "param_norms/w", bounds, {})
        assert sorted((s, _norm(v)) for s, v in python) == sorted(
            (s, _norm(float(v) if isinstance(v, int) else v)) for s, v in sql
        )

    try:
        check()
    finally:
        store.close()
