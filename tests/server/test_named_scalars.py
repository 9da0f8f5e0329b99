"""Named scalars kept as packed rows of a name set (store/chunks.py): a step sent again
keeps the value written last, counts stay integers, long name sets and large rollup
sets store, and fields of several name sets read like a brute-force reference.
(Rollups and Python buckets against their references: test_column_rollups.py.)"""

from __future__ import annotations

import zlib
from typing import Any

from gradwatch.server.downsample import bucket_width


def _points(answer: dict[str, Any]) -> dict[int, Any]:
    """step -> value of the ``param_norms/w`` field of a ``steps`` answer."""
    field = answer["fields"]["param_norms/w"]
    return dict(zip(field["step"], field["value"], strict=True))


def _later_session(first: str) -> str:
    """A session name whose uid salt is lower than ``first``'s: its records' uids are
    smaller although they are written later, so "highest uid wins" would be wrong."""
    salt = zlib.crc32(first.encode()) & 0xFFFFF
    return next(
        name
        for name in (f"resumed-{i}" for i in range(1000))
        if zlib.crc32(name.encode()) & 0xFFFFF < salt
    )


def test_a_step_sent_again_keeps_the_value_written_last(store_sql, gradwatch_db):
    """A resumed process (new session) sends steps 5 and 6 again with other values and
    other names: each name shows the value written last, in full and in buckets."""
    store = store_sql.open(gradwatch_db, "again")
    try:
        first = "process-1"
        store_sql.send(
            store,
            "again",
            0,
            [
                {
                    "kind": "step",
                    "step": s,
                    "param_norms": {"w": float(s)},
                    "gate_norms": {"w": {"f": 0.5}},
                }
                for s in range(40)
            ],
            first,
        )
        later = _later_session(first)
        for seq, step, value in ((0, 5, -100.0), (1, 6, 60.0)):
            record = {"kind": "step", "step": step, "param_norms": {"w": value}}
            store_sql.send(store, "again", seq, [record], later)
        full = store.steps("again", fields=["param_norms/w", "gate_norms/w/f"])["fields"]
        want = [float(s) for s in range(40)]
        want[5], want[6] = -100.0, 60.0
        assert full["param_norms/w"] == {"step": list(range(40)), "value": want}
        # The re-sent records had no gate norm: the first one stays.
        assert full["gate_norms/w/f"]["value"] == [0.5] * 40
        points = _points(store.steps("again", fields=["param_norms/w"], max_points=4))
        assert points[5] == -100.0 and points[6] == 60.0
    finally:
        store.close()


def test_profile_calls_stay_integers(store_sql, gradwatch_db):
    """Counts travel as integers; packed as float64 they still answer as integers, in
    full and in buckets."""
    store = store_sql.open(gradwatch_db, "calls")
    try:
        store_sql.send(
            store,
            "calls",
            0,
            [{"kind": "step", "step": s, "profile": {"m": {"calls": s % 9}}} for s in range(200)],
        )
        for max_points in (2000, 10):
            got = store.steps("calls", fields=["profile/m/calls"], max_points=max_points)
            values = got["fields"]["profile/m/calls"]["value"]
            assert values and all(type(v) is int for v in values), values
    finally:
        store.close()


def test_a_name_set_of_many_long_names_is_stored(store_sql, gradwatch_db):
    """400 names of 250 characters (100 KB of names): found by digest, not by an
    index on the names (PostgreSQL refuses index entries over ~2.7 KB)."""
    names = [f"{i:03d}" + "x" * 247 for i in range(400)]
    store = store_sql.open(gradwatch_db, "long")
    try:
        store_sql.send(
            store,
            "long",
            0,
            [
                {
                    "kind": "step",
                    "step": s,
                    "param_norms": {n: float(i + s) for i, n in enumerate(names)},
                }
                for s in range(3)
            ],
        )
        got = store.steps("long", fields=[f"param_norms/{names[399]}"])["fields"]
        assert got[f"param_norms/{names[399]}"] == {
            "step": [0, 1, 2],
            "value": [399.0, 400.0, 401.0],
        }
    finally:
        store.close()


