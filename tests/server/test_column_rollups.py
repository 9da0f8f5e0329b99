"""Rollups and buckets computed in Python and numpy: the set rows written for a batch
(store/rollups.py), merged per series as history merges them,
equal a brute-force reference over the same values; and the min/max of edge and fine
buckets read from the chunks equal the reference too."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gradwatch.protocol.codec import protocol_number
from gradwatch.protocol.messages import NONFINITE_STRINGS
from gradwatch.server.schema import parse_message
from gradwatch.server.store.chunks import INT_FIELDS, SCALAR_FIELDS
from gradwatch.server.store.rollups import LEVELS, STEP_SERIES, array_blocks
from gradwatch.server.store.split import split_batch

# One value at a time, the orders that rollups.order_keys gives arrays: the reference.
Key = Callable[[Any], tuple[int, Any]]


def sqlite_key(value: Any) -> tuple[int, Any]:
    """SQLite's order: every number before every text value, text by its bytes."""
    return (1, value) if isinstance(value, str) else (0, value)


def postgres_key(value: Any) -> tuple[int, Any]:
    """PostgreSQL's float8 order: NaN above +Infinity, all NaNs equal."""
    return (1, 0.0) if isinstance(value, float) and math.isnan(value) else (0, value)


# A few values that tie, signed zeros, huge ones, the non-finite strings, an integer.
VALUES = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, 2.0, -1.0, 1e300, -1e300, 3, "NaN", "Infinity", "-Infinity"]),
    st.floats(allow_nan=False, allow_infinity=False),
)


def _norm(value: Any) -> tuple[str, str]:
    """Compares NaN with NaN and tells -0.0 from 0.0 (and 3 from 3.0)."""
    return type(value).__name__, repr(value)


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


def _reference_values(batch: Any, scalar: Any) -> list[tuple[str, int, Any]]:
    """(series, step, value) of every series of the batch, values as stored: named
    ones and plain floats as float64 (``scalar``: the backend's non-finite values)."""
    out: list[tuple[str, int, Any]] = []

    def stored(v: Any) -> Any:
        return scalar(v) if isinstance(v, str) else float(v)

    for r in batch.records:
        for p, v in (r.param_norms or {}).items():
            out.append((f"param_norms/{p}", r.step, stored(v)))
        for p, gates in (r.gate_norms or {}).items():
            out.extend((f"gate_norms/{p}/{g}", r.step, stored(v)) for g, v in gates.items())
        for m, entry in (r.profile or {}).items():
            for key in ("forward_s", "backward_s", "calls"):
                if getattr(entry, key) is not None:
                    out.append((f"profile/{m}/{key}", r.step, stored(getattr(entry, key))))
        for name in (STEP_SERIES, *SCALAR_FIELDS):
            value = r.step if name == STEP_SERIES else getattr(r, name)
            if value is not None:
                integral = name == STEP_SERIES or name in INT_FIELDS
                out.append((name, r.step, value if integral else stored(value)))
    return out


def _reference(values: list[tuple[str, int, Any]], key: Key) -> dict[Any, Any]:
    """(series, level, block) -> (min step, min, max step, max, n): brute force, ties
    to the earliest step."""
    blocks: dict[Any, list[tuple[int, Any]]] = {}
    for name, step, value in values:
        for level in LEVELS:
            blocks.setdefault((name, level, step >> level), []).append((step, value))
    out = {}
    for at, points in blocks.items():
        lo = min(points, key=lambda p: (key(p[1]), p[0]))
        top = max(key(p[1]) for p in points)
        hi = min((p for p in points if key(p[1]) == top), key=lambda p: p[0])
        out[at] = (lo[0], _norm(lo[1]), hi[0], _norm(hi[1]), len(points))
    return out


def _merged(rows: list[tuple[Any, ...]], key: Key) -> dict[int, tuple[Any, ...]]:
    """Rows ``(block, min_step, min_v, max_step, max_v)`` of one series merged per
    block: the lower (higher) value in ``key``'s order, then the earlier step."""
    blocks: dict[int, list[Any]] = {}
    for block, *row in rows:
        blocks.setdefault(block, []).append(row)
    out = {}
    for block, found in blocks.items():
        lo = min(found, key=lambda r: (key(r[1]), r[0]))
        top = max(key(r[3]) for r in found)
        hi = min((r for r in found if key(r[3]) == top), key=lambda r: r[2])
        out[block] = (lo[0], lo[1], hi[2], hi[3])
    return out


