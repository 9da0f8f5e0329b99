"""Step records as batch columns (protocol/columns.py): what the trainer packs is what
it was given, and odd records travel as records (docs/PROTOCOL.md, ``columns``). How
batches carry the blocks: test_batching.py."""

from __future__ import annotations

import base64
import copy
import struct
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradwatch.protocol.codec import dumps, loads
from gradwatch.protocol.columns import block_json, from_columns, to_columns
from gradwatch.protocol.messages import NONFINITE_STRINGS
from gradwatch.server.columns import block_records
from gradwatch.server.schema import parse_message

INTS = ("epoch", "graph_nodes", "rss_bytes", "cuda_allocated_bytes", "cuda_reserved_bytes")
FLOATS = ("t", "duration_s", "loss", "total_norm", "overhead")

# -- what a step record means, whichever way it travelled ------------------------------


def _bits(value: Any) -> bytes:
    number = NONFINITE_STRINGS[value] if isinstance(value, str) else float(value)
    return struct.pack("<d", number)  # NaN == NaN, -0.0 != 0.0, as on the wire


def _series(value: Any) -> bytes:
    if isinstance(value, dict):  # the server writes the URL-safe alphabet
        return base64.b64decode(value["f64"].replace("-", "+").replace("_", "/"))
    return b"".join(_bits(v) for v in value)