def test_a_rollup_set_of_many_series_is_stored(store_sql, gradwatch_db):
    """A name set of 1,500 names makes a rollup set of 1,500 series ids (~7 KB as text,
    more than PostgreSQL takes in an index entry even compressed): found by digest too,
    and its rollup rows answer the whole buckets of a downsampled read."""
    names = [f"p{i}" for i in range(1500)]
    store = store_sql.open(gradwatch_db, "wide")
    try:
        records = [
            {
                "kind": "step",
                "step": s,
                "param_norms": {n: float(i + s) for i, n in enumerate(names)},
            }
            for s in range(128)
        ]
        store_sql.send(store, "wide", 0, records)
        # Two whole buckets of 64 steps: each one's min (its first step) and max (its last).
        got = store.steps("wide", fields=["param_norms/p1499"], max_points=4)
        assert got["downsampled"] and got["total"] == 128
        assert got["fields"]["param_norms/p1499"] == {
            "step": [0, 63, 64, 127],
            "value": [1499.0, 1562.0, 1563.0, 1626.0],
        }
        (count,) = store.query(
            "SELECT COUNT(*) FROM rollup_members GROUP BY set_id ORDER BY 1 DESC"
        )[0]
        assert count == len(names)
    finally:
        store.close()


def _bucketed_reference(
    steps: list[int], values: list[Any], first: int, last: int, max_points: int
) -> tuple[list[int], list[Any]]:
    """Each bucket's min and max point by brute force: the buckets of the run's steps
    ``first..last`` (every field shares them); "Infinity" ranks above every number on
    both backends; ties keep the earliest step."""
    width = bucket_width(first, last, max_points // 2)
    rank = {
        s: ((1, 0) if isinstance(v, str) else (0, v)) for s, v in zip(steps, values, strict=True)
    }
    buckets: dict[int, list[int]] = {}
    for s in steps:
        buckets.setdefault(s // width, []).append(s)
    kept = set()
    for members in buckets.values():
        kept.add(min(members, key=lambda s: (rank[s], s)))
        kept.add(min(members, key=lambda s: (tuple(-x for x in rank[s]), s)))
    chosen = sorted(kept)
    by_step = dict(zip(steps, values, strict=True))
    return chosen, [by_step[s] for s in chosen]


def test_fields_of_several_name_sets_read_like_the_reference(store_sql, gradwatch_db):
    """Name sets change within a run (a profile every 3rd step, a parameter that comes
    and goes): each field holds exactly its own steps, in full and in min/max buckets
    (edge and fine buckets from the packed rows, whole ones from the rollups)."""
    store = store_sql.open(gradwatch_db, "sets")
    want: dict[str, dict[int, Any]] = {
        "param_norms/w": {},
        "param_norms/v": {},
        "profile/m/forward_s": {},
    }
    records = []
    for s in range(3000):
        norms: dict[str, Any] = {"w": (s * 7919) % 1000 / 7}
        if s % 5 < 2:
            norms["v"] = "Infinity" if s == 1500 else float(s % 11)
        record: dict[str, Any] = {"kind": "step", "step": s, "param_norms": norms}
        if s % 3 == 0:
            record["profile"] = {"m": {"forward_s": (s % 17) / 100}}
            want["profile/m/forward_s"][s] = (s % 17) / 100
        for p, v in norms.items():
            want[f"param_norms/{p}"][s] = v
        records.append(record)
    try:
        for seq in range(6):
            store_sql.send(store, "sets", seq, records[seq * 500 : (seq + 1) * 500])
        for max_points, lo, hi in ((4000, 0, 2999), (300, 0, 2999), (40, 123, 2777)):
            got = store.steps("sets", start=lo, stop=hi, fields=list(want), max_points=max_points)
            assert got["downsampled"] == (hi - lo + 1 > max_points)
            for name, series in want.items():
                steps = [s for s in series if lo <= s <= hi]
                values = [series[s] for s in steps]
                expected = (steps, values)
                if got["downsampled"]:
                    expected = _bucketed_reference(steps, values, lo, hi, max_points)
                field = got["fields"][name]
                assert (field["step"], field["value"]) == expected, name
    finally:
        store.close()