def _written(batch: Any, scalar: Any, key: Key, order: str) -> dict[Any, Any]:
    """The set rows the writer computes for the batch's chunks, merged per series and
    block as history merges the rows of a series in several sets, values read back
    as the backend stores them."""
    rows: dict[tuple[str, int], list[tuple[Any, ...]]] = {}
    counts: dict[Any, int] = {}

    def stored(v: Any) -> Any:
        return v if isinstance(v, int) or v - v == 0 else scalar(protocol_number(v))

    for chunk in split_batch(batch, scalar, "a-session").groups:
        found, values = array_blocks(np.array(chunk.steps, np.int64), chunk.matrix, order)
        for (level, block, n, _, _), row in zip(found, values.tolist(), strict=True):
            for name, (ls, lv, hs, hv) in zip(chunk.names, row, strict=True):
                rows.setdefault((name, level), []).append((block, ls, stored(lv), hs, stored(hv)))
                counts[name, level, block] = counts.get((name, level, block), 0) + n
    out = {}
    for (name, level), found_rows in rows.items():
        for block, (ls, lv, hs, hv) in _merged(found_rows, key).items():
            out[name, level, block] = (ls, _norm(lv), hs, _norm(hv), counts[name, level, block])
    return out


@settings(max_examples=300, deadline=None)
@given(records=_records(), postgres=st.booleans(), seq=st.integers(0, 50))
def test_set_rollups_equal_the_reference(records, postgres, seq):
    batch = parse_message(
        json.dumps({"type": "batch", "run_id": "r", "rank": 0, "seq": seq, "records": records})
    )

    def to_pg(v: Any) -> Any:
        return NONFINITE_STRINGS[v] if isinstance(v, str) else v

    scalar, key = (to_pg, postgres_key) if postgres else ((lambda v: v), sqlite_key)
    order = "postgresql" if postgres else "sqlite"
    want = _reference(_reference_values(batch, scalar), key)
    assert _written(batch, scalar, key, order) == want


def test_chunk_bucket_extremes_match_the_reference(store_sql, gradwatch_db):
    """Edge and fine buckets come from the chunks: each bucket's min and max
    equal the reference's (the earliest step of equal values, in the backend's order),
    non-finite values, ties and empty buckets included."""
    postgres = gradwatch_db.startswith("postgresql")
    key = postgres_key if postgres else sqlite_key
    store = store_sql.open(gradwatch_db, "x")
    runs = iter(range(10**6))

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        points=st.dictionaries(st.integers(0, 400), VALUES, min_size=1, max_size=120),
        shift=st.integers(0, 7),
        ends=st.lists(st.integers(0, 400), min_size=2, max_size=2).map(sorted),
    )
    def check(points, shift, ends):
        run = f"b-{next(runs)}"
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
            s: (NONFINITE_STRINGS[v] if postgres else v) if isinstance(v, str) else float(v)
            for s, v in points.items()
        }
        # Buckets of 2**shift steps, those at the ends cut by the range lo..hi.
        (lo, hi), width = ends, 1 << shift
        buckets = range(lo // width, hi // width + 1)
        bounds = [(max(b * width, lo), min(b * width + width - 1, hi)) for b in buckets]
        want = []
        for a, b in bounds:
            inside = [(s, v) for s, v in stored.items() if a <= s <= b]
            if inside:
                want.append(min(inside, key=lambda p: (key(p[1]), p[0])))
                top = max(key(v) for _, v in inside)
                want.append(min((p for p in inside if key(p[1]) == top), key=lambda p: p[0]))
        found = store.extremes(run, 0, ["param_norms/w"], width, bounds)["param_norms/w"]
        # Floats come back from either backend: compared as the protocol writes them.
        got = sorted((s, _norm(protocol_number(v))) for s, v in found)
        assert got == sorted((s, _norm(protocol_number(v))) for s, v in want)

    try:
        check()
    finally:
        store.close()