def _frozen(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    return value


def meaning(record: dict[str, Any]) -> Any:
    """A step record with None fields dropped, numbers as float64 bits, series as bytes."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        if value is None:
            continue
        if key in FLOATS:
            out[key] = _bits(value)
        elif key == "param_norms":
            out[key] = {p: _bits(v) for p, v in value.items()}
        elif key == "gate_norms":
            out[key] = {p: {g: _bits(v) for g, v in gates.items()} for p, gates in value.items()}
        elif key == "profile":
            out[key] = {
                m: {k: v if k == "calls" else _bits(v) for k, v in e.items() if v is not None}
                for m, e in value.items()
            }
        elif key == "timesteps":
            out[key] = {m: {s: _series(v) for s, v in by.items()} for m, by in value.items()}
        else:
            out[key] = value
    return _frozen(out)


# -- records: shapes that repeat, good values, and odd records -------------------------

NAMES = st.text(alphabet='ab./_"\\é', min_size=1, max_size=4)  # JSON escapes too
NUMBER = st.one_of(
    st.floats(),  # NaN and infinities included
    st.integers(-(2**70), 2**70),
    st.sampled_from(sorted(NONFINITE_STRINGS)),
)
SHAPES = st.fixed_dictionaries(
    {
        "fields": st.sets(st.sampled_from((*INTS, *FLOATS, "graph_truncated"))),
        "norms": st.lists(NAMES, max_size=3, unique=True),
        "gates": st.dictionaries(NAMES, st.lists(st.sampled_from("ifgo"), min_size=1, unique=True),
                                 max_size=2),
        "profile": st.dictionaries(NAMES, st.sets(st.sampled_from(("forward_s", "backward_s",
                                                                    "calls")), min_size=1),
                                   max_size=2),
        "series": st.dictionaries(NAMES, st.dictionaries(NAMES, st.integers(0, 4), min_size=1,
                                                         max_size=2), max_size=2),
    }
)


@st.composite
def good_record(draw: st.DrawFn, shape: dict[str, Any], step: int) -> dict[str, Any]:
    record: dict[str, Any] = {"kind": "step", "step": step}
    for field in sorted(shape["fields"]):
        if field in INTS:
            record[field] = draw(st.integers(0, 2**63 - 1))
        elif field == "graph_truncated":
            record[field] = draw(st.booleans())
        else:
            record[field] = draw(st.none() | NUMBER)  # None counts as absent
    if shape["norms"]:
        record["param_norms"] = {p: draw(NUMBER) for p in shape["norms"]}
    if shape["gates"]:
        gates = shape["gates"].items()
        record["gate_norms"] = {p: {g: draw(NUMBER) for g in gs} for p, gs in gates}
    if shape["profile"]:
        record["profile"] = {
            m: {k: draw(st.integers(0, 2**53)) if k == "calls" else draw(NUMBER) for k in keys}
            for m, keys in shape["profile"].items()
        }
    if shape["series"]:
        record["timesteps"] = {}
        for module, by_series in shape["series"].items():
            record["timesteps"][module] = {}
            for name, length in by_series.items():
                values = draw(st.lists(st.floats() | NUMBER, min_size=length, max_size=length))
                if draw(st.booleans()):
                    values = {"f64": base64.b64encode(b"".join(map(_bits, values))).decode()}
                record["timesteps"][module][name] = values
    return record


# Each makes a step record one the server must see as it came (to name what is wrong).
ODD: list[tuple[str, Any]] = [
    ("nonfinite", {"loss": True}),
    ("newer_field", 1),
    ("loss", True),
    ("loss", "nan"),
    ("loss", 10**400),
    ("loss", [1.0]),
    ("step", -1),
    ("step", 1.0),
    ("step", True),
    ("epoch", 2**63),
    ("graph_truncated", 1),
    ("rss_bytes", 1.5),
    ("param_norms", {}),
    ("param_norms", {"w": None}),
    ("param_norms", {"w": False}),
    ("param_norms", {"p" * 300: 1.0}),
    ("gate_norms", {"w": {"a/b": 1.0}}),
    ("gate_norms", {"": {"i": 1.0}}),
    ("gate_norms", {"w": {}}),
    ("profile", {"m": {"forward_s": 1.0, "other": 2.0}}),
    ("profile", {"m": {"calls": 1.5}}),
    ("profile", {"m": {"calls": -1}}),
    ("profile", {"m": {"forward_s": None}}),
    ("timesteps", {"m": {"s": [1.0, True]}}),
    ("timesteps", {"m": {"s": [1.0, None]}}),
    ("timesteps", {"m": {"s": {"f64": "!!!!"}}}),
    ("timesteps", {"m": {"s": {"f64": "AAAA"}}}),  # 3 bytes: not whole float64 values
    ("timesteps", {"m": {"s": {"f64": "", "more": 1}}}),
    ("timesteps", {"m": {}}),
]


@st.composite
def odd_record(draw: st.DrawFn, shape: dict[str, Any], step: int) -> dict[str, Any]:
    if draw(st.booleans()):
        return draw(st.sampled_from([{"kind": "epoch", "epoch": 1}, {"kind": "end",
                                     "status": "finished"}, {"step": step}]))
    record = draw(good_record(shape, step))
    key, value = draw(st.sampled_from(ODD))
    record[key] = copy.deepcopy(value)
    if key == "step" and draw(st.booleans()):
        del record["step"]
    return record


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[bool]]:
    shapes = draw(st.lists(SHAPES, min_size=1, max_size=3))
    records, good = [], []
    for step in range(draw(st.integers(0, 12))):
        shape = draw(st.sampled_from(shapes))
        fine = draw(st.integers(0, 4)) > 0
        records.append(draw((good_record if fine else odd_record)(shape, step)))
        good.append(fine)
    return records, good


@settings(max_examples=150, deadline=None)
@given(batches())
def test_blocks_hold_the_step_records_given_and_odd_records_stay_records(
    case: tuple[list[dict[str, Any]], list[bool]],
) -> None:
    records, good = case
    before = dumps(records)
    rest, blocks = to_columns(records)
    assert dumps(records) == before  # the caller's records are not changed
    # Exactly the odd records stay, as the same objects, in order.
    odd = [r for r, fine in zip(records, good, strict=True) if not fine]
    assert [id(r) for r in rest] == [id(r) for r in odd]
    assert [block_json(block) for block in blocks] == [dumps(block) for block in blocks]
    decoded = [from_columns(loads(block_json(block))) for block in blocks]  # as they travel
    assert all(1 <= block["n"] <= 10_000 for block in blocks)
    assert Counter(meaning(r) for b in decoded for r in b) == Counter(
        meaning(r) for r, fine in zip(records, good, strict=True) if fine
    )
    # Records keep their order in a block; blocks come in order of their first record.
    for block in decoded:
        steps = [r["step"] for r in block]
        assert steps == sorted(steps)
    firsts = [block[0]["step"] for block in decoded]
    assert firsts == sorted(firsts)


@pytest.mark.parametrize(("key", "value"), ODD, ids=[f"{k}={v!r}"[:40] for k, v in ODD])
def test_each_odd_field_keeps_its_record_out_of_blocks(key: str, value: Any) -> None:
    shape = {"kind": "step", "loss": 0.5, "graph_truncated": False, "param_norms": {"w": 1.0},
             "gate_norms": {"w": {"i": 1.0}}, "profile": {"m": {"forward_s": 0.1}},
             "timesteps": {"m": {"s": [1.0, 2.0]}}}
    odd = {**copy.deepcopy(shape), "step": 1, key: copy.deepcopy(value)}
    records = [{**shape, "step": 0}, odd, {**shape, "step": 2}]
    rest, blocks = to_columns(records)
    assert rest == [odd] and rest[0] is odd
    assert [r["step"] for b in blocks for r in from_columns(b)] == [0, 2]


@settings(max_examples=50, deadline=None)
@given(batches())
def test_the_server_takes_the_blocks_and_reads_the_same_records(
    case: tuple[list[dict[str, Any]], list[bool]],
) -> None:
    records = [r for r, fine in zip(*case, strict=True) if fine]
    rest, blocks = to_columns(records)
    assert rest == []
    text = dumps({"type": "batch", "run_id": "r", "rank": 0, "seq": 0, "records": [],
                  "columns": blocks})
    batch = parse_message(text)
    for block, parsed in zip(blocks, batch.columns, strict=True):
        ours = from_columns(block)
        theirs = block_records(parsed)
        for mine, server in zip(ours, theirs, strict=True):
            if "epoch" not in mine:
                assert server.pop("epoch") == 0  # absent means 0
            assert meaning(mine) == meaning(server)


def test_a_small_block_is_exactly_these_bytes() -> None:
    records = [
        {"kind": "step", "step": 3, "graph_truncated": False, "loss": 0.5, "total_norm": None,
         "param_norms": {"w": 2.0}, "gate_norms": {"l.w": {"i": 0.25}},
         "timesteps": {"lstm": {"input": [1.0, 2.0]}}},
        {"kind": "epoch", "epoch": 0, "steps": 1},
        {"kind": "step", "step": 4, "graph_truncated": True, "loss": "NaN",
         "param_norms": {"w": 1.0}, "gate_norms": {"l.w": {"i": 0.125}},
         "timesteps": {"lstm": {"input": {"f64": "AAAAAAAACEAAAAAAAAAQQA=="}}}},  # 3.0, 4.0
    ]
    rest, blocks = to_columns(records)
    assert rest == [records[1]]
    # struct.pack("<2q", 3, 4), ("<2q", 0, 1), ("<2d", 0.5, nan), ("<4d", 2, .25, 1, .125),
    # ("<4d", 1, 2, 3, 4), base64 with the standard alphabet.
    assert [block_json(block) for block in blocks] == [
        '{"kind":"step","n":2,"step":{"i64":"AwAAAAAAAAAEAAAAAAAAAA=="},'
        '"graph_truncated":{"i64":"AAAAAAAAAAABAAAAAAAAAA=="},'
        '"loss":{"f64":"AAAAAAAA4D8AAAAAAAD4fw=="},'
        '"named":{"names":["param_norms/w","gate_norms/l.w/i"],'
        '"f64":"AAAAAAAAAEAAAAAAAADQPwAAAAAAAPA/AAAAAAAAwD8="},'
        '"timesteps":{"lstm":{"input":{"len":2,'
        '"f64":"AAAAAAAA8D8AAAAAAAAAQAAAAAAAAAhAAAAAAAAAEEA="}}}}'
    ]
    second = from_columns(blocks[0])[1]
    assert second["timesteps"] == {"lstm": {"input": {"f64": "AAAAAAAACEAAAAAAAAAQQA=="}}}
    assert second["graph_truncated"] is True and second["loss"] != second["loss"]  # NaN


def test_light_and_heavy_steps_interleaved_make_two_blocks_in_step_order() -> None:
    records = [
        {"kind": "step", "step": s, "loss": 1.0}
        | ({"param_norms": {"w": float(s)}} if s % 10 == 0 else {})
        for s in range(30)
    ]
    rest, blocks = to_columns(records)
    assert rest == []
    steps = [[r["step"] for r in from_columns(b)] for b in blocks]
    assert steps == [[0, 10, 20], [s for s in range(1, 30) if s % 10]]


def test_every_record_with_a_wrong_value_leaves_its_block_and_the_others_stay() -> None:
    records = [
        {"kind": "step", "step": s, "loss": True if s % 3 == 0 else 0.5,
         "param_norms": {"w": None if s % 5 == 0 else 1.0}}
        for s in range(3_000)
    ]
    rest, blocks = to_columns(records)
    assert [r["step"] for r in rest] == [s for s in range(3_000) if s % 3 == 0 or s % 5 == 0]
    assert [r["step"] for b in blocks for r in from_columns(b)] == [
        s for s in range(3_000) if s % 3 and s % 5
    ]


def test_a_group_over_ten_thousand_records_is_cut_into_blocks() -> None:
    records = [{"kind": "step", "step": s, "loss": s / 2} for s in range(25_000)]
    _, blocks = to_columns(records)
    assert [b["n"] for b in blocks] == [10_000, 10_000, 5_000]
    assert [r["step"] for b in blocks for r in from_columns(b)] == list(range(25_000))


@pytest.mark.parametrize("max_bytes", [2_000, 50_000, 1 << 20])
def test_blocks_cut_for_a_batch_size_fit_in_it_and_fill_it(max_bytes: int) -> None:
    records = [
        {"kind": "step", "step": s, "loss": 0.5, "rss_bytes": 7,
         "param_norms": {f"{'é' * 40}.\"{j}": 0.25 for j in range(8)},  # escaped names
         "timesteps": {"lstm": {"input": [0.5] * 32, "hidden": [0.25] * 8}}}
        for s in range(3_000)
    ]
    _, blocks = to_columns(records, max_bytes)
    sizes = [len(block_json(block)) for block in blocks]
    assert max(sizes) <= max_bytes
    # Not needlessly small: one more record would not have fitted.
    n = blocks[0]["n"]
    assert len(block_json(to_columns(records[: n + 1])[1][0])) > max_bytes
    assert [r["step"] for b in blocks for r in from_columns(b)] == list(range(3_000))
